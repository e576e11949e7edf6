//! Shared plumbing of the CUDA launchers ([`crate::ops::cuda::elementwise`], [`crate::ops::cuda::bn`], [`crate::ops::cuda::shift`]):
//! NVRTC compilation cached per process and architecture, module loading cached per device
//! (candle's `get_or_load_custom_func`), launch geometries, and checked views of operands.
//!
//! Only compiled with the `cuda` feature. Every failure is an `Err` naming the op, never a
//! panic, and never a silent copy: operands must be contiguous views (any start offset).

use crate::ops::cuda::src::{self, CudaModule};
use candle_core::cuda_backend::cudarc::driver::{
    CudaFunction, CudaSlice, CudaView, CudaViewMut, DeviceRepr, LaunchConfig,
};
use candle_core::cuda_backend::cudarc::nvrtc::{self, CompileError, CompileOptions};
use candle_core::cuda_backend::{CudaDType, CudaDevice, DeviceId, WrapErr};
use candle_core::{DType, Layout};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// A feature type the kernels are instantiated for: f32, f64, or bf16 (features stored as
/// bf16, computed in f32: `prelude.cuh`, the CPU twins' `Elem`).
pub(crate) trait Float: CudaDType + DeviceRepr + candle_core::WithDType + Copy {
    /// The suffix of the kernel names (`relu_inplace_f32`).
    const SUFFIX: &'static str;
    /// The type of the per-channel tables, statistics and scalars that go with features of
    /// this type (the kernels' `db_acc<T>`): itself, f32 for bf16.
    type Acc: Float;
}
impl Float for f32 {
    const SUFFIX: &'static str = "f32";
    type Acc = f32;
}
impl Float for f64 {
    const SUFFIX: &'static str = "f64";
    type Acc = f64;
}
impl Float for half::bf16 {
    const SUFFIX: &'static str = "bf16";
    type Acc = f32;
}

pub(crate) fn msg(s: String) -> candle_core::Error {
    candle_core::Error::Msg(s)
}

/// The PTX of `module` for `arch`: from the on-disk cache ([`crate::ops::cuda::ptx_cache`]) where this
/// source, these options and this NVRTC were compiled before, else compiled with NVRTC (and
/// stored for the next process); NVRTC's log as the message of a compile error.
fn compile(module: &CudaModule, arch: &str) -> std::result::Result<String, String> {
    use crate::ops::cuda::ptx_cache;
    let options = src::nvrtc_options(arch);
    match ptx_cache::dir().zip(ptx_cache::nvrtc_version()) {
        Some((dir, nvrtc)) => {
            let key = ptx_cache::key(&module.source(), &options, nvrtc);
            ptx_cache::get_or_compile(Some(&dir), &key, || nvrtc_compile(module, arch, options))
                .map(|(ptx, _)| ptx)
        }
        None => nvrtc_compile(module, arch, options),
    }
}

/// Compiles `module` for `arch` with NVRTC; the PTX text, or NVRTC's log as the message.
fn nvrtc_compile(
    module: &CudaModule,
    arch: &str,
    options: Vec<String>,
) -> std::result::Result<String, String> {
    let opts = CompileOptions {
        options,
        name: Some(module.file.to_string()),
        ..CompileOptions::default()
    };
    match nvrtc::compile_ptx_with_opts(module.source(), opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { nvrtc, log, .. }) => Err(format!(
            "NVRTC could not compile {} for {arch} ({nvrtc:?}):\n{}",
            module.file,
            log.to_string_lossy()
        )),
        Err(e) => Err(format!("NVRTC failed on {} for {arch}: {e}", module.file)),
    }
}

/// The PTX of `module` for `arch`, compiled on first request and kept for the process (one
/// entry per module and architecture, so a few strings). A compile failure is kept too and
/// returned by every later call: reported once per use, not recompiled per op.
fn ptx(module: &CudaModule, arch: &str) -> candle_core::Result<&'static str> {
    type Cache = HashMap<(&'static str, String), std::result::Result<&'static str, String>>;
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Mutex::default)
        .lock()
        .map_err(|_| msg("densebench's PTX cache is poisoned (a compile panicked)".into()))?;
    cache
        .entry((module.name, arch.to_string()))
        // Leaked on purpose: one string per module and architecture for the process's life,
        // which lets every launch borrow it without a lock.
        .or_insert_with(|| compile(module, arch).map(|p| &*Box::leak(p.into_boxed_str())))
        .clone()
        .map_err(msg)
}

/// The compute capability `(major, minor)` of `dev` (`(9, 0)` on an H100), asked from the
/// driver once per device.
pub(crate) fn capability(dev: &CudaDevice) -> candle_core::Result<(i32, i32)> {
    static CAPABILITY: OnceLock<Mutex<HashMap<DeviceId, (i32, i32)>>> = OnceLock::new();
    let mut known = CAPABILITY
        .get_or_init(Mutex::default)
        .lock()
        .map_err(|_| msg("densebench's architecture cache is poisoned".into()))?;
    if let Some(&c) = known.get(&dev.id()) {
        return Ok(c);
    }
    let c = dev.cuda_stream().context().compute_capability().w()?;
    known.insert(dev.id(), c);
    Ok(c)
}

/// The virtual architecture of `dev` (`compute_90` on an H100).
fn device_arch(dev: &CudaDevice) -> candle_core::Result<String> {
    let (major, minor) = capability(dev)?;
    Ok(src::virtual_arch(major, minor))
}

/// Kernel `{kernel}_{T::SUFFIX}` of `module`, compiled for `dev`'s architecture and loaded into
/// `dev` (once per device: candle caches the module under `module.name`). Launch it on
/// `dev.cuda_stream()`, candle's own stream, so it is ordered with candle's ops.
pub(crate) fn function<T: Float>(
    dev: &CudaDevice,
    module: &CudaModule,
    kernel: &str,
) -> candle_core::Result<CudaFunction> {
    let ptx = ptx(module, &device_arch(dev)?)?;
    Ok(dev
        .get_or_load_custom_func(&format!("{kernel}_{}", T::SUFFIX), module.name, ptx)?
        .into_cuda_function())
}

fn to_u32(n: usize, cap: u32) -> u32 {
    // `n.min(cap)` fits in u32 by construction; the fallback is never taken.
    u32::try_from(n.min(cap as usize)).unwrap_or(cap)
}

/// 1-D launch for `n` elements: blocks of [`src::ELEMENTWISE_THREADS`], grid capped at
/// [`src::MAX_GRID_X`] (the kernels' grid-stride loops cover the rest).
pub(crate) fn elementwise_config(n: usize) -> LaunchConfig {
    let t = src::ELEMENTWISE_THREADS;
    LaunchConfig {
        grid_dim: (to_u32(n.div_ceil(t as usize).max(1), src::MAX_GRID_X), 1, 1),
        block_dim: (t, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Row-wise launch over `rows × cols`: x covers the columns of a row, y the rows, both capped
/// (the kernels stride over the rest).
pub(crate) fn rows_config(rows: usize, cols: usize) -> LaunchConfig {
    let t = src::ELEMENTWISE_THREADS;
    LaunchConfig {
        grid_dim: (
            to_u32(cols.div_ceil(t as usize).max(1), src::MAX_GRID_X),
            to_u32(rows.max(1), src::MAX_GRID_Y),
            1,
        ),
        block_dim: (t, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of [`src::REDUCE_THREADS`] per row: the deterministic per-channel reductions.
/// Errs past 2³¹ − 1 rows (the x-dimension limit of a grid); the kernels do not stride rows.
pub(crate) fn reduce_config(op: &str, rows: usize) -> candle_core::Result<LaunchConfig> {
    const MAX_BLOCKS_X: usize = (1 << 31) - 1;
    if rows > MAX_BLOCKS_X {
        return Err(msg(format!(
            "{op} (cuda): {rows} channels, at most {MAX_BLOCKS_X} (one block each)"
        )));
    }
    Ok(LaunchConfig {
        grid_dim: (to_u32(rows, u32::MAX), 1, 1),
        block_dim: (src::REDUCE_THREADS, 1, 1),
        // The kernels' shared buffer is static (`__shared__ double buf[...]`).
        shared_mem_bytes: 0,
    })
}

/// The element range `[start, end)` of a contiguous layout, or an error naming the op.
pub(crate) fn contiguous_range(l: &Layout, op: &str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        msg(format!(
            "{op} (cuda): operand must be contiguous, got strides {:?}",
            l.stride()
        ))
    })
}

/// `r` holds exactly `len` elements, or an error naming the operand: a kernel indexes its
/// operands from the shapes it is given, so a short operand would be read out of bounds.
pub(crate) fn expect_len(
    op: &str,
    what: &str,
    r: (usize, usize),
    len: usize,
) -> candle_core::Result<()> {
    let n = r.1 - r.0;
    if n != len {
        return Err(msg(format!(
            "{op} (cuda): {what} has {n} elements, expected {len}"
        )));
    }
    Ok(())
}

/// The element ranges of a pass's destination and two operands ([`contiguous_range`] each),
/// holding exactly `lens` elements ([`expect_len`]), or an error naming the operand.
pub(crate) fn pass_ranges(
    op: &str,
    layouts: [&Layout; 3],
    lens: [usize; 3],
) -> candle_core::Result<[(usize, usize); 3]> {
    let mut ranges = [(0, 0); 3];
    for (i, what) in ["the destination", "the first operand", "the second operand"]
        .into_iter()
        .enumerate()
    {
        ranges[i] = contiguous_range(layouts[i], op)?;
        expect_len(op, what, ranges[i], lens[i])?;
    }
    Ok(ranges)
}

fn out_of_range(op: &str, r: (usize, usize), len: usize) -> candle_core::Error {
    msg(format!(
        "{op} (cuda): elements {}..{} out of range of a storage of {len}",
        r.0, r.1
    ))
}

/// The view of elements `[r.0, r.1)` of `s`, or an error (never the panic of `slice`).
pub(crate) fn view<'a, T>(
    op: &str,
    s: &'a CudaSlice<T>,
    r: (usize, usize),
) -> candle_core::Result<CudaView<'a, T>> {
    let len = s.len();
    s.try_slice(r.0..r.1)
        .ok_or_else(|| out_of_range(op, r, len))
}

/// The mutable view of elements `[r.0, r.1)` of `s`, or an error.
pub(crate) fn view_mut<'a, T>(
    op: &str,
    s: &'a mut CudaSlice<T>,
    r: (usize, usize),
) -> candle_core::Result<CudaViewMut<'a, T>> {
    let len = s.len();
    s.try_slice_mut(r.0..r.1)
        .ok_or_else(|| out_of_range(op, r, len))
}

/// The error for a dtype the kernels are not instantiated for.
pub(crate) fn unsupported(op: &str, found: DType) -> candle_core::Error {
    msg(format!(
        "{op} (cuda): dtype {found:?} unsupported (f32 or f64 operands alike, or bf16 features \
         with f32 tables)"
    ))
}

/// Calls `$run::<f32>`, `$run::<f64>` or `$run::<half::bf16>` by the dtype of `$s` (a
/// feature operand); other operands are checked by `as_cuda_slice::<T>()` (features) or
/// `as_cuda_slice::<T::Acc>()` (tables) inside (a mismatch is candle's dtype error).
macro_rules! by_dtype {
    ($op:expr, $s:expr, $run:ident ( $($arg:expr),* )) => {
        match $s.dtype() {
            candle_core::DType::F32 => $run::<f32>($($arg),*),
            candle_core::DType::F64 => $run::<f64>($($arg),*),
            candle_core::DType::BF16 => $run::<half::bf16>($($arg),*),
            other => Err($crate::ops::cuda::launch::unsupported($op, other)),
        }
    };
}
pub(crate) use by_dtype;
