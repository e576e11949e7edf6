//! cuDNN for the bc layer's 3×3 convolution on a GPU (the `cudnn` feature): forward, data
//! gradient and filter gradient straight on the channel-major features `[C, N·H·W]` — described
//! to cuDNN as NCHW tensors with strides `(H·W, N·H·W, W, 1)`, no copy — and PyTorch's
//! `[k, B, 3, 3]` filter as it is. One plan per thread, device, shapes, dtype and math mode
//! (descriptors, the algorithm of each pass and its workspace size), made at the first call and
//! kept, so a step (and a CUDA graph capture) only launches.
//!
//! **The data gradient is a forward convolution**: cuDNN's backward-data algorithms write only
//! packed layouts (on an H100 with cuDNN 9 every one of them answered
//! `CUDNN_STATUS_NOT_SUPPORTED` for the channel-major `dx`), while its forward convolution
//! reads and writes these strides. `ds = conv(gy, Wᵀ)` in true-convolution mode (the filter
//! flipped, `CUDNN_CONVOLUTION`) with `Wᵀ [B, k, 3, 3]` the filter with its two channel axes
//! swapped, written by `cudnnTransformTensor` into the head of the pass's workspace (so the
//! memory model's data workspace is `Wᵀ`'s bytes, rounded up to 256, plus the algorithm's).
//!
//! **Packed copies where cuDNN refuses the strides** (`DENSEBENCH_CUDNN_STAGING`, default
//! `auto`): a pass for which cuDNN's heuristics offer no algorithm on the channel-major strides
//! (the filter gradient's reads were never planned on a GPU) runs on packed NCHW copies instead:
//! `cudnnTransformTensor` copies its feature operands into its workspace, the pass runs there
//! (the data gradient as cuDNN's own backward-data pass, on packed `gy` and `ds`), and a result
//! of features is copied back into the channel-major tensor. The copies are the head of the
//! pass's one workspace allocation (`B` channels, then `k`, each rounded up to 256 bytes), so
//! the memory model charges them with the rest. `strided` or `packed` pins every pass one way.
//!
//! **Algorithms**: cuDNN's own heuristics (`cudnnGetConvolution*Algorithm_v7`, what PyTorch asks
//! with `torch.backends.cudnn.benchmark` off, its default), the first one ranked that succeeds,
//! is **deterministic** (two runs and a graph replay give the same bits: densebench's GPU tests
//! check that) and keeps the math mode: `--math ieee` only FMA kernels (`CUDNN_FMA_MATH`, as
//! PyTorch sets without TF32), `tf32` any (`CUDNN_DEFAULT_MATH`: TF32 tensor cores on sm_80+),
//! bf16 tensor cores with f32 accumulation (`CUDNN_TENSOR_OP_MATH`, compute type float), f64
//! double. **Workspaces** come from the device's stream-ordered pool, one per call, freed as soon
//! as the call is queued — the memory model charges exactly these sizes (the family's
//! `ConvWorkspaces`).
//!
//! Only compiled with the `cudnn` feature. Every failure is an `Err` naming the op and cuDNN's
//! status, never a panic.

use crate::ops::cuda::launch::{msg, pass_ranges, unsupported};
use crate::ops::cuda::staging::{
    cudnn_staging, packed_copies_bytes, workspace_aligned, CudnnStaging, CudnnStagingChoice,
};
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::cudnn::{result as dnn, sys};
use candle_core::cuda_backend::cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};
use candle_core::cuda_backend::{CudaDType, CudaDevice, CudaStorage, DeviceId};
use candle_core::{DType, Layout};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

/// The shapes of one 3×3 convolution (padding 1, stride 1): `b` channels in, `k` out, `n`
/// images of `h × w`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConvShape {
    pub n: usize,
    pub b: usize,
    pub k: usize,
    pub h: usize,
    pub w: usize,
}

impl ConvShape {
    fn columns(&self) -> usize {
        self.n * self.h * self.w
    }
}

/// The algorithms a plan runs, by name, each with how the pass meets the features, for a
/// row's `note`: `IMPLICIT_PRECOMP_GEMM`, `(fwd, Wᵀ) IMPLICIT_GEMM` (the data gradient as a
/// forward convolution), `ALGO_1 on packed copies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConvAlgorithms {
    pub forward: String,
    pub data: String,
    pub filter: String,
}

fn err(op: &str, what: &str, e: dnn::CudnnError) -> candle_core::Error {
    msg(format!("{op} (cudnn): {what}: {:?}", e.0))
}

/// A cuDNN handle bound to candle's stream of a device.
struct Handle(sys::cudnnHandle_t);
impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `dnn::create_handle`, destroyed once
        let _ = unsafe { dnn::destroy_handle(self.0) };
    }
}

struct TensorDesc(sys::cudnnTensorDescriptor_t);
impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by `dnn::create_tensor_descriptor`, destroyed once
        let _ = unsafe { dnn::destroy_tensor_descriptor(self.0) };
    }
}

struct FilterDesc(sys::cudnnFilterDescriptor_t);
impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by `dnn::create_filter_descriptor`, destroyed once
        let _ = unsafe { dnn::destroy_filter_descriptor(self.0) };
    }
}

struct ConvDesc(sys::cudnnConvolutionDescriptor_t);
impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by `dnn::create_convolution_descriptor`, destroyed once
        let _ = unsafe { dnn::destroy_convolution_descriptor(self.0) };
    }
}

/// One pass's choice: the algorithm, its workspace in bytes, and a convolution descriptor set
/// to the math type cuDNN ranked it with (as PyTorch sets it per call).
struct Pass<A> {
    algo: A,
    workspace: usize,
    conv: ConvDesc,
}

/// The data gradient's pass: a forward convolution of `gy` with [`Plan::wt`] on the strides
/// (module doc), or cuDNN's backward-data pass on packed copies.
enum DataPass {
    Transposed(Pass<sys::cudnnConvolutionFwdAlgo_t>),
    Packed(Pass<sys::cudnnConvolutionBwdDataAlgo_t>),
}

/// Everything one convolution needs at launch.
struct Plan {
    handle: Rc<Handle>,
    /// `s`/`ds` (`B` channels) and `y`/`gy` (`k`) with the channel-major strides, and packed.
    x: TensorDesc,
    y: TensorDesc,
    xp: TensorDesc,
    yp: TensorDesc,
    w: FilterDesc,
    forward: (Pass<sys::cudnnConvolutionFwdAlgo_t>, CudnnStaging),
    data: DataPass,
    filter: (Pass<sys::cudnnConvolutionBwdFilterAlgo_t>, CudnnStaging),
    /// `Wᵀ [B, k, 3, 3]`, the strided data pass's filter.
    wt: FilterDesc,
    /// `W [k, B, 3, 3]` read as `[B, k, 9, 1]` (strides `9, 9·B, 1, 1`) and `Wᵀ` packed
    /// `[B, k, 9, 1]`: the two sides of the transposing `cudnnTransformTensor`.
    w_swapped: TensorDesc,
    wt_packed: TensorDesc,
    /// `Wᵀ`'s bytes rounded up to 256: where the strided data pass's algorithm workspace starts.
    wt_bytes: usize,
    /// A packed pass's workspace: the `k`-channel copy from `copies.0` bytes on (the
    /// `B`-channel one from 0), the algorithm's workspace from `copies.1` on.
    copies: (usize, usize),
}

impl Plan {
    /// The bytes a pass's launch takes from the pool: its algorithm's workspace, after `Wᵀ`
    /// for the strided data gradient and after the packed copies for a packed pass.
    fn workspace(&self, which: Which) -> usize {
        let copies = |staging| match staging {
            CudnnStaging::Strided => 0,
            CudnnStaging::Packed => self.copies.1,
        };
        match which {
            Which::Forward => copies(self.forward.1) + self.forward.0.workspace,
            Which::Data => match &self.data {
                DataPass::Transposed(p) => self.wt_bytes + p.workspace,
                DataPass::Packed(p) => self.copies.1 + p.workspace,
            },
            Which::Filter => copies(self.filter.1) + self.filter.0.workspace,
        }
    }
}

/// A pass planned in the staging `choice` allows: `strided()` or `packed()` where one is
/// pinned; else `strided()`, and `packed()` where that fails (the error then names both).
fn staged<R>(
    choice: CudnnStagingChoice,
    strided: impl FnOnce() -> candle_core::Result<R>,
    packed: impl FnOnce() -> candle_core::Result<R>,
) -> candle_core::Result<(R, CudnnStaging)> {
    match choice {
        Some(CudnnStaging::Strided) => strided().map(|r| (r, CudnnStaging::Strided)),
        Some(CudnnStaging::Packed) => packed().map(|r| (r, CudnnStaging::Packed)),
        None => match strided() {
            Ok(r) => Ok((r, CudnnStaging::Strided)),
            Err(on_strides) => match packed() {
                Ok(r) => Ok((r, CudnnStaging::Packed)),
                Err(on_copies) => Err(msg(format!(
                    "on the channel-major strides: {on_strides}; on packed copies: {on_copies}"
                ))),
            },
        },
    }
}

type Key = (DeviceId, ConvShape, DType, bool, CudnnStagingChoice);

thread_local! {
    // Handles and plans are per thread: cuDNN handles are not to be shared between threads
    // without care (candle keeps its own per thread too).
    static HANDLES: RefCell<HashMap<DeviceId, Rc<Handle>>> = RefCell::default();
    static PLANS: RefCell<HashMap<Key, Rc<Plan>>> = RefCell::default();
}

fn handle(dev: &CudaDevice) -> candle_core::Result<Rc<Handle>> {
    if let Some(h) = HANDLES.with(|m| m.borrow().get(&dev.id()).cloned()) {
        return Ok(h);
    }
    let op = "conv3x3";
    let stream = dev.cuda_stream();
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| msg(format!("{op} (cudnn): binding the context: {e:?}")))?;
    let h = Handle(dnn::create_handle().map_err(|e| {
        err(
            op,
            "cudnnCreate (is libcudnn.so.9 of cuDNN 9 on the library path?)",
            e,
        )
    })?);
    // SAFETY: a live handle and candle's live stream of the same context
    unsafe { dnn::set_stream(h.0, stream.cu_stream() as sys::cudaStream_t) }
        .map_err(|e| err(op, "cudnnSetStream", e))?;
    let h = Rc::new(h);
    HANDLES.with(|m| m.borrow_mut().insert(dev.id(), h.clone()));
    Ok(h)
}

fn data_type(op: &str, dtype: DType) -> candle_core::Result<sys::cudnnDataType_t> {
    Ok(match dtype {
        DType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        DType::F64 => sys::cudnnDataType_t::CUDNN_DATA_DOUBLE,
        DType::BF16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        other => return Err(unsupported(op, other)),
    })
}

fn int(op: &str, v: usize) -> candle_core::Result<i32> {
    i32::try_from(v).map_err(|_| msg(format!("{op} (cudnn): {v} does not fit cuDNN's int")))
}

/// A 4-d tensor descriptor of `dims` with `strides` (elements).
fn tensor4d(
    op: &str,
    dt: sys::cudnnDataType_t,
    dims: [usize; 4],
    strides: [usize; 4],
) -> candle_core::Result<TensorDesc> {
    let d =
        TensorDesc(dnn::create_tensor_descriptor().map_err(|e| err(op, "tensor descriptor", e))?);
    let i = |v| int(op, v);
    let (dims, strides) = (
        [i(dims[0])?, i(dims[1])?, i(dims[2])?, i(dims[3])?],
        [
            i(strides[0])?,
            i(strides[1])?,
            i(strides[2])?,
            i(strides[3])?,
        ],
    );
    // SAFETY: a live descriptor
    unsafe { dnn::set_tensor4d_descriptor_ex(d.0, dt, dims, strides) }
        .map_err(|e| err(op, "tensor descriptor", e))?;
    Ok(d)
}

/// A channel-major `[c, N·H·W]` tensor as cuDNN's NCHW with strides `(H·W, N·H·W, W, 1)`.
fn channel_major(
    op: &str,
    dt: sys::cudnnDataType_t,
    s: ConvShape,
    c: usize,
) -> candle_core::Result<TensorDesc> {
    tensor4d(op, dt, [s.n, c, s.h, s.w], [s.h * s.w, s.columns(), s.w, 1])
}

/// A 3×3 filter descriptor `[out, in, 3, 3]` (NCHW).
fn filter3x3(
    op: &str,
    dt: sys::cudnnDataType_t,
    out: usize,
    inp: usize,
) -> candle_core::Result<FilterDesc> {
    let w =
        FilterDesc(dnn::create_filter_descriptor().map_err(|e| err(op, "filter descriptor", e))?);
    // SAFETY: a live descriptor
    unsafe {
        dnn::set_filter4d_descriptor(
            w.0,
            dt,
            sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            [int(op, out)?, int(op, inp)?, 3, 3],
        )
    }
    .map_err(|e| err(op, "filter descriptor", e))?;
    Ok(w)
}

/// The convolution descriptor: padding 1, stride 1, `mode` (cross-correlation, PyTorch's, for
/// the forward and filter passes; true convolution for the data pass), compute type double for
/// f64, float otherwise, with `math`.
fn conv_desc(
    op: &str,
    mode: sys::cudnnConvolutionMode_t,
    dtype: DType,
    math: sys::cudnnMathType_t,
) -> candle_core::Result<ConvDesc> {
    let c = ConvDesc(
        dnn::create_convolution_descriptor().map_err(|e| err(op, "convolution descriptor", e))?,
    );
    let compute = if dtype == DType::F64 {
        sys::cudnnDataType_t::CUDNN_DATA_DOUBLE
    } else {
        sys::cudnnDataType_t::CUDNN_DATA_FLOAT
    };
    // SAFETY: a live descriptor
    unsafe { dnn::set_convolution2d_descriptor(c.0, 1, 1, 1, 1, 1, 1, mode, compute) }
        .map_err(|e| err(op, "convolution descriptor", e))?;
    // SAFETY: as above
    unsafe { dnn::set_convolution_math_type(c.0, math) }
        .map_err(|e| err(op, "convolution math type", e))?;
    Ok(c)
}

/// The math type a plan asks for (see the module's doc).
fn requested_math(dtype: DType, tf32: bool) -> sys::cudnnMathType_t {
    use sys::cudnnMathType_t as M;
    match dtype {
        DType::BF16 => M::CUDNN_TENSOR_OP_MATH,
        DType::F32 if !tf32 => M::CUDNN_FMA_MATH,
        _ => M::CUDNN_DEFAULT_MATH,
    }
}

/// Whether an algorithm ranked with `math` may run under the plan's mode: in IEEE f32 none
/// ranked for tensor cores (TF32), every other mode any.
fn math_allowed(dtype: DType, tf32: bool, math: sys::cudnnMathType_t) -> bool {
    use sys::cudnnMathType_t as M;
    let tensor_cores = matches!(
        math,
        M::CUDNN_TENSOR_OP_MATH | M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION
    );
    dtype != DType::F32 || tf32 || !tensor_cores
}

/// The math type a pass's descriptor runs its algorithm with: the one cuDNN ranked it with (as
/// PyTorch sets it), except in IEEE f32, where it stays `CUDNN_FMA_MATH` whatever the ranking
/// said (`CUDNN_DEFAULT_MATH` would let an sm_80+ GPU use TF32).
fn pass_math(dtype: DType, tf32: bool, ranked: sys::cudnnMathType_t) -> sys::cudnnMathType_t {
    if dtype == DType::F32 && !tf32 {
        sys::cudnnMathType_t::CUDNN_FMA_MATH
    } else {
        ranked
    }
}

/// The first of cuDNN's ranked results that succeeded, is deterministic and keeps the math
/// mode: its algorithm and the math type it was ranked with.
fn choose<A: Copy + std::fmt::Debug>(
    op: &str,
    pass: &str,
    (dtype, tf32): (DType, bool),
    ranked: impl Iterator<
        Item = (
            A,
            sys::cudnnStatus_t,
            sys::cudnnDeterminism_t,
            sys::cudnnMathType_t,
        ),
    >,
) -> candle_core::Result<(A, sys::cudnnMathType_t)> {
    let mut seen = Vec::new();
    for (algo, status, determinism, math) in ranked {
        let ok = status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
            && determinism == sys::cudnnDeterminism_t::CUDNN_DETERMINISTIC
            && math_allowed(dtype, tf32, math);
        if ok {
            return Ok((algo, math));
        }
        seen.push(format!("{algo:?} ({status:?}, {determinism:?}, {math:?})"));
    }
    Err(msg(format!(
        "{op} (cudnn): no deterministic {pass} algorithm for {dtype:?}{} among cuDNN's: [{}]; \
         DENSEBENCH_CONV unset (or `tap-stack`) runs the tap stack instead",
        if dtype == DType::F32 && !tf32 {
            " in IEEE math"
        } else {
            ""
        },
        seen.join(", ")
    )))
}

/// One of cuDNN's three ranked-result types (`cudnnConvolution*AlgoPerf_t`).
trait Ranked: Copy {
    type Algo: Copy + std::fmt::Debug;
    /// How many algorithms cuDNN has for the pass (`*_ALGO_COUNT`).
    const COUNT: usize;
    fn fields(
        &self,
    ) -> (
        Self::Algo,
        sys::cudnnStatus_t,
        sys::cudnnDeterminism_t,
        sys::cudnnMathType_t,
    );
}

macro_rules! ranked {
    ($perf:ty, $algo:ty, $count:expr) => {
        impl Ranked for $perf {
            type Algo = $algo;
            const COUNT: usize = $count as usize;
            fn fields(
                &self,
            ) -> (
                Self::Algo,
                sys::cudnnStatus_t,
                sys::cudnnDeterminism_t,
                sys::cudnnMathType_t,
            ) {
                (self.algo, self.status, self.determinism, self.mathType)
            }
        }
    };
}
ranked!(
    sys::cudnnConvolutionFwdAlgoPerf_t,
    sys::cudnnConvolutionFwdAlgo_t,
    sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_COUNT
);
ranked!(
    sys::cudnnConvolutionBwdDataAlgoPerf_t,
    sys::cudnnConvolutionBwdDataAlgo_t,
    sys::cudnnConvolutionBwdDataAlgo_t::CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT
);
ranked!(
    sys::cudnnConvolutionBwdFilterAlgoPerf_t,
    sys::cudnnConvolutionBwdFilterAlgo_t,
    sys::cudnnConvolutionBwdFilterAlgo_t::CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT
);

/// One pass planned: cuDNN's ranking (`heuristics(out, asked, &mut returned)`), the algorithm
/// [`choose`] takes from it, a descriptor with its math ([`pass_math`]) and its workspace size
/// (`workspace(descriptor, algorithm)`).
fn pass<P: Ranked>(
    (op, name): (&str, &str),
    mode: sys::cudnnConvolutionMode_t,
    (dtype, tf32): (DType, bool),
    heuristics: impl FnOnce(*mut P, i32, &mut i32) -> Result<(), dnn::CudnnError>,
    workspace: impl FnOnce(&ConvDesc, P::Algo) -> Result<usize, dnn::CudnnError>,
) -> candle_core::Result<Pass<P::Algo>> {
    // SAFETY: plain C structs of enums, numbers and padding, for cuDNN to fill
    let mut out = vec![unsafe { std::mem::zeroed::<P>() }; P::COUNT];
    let mut count = 0;
    heuristics(out.as_mut_ptr(), P::COUNT as i32, &mut count)
        .map_err(|e| err(op, &format!("{name} heuristics"), e))?;
    let returned = (count.max(0) as usize).min(P::COUNT);
    let (algo, math) = choose(
        op,
        name,
        (dtype, tf32),
        out[..returned].iter().map(P::fields),
    )?;
    let conv = conv_desc(op, mode, dtype, pass_math(dtype, tf32, math))?;
    let workspace =
        workspace(&conv, algo).map_err(|e| err(op, &format!("{name} workspace size"), e))?;
    Ok(Pass {
        algo,
        workspace,
        conv,
    })
}

fn plan(dev: &CudaDevice, s: ConvShape, dtype: DType, tf32: bool) -> candle_core::Result<Rc<Plan>> {
    let op = "conv3x3";
    let choice = cudnn_staging().map_err(|e| msg(format!("{op}: {e}")))?;
    let key = (dev.id(), s, dtype, tf32, choice);
    if let Some(p) = PLANS.with(|m| m.borrow().get(&key).cloned()) {
        return Ok(p);
    }
    let handle = handle(dev)?;
    let dt = data_type(op, dtype)?;
    let x = channel_major(op, dt, s, s.b)?;
    let y = channel_major(op, dt, s, s.k)?;
    let packed = |c: usize| {
        let plane = s.h * s.w;
        tensor4d(op, dt, [s.n, c, s.h, s.w], [c * plane, plane, s.w, 1])
    };
    let (xp, yp) = (packed(s.b)?, packed(s.k)?);
    let w = filter3x3(op, dt, s.k, s.b)?;
    let wt = filter3x3(op, dt, s.b, s.k)?;
    let w_swapped = tensor4d(op, dt, [s.b, s.k, 9, 1], [9, 9 * s.b, 1, 1])?;
    let wt_packed = tensor4d(op, dt, [s.b, s.k, 9, 1], [9 * s.k, 9, 1, 1])?;
    let wt_bytes = workspace_aligned(9 * s.b * s.k * dtype.size_in_bytes());
    let copies = packed_copies_bytes(s.b, s.k, s.columns(), dtype.size_in_bytes());
    let asked = requested_math(dtype, tf32);
    let h = handle.0;
    let modes = (dtype, tf32);

    use sys::cudnnConvolutionMode_t::{CUDNN_CONVOLUTION, CUDNN_CROSS_CORRELATION};
    let probe = conv_desc(op, CUDNN_CROSS_CORRELATION, dtype, asked)?;
    let probe_flipped = conv_desc(op, CUDNN_CONVOLUTION, dtype, asked)?;
    // SAFETY (each cuDNN call below): a live handle and descriptors, and room for as many
    // results as asked for
    let forward_on = |x: &TensorDesc, y: &TensorDesc, name: &str| {
        pass::<sys::cudnnConvolutionFwdAlgoPerf_t>(
            (op, name),
            CUDNN_CROSS_CORRELATION,
            modes,
            |out, n, count| unsafe {
                dnn::get_convolution_forward_algorithm(h, x.0, w.0, probe.0, y.0, n, count, out)
            },
            |conv, algo| unsafe {
                dnn::get_convolution_forward_workspace_size(h, x.0, w.0, conv.0, y.0, algo)
            },
        )
    };
    let forward = staged(
        choice,
        || forward_on(&x, &y, "forward"),
        || forward_on(&xp, &yp, "forward (packed)"),
    )?;
    // the data gradient: on the strides, gy [k channels] convolved (flipped) with Wᵀ into
    // ds [B channels]; on packed copies, cuDNN's backward-data pass
    let (data, _) = staged(
        choice,
        || {
            pass::<sys::cudnnConvolutionFwdAlgoPerf_t>(
                (
                    op,
                    "data-gradient (forward convolution with the filter transposed)",
                ),
                CUDNN_CONVOLUTION,
                modes,
                |out, n, count| unsafe {
                    dnn::get_convolution_forward_algorithm(
                        h,
                        y.0,
                        wt.0,
                        probe_flipped.0,
                        x.0,
                        n,
                        count,
                        out,
                    )
                },
                |conv, algo| unsafe {
                    dnn::get_convolution_forward_workspace_size(h, y.0, wt.0, conv.0, x.0, algo)
                },
            )
            .map(DataPass::Transposed)
        },
        || {
            pass::<sys::cudnnConvolutionBwdDataAlgoPerf_t>(
                (op, "data-gradient (packed)"),
                CUDNN_CROSS_CORRELATION,
                modes,
                |out, n, count| unsafe {
                    dnn::get_convolution_backward_data_algorithm(
                        h, w.0, yp.0, probe.0, xp.0, n, count, out,
                    )
                },
                |conv, algo| unsafe {
                    dnn::get_convolution_backward_data_workspace_size(
                        h, w.0, yp.0, conv.0, xp.0, algo,
                    )
                },
            )
            .map(DataPass::Packed)
        },
    )?;
    let filter_on = |x: &TensorDesc, y: &TensorDesc, name: &str| {
        pass::<sys::cudnnConvolutionBwdFilterAlgoPerf_t>(
            (op, name),
            CUDNN_CROSS_CORRELATION,
            modes,
            |out, n, count| unsafe {
                dnn::get_convolution_backward_filter_algorithm(
                    h, x.0, y.0, probe.0, w.0, n, count, out,
                )
            },
            |conv, algo| unsafe {
                dnn::get_convolution_backward_filter_workspace_size(h, x.0, y.0, conv.0, w.0, algo)
            },
        )
    };
    let filter = staged(
        choice,
        || filter_on(&x, &y, "filter-gradient"),
        || filter_on(&xp, &yp, "filter-gradient (packed)"),
    )?;

    let p = Rc::new(Plan {
        handle,
        x,
        y,
        xp,
        yp,
        w,
        forward,
        data,
        filter,
        wt,
        w_swapped,
        wt_packed,
        wt_bytes,
        copies,
    });
    PLANS.with(|m| m.borrow_mut().insert(key, p.clone()));
    Ok(p)
}

/// Whether candle's f32 products run in TF32 (`--math tf32`), which the convolution follows.
fn tf32() -> bool {
    candle_core::cuda::gemm_reduced_precision_f32()
}

/// The workspace bytes (forward, data gradient, filter gradient) of the plan for `s` in
/// `dtype` under the current math mode on `dev` (the plan is made and kept for the step).
pub fn workspaces(dev: &CudaDevice, s: ConvShape, dtype: DType) -> candle_core::Result<[usize; 3]> {
    let p = plan(dev, s, dtype, tf32())?;
    Ok([Which::Forward, Which::Data, Which::Filter].map(|w| p.workspace(w)))
}

/// The algorithms of that plan, by cuDNN's names.
pub fn algorithms(
    dev: &CudaDevice,
    s: ConvShape,
    dtype: DType,
) -> candle_core::Result<ConvAlgorithms> {
    let p = plan(dev, s, dtype, tf32())?;
    let name = |a: String| {
        a.trim_start_matches("CUDNN_CONVOLUTION_")
            .replace("FWD_ALGO_", "")
            .replace("BWD_DATA_ALGO_", "ALGO_")
            .replace("BWD_FILTER_ALGO_", "ALGO_")
    };
    let staged = |a: String, staging| match staging {
        CudnnStaging::Strided => a,
        CudnnStaging::Packed => format!("{a} on packed copies"),
    };
    Ok(ConvAlgorithms {
        forward: staged(name(format!("{:?}", p.forward.0.algo)), p.forward.1),
        data: match &p.data {
            DataPass::Transposed(d) => format!("(fwd, Wᵀ) {}", name(format!("{:?}", d.algo))),
            DataPass::Packed(d) => staged(
                format!("(bwd) {}", name(format!("{:?}", d.algo))),
                CudnnStaging::Packed,
            ),
        },
        filter: staged(name(format!("{:?}", p.filter.0.algo)), p.filter.1),
    })
}

/// Which pass a launch runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// `dst = conv(a = s, b = W)`: `dst` `[k, M]`.
    Forward,
    /// `dst = ds` from `a = W`, `b = gy`: `dst` `[B, M]`.
    Data,
    /// `dst = dW` from `a = s`, `b = gy`: `dst` `[k, B, 3, 3]`.
    Filter,
}

/// One pass of the 3×3 convolution of shapes `s`: the destination written whole (β = 0), the
/// two operands as [`Which`] says. Every operand contiguous (any start offset) and of the
/// length its role asks, all of one dtype.
pub fn launch(
    which: Which,
    s: ConvShape,
    dst: (&mut CudaStorage, &Layout),
    a: (&CudaStorage, &Layout),
    b: (&CudaStorage, &Layout),
) -> candle_core::Result<()> {
    let op = match which {
        Which::Forward => "conv3x3 forward",
        Which::Data => "conv3x3 data gradient",
        Which::Filter => "conv3x3 filter gradient",
    };
    let dtype = dst.0.dtype();
    if a.0.dtype() != dtype || b.0.dtype() != dtype {
        return Err(msg(format!(
            "{op} (cudnn): operands must share the destination's dtype {dtype:?}, got {:?} and {:?}",
            a.0.dtype(),
            b.0.dtype()
        )));
    }
    let (m, weights) = (s.columns(), 9 * s.k * s.b);
    let (dst_len, a_len, b_len) = match which {
        Which::Forward => (s.k * m, s.b * m, weights),
        Which::Data => (s.b * m, weights, s.k * m),
        Which::Filter => (weights, s.b * m, s.k * m),
    };
    let [dr, ar, br] = pass_ranges(op, [dst.1, a.1, b.1], [dst_len, a_len, b_len])?;
    let dev = dst.0.device.clone();
    let p = plan(&dev, s, dtype, tf32())?;
    let workspace = p.workspace(which);
    let stream = dev.cuda_stream();
    // the workspace from the stream-ordered pool (charged like every tensor), freed on the
    // stream once the call is queued
    let mut ws = match workspace {
        0 => None,
        n => Some(
            // SAFETY: cuDNN writes the workspace before it reads it
            unsafe { dev.alloc::<u8>(n) }
                .map_err(|e| msg(format!("{op} (cudnn): workspace of {n} bytes: {e}")))?,
        ),
    };
    let ws_ptr = ws.as_mut().map(|w| w.device_ptr_mut(&stream));
    let ws_addr = ws_ptr.as_ref().map_or(0, |(p, _)| *p);
    let (d, a, b, scratch) = (
        (dst.0, dr.0),
        (a.0, ar.0),
        (b.0, br.0),
        (ws_addr, workspace),
    );
    let status = match dtype {
        DType::F32 => run::<f32>(which, &p, &stream, d, a, b, scratch),
        DType::F64 => run::<f64>(which, &p, &stream, d, a, b, scratch),
        DType::BF16 => run::<half::bf16>(which, &p, &stream, d, a, b, scratch),
        other => return Err(unsupported(op, other)),
    }?;
    drop(ws_ptr);
    drop(ws);
    status.map_err(|e| err(op, "launch", e))
}

/// The call of `which` on the addresses of the operands (each offset applied) with α = 1,
/// β = 0 (f64 scalars for f64 data, f32 otherwise), while the guards that keep the storages'
/// pointers valid are held.
#[allow(clippy::too_many_arguments)]
fn run<T: CudaDType + candle_core::WithDType>(
    which: Which,
    p: &Plan,
    stream: &Arc<CudaStream>,
    (dst, d0): (&mut CudaStorage, usize),
    (a, a0): (&CudaStorage, usize),
    (b, b0): (&CudaStorage, usize),
    (ws, ws_bytes): (u64, usize),
) -> candle_core::Result<Result<(), dnn::CudnnError>> {
    let size = std::mem::size_of::<T>() as u64;
    let (dst_base, _d) = dst.as_cuda_slice_mut::<T>()?.device_ptr_mut(stream);
    let (a_base, _a) = a.as_cuda_slice::<T>()?.device_ptr(stream);
    let (b_base, _b) = b.as_cuda_slice::<T>()?.device_ptr(stream);
    let at = |base: u64, off: usize| (base + off as u64 * size) as *mut std::ffi::c_void;
    let (d, x, y) = (at(dst_base, d0), at(a_base, a0), at(b_base, b0));
    let (one64, zero64, one32, zero32) = (1f64, 0f64, 1f32, 0f32);
    let (one, zero): (*const std::ffi::c_void, *const std::ffi::c_void) = if T::DTYPE == DType::F64
    {
        (&one64 as *const f64 as _, &zero64 as *const f64 as _)
    } else {
        (&one32 as *const f32 as _, &zero32 as *const f32 as _)
    };
    let wsp = ws as *mut std::ffi::c_void;
    let h = p.handle.0;
    // a packed pass's slots in the workspace: the B-channel copy, the k-channel copy, then
    // the algorithm's workspace (`Plan::copies`)
    let slot = |offset: usize| (ws + offset as u64) as *mut std::ffi::c_void;
    let (b_copy, k_copy, after_copies) = (wsp, slot(p.copies.0), slot(p.copies.1));
    let rest = ws_bytes.saturating_sub(p.copies.1);
    // SAFETY (every call below): the descriptors describe the operands (checked lengths,
    // contiguous, one dtype) and the workspace's slots (the plan's sizes, inside the
    // workspace of `ws_bytes`); the destination does not overlap the operands (another
    // storage: candle's in-place op refuses shared storages); the handle is bound to candle's
    // stream, which orders the calls with every other op and with each other.
    type Ptr = *mut std::ffi::c_void;
    let copy = |from: &TensorDesc, src: Ptr, to: &TensorDesc, dst: Ptr| unsafe {
        sys::cudnnTransformTensor(h, one, from.0, src, zero, to.0, dst).result()
    };
    // the forward convolution of `(xd, x)` with the filter into `(yd, out)`, and the filter
    // gradient from `(xd, x)` and `(yd, gy)`, each with the algorithm workspace `(w, bytes)`:
    // on the features where they lie, or between their copies
    let forward = |(xd, x): (&TensorDesc, Ptr), (yd, out): (&TensorDesc, Ptr), (w, bytes)| unsafe {
        let pass = &p.forward.0;
        dnn::convolution_forward(
            h,
            one,
            xd.0,
            x,
            p.w.0,
            y,
            pass.conv.0,
            pass.algo,
            w,
            bytes,
            zero,
            yd.0,
            out,
        )
    };
    let filter = |(xd, x): (&TensorDesc, Ptr), (yd, gy): (&TensorDesc, Ptr), (w, bytes)| unsafe {
        let pass = &p.filter.0;
        dnn::convolution_backward_filter(
            h,
            one,
            xd.0,
            x,
            yd.0,
            gy,
            pass.conv.0,
            pass.algo,
            w,
            bytes,
            zero,
            p.w.0,
            d,
        )
    };
    Ok(match which {
        Which::Forward => match p.forward.1 {
            CudnnStaging::Strided => forward((&p.x, x), (&p.y, d), (wsp, ws_bytes)),
            // s into its copy, the convolution between the copies, y back
            CudnnStaging::Packed => copy(&p.x, x, &p.xp, b_copy)
                .and_then(|()| forward((&p.xp, b_copy), (&p.yp, k_copy), (after_copies, rest)))
                .and_then(|()| copy(&p.yp, k_copy, &p.y, d)),
        },
        Which::Data => match &p.data {
            // Wᵀ into the workspace's head, then ds = conv(gy, Wᵀ) (flipped) with the rest
            DataPass::Transposed(data) => {
                let wt = wsp;
                let algo_ws = slot(p.wt_bytes);
                copy(&p.w_swapped, x, &p.wt_packed, wt).and_then(|()| unsafe {
                    dnn::convolution_forward(
                        h,
                        one,
                        p.y.0,
                        y,
                        p.wt.0,
                        wt,
                        data.conv.0,
                        data.algo,
                        algo_ws,
                        ws_bytes - p.wt_bytes,
                        zero,
                        p.x.0,
                        d,
                    )
                })
            }
            // gy into its copy, cuDNN's backward-data pass into the other, ds back
            DataPass::Packed(data) => copy(&p.y, y, &p.yp, k_copy)
                .and_then(|()| unsafe {
                    dnn::convolution_backward_data(
                        h,
                        one,
                        p.w.0,
                        x,
                        p.yp.0,
                        k_copy,
                        data.conv.0,
                        data.algo,
                        after_copies,
                        rest,
                        zero,
                        p.xp.0,
                        b_copy,
                    )
                })
                .and_then(|()| copy(&p.xp, b_copy, &p.x, d)),
        },
        Which::Filter => match p.filter.1 {
            CudnnStaging::Strided => filter((&p.x, x), (&p.y, y), (wsp, ws_bytes)),
            // s and gy into their copies, the filter gradient from them
            CudnnStaging::Packed => copy(&p.x, x, &p.xp, b_copy)
                .and_then(|()| copy(&p.y, y, &p.yp, k_copy))
                .and_then(|()| filter((&p.xp, b_copy), (&p.yp, k_copy), (after_copies, rest))),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` plans a pass on the strides where cuDNN offers an algorithm there and on packed
    /// copies only where it does not (an error then names both refusals); a pinned staging
    /// never falls back, and never asks the other.
    #[test]
    fn a_pass_falls_back_to_packed_copies_only_where_the_strides_are_refused() {
        let ok = |v: u8| move || -> candle_core::Result<u8> { Ok(v) };
        let refused =
            |why: &'static str| move || -> candle_core::Result<u8> { Err(msg(why.to_string())) };
        let never = || -> candle_core::Result<u8> { panic!("asked a staging that is pinned off") };
        use CudnnStaging::{Packed, Strided};
        assert_eq!(staged(None, ok(1), never).unwrap(), (1, Strided));
        assert_eq!(staged(None, refused("no"), ok(2)).unwrap(), (2, Packed));
        let e = staged(None, refused("strides refused"), refused("copies refused"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("on the channel-major strides: strides refused")
                && e.contains("on packed copies: copies refused"),
            "{e}"
        );
        assert_eq!(staged(Some(Strided), ok(3), never).unwrap(), (3, Strided));
        let e = staged(Some(Strided), refused("strides refused"), never)
            .unwrap_err()
            .to_string();
        assert!(e.contains("strides refused"), "{e}");
        assert_eq!(staged(Some(Packed), never, ok(4)).unwrap(), (4, Packed));
    }
}
