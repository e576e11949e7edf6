//! The GPU's direct 3×3 convolution (`ops/cuda/conv.cu`, picked with `DENSEBENCH_CONV=direct`)
//! as candle ops over the channel-major maps `[C, N·H·W]` the layer maths hold (the `cuda`
//! feature), and its geometry ([`crate::ops::cuda::direct`], re-exported: the memory model
//! charges its transient in every build).
//!
//! No tap stack and no stacked weight: forward and data gradient read the features and the
//! PyTorch weight `[k, B, 3, 3]` where they lie (the data gradient as a forward convolution
//! with the weight read transposed and flipped) and write their output once; the weight
//! gradient sums slices of the pixels into `[slices, k, B, 3, 3]` partials (f32 for f32 and
//! bf16 features, f64 for f64), then adds them in slice order into `dW` — deterministic, two
//! runs bitwise equal. IEEE FP32 fused multiply-adds, never TF32.

pub use crate::ops::cuda::direct::*;

#[cfg(feature = "cuda")]
pub use ops::{backward_data, backward_weight, forward};

#[cfg(feature = "cuda")]
mod ops {
    use crate::error::{CandleContext, Result};
    use crate::ops::cpu::shared::unfilled;
    use crate::ops::cuda::conv as launch;
    use crate::ops::cuda::direct::Pass;
    use crate::ops::layout::grid::Grid;
    use candle_core::{CpuStorage, Device, InplaceOp3, Layout, Tensor};

    struct Direct {
        pass: Pass,
        grid: Grid,
        /// Channels in (B) and out (k) of the layer's convolution, whatever the pass.
        b: usize,
        k: usize,
    }

    impl InplaceOp3 for Direct {
        fn name(&self) -> &'static str {
            match self.pass {
                Pass::Forward => "conv3x3-direct-forward",
                Pass::Data => "conv3x3-direct-data",
                Pass::Weight => "conv3x3-direct-weight",
            }
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
                "{}: the GPU's direct kernels run on CUDA devices only (the CPU has its own)",
                self.name()
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
            launch::run(
                self.name(),
                self.pass,
                self.grid,
                (self.b, self.k),
                (dst, dl),
                (a, al),
                (b, bl),
            )
        }
    }

    fn cuda_only(dev: &Device, what: &'static str) -> Result<()> {
        if dev.is_cuda() {
            return Ok(());
        }
        Err(crate::error::Error::Unsupported {
            device: format!("{dev:?}"),
            what: format!("{what}: the direct kernels run on CUDA devices only"),
        })
    }

    /// A new tensor of `shape` and `dtype` written whole by `pass` from `a` and `b`.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        pass: Pass,
        what: &'static str,
        g: Grid,
        (b_in, k): (usize, usize),
        (shape, dtype): (&[usize], candle_core::DType),
        a: &Tensor,
        b: &Tensor,
    ) -> Result<Tensor> {
        cuda_only(a.device(), what)?;
        // operands as they are (the launcher refuses a strided one: never a silent copy,
        // which the memory model would not know of)
        // SAFETY: every pass writes its destination whole (each element once, from +0).
        let dst = unsafe { unfilled(shape, dtype, a.device(), what)? };
        let op = Direct {
            pass,
            grid: g,
            b: b_in,
            k,
        };
        dst.inplace_op3(a, b, &op).ctx(what)?;
        Ok(dst)
    }

    /// `y [k, M] = conv(s [B, M], w [k, B, 3, 3])`, all in one dtype (bf16: f32 sums rounded
    /// once).
    pub fn forward(s: &Tensor, w: &Tensor, g: Grid) -> Result<Tensor> {
        let (k, b) = (w.dims()[0], w.dims()[1]);
        let m = g.n * g.h * g.w;
        let what = "conv2 forward (direct)";
        pass(Pass::Forward, what, g, (b, k), (&[k, m], s.dtype()), s, w)
    }

    /// `ds [B, M]` from `gy [k, M]` and `w [k, B, 3, 3]`.
    pub fn backward_data(gy: &Tensor, w: &Tensor, g: Grid) -> Result<Tensor> {
        let (k, b) = (w.dims()[0], w.dims()[1]);
        let m = g.n * g.h * g.w;
        let what = "conv2 bwd ds (direct)";
        pass(Pass::Data, what, g, (b, k), (&[b, m], gy.dtype()), gy, w)
    }

    /// `dW [k, B, 3, 3]` in the parameter dtype (f32 for bf16 features, not rounded) from
    /// `gy [k, M]` and `s [B, M]`; the partial sums ([`super::partial_elems`]) are allocated
    /// and freed inside.
    pub fn backward_weight(gy: &Tensor, s: &Tensor, g: Grid) -> Result<Tensor> {
        let (k, b) = (gy.dims()[0], s.dims()[0]);
        let what = "conv2 bwd dW (direct)";
        let param = crate::config::param_dtype(gy.dtype());
        pass(Pass::Weight, what, g, (b, k), (&[k, b, 3, 3], param), gy, s)
    }
}
