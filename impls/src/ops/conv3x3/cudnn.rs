//! The 3×3 convolution through cuDNN on a GPU (the `cudnn` feature), as candle in-place ops
//! over the channel-major maps `[C, N·H·W]` the layer maths hold: forward, data gradient and
//! filter gradient, each writing a new tensor whole (the launcher: `ops::cuda::cudnn`). No tap
//! stack and no stacked weight: the only transient is the workspace cuDNN asks for, which
//! [`workspaces`] reports for the memory model. The CPU has its own direct kernel (the parent
//! module); these ops refuse it.

use super::ConvWorkspaces;
use crate::error::{CandleContext, Result};
use crate::ops::cuda::cudnn::{self as dnn, ConvShape, Which};
use crate::ops::layout::grid::Grid;
use candle_core::{DType, Device, Tensor};

fn shape_of(g: Grid, b: usize, k: usize) -> ConvShape {
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

/// A new tensor of `shape` in `like`'s dtype and device, written whole by cuDNN's pass `which`
/// (β = 0) from `a` and `b`, for a convolution of `b_in` channels into `k`.
#[allow(clippy::too_many_arguments)]
fn pass(
    which: Which,
    what: &'static str,
    g: Grid,
    (b_in, k): (usize, usize),
    shape: &[usize],
    like: &Tensor,
    a: &Tensor,
    b: &Tensor,
) -> Result<Tensor> {
    let name = match which {
        Which::Forward => "conv3x3-cudnn-forward",
        Which::Data => "conv3x3-cudnn-data",
        Which::Filter => "conv3x3-cudnn-filter",
    };
    let s = shape_of(g, b_in, k);
    super::cuda_pass((name, what), (shape, like.dtype()), a, b, |d, x, y| {
        dnn::launch(which, s, d, x, y)
    })
}

/// `y [k, M] = conv(s [B, M], w [k, B, 3, 3])`, all in one dtype.
pub fn forward(s: &Tensor, w: &Tensor, g: Grid) -> Result<Tensor> {
    let (k, b) = (w.dims()[0], w.dims()[1]);
    let m = g.n * g.h * g.w;
    pass(
        Which::Forward,
        "conv2 forward (cudnn)",
        g,
        (b, k),
        &[k, m],
        s,
        s,
        w,
    )
}

/// `ds [B, M]` from `w [k, B, 3, 3]` and `gy [k, M]`.
pub fn backward_data(gy: &Tensor, w: &Tensor, g: Grid) -> Result<Tensor> {
    let (k, b) = (w.dims()[0], w.dims()[1]);
    let m = g.n * g.h * g.w;
    pass(
        Which::Data,
        "conv2 bwd ds (cudnn)",
        g,
        (b, k),
        &[b, m],
        gy,
        w,
        gy,
    )
}

/// `dW [k, B, 3, 3]` from `s [B, M]` and `gy [k, M]`, in their dtype (cuDNN's filter gradient
/// takes the operands' type: bf16 under autocast, as PyTorch's; the caller widens it).
pub fn backward_filter(gy: &Tensor, s: &Tensor, g: Grid) -> Result<Tensor> {
    let (k, b) = (gy.dims()[0], s.dims()[0]);
    pass(
        Which::Filter,
        "conv2 bwd dW (cudnn)",
        g,
        (b, k),
        &[k, b, 3, 3],
        gy,
        s,
        gy,
    )
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
        dnn::workspaces(&d, shape_of(g, b, k), dtype).ctx("conv2 workspaces (cudnn)")?;
    Ok(ConvWorkspaces {
        forward: forward as u64,
        data: data as u64,
        filter: filter as u64,
    })
}

/// cuDNN's algorithms for that convolution, for a row's `note`:
/// `fwd IMPLICIT_PRECOMP_GEMM, data (fwd, Wᵀ) IMPLICIT_GEMM, filter ALGO_1` (the data gradient
/// a forward convolution with the filter transposed), or with a pass on packed copies
/// `filter ALGO_1 on packed copies`, `data (bwd) ALGO_1 on packed copies` (see
/// `ops::cuda::cudnn`).
pub fn algorithms(dev: &Device, g: Grid, b: usize, k: usize, dtype: DType) -> Result<String> {
    let d = cuda(dev, "conv2 algorithms")?;
    let a = dnn::algorithms(&d, shape_of(g, b, k), dtype).ctx("conv2 algorithms (cudnn)")?;
    Ok(format!(
        "fwd {}, data {}, filter {}",
        a.forward, a.data, a.filter
    ))
}
