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
//! runs bitwise equal. Every pass on tensor cores (`conv3x3_mma`, `conv3x3_wgrad_mma`: bf16
//! features, and f32 ones under `--math tf32` as TF32 operands; sm_80 and later) unless refused
//! (`DENSEBENCH_CONV=direct-fma`), else in fused multiply-adds (IEEE FP32, f64 for f64).

pub use crate::ops::cuda::direct::*;

#[cfg(feature = "cuda")]
pub use ops::{backward_data, backward_weight, forward, kernel};

#[cfg(feature = "cuda")]
mod ops {
    use crate::error::CandleContext;
    use crate::error::Result;
    use crate::ops::cuda::conv as launch;
    use crate::ops::cuda::direct::{ConvKernel, Mma, Pass};
    use crate::ops::layout::grid::Grid;
    use candle_core::{DType, Device, Tensor};

    /// The kernel a pass on `dtype` features runs on `device`
    /// ([`super::conv_kernel`]); [`ConvKernel::Fma`] off CUDA.
    pub fn kernel(device: &Device, dtype: DType, mma: Mma) -> Result<ConvKernel> {
        match device {
            Device::Cuda(dev) => {
                launch::kernel(dev, dtype, mma).ctx("the direct convolution's kernel")
            }
            _ => Ok(ConvKernel::Fma),
        }
    }

    /// A new tensor of `shape` and `dtype` written whole by `pass` from `a` and `b`, for a
    /// convolution of `b_in` channels into `k`.
    fn pass(
        pass: Pass,
        what: &'static str,
        (g, b_in, k, mma): (Grid, usize, usize, Mma),
        out: (&[usize], candle_core::DType),
        a: &Tensor,
        b: &Tensor,
    ) -> Result<Tensor> {
        let name = match pass {
            Pass::Forward => "conv3x3-direct-forward",
            Pass::Data => "conv3x3-direct-data",
            Pass::Weight => "conv3x3-direct-weight",
        };
        super::super::cuda_pass((name, what), out, a, b, |d, x, y| {
            launch::run(name, pass, g, (b_in, k), mma, d, x, y)
        })
    }

    /// `y [k, M] = conv(s [B, M], w [k, B, 3, 3])`, all in one dtype (bf16: f32 sums rounded
    /// once); `mma`: on tensor cores where [`kernel`] allows.
    pub fn forward(s: &Tensor, w: &Tensor, g: Grid, mma: Mma) -> Result<Tensor> {
        let (k, b) = (w.dims()[0], w.dims()[1]);
        let m = g.n * g.h * g.w;
        let what = "conv2 forward (direct)";
        pass(
            Pass::Forward,
            what,
            (g, b, k, mma),
            (&[k, m], s.dtype()),
            s,
            w,
        )
    }

    /// `ds [B, M]` from `gy [k, M]` and `w [k, B, 3, 3]`; `mma` as for [`forward`].
    pub fn backward_data(gy: &Tensor, w: &Tensor, g: Grid, mma: Mma) -> Result<Tensor> {
        let (k, b) = (w.dims()[0], w.dims()[1]);
        let m = g.n * g.h * g.w;
        let what = "conv2 bwd ds (direct)";
        pass(
            Pass::Data,
            what,
            (g, b, k, mma),
            (&[b, m], gy.dtype()),
            gy,
            w,
        )
    }

    /// `dW [k, B, 3, 3]` in the parameter dtype (f32 for bf16 features, not rounded) from
    /// `gy [k, M]` and `s [B, M]`; the partial sums ([`super::partial_elems`]) are allocated
    /// and freed inside; `mma` as for [`forward`].
    pub fn backward_weight(gy: &Tensor, s: &Tensor, g: Grid, mma: Mma) -> Result<Tensor> {
        let (k, b) = (gy.dims()[0], s.dims()[0]);
        let what = "conv2 bwd dW (direct)";
        let param = crate::config::param_dtype(gy.dtype());
        pass(
            Pass::Weight,
            what,
            (g, b, k, mma),
            (&[k, b, 3, 3], param),
            gy,
            s,
        )
    }
}
