//! What the CPU kernels (`kernels`, `fused`, `conv3x3`, `dense`) share: the float type they run
//! on, and the raw pointer their parallel tasks write one output through.

use candle_core::CpuStorage;

/// A float type the CPU kernels run on (f32 and f64).
pub trait Float:
    Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    /// The value as f64 (exact).
    fn f64(self) -> f64;
    /// The nearest value to `v`.
    fn of(v: f64) -> Self;
    /// The storage's elements when it holds this type.
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
}
impl Float for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn f64(self) -> f64 {
        f64::from(self)
    }
    fn of(v: f64) -> Self {
        v as f32
    }
    fn slice(s: &CpuStorage) -> Option<&[Self]> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}
impl Float for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn f64(self) -> f64 {
        self
    }
    fn of(v: f64) -> Self {
        v
    }
    fn slice(s: &CpuStorage) -> Option<&[Self]> {
        match s {
            CpuStorage::F64(v) => Some(v),
            _ => None,
        }
    }
}

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
