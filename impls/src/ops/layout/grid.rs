//! The spatial geometry of a channel-major feature map `[C, N·H·W]` and the kinds of 3×3
//! shifted views of it, shared by the CPU kernels (`ops/shift.rs`) and their CUDA launchers
//! (`ops/cuda`) so that neither imports the other for them.

/// Spatial geometry of a channel-major map `[C, N·H·W]`.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub n: usize,
    pub h: usize,
    pub w: usize,
}

/// Which shifted view an op writes: the stack `[C, m] → [9C, m]` (row `j·C + c` is row `c`
/// shifted by tap `j`) or the sum `[9C, m] → [C, m]` (row `c` is `Σ_j` row `j·C + c` shifted by
/// tap `j`, added in the order j = 0..9 to +0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shift {
    /// `[C, m] → [9C, m]`: the nine shifted copies.
    Stack,
    /// `[9C, m] → [C, m]`: the nine shifted blocks added.
    Sum,
}

/// The nine (dy, dx) ∈ {0,1,2}² taps of a 3×3 kernel, in PyTorch weight order (j = 3·dy + dx).
pub const TAPS: [(usize, usize); 9] = [
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (1, 2),
    (2, 0),
    (2, 1),
    (2, 2),
];
