//! The spatial geometry of a channel-major feature map `[C, N·H·W]`, shared by the CPU kernels
//! (`fused`) and their CUDA launchers (`fused_cuda`) so that neither imports the other for it.

/// Spatial geometry of a channel-major map `[C, N·H·W]`.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub n: usize,
    pub h: usize,
    pub w: usize,
}
