//! The raw pointer the CPU kernels' parallel tasks share to write disjoint parts of one output
//! (tiles of a convolution, panels of a product, chunks of a copy).

/// A raw pointer that parallel tasks share. Each user partitions the output so that no two
/// tasks write the same element and none reads what another writes (each says how at its use).
#[derive(Clone, Copy)]
pub(crate) struct SharedPtr<T>(pub(crate) *mut T);
// SAFETY: see the type's contract: disjoint writes, no reads of what another task writes.
unsafe impl<T: Send> Send for SharedPtr<T> {}
unsafe impl<T: Send> Sync for SharedPtr<T> {}
impl<T> SharedPtr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not its field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}
