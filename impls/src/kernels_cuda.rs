//! CUDA versions of the element-wise kernels in [`crate::kernels`]: in-place ReLU, ReLU backward
//! (into a new tensor and in place) and in-place accumulation, so that the variants keep their
//! memory behaviour on a GPU instead of silently copying.
//!
//! The kernels are compiled once per process at run time with NVRTC (through candle's re-export
//! of cudarc) and loaded once per device through candle's module cache
//! ([`CudaDevice::get_or_load_custom_func`]). Each op handles `f32` and `f64`, contiguous operands
//! only (with any start offset, so a narrowed prefix of a buffer is written through its view),
//! and errs — never panics — on anything else. The semantics are exactly the CPU ones, including
//! NaN: `!(x > 0)` maps NaN to 0 in ReLU and masks the gradient where the output is NaN.
//!
//! Only compiled with the `cuda` feature; [`crate::kernels`] delegates its ops' `cuda_fwd` here.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::cudarc::nvrtc;
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{DType, Layout, Shape};
use std::sync::OnceLock;

/// The module name candle caches the loaded kernels under (one module per device).
const MODULE: &str = "densebench_inplace_kernels";

/// CUDA C source of every kernel, instantiated for `float` and `double` by the macro at the end.
/// Grid-stride loops, so any element count works with a capped grid.
const SOURCE: &str = r#"
#define DENSEBENCH_KERNELS(T, SUFFIX)                                                       \
extern "C" __global__ void relu_inplace_##SUFFIX(T *x, const size_t n) {                  \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;                  \
         i += (size_t)blockDim.x * gridDim.x) {                                            \
        if (!(x[i] > (T)0)) x[i] = (T)0;                                                   \
    }                                                                                      \
}                                                                                          \
extern "C" __global__ void relu_bwd_##SUFFIX(T *dst, const T *g, const T *out,            \
                                             const size_t n) {                             \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;                  \
         i += (size_t)blockDim.x * gridDim.x) {                                            \
        dst[i] = out[i] > (T)0 ? g[i] : (T)0;                                              \
    }                                                                                      \
}                                                                                          \
extern "C" __global__ void relu_bwd_inplace_##SUFFIX(T *g, const T *out, const size_t n) { \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;                  \
         i += (size_t)blockDim.x * gridDim.x) {                                            \
        if (!(out[i] > (T)0)) g[i] = (T)0;                                                 \
    }                                                                                      \
}                                                                                          \
extern "C" __global__ void add_assign_##SUFFIX(T *dst, const T *src, const size_t n) {    \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;                  \
         i += (size_t)blockDim.x * gridDim.x) {                                            \
        dst[i] = dst[i] + src[i];                                                          \
    }                                                                                      \
}

DENSEBENCH_KERNELS(float, f32)
DENSEBENCH_KERNELS(double, f64)
"#;

/// Threads per block: a multiple of the warp size that every CUDA GPU accepts.
const BLOCK: u32 = 256;
/// Grid cap: the grid-stride loop covers the rest; enough blocks to fill any current GPU.
const MAX_GRID: u32 = 65_535;

/// The PTX of [`SOURCE`], compiled by NVRTC on first use. A compile failure is kept as its
/// message and returned by every later call, so it is reported, not retried per op.
fn ptx() -> candle_core::Result<&'static str> {
    static PTX: OnceLock<std::result::Result<String, String>> = OnceLock::new();
    PTX.get_or_init(|| {
        nvrtc::compile_ptx(SOURCE)
            .map(|p| p.to_src())
            .map_err(|e| format!("compiling densebench's in-place kernels with NVRTC: {e}"))
    })
    .as_deref()
    .map_err(|e| candle_core::Error::Msg(e.clone()))
}

/// A float type the kernels are instantiated for.
trait Float: CudaDType + DeviceRepr {
    /// The suffix of the kernel names in [`SOURCE`].
    const SUFFIX: &'static str;
}
impl Float for f32 {
    const SUFFIX: &'static str = "f32";
}
impl Float for f64 {
    const SUFFIX: &'static str = "f64";
}

/// Launch configuration for `n` elements (grid-stride loop: any `n` is covered).
fn launch_config(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(BLOCK as usize).clamp(1, MAX_GRID as usize);
    LaunchConfig {
        // `blocks` ≤ MAX_GRID, so the conversion cannot fail; the fallback is never taken.
        grid_dim: (u32::try_from(blocks).unwrap_or(MAX_GRID), 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The element range `[start, end)` of a contiguous layout, or an error naming the op.
fn contiguous_range(l: &Layout, op: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "{op} (cuda): operand must be contiguous, got strides {:?}",
            l.stride()
        ))
    })
}

fn same_len(op: &str, a: (usize, usize), b: (usize, usize)) -> candle_core::Result<usize> {
    let (n, m) = (a.1 - a.0, b.1 - b.0);
    if n != m {
        return Err(candle_core::Error::Msg(format!(
            "{op} (cuda): operands have {n} and {m} elements"
        )));
    }
    Ok(n)
}

fn unsupported(op: &str, a: DType, b: Option<DType>) -> candle_core::Error {
    let found = match b {
        Some(b) if b != a => format!("{a:?} and {b:?}"),
        _ => format!("{a:?}"),
    };
    candle_core::Error::Msg(format!(
        "{op} (cuda): dtype {found} unsupported (f32 or f64, both operands alike)"
    ))
}

/// The kernel `kernel`, loaded into `dev` (once per device; candle caches the module).
fn function(dev: &CudaDevice, kernel: &str) -> candle_core::Result<CudaFunction> {
    Ok(dev
        .get_or_load_custom_func(kernel, MODULE, ptx()?)?
        .into_cuda_function())
}

fn out_of_range(op: &str, r: (usize, usize), len: usize) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op} (cuda): elements {}..{} out of range of a storage of {len}",
        r.0, r.1
    ))
}

/// The view of elements `[r.0, r.1)` of `s`, or an error (never the panic of `slice`).
fn view<'a, T>(
    op: &str,
    s: &'a CudaSlice<T>,
    r: (usize, usize),
) -> candle_core::Result<CudaView<'a, T>> {
    let len = s.len();
    s.try_slice(r.0..r.1)
        .ok_or_else(|| out_of_range(op, r, len))
}

/// The mutable view of elements `[r.0, r.1)` of `s`, or an error.
fn view_mut<'a, T>(
    op: &str,
    s: &'a mut CudaSlice<T>,
    r: (usize, usize),
) -> candle_core::Result<CudaViewMut<'a, T>> {
    let len = s.len();
    s.try_slice_mut(r.0..r.1)
        .ok_or_else(|| out_of_range(op, r, len))
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
        let func = function(dev, &format!("relu_inplace_{}", T::SUFFIX))?;
        let mut x = view_mut(op, x, r)?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&mut x);
        b.arg(&n);
        // SAFETY: the kernel writes `n` elements of `x`, a view of exactly `n` elements.
        unsafe { b.launch(launch_config(n)) }.w()?;
        Ok(())
    }
    let r = contiguous_range(l, op)?;
    let dev = s.device.clone();
    match s.dtype() {
        DType::F32 => run(op, &dev, s.as_cuda_slice_mut::<f32>()?, r),
        DType::F64 => run(op, &dev, s.as_cuda_slice_mut::<f64>()?, r),
        other => Err(unsupported(op, other, None)),
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
            let func = function(dev, &format!("relu_bwd_{}", T::SUFFIX))?;
            let (g, out) = (view(op, g, rg)?, view(op, out, ro)?);
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            b.arg(&mut dst);
            b.arg(&g);
            b.arg(&out);
            b.arg(&n);
            // SAFETY: `dst`, `g` and `out` each hold exactly `n` elements.
            unsafe { b.launch(launch_config(n)) }.w()?;
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
        (a, b) => return Err(unsupported(op, a, Some(b))),
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
        let func = function(dev, &format!("{kernel}_{}", T::SUFFIX))?;
        let mut d = view_mut(op, dst, rd)?;
        let s = view(op, src, rs)?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&mut d);
        b.arg(&s);
        b.arg(&n);
        // SAFETY: `d` and `s` each hold exactly `n` elements; candle hands the two operands as
        // distinct storages (`&mut` and `&`), so they do not alias.
        unsafe { b.launch(launch_config(n)) }.w()?;
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
        (a, b) => Err(unsupported(op, a, Some(b))),
    }
}
