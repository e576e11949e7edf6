//! The 3×3 convolution through cuDNN on a GPU (the `cudnn` feature), as candle in-place ops
//! over the channel-major maps `[C, N·H·W]` the layer maths hold: forward, data gradient and
//! filter gradient, each writing a new tensor whole (the launcher: `ops::cuda::cudnn`). No tap
//! stack and no stacked weight: the only transient is the workspace cuDNN asks for, which
//! [`workspaces`] reports for the memory model. The CPU has its own direct kernel (the parent
//! module); these ops refuse it.

use super::ConvWorkspaces;
use crate::error::{CandleContext, Result};
use crate::ops::cpu::shared::unfilled;
use crate::ops::cuda::cudnn::{self as dnn, ConvShape, Which};
use crate::ops::layout::grid::Grid;
use candle_core::{CpuStorage, DType, Device, InplaceOp3, Layout, Tensor};

struct Cudnn {
    which: Which,
    shape: ConvShape,
}

impl InplaceOp3 for Cudnn {
    fn name(&self) -> &'static str {
        match self.which {
            Which::Forward => "conv3x3-cudnn-forward",
            Which::Data => "conv3x3-cudnn-data",
            Which::Filter => "conv3x3-cudnn-filter",
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
            "{}: cuDNN runs on CUDA devices only (the CPU has its own 3×3 kernel)",
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
        dnn::launch(self.which, self.shape, (dst, dl), (a, al), (b, bl))
    }
}

fn shape(g: Grid, b: usize, k: usize) -> ConvShape {
    ConvShape {
        n: g.n,
        b,
        k,
        h: g.h,
        w: g.w,
    }
}

fn cuda(dev: &Device, what: &'static str) -> Result<candle_core::CudaDevice> {
    match dev {
        Device::Cuda(d) => Ok(d.clone()),
        other => Err(crate::error::Error::Unsupported {
            device: format!("{other:?}"),
            what: format!("{what}: cuDNN runs on CUDA devices only"),
        }),
    }
}

/// `y [k, M] = conv(s [B, M], w [k, B, 3, 3])`, all in one dtype.
pub fn forward(s: &Tensor, w: &Tensor, g: Grid) -> Result<Tensor> {
    let (k, b) = (w.dims()[0], w.dims()[1]);
    // SAFETY: cuDNN writes y whole (β = 0) before anything reads it
    let y = unsafe { unfilled((k, g.n * g.h * g.w), s.dtype(), s.device(), "conv2 forward")? };
    let op = Cudnn {
        which: Which::Forward,
        shape: shape(g, b, k),
    };
    y.inplace_op3(s, w, &op).ctx("conv2 forward (cudnn)")?;
    Ok(y)
}

/// `ds [B, M]` from `w [k, B, 3, 3]` and `gy [k, M]`.
pub fn backward_data(gy: &Tensor, w: &Tensor, g: Grid) -> Result<Tensor> {
    let (k, b) = (w.dims()[0], w.dims()[1]);
    // SAFETY: cuDNN writes ds whole (β = 0)
    let ds = unsafe {
        unfilled(
            (b, g.n * g.h * g.w),
            gy.dtype(),
            gy.device(),
            "conv2 bwd ds",
        )?
    };
    let op = Cudnn {
        which: Which::Data,
        shape: shape(g, b, k),
    };
    ds.inplace_op3(w, gy, &op).ctx("conv2 bwd ds (cudnn)")?;
    Ok(ds)
}

/// `dW [k, B, 3, 3]` from `s [B, M]` and `gy [k, M]`, in their dtype (cuDNN's filter gradient
/// takes the operands' type: bf16 under autocast, as PyTorch's; the caller widens it).
pub fn backward_filter(gy: &Tensor, s: &Tensor, g: Grid) -> Result<Tensor> {
    let (k, b) = (gy.dims()[0], s.dims()[0]);
    // SAFETY: cuDNN writes dW whole (β = 0)
    let dw = unsafe { unfilled((k, b, 3, 3), gy.dtype(), gy.device(), "conv2 bwd dW")? };
    let op = Cudnn {
        which: Which::Filter,
        shape: shape(g, b, k),
    };
    dw.inplace_op3(s, gy, &op).ctx("conv2 bwd dW (cudnn)")?;
    Ok(dw)
}

/// The workspaces cuDNN takes on `dev` for a convolution of `b` channels into `k` on `g` in
/// `dtype` (under the current math mode): what the memory model charges.
pub fn workspaces(
    dev: &Device,
    g: Grid,
    b: usize,
    k: usize,
    dtype: DType,
) -> Result<ConvWorkspaces> {
    let d = cuda(dev, "conv2 workspaces")?;
    let [forward, data, filter] =
        dnn::workspaces(&d, shape(g, b, k), dtype).ctx("conv2 workspaces (cudnn)")?;
    Ok(ConvWorkspaces {
        forward: forward as u64,
        data: data as u64,
        filter: filter as u64,
    })
}

/// cuDNN's algorithms for that convolution, for a row's `note`:
/// `fwd IMPLICIT_PRECOMP_GEMM, data ALGO_1, filter ALGO_1`.
pub fn algorithms(dev: &Device, g: Grid, b: usize, k: usize, dtype: DType) -> Result<String> {
    let d = cuda(dev, "conv2 algorithms")?;
    let a = dnn::algorithms(&d, shape(g, b, k), dtype).ctx("conv2 algorithms (cudnn)")?;
    Ok(format!(
        "fwd {}, data {}, filter {}",
        a.forward, a.data, a.filter
    ))
}
