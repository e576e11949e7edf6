//! CUDA versions of the element-wise kernels in [`crate::ops::elementwise`]: in-place ReLU, ReLU backward
//! (into a new tensor and in place) and in-place accumulation, so that the variants keep their
//! memory behaviour on a GPU instead of silently copying.
//!
//! The kernel source is `ops/cuda/inplace.cu` ([`crate::ops::cuda::src::INPLACE`]), compiled with NVRTC
//! at first use and loaded once per device (see [`crate::ops::cuda::launch`]). Each op handles `f32`,
//! `f64` and `bf16` (added in f32, rounded once), contiguous operands only (with any start
//! offset, so a narrowed prefix of a buffer is written through its view), and errs — never panics — on anything else. The semantics are
//! exactly the CPU ones, including NaN: `!(x > 0)` maps NaN to 0 in ReLU and masks the gradient
//! where the output is NaN.
//!
//! Only compiled with the `cuda` feature; [`crate::ops::elementwise`] delegates its ops' `cuda_fwd` here.

use crate::ops::cuda::launch::{
    contiguous_range, elementwise_config, function, msg, unsupported, view, view_mut, Float,
};
use crate::ops::cuda::src::INPLACE;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Shape};

/// The error for two operands whose dtypes are not both f32, both f64 or both bf16.
fn mixed(op: &str, a: DType, b: DType) -> candle_core::Error {
    if a == b {
        unsupported(op, a)
    } else {
        msg(format!("{op} (cuda): dtypes {a:?} and {b:?} differ"))
    }
}

fn same_len(op: &str, a: (usize, usize), b: (usize, usize)) -> candle_core::Result<usize> {
    let (n, m) = (a.1 - a.0, b.1 - b.0);
    if n != m {
        return Err(msg(format!(
            "{op} (cuda): operands have {n} and {m} elements"
        )));
    }
    Ok(n)
}

/// In-place ReLU: **overwrites** elements `[start, end)` of `s` with `max(x, 0)`.
pub fn relu_inplace(op: &str, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
    fn run<T: Float>(
        op: &str,
        dev: &CudaDevice,
        x: &mut CudaSlice<T>,
        r: (usize, usize),
    ) -> candle_core::Result<()> {
        let n = r.1 - r.0;
        if n == 0 {
            return Ok(());
        }
        let func = function::<T>(dev, &INPLACE, "relu_inplace")?;
        let mut x = view_mut(op, x, r)?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&mut x);
        b.arg(&n);
        // SAFETY: the kernel writes `n` elements of `x`, a view of exactly `n` elements.
        unsafe { b.launch(elementwise_config(n)) }.w()?;
        Ok(())
    }
    let r = contiguous_range(l, op)?;
    let dev = s.device.clone();
    match s.dtype() {
        DType::F32 => run(op, &dev, s.as_cuda_slice_mut::<f32>()?, r),
        DType::F64 => run(op, &dev, s.as_cuda_slice_mut::<f64>()?, r),
        DType::BF16 => run(op, &dev, s.as_cuda_slice_mut::<half::bf16>()?, r),
        other => Err(unsupported(op, other)),
    }
}

/// ReLU backward into a new tensor: `out > 0 ? g : 0`, shaped like `g`.
pub fn relu_bwd(
    op: &str,
    g: &CudaStorage,
    lg: &Layout,
    out: &CudaStorage,
    lo: &Layout,
) -> candle_core::Result<(CudaStorage, Shape)> {
    fn run<T: Float>(
        op: &str,
        dev: &CudaDevice,
        g: &CudaSlice<T>,
        rg: (usize, usize),
        out: &CudaSlice<T>,
        ro: (usize, usize),
        n: usize,
    ) -> candle_core::Result<CudaStorage> {
        // SAFETY: every one of the `n` elements is written by the kernel below before any read.
        let mut dst = unsafe { dev.alloc::<T>(n) }?;
        if n > 0 {
            let func = function::<T>(dev, &INPLACE, "relu_bwd")?;
            let (g, out) = (view(op, g, rg)?, view(op, out, ro)?);
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            b.arg(&mut dst);
            b.arg(&g);
            b.arg(&out);
            b.arg(&n);
            // SAFETY: `dst`, `g` and `out` each hold exactly `n` elements.
            unsafe { b.launch(elementwise_config(n)) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(dst, dev.clone()))
    }
    let (rg, ro) = (contiguous_range(lg, op)?, contiguous_range(lo, op)?);
    let n = same_len(op, rg, ro)?;
    let dev = &g.device;
    let res = match (g.dtype(), out.dtype()) {
        (DType::F32, DType::F32) => run(
            op,
            dev,
            g.as_cuda_slice::<f32>()?,
            rg,
            out.as_cuda_slice::<f32>()?,
            ro,
            n,
        )?,
        (DType::F64, DType::F64) => run(
            op,
            dev,
            g.as_cuda_slice::<f64>()?,
            rg,
            out.as_cuda_slice::<f64>()?,
            ro,
            n,
        )?,
        (DType::BF16, DType::BF16) => run(
            op,
            dev,
            g.as_cuda_slice::<half::bf16>()?,
            rg,
            out.as_cuda_slice::<half::bf16>()?,
            ro,
            n,
        )?,
        (a, b) => return Err(mixed(op, a, b)),
    };
    Ok((res, lg.shape().clone()))
}

/// The two-operand in-place kernels: `dst` is **overwritten** element-wise from `src`.
#[derive(Clone, Copy)]
pub enum Inplace2 {
    /// `g = out > 0 ? g : 0` (`dst` is the gradient, `src` the ReLU output).
    ReluBwd,
    /// `dst = dst + src`.
    AddAssign,
}

impl Inplace2 {
    fn kernel(self) -> &'static str {
        match self {
            Inplace2::ReluBwd => "relu_bwd_inplace",
            Inplace2::AddAssign => "add_assign",
        }
    }
}

/// Runs `kind` on elements `[start, end)` of `dst` and `src`, **writing into `dst`'s storage**
/// (which may be a view of a larger buffer).
pub fn inplace2(
    kind: Inplace2,
    op: &str,
    dst: &mut CudaStorage,
    ld: &Layout,
    src: &CudaStorage,
    ls: &Layout,
) -> candle_core::Result<()> {
    fn run<T: Float>(
        (op, kernel): (&str, &str),
        dev: &CudaDevice,
        dst: &mut CudaSlice<T>,
        rd: (usize, usize),
        src: &CudaSlice<T>,
        rs: (usize, usize),
        n: usize,
    ) -> candle_core::Result<()> {
        if n == 0 {
            return Ok(());
        }
        let func = function::<T>(dev, &INPLACE, kernel)?;
        let mut d = view_mut(op, dst, rd)?;
        let s = view(op, src, rs)?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&mut d);
        b.arg(&s);
        b.arg(&n);
        // SAFETY: `d` and `s` each hold exactly `n` elements; candle hands the two operands as
        // distinct storages (`&mut` and `&`), so they do not alias.
        unsafe { b.launch(elementwise_config(n)) }.w()?;
        Ok(())
    }
    let (rd, rs) = (contiguous_range(ld, op)?, contiguous_range(ls, op)?);
    let n = same_len(op, rd, rs)?;
    let dev = dst.device.clone();
    let k = kind.kernel();
    match (dst.dtype(), src.dtype()) {
        (DType::F32, DType::F32) => run(
            (op, k),
            &dev,
            dst.as_cuda_slice_mut::<f32>()?,
            rd,
            src.as_cuda_slice::<f32>()?,
            rs,
            n,
        ),
        (DType::F64, DType::F64) => run(
            (op, k),
            &dev,
            dst.as_cuda_slice_mut::<f64>()?,
            rd,
            src.as_cuda_slice::<f64>()?,
            rs,
            n,
        ),
        (DType::BF16, DType::BF16) => run(
            (op, k),
            &dev,
            dst.as_cuda_slice_mut::<half::bf16>()?,
            rd,
            src.as_cuda_slice::<half::bf16>()?,
            rs,
            n,
        ),
        (a, b) => Err(mixed(op, a, b)),
    }
}
