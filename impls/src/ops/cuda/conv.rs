//! CUDA launcher of the direct 3×3 convolution (`ops/cuda/conv.cu`): the `cuda_fwd` of
//! [`crate::ops::conv3x3::gpu`]'s ops. Forward and data gradient are one launch each into the
//! destination; the weight gradient two (the slices' partial sums into a buffer from candle's
//! stream-ordered pool, freed once queued, then their sum into `dW`); each pass on tensor cores
//! where [`kernel`] says so. Geometry:
//! [`crate::ops::cuda::direct`].
//!
//! Only compiled with the `cuda` feature.

use crate::ops::cuda::direct::{self as gpu, ConvKernel, Mma, Pass};
use crate::ops::cuda::launch::{capability, function, msg, pass_ranges, view, view_mut, Float};
use crate::ops::cuda::src::CONV;
use crate::ops::layout::grid::Grid;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::{DType, Layout};

/// `struct db_conv_weight` of `conv.cu`: weight element (o, c, tap) of the pass's convolution
/// at `first + o·out + c·in + tap·step`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct WeightLayout {
    out: i64,
    inp: i64,
    step: i64,
    first: i64,
}

// SAFETY: `repr(C)`, four i64, no padding: laid out exactly like the kernel's `db_conv_weight`,
// passed by value as a kernel parameter.
unsafe impl DeviceRepr for WeightLayout {}

fn config(((gx, gy, gz), block): gpu::Dims) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (gx, gy, gz),
        block_dim: block,
        // the kernels' shared arrays are static
        shared_mem_bytes: 0,
    }
}

fn signed(op: &str, v: usize) -> candle_core::Result<i64> {
    i64::try_from(v).map_err(|_| msg(format!("{op} (cuda): {v} out of range")))
}

/// The kernel a pass on `dtype` features runs on `dev` ([`gpu::conv_kernel`]):
/// `mma` whether tensor cores may be used, the math mode candle's (`--math tf32`), the compute
/// capability the driver's.
pub(crate) fn kernel(
    dev: &candle_core::cuda_backend::CudaDevice,
    dtype: DType,
    mma: Mma,
) -> candle_core::Result<ConvKernel> {
    let tf32 = candle_core::cuda::gemm_reduced_precision_f32();
    Ok(gpu::conv_kernel(dtype, tf32, capability(dev)?.0, mma))
}

/// Runs `pass` of a convolution of `b` channels into `k` on `grid`: `dst` ← (`a`, `bb`) with
/// the operands of [`crate::ops::conv3x3::gpu`]'s ops (forward `(s, w) → y`, data
/// `(gy, w) → ds`, weight `(gy, s) → dW`), all contiguous, their lengths checked; `mma`: a
/// pass may run on tensor cores ([`kernel`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    op: &str,
    pass: Pass,
    grid: Grid,
    (b, k): (usize, usize),
    mma: Mma,
    dst: (&mut CudaStorage, &Layout),
    a: (&CudaStorage, &Layout),
    bb: (&CudaStorage, &Layout),
) -> candle_core::Result<()> {
    let dtype = a.0.dtype();
    if bb.0.dtype() != dtype {
        return Err(msg(format!(
            "{op} (cuda): operands {dtype:?} and {:?} differ",
            bb.0.dtype()
        )));
    }
    let m = grid.n * grid.h * grid.w;
    let weights = 9 * k * b;
    let (dst_len, a_len, b_len) = match pass {
        Pass::Forward => (k * m, b * m, weights),
        Pass::Data => (b * m, k * m, weights),
        Pass::Weight => (weights, k * m, b * m),
    };
    let [dr, ar, br] = pass_ranges(op, [dst.1, a.1, bb.1], [dst_len, a_len, b_len])?;
    if dst_len == 0 {
        return Ok(());
    }
    let shape = (grid, b, k);
    let choice = kernel(&dst.0.device, dtype, mma)?;
    let (d, a, bb) = ((dst.0, dr), (a.0, ar), (bb.0, br));
    match dtype {
        DType::F32 => go::<f32>(op, pass, choice, shape, d, a, bb),
        DType::F64 => go::<f64>(op, pass, choice, shape, d, a, bb),
        DType::BF16 => go::<half::bf16>(op, pass, choice, shape, d, a, bb),
        other => Err(crate::ops::cuda::launch::unsupported(op, other)),
    }
}

type Operand<'a> = (&'a CudaStorage, (usize, usize));

fn go<T: Float>(
    op: &str,
    pass: Pass,
    choice: ConvKernel,
    (grid, b, k): (Grid, usize, usize),
    (d, dr): (&mut CudaStorage, (usize, usize)),
    (a, ar): Operand<'_>,
    (bb, br): Operand<'_>,
) -> candle_core::Result<()> {
    let (n, h, w) = (grid.n, grid.h, grid.w);
    let dev = d.device.clone();
    let stream = dev.cuda_stream();
    let a = view(op, a.as_cuda_slice::<T>()?, ar)?;
    let bb = view(op, bb.as_cuda_slice::<T>()?, br)?;
    match pass {
        Pass::Forward | Pass::Data => {
            let (cin, cout, layout) = match pass {
                Pass::Forward => (
                    b,
                    k,
                    WeightLayout {
                        out: signed(op, 9 * b)?,
                        inp: 9,
                        step: 1,
                        first: 0,
                    },
                ),
                _ => (
                    k,
                    b,
                    WeightLayout {
                        out: 9,
                        inp: signed(op, 9 * b)?,
                        step: -1,
                        first: 8,
                    },
                ),
            };
            let (name, dims) = match choice {
                ConvKernel::Fma => ("conv3x3", gpu::conv_dims(grid, cout)),
                ConvKernel::Mma => ("conv3x3_mma", gpu::mma_dims(grid, cout)),
            };
            let func = function::<T>(&dev, &CONV, name)?;
            let mut y = view_mut(op, d.as_cuda_slice_mut::<T>()?, dr)?;
            let mut l = stream.launch_builder(&func);
            l.arg(&a)
                .arg(&cin)
                .arg(&mut y)
                .arg(&cout)
                .arg(&bb)
                .arg(&layout)
                .arg(&n)
                .arg(&h)
                .arg(&w);
            // SAFETY: the lengths are checked (input cin·M, output cout·M, weight 9·k·B, M =
            // N·H·W); either kernel reads pixels of its own image only, weight elements
            // (o, c, tap) with o < cout, c < cin, and writes each output once; `conv3x3_mma`
            // exists for f32 and bf16 only and `kernel` picks it for those on sm_80+ only.
            unsafe { l.launch(config(dims)) }.w()?;
        }
        Pass::Weight => {
            let s = gpu::weight_slices(grid, b, k);
            let len = 9 * k * b;
            // at least one element: a map without pixels has no slices, its dW is all zeros
            // (the sum of none), and the sum kernel still takes a pointer it never reads
            let parts = (s.slices * len).max(1);
            // SAFETY: the partials kernel writes every (slice, o, c, tap) element before the
            // sum reads it (both on this stream)
            let mut part = unsafe { dev.alloc::<T::Acc>(parts) }.map_err(|e| {
                msg(format!(
                    "{op} (cuda): weight-gradient partials of {parts} elements: {e}"
                ))
            })?;
            if s.slices > 0 {
                let (name, dims) = match choice {
                    ConvKernel::Fma => ("conv3x3_wgrad", gpu::wgrad_dims(grid, b, k)),
                    ConvKernel::Mma => ("conv3x3_wgrad_mma", gpu::wgrad_mma_dims(grid, b, k)),
                };
                let func = function::<T>(&dev, &CONV, name)?;
                let mut l = stream.launch_builder(&func);
                l.arg(&a)
                    .arg(&bb)
                    .arg(&mut part)
                    .arg(&b)
                    .arg(&k)
                    .arg(&n)
                    .arg(&h)
                    .arg(&w)
                    .arg(&s.per_slice);
                // SAFETY: gy is k·M, s is B·M (checked); part holds slices·9·k·B elements,
                // either kernel writes element ((slice·k + o)·B + c)·9 + tap for slice < slices
                // (the same slices); the tensor-core one exists for f32 and bf16 features only,
                // whose partials are f32, and `kernel` picks it for those on sm_80+ only.
                unsafe { l.launch(config(dims)) }.w()?;
            }
            let func = function::<T::Acc>(&dev, &CONV, "conv3x3_wgrad_sum")?;
            let mut dw = view_mut(op, d.as_cuda_slice_mut::<T::Acc>()?, dr)?;
            let mut l = stream.launch_builder(&func);
            l.arg(&part).arg(&mut dw).arg(&s.slices).arg(&len);
            // SAFETY: part holds slices·len elements (at least one), dW len (checked).
            unsafe { l.launch(config(gpu::sum_dims(len))) }.w()?;
        }
    }
    Ok(())
}
