//! The direct, cache-blocked 3×3 convolution (padding 1, stride 1, no bias) on channel-major
//! maps `[C, N·H·W]` for the CPU: forward, backward-data and backward-weight, without the 9×
//! tap stack of the whole map. H and W are separate throughout ([`Grid`]); nothing assumes a
//! square image.
//!
//! The image is cut into tiles of whole rows of one image. A tile copies its rows, plus one halo
//! row above and below, into a zero-padded scratch `[C, R+2, W+2]`; in that padded tile every
//! tap is a constant offset, and outputs are computed in padded-width columns (copied out
//! without the pad columns). Per tile, each pass is one to three `gemm` products of a useful
//! inner length, all in cache:
//!
//! - forward: for each kernel row dy, `Z_dy [3k, ·] = W_dy [3k, B] · tile[dy-th row on]` (the
//!   three taps of that row stacked), then `y = Σ_j Z_j` shifted by tap j's column, summed in
//!   tap order — the same sums, in the same order, as nine accumulated per-tap products;
//! - backward-data: the nine shifted copies of the gradient tile stacked, `G [9k, ·]`, then
//!   `ds = Wᵀ_flipped [B, 9k] · G`: one product of inner length 9k (per tap it was k = 12);
//! - backward-weight: the same `G` times the layer-input tile, `dW_taps [9k, B] += G · sᵀ`.
//!
//! Products run single-threaded inside a tile, tiles in parallel (rayon); every output element
//! is produced by one tile, and the weight gradient sums a fixed number of per-group partials in
//! order, so results do not depend on the thread count or on scheduling. The only workspace is
//! one scratch per thread ([`workspace_elems`]) and the stacked weight of the pass.
//!
//! Dtypes: all f32 or all f64, or bf16 operands (PyTorch autocast's convolution): where the CPU
//! has AVX-512 BF16, the passes run on its dot-product kernel with bf16 tiles
//! (the `bf16` submodule, in the same allocations); elsewhere (or where a block's
//! packed operands do not fit them) the scratch tiles and the stacked weight are f32 — the bf16
//! operands widened (exact) as a tile is filled. Either way the products accumulate in f32,
//! and each output element is written once, rounded to bf16 (forward, backward-data) or not
//! rounded (backward-weight: an f32 parameter gradient). For bf16 the scratch is [`workspace_elems`] f32 elements (4 bytes each, not the
//! operands' 2) per thread and the stacked weight `9·k·B` f32 elements: the same element counts
//! as for f32 operands.

mod bf16;
#[cfg(feature = "cudnn")]
pub mod cudnn;
pub mod gpu;
mod tiles;
mod widened;

use crate::error::{CandleContext, Result};
use crate::ops::cpu::shared::Elem;
pub use crate::ops::cpu::shared::Float;
pub use crate::ops::cuda::staging::{with_cudnn_staging, CudnnStaging, CudnnStagingChoice};
use crate::ops::layout::grid::Grid;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
pub use tiles::{scratch_elems, weight_partial_elems, workspace_elems, Pass, WEIGHT_GROUPS};
use widened::{data_tiles, forward_tiles, weight_grad};

/// Bytes of the workspaces cuDNN takes for a bc layer's 3×3 convolution, one per pass, for the
/// algorithms the device runs (asked of cuDNN on the device with the `cudnn` feature: `cudnn::workspaces`). Every layer of a block convolves the same shapes (B = 4k channels
/// in, k out, the same maps), so one triple holds for the whole block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ConvWorkspaces {
    /// Forward (`y = conv(s, W2)`).
    pub forward: u64,
    /// Data gradient (`ds`).
    pub data: u64,
    /// Filter gradient (`dW2`).
    pub filter: u64,
}

/// What runs a GPU pass: the destination written whole from two operands, each with its layout.
#[cfg(feature = "cuda")]
trait PassFn:
    Fn(
    (&mut candle_core::CudaStorage, &Layout),
    (&candle_core::CudaStorage, &Layout),
    (&candle_core::CudaStorage, &Layout),
) -> candle_core::Result<()>
{
}
#[cfg(feature = "cuda")]
impl<F> PassFn for F where
    F: Fn(
        (&mut candle_core::CudaStorage, &Layout),
        (&candle_core::CudaStorage, &Layout),
        (&candle_core::CudaStorage, &Layout),
    ) -> candle_core::Result<()>
{
}

/// One pass of a GPU-only 3×3 convolution (cuDNN's, the direct kernels') as a candle in-place
/// op: `run` writes the destination whole from two operands; the CPU is refused (it runs its
/// own kernel, this module's).
#[cfg(feature = "cuda")]
struct CudaPass<F> {
    name: &'static str,
    run: F,
}

#[cfg(feature = "cuda")]
impl<F> candle_core::InplaceOp3 for CudaPass<F>
where
    F: PassFn,
{
    fn name(&self) -> &'static str {
        self.name
    }
    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        Err(candle_core::Error::Msg(format!(
            "{}: runs on CUDA devices only (the CPU has its own 3×3 kernel)",
            self.name
        )))
    }
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        a: &candle_core::CudaStorage,
        al: &Layout,
        b: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<()> {
        (self.run)((dst, dl), (a, al), (b, bl))
    }
}

/// A new tensor of `shape` and `dtype` on `a`'s device written whole by the GPU pass `run`
/// (the op `name`; `what` in errors) from `a` and `b`, taken as they are (a launcher refuses a
/// strided operand: never a silent copy the memory model would not know of). An error off a
/// CUDA device.
#[cfg(feature = "cuda")]
fn cuda_pass<F>(
    (name, what): (&'static str, &'static str),
    (shape, dtype): (&[usize], candle_core::DType),
    a: &Tensor,
    b: &Tensor,
    run: F,
) -> Result<Tensor>
where
    F: PassFn,
{
    if !a.device().is_cuda() {
        return Err(crate::error::Error::Unsupported {
            device: format!("{:?}", a.device()),
            what: format!("{what}: runs on CUDA devices only"),
        });
    }
    // SAFETY: every GPU pass writes its destination whole before anything reads it
    let dst = unsafe { crate::ops::cpu::shared::unfilled(shape, dtype, a.device(), what)? };
    dst.inplace_op3(a, b, &CudaPass { name, run }).ctx(what)?;
    Ok(dst)
}

struct Conv3x3Op {
    grid: Grid,
    pass: Pass,
}

impl CustomOp2 for Conv3x3Op {
    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "conv3x3-forward",
            Pass::Data => "conv3x3-backward-data",
            Pass::Weight => "conv3x3-backward-weight",
        }
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        crate::ops::cpu::shared::tune_gemm();
        let name = self.name();
        let g = self.grid;
        let (c1, m) = l1.shape().dims2()?;
        if m != g.n * g.h * g.w {
            return Err(candle_core::Error::Msg(format!(
                "{name}: {m} columns, grid {}×{}×{} wants {}",
                g.n,
                g.h,
                g.w,
                g.n * g.h * g.w
            )));
        }
        let d2 = l2.shape().dims();
        let (out_shape, k, b) = match self.pass {
            Pass::Forward | Pass::Data => {
                let (k, b) = match d2 {
                    [k, b, 3, 3] => (*k, *b),
                    _ => {
                        return Err(candle_core::Error::Msg(format!(
                            "{name}: weight {d2:?}, expected [k, B, 3, 3]"
                        )))
                    }
                };
                let (want, out) = match self.pass {
                    Pass::Forward => (b, k),
                    _ => (k, b),
                };
                if c1 != want {
                    return Err(candle_core::Error::Msg(format!(
                        "{name}: {c1} input channels, weight {d2:?} wants {want}"
                    )));
                }
                (Shape::from((out, m)), k, b)
            }
            Pass::Weight => {
                let (b, m2) = l2.shape().dims2()?;
                if m2 != m {
                    return Err(candle_core::Error::Msg(format!(
                        "{name}: gradient has {m} columns, input {m2}"
                    )));
                }
                (Shape::from((c1, b, 3, 3)), c1, b)
            }
        };
        // features out as E (rounded once), the weight gradient as E::Acc (f32 for bf16)
        fn go<E: Elem<Acc = T>, T: Float>(
            p: Pass,
            a: &[E],
            w: &[E],
            (k, b): (usize, usize),
            g: Grid,
        ) -> CpuStorage {
            match p {
                Pass::Forward => E::storage(forward_tiles(a, w, b, k, g)),
                Pass::Data => E::storage(data_tiles(a, w, b, k, g)),
                Pass::Weight => T::storage(weight_grad(a, w, k, b, g)),
            }
        }
        let sl = |l: &Layout| {
            l.contiguous_offsets().ok_or_else(|| {
                candle_core::Error::Msg(format!("{name}: operand must be contiguous"))
            })
        };
        let ((a1, b1), (a2, b2)) = (sl(l1)?, sl(l2)?);
        let p = self.pass;
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => go(p, &x[a1..b1], &y[a2..b2], (k, b), g),
            (CpuStorage::F64(x), CpuStorage::F64(y)) => go(p, &x[a1..b1], &y[a2..b2], (k, b), g),
            (CpuStorage::BF16(x), CpuStorage::BF16(y)) => {
                let (x, y) = (&x[a1..b1], &y[a2..b2]);
                // the dot-product kernel where the CPU has AVX-512 BF16 and the pass's blocks
                // fit; on AVX2 the widened direct kernel is the faster (BC-100 L=16 bf16 steps
                // ×0.88–0.99 of those with this pass on the AVX2 dot kernel, Zen 3, three
                // alternations of `cat-store-copy` and `buffer-recompute-inplace`)
                use crate::ops::cpu::bf16_dot::{isa, Isa};
                let dot = (isa() == Some(Isa::Avx512Bf16))
                    .then(|| bf16::run(p, x, y, (k, b), g))
                    .flatten();
                dot.unwrap_or_else(|| go(p, x, y, (k, b), g))
            }
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "{name}: operands must all be f32, all f64 or all bf16, got {:?} and {:?}",
                    s1.dtype(),
                    s2.dtype()
                )))
            }
        };
        Ok((out, out_shape))
    }
}

fn apply(a: &Tensor, b: &Tensor, grid: Grid, pass: Pass, what: &'static str) -> Result<Tensor> {
    let a = a.contiguous().ctx(what)?;
    let b = b.contiguous().ctx(what)?;
    a.apply_op2_no_bwd(&b, &Conv3x3Op { grid, pass }).ctx(what)
}

/// `y [k, M]` of `s [B, M]` and a PyTorch weight `w [k, B, 3, 3]` (CPU tensors): f32, f64,
/// or bf16 (f32 accumulation, rounded once to bf16).
pub fn forward(s: &Tensor, w: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(s, w, grid, Pass::Forward, "conv3x3 forward")
}

/// `ds [B, M]` of the upstream gradient `gy [k, M]` and the weight `w [k, B, 3, 3]`: f32, f64,
/// or bf16 (f32 accumulation, rounded once to bf16).
pub fn backward_data(gy: &Tensor, w: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(gy, w, grid, Pass::Data, "conv3x3 backward data")
}

/// `dW [k, B, 3, 3]` of the upstream gradient `gy [k, M]` and the layer input `s [B, M]`:
/// f32 or f64 in their own dtype; of bf16 operands an f32 gradient (f32 accumulation, not
/// rounded).
pub fn backward_weight(gy: &Tensor, s: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(gy, s, grid, Pass::Weight, "conv3x3 backward weight")
}
