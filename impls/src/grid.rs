//! The spatial geometry of a channel-major feature map `[C, N·H·W]` and the kinds of 3×3
//! shifted views of it, shared by the CPU kernels (`fused`) and their CUDA launchers
//! (`fused_cuda`) so that neither imports the other for them.

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
