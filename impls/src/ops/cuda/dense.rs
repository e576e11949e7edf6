//! cuBLAS for the dense products that add into an existing tensor on a GPU ([`crate::ops::dense`]'s
//! `accumulate` and `accumulate_tail`): `dst += a · b` as one GEMM with β = 1 straight into the
//! destination view (a prefix of a gradient buffer, or a Linear output holding its bias), so
//! the GPU path makes no `[C, M]` temporary and no second pass, as the CPU's `gemm` does not.
//!
//! The call is candle's own matmul call on candle's cuBLAS handle (bound to its stream), with
//! β = 1 and batch 1: `cublasGemmStridedBatchedEx` in f32 with candle's TF32 switch
//! (`set_gemm_reduced_precision_f32`, so `--math tf32` holds here too), and
//! `cublasDgemmStridedBatched` in f64. The row-major operands are mapped to BLAS's column-major
//! convention by [`ColMajorGemm::of`], which the CPU tests check against `gemm`.
//!
//! Also here: [`pin_cublas_workspace`], the fixed workspace every cuBLAS call of a measured
//! device uses (outside the memory pool a GPU row's peak is read from).
//!
//! bf16 operands (mixed precision, autocast's rule): `cublasGemmStridedBatchedEx` with
//! `CUDA_R_16BF` operands and `CUBLAS_COMPUTE_32F` (f32 accumulation on tensor cores) into a bf16
//! destination (each element rounded once) or an f32 one (a parameter gradient, the f32 tap
//! products of a bf16 convolution): PyTorch's bf16 GEMM under autocast.
//!
//! Only compiled with the `cuda` feature. Every failure is an `Err` naming the op.

use crate::ops::cuda::launch::{msg, unsupported};
use crate::ops::layout::matrix::{ColMajorGemm, Mat};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cublas::{result as blas, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDType, CudaStorage};
use candle_core::{DType, Layout};
use std::sync::Arc;

/// `dst += a · b` (`b` another storage), or with `tail = Some(top)` the rows of `dst`'s view
/// split after row `top`: `dst[..top] += a · dst[top..]` (`b` is `None`). Without `add`,
/// `dst = a · b` (β = 0: dst's old values are not read).
pub fn accumulate(
    (op, add): (&str, bool),
    dst: &mut CudaStorage,
    dl: &Layout,
    (a, al): (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
    tail: Option<usize>,
) -> candle_core::Result<()> {
    let dtype = dst.dtype();
    // the operands' dtype: the destination's, or bf16 into f32 (a parameter gradient of bf16
    // features, and the f32 tap products of a bf16 convolution)
    let operands = a.dtype();
    let fits = match (dtype, operands) {
        (DType::F32, DType::F32) | (DType::F64, DType::F64) | (DType::BF16, DType::BF16) => true,
        (DType::F32, DType::BF16) => b.is_some(),
        _ => false,
    };
    if !fits || b.is_some_and(|(b, _)| b.dtype() != operands) {
        return Err(msg(format!(
            "{op} (cuda): operands must all be f32 or all f64, or bf16 into a bf16 or f32 \
             destination; got {:?} and {:?} into {dtype:?}",
            a.dtype(),
            b.map(|(b, _)| b.dtype())
        )));
    }
    let len = |s: &CudaStorage| -> candle_core::Result<usize> {
        Ok(match s.dtype() {
            DType::F32 => s.as_cuda_slice::<f32>()?.len(),
            DType::F64 => s.as_cuda_slice::<f64>()?.len(),
            DType::BF16 => s.as_cuda_slice::<half::bf16>()?.len(),
            other => return Err(unsupported(op, other)),
        })
    };
    let am = Mat::of(al, len(a)?, op, "lhs")?;
    let (dm, bm) = match (b, tail) {
        (Some((b, bl)), None) => (
            Mat::of(dl, len(dst)?, op, "destination")?,
            Mat::of(bl, len(b)?, op, "rhs")?,
        ),
        (None, Some(top)) => {
            let whole = Mat::of(dl, len(dst)?, op, "rows")?;
            if top > whole.rows {
                return Err(msg(format!(
                    "{op} (cuda): cannot split {} rows after row {top}",
                    whole.rows
                )));
            }
            (
                Mat { rows: top, ..whole },
                Mat {
                    rows: whole.rows - top,
                    off: whole.off + top * whole.rs,
                    ..whole
                },
            )
        }
        _ => return Err(msg(format!("{op} (cuda): one right operand, not two"))),
    };
    let g = ColMajorGemm::of(op, dm, am, bm)?;
    if g.m == 0 || g.n == 0 {
        return Ok(()); // no element to write
    }
    if g.k == 0 && add {
        return Ok(()); // nothing to add
    }
    let dev = dst.device.clone();
    let stream = dev.cuda_stream();
    let blas_handle = dev.cublas_handle();
    let handle = *blas_handle.handle();
    let t = |trans: bool| {
        if trans {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    let (ta, tb) = (t(g.trans_x), t(g.trans_y));
    // BLAS ints: checked by ColMajorGemm::of
    let i = |v: usize| v as i32;
    let (m, n, k) = (i(g.m), i(g.n), i(g.k));
    let (ldx, ldy, ldc) = (i(g.x.1), i(g.y.1), i(g.c.1));
    // SAFETY (both calls): Mat::of checked every operand against its storage; dst's rows do not
    // overlap the right operand's (another storage, or the rows after `top`); the handle is
    // candle's, on candle's stream, which orders the call with every other op.
    // f32 and bf16 operands: one `cublasGemmStridedBatchedEx` with f32 scalars (α = 1, β = 1
    // to add or 0), the operands' and destination's types and the compute type
    let one = &1f32 as *const f32 as *const _;
    let beta = if add {
        one
    } else {
        &0f32 as *const f32 as *const _
    };
    let ex = |(ab, out, compute): (sys::cudaDataType_t, sys::cudaDataType_t, _)| {
        move |c: u64, x: u64, y: u64| unsafe {
            blas::gemm_strided_batched_ex(
                handle,
                ta,
                tb,
                m,
                n,
                k,
                one,
                x as *const _,
                ab,
                ldx,
                0,
                y as *const _,
                ab,
                ldy,
                0,
                beta,
                c as *mut _,
                out,
                ldc,
                0,
                1,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT_TENSOR_OP,
            )
        }
    };
    let (r32, bf) = (
        sys::cudaDataType_t::CUDA_R_32F,
        sys::cudaDataType_t::CUDA_R_16BF,
    );
    let status = match (dtype, operands) {
        (DType::F32, DType::F32) => {
            let compute = if candle_core::cuda::gemm_reduced_precision_f32() {
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
            } else {
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
            };
            with_addresses::<f32, f32, _>(&stream, dst, a, b, &g, ex((r32, r32, compute)))?
        }
        // bf16 operands (autocast): f32 accumulation (`CUBLAS_COMPUTE_32F`, tensor cores) into a
        // bf16 destination, each element rounded once, or an f32 one, not rounded to bf16
        (DType::F32, DType::BF16) => with_addresses::<f32, half::bf16, _>(
            &stream,
            dst,
            a,
            b,
            &g,
            ex((bf, r32, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F)),
        )?,
        (DType::BF16, DType::BF16) => with_addresses::<half::bf16, half::bf16, _>(
            &stream,
            dst,
            a,
            b,
            &g,
            ex((bf, bf, sys::cublasComputeType_t::CUBLAS_COMPUTE_32F)),
        )?,
        (DType::F64, _) => {
            with_addresses::<f64, f64, _>(&stream, dst, a, b, &g, |c, x, y| unsafe {
                blas::dgemm_strided_batched(
                    handle,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    &1.0,
                    x as *const f64,
                    ldx,
                    0,
                    y as *const f64,
                    ldy,
                    0,
                    if add { &1.0 } else { &0.0 },
                    c as *mut f64,
                    ldc,
                    0,
                    1,
                )
            })?
        }
        (other, _) => return Err(unsupported(op, other)),
    };
    status.map_err(|e| msg(format!("{op} (cuda): cuBLAS: {e:?}")))
}

/// Runs `call` with the device addresses of `g`'s C (in `dst`, elements `D`), X (in `b`, or in
/// `dst` itself for a tail) and Y (in `a`) (elements `E`), each operand's offset applied, while
/// the guards that keep the storages' pointers valid are held (until the call is queued).
fn with_addresses<D: CudaDType, E: CudaDType, R>(
    stream: &Arc<CudaStream>,
    dst: &mut CudaStorage,
    a: &CudaStorage,
    b: Option<(&CudaStorage, &Layout)>,
    g: &ColMajorGemm,
    call: impl FnOnce(u64, u64, u64) -> R,
) -> candle_core::Result<R> {
    let at = |base: u64, off: usize, size: usize| base + (off * size) as u64;
    let (d, e) = (std::mem::size_of::<D>(), std::mem::size_of::<E>());
    let (base_c, _c) = dst.as_cuda_slice_mut::<D>()?.device_ptr_mut(stream);
    let (base_a, _a) = a.as_cuda_slice::<E>()?.device_ptr(stream);
    let b = match b {
        Some((b, _)) => Some(b.as_cuda_slice::<E>()?.device_ptr(stream)),
        None => None,
    };
    // a tail's right operand is rows of dst itself (D = E there: checked by the caller)
    let (base_b, size_b) = b.as_ref().map_or((base_c, d), |(p, _)| (*p, e));
    Ok(call(
        at(base_c, g.c.0, d),
        at(base_b, g.x.0, size_b),
        at(base_a, g.y.0, e),
    ))
}

/// Bytes of the fixed workspace [`pin_cublas_workspace`] gives a device's cuBLAS handle:
/// NVIDIA's recommended size for Hopper (cuBLAS documentation, `cublasSetWorkspace`: 32 MiB;
/// 4 MiB suffices before it).
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Gives candle's cuBLAS handle of `dev` a fixed workspace of [`CUBLAS_WORKSPACE_BYTES`],
/// allocated with `cuMemAlloc` (not from the stream-ordered pool), for the life of the process.
///
/// Why: without one, cuBLAS of CUDA ≥ 12.2 takes its workspace with `cudaMallocAsync` from the
/// device's current memory pool — the default pool whose `USED_MEM_HIGH` is a GPU row's peak —
/// so a GEMM that wants workspace (split-K on `dW = G·Sᵀ`, inner dimension M) would add up to
/// tens of MiB to a step's peak that no model of the variant's tensors has, and a CUDA graph
/// capture would record the allocation as a node (PyTorch #113994, #124250; cudarc #595). With
/// it, every cuBLAS call of the handle — candle's matmuls and [`crate::ops::dense`]'s accumulating
/// products — uses this buffer: nothing of cuBLAS is in the pool, by construction, as
/// `docs/gpu.md` states. Candle binds the handle to its stream once, when the device is made
/// (`cublasSetStream` would reset the workspace; nothing calls it later).
///
/// Never freed: one buffer per opened device (a measuring child opens one), released with the
/// context at exit.
pub fn pin_cublas_workspace(dev: &candle_core::CudaDevice) -> candle_core::Result<()> {
    use candle_core::cuda_backend::cudarc::driver::result as drv;
    let stream = dev.cuda_stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| msg(format!("cuBLAS workspace: binding the context: {e:?}")))?;
    // SAFETY: a plain device allocation in the context bound above; the pointer is handed to
    // cuBLAS below and outlives every call of the handle (it is never freed).
    let ptr = unsafe { drv::malloc_sync(CUBLAS_WORKSPACE_BYTES) }.map_err(|e| {
        msg(format!(
            "cuBLAS workspace: cuMemAlloc of {CUBLAS_WORKSPACE_BYTES} bytes failed: {e:?}"
        ))
    })?;
    let blas_handle = dev.cublas_handle();
    // SAFETY: candle's live handle; `ptr` is `CUBLAS_WORKSPACE_BYTES` of device memory of the
    // handle's context, 256-byte aligned as cuMemAlloc returns it (cuBLAS asks for 256).
    let bound = unsafe {
        sys::cublasSetWorkspace_v2(
            *blas_handle.handle(),
            ptr as *mut std::ffi::c_void,
            CUBLAS_WORKSPACE_BYTES,
        )
    }
    .result();
    if let Err(e) = bound {
        // SAFETY: allocated above, handed to nobody.
        let _ = unsafe { drv::free_sync(ptr) };
        return Err(msg(format!(
            "cuBLAS workspace: cublasSetWorkspace failed: {e:?}"
        )));
    }
    Ok(())
}
