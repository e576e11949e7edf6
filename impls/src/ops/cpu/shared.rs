//! What the CPU kernels (the op families of `ops`) share: the float type they run
//! on, the raw pointer their parallel tasks write one output through, `gemm`'s tuning, and
//! whether the CPU takes its own kernels or the GPU's path on this thread ([`cpu_kernels`]), the
//! new tensors a kernel writes whole (`unfilled`), and the element types a feature map is stored
//! in ([`Elem`]: f32, f64, bf16) with the float type each computes in.
//!
//! The element loops of the kernels (BN statistics, apply and backward, ReLU, the 3×3
//! convolution's tile copies, the bf16 products' widening and rounding) are compiled three
//! times — for AVX-512 (F, BW, VL), for AVX2 with FMA, and for the x86-64 baseline (SSE2) — one
//! picked at run time by the `multiversion` attribute: on `lane_sums`, `block_sums` and the loop helpers
//! `fill_from`, `map_each`, `zip1`, `zip2`, `zip3`, which take the per-element work
//! as a small closure that inlines into each version (a closure holding a whole loop, such as
//! rayon's per-row one, is not inlined and would keep the baseline's code). Built for the
//! baseline alone, the bf16 conversions and selects
//! vectorized two elements at a time, and a bf16 bc step took ×1.43 the time of the same code
//! built for AVX-512 (BC-100 L=16, 1 thread); the same operations in the same order, so the
//! same bits on every version (no target feature lets Rust contract or reassociate floats).

use candle_core::{CpuStorage, DType, Device, Shape, Tensor};
use std::cell::Cell;

thread_local! {
    /// Set inside [`crate::layer::with_tap_stack_on_cpu`].
    pub(crate) static TAP_STACK_ON_CPU: Cell<bool> = const { Cell::new(false) };
}

/// Whether operands on `dev` take the CPU's own kernels on this thread
/// ([`crate::model::trace::Kernels::Cpu`]; else the tap stack's path, the GPU's, which
/// [`crate::layer::with_tap_stack_on_cpu`] has the CPU take).
pub fn cpu_kernels(dev: &Device) -> bool {
    dev.is_cpu() && !TAP_STACK_ON_CPU.with(Cell::get)
}

/// A new tensor of uninitialised memory, for an output that the caller writes whole before any
/// element of it is read (a shift kernel's output, a product with β = 0 that does not read its
/// destination). Same allocation as [`Tensor::zeros`], without its fill: on a GPU a memset
/// launch over the whole tensor (the 3×3 convolution's tap products and stacked gradients,
/// `[9k, ·]`, 28 MB per layer on BC-100's block) that the kernel then overwrites.
///
/// Debug builds fill it with NaN on the CPU (see the body), so the tests catch a read of an
/// element before its write.
///
/// # Safety
/// Every element must be written before any is read; callers say how at each call.
pub(crate) unsafe fn unfilled(
    shape: impl Into<Shape>,
    dtype: DType,
    device: &Device,
    what: &'static str,
) -> crate::error::Result<Tensor> {
    use crate::error::CandleContext;
    // Debug builds (the tests) fill CPU tensors with NaN instead, one allocation as in a
    // release build: an element read before it is written then shows in every result made
    // from it, where fresh memory, often zero, would hide it.
    if cfg!(debug_assertions) && device.is_cpu() {
        match dtype {
            DType::F32 => return Tensor::full(f32::NAN, shape, device).ctx(what),
            DType::F64 => return Tensor::full(f64::NAN, shape, device).ctx(what),
            DType::BF16 => return Tensor::full(half::bf16::NAN, shape, device).ctx(what),
            _ => {}
        }
    }
    // SAFETY: the caller's contract; f32, f64 and bf16 have no invalid bit patterns.
    unsafe { Tensor::empty(shape, dtype, device) }.ctx(what)
}

/// A float type the CPU kernels run on (f32 and f64), also a feature type of its own.
pub trait Float:
    Elem<Acc = Self>
    + Copy
    + Send
    + Sync
    + Default
    + PartialOrd
    + std::ops::Add<Output = Self>
    + std::ops::Mul<Output = Self>
    + std::ops::Sub<Output = Self>
    + std::ops::Div<Output = Self>
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    /// The value as f64 (exact).
    fn f64(self) -> f64;
    /// The nearest f32 (exact for f32).
    fn f32(self) -> f32;
    /// The nearest value to `v`.
    fn of(v: f64) -> Self;
    /// The correctly rounded square root.
    fn sqrt(self) -> Self;
}
impl Float for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn f64(self) -> f64 {
        f64::from(self)
    }
    fn f32(self) -> f32 {
        self
    }
    fn of(v: f64) -> Self {
        v as f32
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
}
impl Float for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn f64(self) -> f64 {
        self
    }
    fn f32(self) -> f32 {
        self as f32
    }
    fn of(v: f64) -> Self {
        v
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
}

/// Partial sums [`lane_sums`] keeps per output: eight f64 lanes (one AVX-512 register) twice
/// over, so that consecutive additions do not wait on each other.
const SUM_LANES: usize = 16;

/// Elements [`lane_sums`] evaluates into a buffer before adding them into its lanes, and
/// [`block_sums`] folds in f32 before widening them.
const SUM_BLOCK: usize = 256;

/// `K` sums over the paired elements of `a` and `b` (the shorter's length) of `f(a[j], b[j])`,
/// in f64, each as [`SUM_LANES`] interleaved partial sums added pairwise at the end. A
/// sequential f64 sum of a feature row waits one addition's latency per element: BN's
/// statistics and its backward's two sums took about a sixth of a 1-thread bc
/// `cat-store-copy` step's own CPU time that way (perf, BC-100 L=16). The order is fixed by
/// the row's length alone, so a row's sums are the same bits on every call and thread count.
///
/// Each block of [`SUM_BLOCK`] elements is evaluated first into a buffer per sum (a plain map
/// over the block, which the loop vectorizer widens to whole registers), then
/// added into the lanes (lane `l` takes elements `l`, `l + 16`, … in order, as before). Adding
/// `f`'s values straight into the lanes left the vectorizing to the SLP pass, which built
/// 2-wide vectors from 4-byte loads and kept partial sums on the stack. Measured with the
/// `bn_shapes` example (`[204, 65536]`, 1 thread, AMD EPYC Zen 4): bf16 statistics 7.2 → 5.2
/// ms, the f32 backward reduction 9.9 → 5.7–6.7 ms; the same bits (the order is unchanged).
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma"
))]
pub(crate) fn lane_sums<A: Copy, B: Copy, const K: usize>(
    a: &[A],
    b: &[B],
    f: impl Fn(A, B) -> [f64; K],
) -> [f64; K] {
    let n = a.len().min(b.len());
    let full = n - n % SUM_LANES;
    let mut acc = [[0f64; SUM_LANES]; K];
    let mut buf = [[0f64; SUM_BLOCK]; K];
    for (ca, cb) in a[..full].chunks(SUM_BLOCK).zip(b[..full].chunks(SUM_BLOCK)) {
        // a whole number of lanes (`full` is, and so is SUM_BLOCK)
        let len = eval_block(ca, cb, &mut buf, &f);
        for (acc, buf) in acc.iter_mut().zip(&buf) {
            // the lanes in a local (registers) and the block as whole arrays (no bounds
            // checks between the lanes' loads)
            let mut lanes = *acc;
            for c in buf[..len].as_chunks::<SUM_LANES>().0 {
                for l in 0..SUM_LANES {
                    lanes[l] += c[l];
                }
            }
            *acc = lanes;
        }
    }
    let mut out = acc.map(pairwise);
    for (x, y) in a[full..n].iter().zip(&b[full..n]) {
        let v = f(*x, *y);
        for k in 0..K {
            out[k] += v[k];
        }
    }
    out
}

/// `K` sums of f32 terms `f(a[j], b[j])` over the paired elements of `a` and `b` (the shorter's
/// length), the way PyTorch autocast's kernels sum bf16 features' terms (in f32), blocked so that
/// no f32 sum runs long: each block of [`SUM_BLOCK`] terms (the last padded with +0) is folded
/// pairwise in f32 — `t[i] + t[i + 128]`, then `+ t[i + 64]`, 32, 16 — to [`SUM_LANES`] values,
/// each widened and added in f64 to its lane's running sum; the lanes are added pairwise at the
/// end, as in [`lane_sums`]. Each term passes through four f32 additions (at most
/// `4·2⁻²⁴·Σ|terms|` over a row, beside the terms' own roundings), and the order is fixed by the
/// row's length alone, so a row's sums are the same bits on every call and thread count.
/// [`lane_sums`]' f64 arithmetic ran at half this rate on bf16 features, whose terms are
/// computed in f32 anyway.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma"
))]
pub(crate) fn block_sums<A: Copy, B: Copy, const K: usize>(
    a: &[A],
    b: &[B],
    f: impl Fn(A, B) -> [f32; K],
) -> [f64; K] {
    let n = a.len().min(b.len());
    let mut acc = [[0f64; SUM_LANES]; K];
    let mut buf = [[0f32; SUM_BLOCK]; K];
    for (ca, cb) in a[..n].chunks(SUM_BLOCK).zip(b[..n].chunks(SUM_BLOCK)) {
        let len = eval_block(ca, cb, &mut buf, &f);
        for (acc, buf) in acc.iter_mut().zip(&mut buf) {
            buf[len..].fill(0.0);
            let mut w = SUM_BLOCK;
            while w > SUM_LANES {
                w /= 2;
                let (lo, hi) = buf.split_at_mut(w);
                for (l, h) in lo.iter_mut().zip(&hi[..w]) {
                    *l += *h;
                }
            }
            for (s, &v) in acc.iter_mut().zip(&buf[..SUM_LANES]) {
                *s += f64::from(v);
            }
        }
    }
    acc.map(pairwise)
}

/// `f` of the paired elements of one block (at most `N`) into one buffer per sum; returns how
/// many: the map that [`lane_sums`] and [`block_sums`] leave to the loop vectorizer.
#[inline(always)]
fn eval_block<A: Copy, B: Copy, V: Copy, const K: usize, const N: usize>(
    a: &[A],
    b: &[B],
    buf: &mut [[V; N]; K],
    f: &impl Fn(A, B) -> [V; K],
) -> usize {
    let len = a.len().min(b.len()).min(N);
    let (a, b) = (&a[..len], &b[..len]);
    for i in 0..len {
        let v = f(a[i], b[i]);
        for k in 0..K {
            buf[k][i] = v[k];
        }
    }
    len
}

/// Sixteen lane sums added pairwise (lane l += lane l + 8, then + 4, + 2, + 1).
#[inline(always)]
fn pairwise(mut s: [f64; SUM_LANES]) -> f64 {
    let mut w = SUM_LANES;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            s[l] += s[l + w];
        }
    }
    s[0]
}

/// Writes `it`'s values into `out` in order until either ends; returns how many were written.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma"
))]
pub(crate) fn fill_from<T, I: Iterator<Item = T>>(
    out: &mut [std::mem::MaybeUninit<T>],
    it: I,
) -> usize {
    let mut written = 0;
    for (o, v) in out.iter_mut().zip(it) {
        o.write(v);
        written += 1;
    }
    written
}

/// `x = f(x)` for every element.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma"
))]
pub(crate) fn map_each<A: Copy>(xs: &mut [A], f: impl Fn(A) -> A) {
    for x in xs {
        *x = f(*x);
    }
}

/// `d[i] = f(d[i], a[i])` over the shorter of the two.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma"
))]
pub(crate) fn zip1<D: Copy, A: Copy>(d: &mut [D], a: &[A], f: impl Fn(D, A) -> D) {
    for (d, &a) in d.iter_mut().zip(a) {
        *d = f(*d, a);
    }
}

/// `d[i] = f(d[i], a[i], b[i])` over the shortest.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma"
))]
pub(crate) fn zip2<D: Copy, A: Copy, B: Copy>(
    d: &mut [D],
    a: &[A],
    b: &[B],
    f: impl Fn(D, A, B) -> D,
) {
    for ((d, &a), &b) in d.iter_mut().zip(a).zip(b) {
        *d = f(*d, a, b);
    }
}

/// `d[i] = f(d[i], a[i], b[i], c[i])` over the shortest.
#[multiversion::multiversion(targets(
    "x86_64+avx512f+avx512bw+avx512vl+avx2+fma",
    "x86_64+avx2+fma"
))]
pub(crate) fn zip3<D: Copy, A: Copy, B: Copy, C: Copy>(
    d: &mut [D],
    a: &[A],
    b: &[B],
    c: &[C],
    f: impl Fn(D, A, B, C) -> D,
) {
    for (((d, &a), &b), &c) in d.iter_mut().zip(a).zip(b).zip(c) {
        *d = f(*d, a, b, c);
    }
}

/// How a feature map (activations and their gradients) is stored: f32 or f64, computed in
/// itself, or bf16 (PyTorch autocast's features), computed in f32. The kernels read a feature as
/// [`Elem::widen`] (exact), compute in [`Elem::Acc`] — per-channel tables, parameters and
/// statistics are `Acc` too — and write a feature once, [`Elem::narrow`] (round to nearest,
/// ties to even). For f32 and f64 both are the identity, so their results are the bits they
/// were before bf16 existed.
pub trait Elem: Copy + Send + Sync + PartialOrd + 'static {
    /// The float type the kernels compute in and per-channel tables are stored in.
    type Acc: Float;
    /// +0 (named apart from [`Float::ZERO`], which every `Float` also has).
    const POS_ZERO: Self;
    /// Stored narrower than computed (bf16): the passes that f32 and f64 features evaluate in
    /// f64 (BN backward's `A·gy + B·x + C`, rounded once; its sums Σgy and Σgy·x̂) evaluate in
    /// the compute type instead, f32, as PyTorch autocast's kernels do — the result is rounded
    /// to bf16 anyway, and f64 arithmetic took twice as long there (`bn_backward::dx_value`,
    /// `block_sums`).
    const NARROW: bool;
    /// The value in the compute type (exact).
    fn widen(self) -> Self::Acc;
    /// The nearest value to `v` (round to nearest, ties to even; exact for f32 and f64).
    fn narrow(v: Self::Acc) -> Self;
    /// `self > +0`, false for NaN (ReLU's test), without a branch: `half`'s comparison of bf16
    /// branches on NaN and sign, which kept the ReLU loops scalar.
    fn is_positive(self) -> bool;
    /// The storage's elements when it holds this type.
    fn in_storage(s: &CpuStorage) -> Option<&[Self]>;
    /// The storage's elements, writable, when it holds this type.
    fn in_storage_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    /// A CPU storage holding `v`.
    fn storage(v: Vec<Self>) -> CpuStorage;
}
impl Elem for f32 {
    type Acc = f32;
    const POS_ZERO: Self = 0.0;
    const NARROW: bool = false;
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
    #[inline(always)]
    fn narrow(v: f32) -> Self {
        v
    }
    #[inline(always)]
    fn is_positive(self) -> bool {
        self > 0.0
    }
    fn in_storage(s: &CpuStorage) -> Option<&[Self]> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
    fn in_storage_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
    fn storage(v: Vec<Self>) -> CpuStorage {
        CpuStorage::F32(v)
    }
}
impl Elem for f64 {
    type Acc = f64;
    const POS_ZERO: Self = 0.0;
    const NARROW: bool = false;
    #[inline(always)]
    fn widen(self) -> f64 {
        self
    }
    #[inline(always)]
    fn narrow(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn is_positive(self) -> bool {
        self > 0.0
    }
    fn in_storage(s: &CpuStorage) -> Option<&[Self]> {
        match s {
            CpuStorage::F64(v) => Some(v),
            _ => None,
        }
    }
    fn in_storage_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
        match s {
            CpuStorage::F64(v) => Some(v),
            _ => None,
        }
    }
    fn storage(v: Vec<Self>) -> CpuStorage {
        CpuStorage::F64(v)
    }
}
/// `half::bf16::to_f32`, bit for bit (a NaN made quiet, as `half` does), without a branch:
/// `half`'s branch on NaN kept the element-wise kernels' loops scalar, and the conversions
/// took about a quarter of a bf16 bc step (perf, BC-100 L=16, 1 thread).
#[inline(always)]
pub fn bf16_to_f32(v: half::bf16) -> f32 {
    let b = v.to_bits();
    let quiet = u32::from(b & 0x7fff > 0x7f80) << 22;
    f32::from_bits(((b as u32) << 16) | quiet)
}

/// `half::bf16::from_f32`, bit for bit (round to nearest, ties to even; a NaN keeps its high
/// mantissa bits and is made quiet), without a branch (see [`bf16_to_f32`]).
#[inline(always)]
pub fn f32_to_bf16(v: f32) -> half::bf16 {
    let x = v.to_bits();
    // up when the dropped half is above one half, or exactly one half and the kept part odd
    let up = u32::from(x & 0x8000 != 0 && x & 0x1_7fff != 0);
    let rounded = (x >> 16).wrapping_add(up);
    let nan = (x >> 16) | 0x40;
    half::bf16::from_bits(if x & 0x7fff_ffff > 0x7f80_0000 {
        nan
    } else {
        rounded
    } as u16)
}

impl Elem for half::bf16 {
    type Acc = f32;
    const POS_ZERO: Self = half::bf16::ZERO;
    const NARROW: bool = true;
    #[inline(always)]
    fn widen(self) -> f32 {
        bf16_to_f32(self)
    }
    #[inline(always)]
    fn narrow(v: f32) -> Self {
        // round to nearest, ties to even (NaN stays NaN)
        f32_to_bf16(v)
    }
    #[inline(always)]
    fn is_positive(self) -> bool {
        // the positive values are the bit patterns 0x0001 (least subnormal) ..= 0x7f80 (+inf);
        // +0, NaNs and everything with the sign bit set lie outside
        self.to_bits().wrapping_sub(1) < 0x7f80
    }
    fn in_storage(s: &CpuStorage) -> Option<&[Self]> {
        match s {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }
    fn in_storage_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
        match s {
            CpuStorage::BF16(v) => Some(v),
            _ => None,
        }
    }
    fn storage(v: Vec<Self>) -> CpuStorage {
        CpuStorage::BF16(v)
    }
}

/// A raw pointer that parallel tasks share. Each user partitions the output so that no two
/// tasks write the same element and none reads what another writes (each says how at its use).
#[derive(Clone, Copy)]
pub(crate) struct SharedPtr<T>(pub(crate) *mut T);
// SAFETY: see the type's contract: disjoint writes, no reads of what another task writes.
unsafe impl<T: Send> Send for SharedPtr<T> {}
unsafe impl<T: Send> Sync for SharedPtr<T> {}
impl<T> SharedPtr<T> {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper, not its field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Sets `gemm`'s one process-wide heuristic the CPU products are tuned for (once; later calls
/// return at once): a single-threaded product packs its left operand whenever the product has
/// more than one micro-panel of columns (`gemm`'s default: more than eight). A bc Conv1×1
/// forward, `W [48, C] · X [C, N·H·W]`, has exactly eight: unpacked, `gemm` read `X` with a
/// stride of a whole channel (256 KiB) per step of the inner dimension, 26 GFLOP/s against 43
/// packed on BC-100's `[48, 204] · [204, 65536]` (1 thread); the whole bc step ~7% faster, the 3×3
/// kernel's products ~3% slower, the mlp's unchanged (64 columns are packed either way).
/// Packing copies operands; it never changes a sum, so results are the same bits either way.
pub(crate) fn tune_gemm() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| gemm::set_lhs_packing_threshold_single_thread(1));
}

/// Every element's bits (as f64, exact for f32 and f64), for comparisons bit for bit (the
/// crate's tests and the test binaries).
pub fn tensor_bits(t: &candle_core::Tensor) -> candle_core::Result<Vec<u64>> {
    Ok(t.to_dtype(candle_core::DType::F64)?
        .flatten_all()?
        .to_vec1::<f64>()?
        .into_iter()
        .map(f64::to_bits)
        .collect())
}

/// [`tensor_bits`] for the crate's tests.
#[cfg(test)]
pub(crate) fn bits(t: &candle_core::Tensor) -> Vec<u64> {
    tensor_bits(t).unwrap()
}

/// `f` run in a rayon pool of `threads` threads (the crate's tests of thread-count independence).
#[cfg(test)]
pub(crate) fn in_pool<R: Send>(threads: usize, f: impl FnOnce() -> R + Send) -> R {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a rayon pool for the test")
        .install(f)
}

/// A standard-normal CPU tensor of `dtype` (drawn in f32, so f32 and f64 tests see the same
/// values), for tests.
#[cfg(test)]
pub(crate) fn randn<S: Into<candle_core::Shape>>(
    shape: S,
    dtype: candle_core::DType,
) -> candle_core::Tensor {
    candle_core::Tensor::randn(0f32, 1.0, shape, &candle_core::Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    /// bf16 narrowing rounds to nearest with ties to even, widening is exact, and f32 and f64
    /// are their own compute type (identities).
    #[test]
    fn bf16_narrows_to_nearest_even_and_widens_exactly() {
        let step = 1.0 / 128.0; // one bf16 ulp at 1
                                // halfway between 1 (even) and 1 + step (odd): to 1; between 1 + step and 1 + 2·step
                                // (even): up
        assert_eq!(bf16::narrow(1.0 + step / 2.0).to_f32(), 1.0);
        assert_eq!(bf16::narrow(1.0 + 1.5 * step).to_f32(), 1.0 + 2.0 * step);
        // just above a tie: up; just below: down
        assert_eq!(
            bf16::narrow(1.0 + step / 2.0 + f32::EPSILON).to_f32(),
            1.0 + step
        );
        assert_eq!(bf16::narrow(1.0 + step / 2.0 - f32::EPSILON).to_f32(), 1.0);
        assert!(bf16::narrow(f32::NAN).is_nan());
        for bits in [0u16, 0x8000, 0x3f81, 0xc2f7, 0x0001, 0x7f7f, 0x7f80] {
            let v = bf16::from_bits(bits);
            assert_eq!(
                bf16::narrow(v.widen()).to_bits(),
                bits,
                "round trip {bits:#x}"
            );
        }
        assert_eq!(
            <f32 as Elem>::narrow(0.1f32.widen()).to_bits(),
            0.1f32.to_bits()
        );
        assert_eq!(
            <f64 as Elem>::narrow(0.1f64.widen()).to_bits(),
            0.1f64.to_bits()
        );
    }

    /// The branch-free conversions are `half`'s bit for bit: every bf16 widened, and every
    /// f32 whose low half is one of the patterns rounding distinguishes (zero, one below and
    /// above a tie, the tie, all ones, and a few others) narrowed, for every high half (all
    /// signs, exponents, NaNs and infinities).
    #[test]
    fn branch_free_conversions_are_halfs() {
        for b in 0..=u16::MAX {
            let v = bf16::from_bits(b);
            assert_eq!(
                bf16_to_f32(v).to_bits(),
                v.to_f32().to_bits(),
                "widen {b:#06x}"
            );
        }
        let lows = [
            0u32, 1, 0x3fff, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xffff, 0x1234,
        ];
        for hi in 0..=u16::MAX as u32 {
            for lo in lows {
                let f = f32::from_bits(hi << 16 | lo);
                assert_eq!(
                    f32_to_bf16(f).to_bits(),
                    bf16::from_f32(f).to_bits(),
                    "narrow {:#010x}",
                    f.to_bits()
                );
            }
        }
    }

    /// `is_positive` is `x > +0` of `half`'s comparison for every bf16.
    #[test]
    fn bf16_is_positive_is_greater_than_zero() {
        for b in 0..=u16::MAX {
            let v = bf16::from_bits(b);
            assert_eq!(v.is_positive(), v > bf16::ZERO, "{b:#06x}");
        }
    }

    /// Debug builds fill a new bf16 CPU tensor with NaN, like f32 and f64.
    #[test]
    fn unfilled_bf16_is_nan_in_debug_builds() {
        // SAFETY: only read to check the debug fill (bf16 has no invalid bit patterns).
        let t = unsafe { unfilled((2, 3), DType::BF16, &Device::Cpu, "test") }.unwrap();
        assert_eq!(t.dtype(), DType::BF16);
        if cfg!(debug_assertions) {
            let v = t.flatten_all().unwrap().to_vec1::<bf16>().unwrap();
            assert!(v.iter().all(|x| x.is_nan()), "{v:?}");
        }
    }

    /// Every length around the lane count (the tail loop, no full chunk, several) and two sums
    /// at once: each within the f64 bound of a different summation order of a sequential sum,
    /// and a term dropped or counted twice (O(1)) far outside it.
    #[test]
    fn lane_sums_are_the_sums_of_every_element() {
        for n in [0usize, 1, 7, 15, 16, 17, 31, 33, 1000] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.37)
                .collect();
            let b: Vec<f32> = (0..n).map(|i| (i % 5) as f32 + 0.5).collect();
            let [s, t] = lane_sums(&a, &b, |x, y| [f64::from(x), f64::from(x) * f64::from(y)]);
            let s0: f64 = a.iter().map(|&x| f64::from(x)).sum();
            let t0: f64 = a
                .iter()
                .zip(&b)
                .map(|(&x, &y)| f64::from(x) * f64::from(y))
                .sum();
            let scale: f64 = a.iter().map(|&x| f64::from(x).abs() * 3.0).sum::<f64>() + 1.0;
            let bound = (n as f64 + 1.0) * f64::EPSILON * scale;
            assert!((s - s0).abs() <= bound, "n = {n}: Σa {s} vs {s0}");
            assert!((t - t0).abs() <= bound, "n = {n}: Σab {t} vs {t0}");
        }
        // the shorter slice's length
        let [s] = lane_sums(&[1f32; 40], &[0f32; 21], |x, _| [f64::from(x)]);
        assert_eq!(s, 21.0);
    }

    /// The order [`lane_sums`] promises, restated plainly: lane `l` adds elements `l`, `l + 16`,
    /// … of the whole lanes in turn, the lanes are added pairwise (8 + 8, 4 + 4, …), then the
    /// tail in order — bit for bit, on lengths that end inside, at and past a block of
    /// [`SUM_BLOCK`] and several blocks, with terms of mixed magnitudes (so that another
    /// order gives other bits: checked on the plain sequential sum).
    #[test]
    fn lane_sums_add_in_the_interleaved_order() {
        let mut differs = false;
        for n in [15usize, 16, 255, 256, 257, 272, 511, 1000, 4099] {
            let a: Vec<f64> = (0..n)
                .map(|i| ((i * 7919 % 1009) as f64 - 504.0) * 10f64.powi((i % 9) as i32 - 4))
                .collect();
            let b: Vec<f64> = (0..n).map(|i| 1.0 + (i % 13) as f64 / 7.0).collect();
            let [s, t] = lane_sums(&a, &b, |x, y| [x, x * y]);
            let plain = |f: &dyn Fn(usize) -> f64| {
                let full = n - n % SUM_LANES;
                let mut lanes = [0f64; SUM_LANES];
                for i in 0..full {
                    lanes[i % SUM_LANES] += f(i);
                }
                let mut w = SUM_LANES;
                while w > 1 {
                    w /= 2;
                    for l in 0..w {
                        lanes[l] += lanes[l + w];
                    }
                }
                (full..n).fold(lanes[0], |acc, i| acc + f(i))
            };
            assert_eq!(s.to_bits(), plain(&|i| a[i]).to_bits(), "n = {n}: Σa");
            assert_eq!(
                t.to_bits(),
                plain(&|i| a[i] * b[i]).to_bits(),
                "n = {n}: Σab"
            );
            differs |= s.to_bits() != a.iter().sum::<f64>().to_bits();
        }
        assert!(
            differs,
            "the terms must tell one summation order from another"
        );
    }

    /// [`block_sums`]' order restated plainly (blocks of 256 f32 terms padded with +0, folded
    /// by halves to 16 in f32, widened into 16 f64 lanes, the lanes added pairwise), bit for
    /// bit on lengths around and past a block, two sums at once; the shorter slice's length.
    #[test]
    fn block_sums_fold_each_block_in_f32_then_add_in_f64() {
        for n in [0usize, 1, 15, 16, 255, 256, 257, 700, 4099] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 10f32.powi((i % 7) as i32 - 3))
                .collect();
            let b: Vec<f32> = (0..n).map(|i| 1.0 + (i % 13) as f32 / 7.0).collect();
            let [s, t] = block_sums(&a, &b, |x, y| [x, x * y]);
            let plain = |f: &dyn Fn(usize) -> f32| {
                let mut lanes = [0f64; SUM_LANES];
                for start in (0..n).step_by(SUM_BLOCK) {
                    let mut blk = [0f32; SUM_BLOCK];
                    for (j, v) in blk.iter_mut().enumerate().take((n - start).min(SUM_BLOCK)) {
                        *v = f(start + j);
                    }
                    let mut w = SUM_BLOCK;
                    while w > SUM_LANES {
                        w /= 2;
                        for i in 0..w {
                            blk[i] += blk[i + w];
                        }
                    }
                    for (l, v) in lanes.iter_mut().zip(&blk) {
                        *l += f64::from(*v);
                    }
                }
                let mut w = SUM_LANES;
                while w > 1 {
                    w /= 2;
                    for l in 0..w {
                        lanes[l] += lanes[l + w];
                    }
                }
                lanes[0]
            };
            assert_eq!(s.to_bits(), plain(&|i| a[i]).to_bits(), "n = {n}: Σa");
            assert_eq!(
                t.to_bits(),
                plain(&|i| a[i] * b[i]).to_bits(),
                "n = {n}: Σab"
            );
        }
        let [s] = block_sums(&[1f32; 300], &[0f32; 257], |x, _| [x]);
        assert_eq!(s, 257.0);
    }
}
