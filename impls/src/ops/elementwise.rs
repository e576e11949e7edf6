//! Element-wise kernels candle-core lacks: in-place ReLU, ReLU backward (copy and in place) and
//! in-place accumulation. Every in-place write is documented on the function that does it.
//!
//! They are candle custom ops so they run on candle tensors and respect views (a narrowed prefix
//! of a buffer is written through its layout's offset). The CPU versions are here; the CUDA
//! versions (NVRTC kernels, `cuda` feature) are in `ops/cuda/elementwise.rs`, so the variants keep their
//! in-place memory behaviour on a GPU. Without a port an op returns candle's typed "no cuda
//! implementation" error, never a panic.
//!
//! On the CPU every op here takes f32, f64 or bf16 (all operands one dtype): the ReLUs and the
//! copies are exact in any dtype (a selection or a move of the stored bits); [`add_assign`] of
//! bf16 is `bf16(f32(dst) + f32(src))`, rounded once ([`Elem`]).

use crate::error::{CandleContext, Result};
use crate::ops::cpu::shared::{fill_from, map_each, zip1, Elem, SharedPtr};
use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, InplaceOp1, InplaceOp2, Layout, Shape, Storage, Tensor,
};
use rayon::prelude::*;

/// Elements per rayon task: large enough that scheduling is noise next to the memory traffic.
const PAR_CHUNK: usize = 1 << 15;

fn contiguous_range(l: &Layout, op: &'static str) -> candle_core::Result<(usize, usize)> {
    l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "{op}: operand must be contiguous, got strides {:?}",
            l.stride()
        ))
    })
}

// `Elem::is_positive` (x > 0, false for NaN): ReLU maps NaN to 0 and masks the gradient where
// the output is NaN.
// The loops below are written as selects (`if p { a } else { b }` on values), not as branches
// around a store: ReLU inputs are positive about half the time at random, and a mispredicted
// branch per element made these kernels 4× slower than a plain copy.

fn relu_slice<E: Elem>(xs: &mut [E]) {
    xs.par_chunks_mut(PAR_CHUNK).for_each(|c| {
        map_each(c, |x| if x.is_positive() { x } else { E::POS_ZERO });
    });
}

/// `max(x, 0)` into a new vector, NaN to 0 like [`relu_slice`].
fn relu_new<E: Elem>(xs: &[E]) -> Vec<E> {
    new_chunks(xs.len(), PAR_CHUNK, |r| {
        chunk_of(xs, r)
            .iter()
            .map(|x| if x.is_positive() { *x } else { E::POS_ZERO })
    })
}

/// Chunk `r` of [`PAR_CHUNK`] elements of `v` (the last one shorter).
fn chunk_of<T>(v: &[T], r: usize) -> &[T] {
    &v[r * PAR_CHUNK..v.len().min((r + 1) * PAR_CHUNK)]
}

/// `dst[i] = out[i] > 0 ? g[i] : 0`: the ReLU derivative taken from the output, the only thing
/// an in-place ReLU leaves behind.
fn relu_bwd_new<E: Elem>(g: &[E], out: &[E]) -> Vec<E> {
    let len = g.len().min(out.len());
    new_chunks(len, PAR_CHUNK, |r| {
        chunk_of(&g[..len], r)
            .iter()
            .zip(chunk_of(&out[..len], r))
            .map(|(g, o)| if o.is_positive() { *g } else { E::POS_ZERO })
    })
}

fn relu_bwd_inplace_slice<E: Elem>(g: &mut [E], out: &[E]) {
    g.par_chunks_mut(PAR_CHUNK)
        .zip(out.par_chunks(PAR_CHUNK))
        .for_each(|(g, o)| {
            zip1(g, o, |g, o| if o.is_positive() { g } else { E::POS_ZERO });
        });
}

/// `dst += src` in the compute type, rounded once (the identity for f32 and f64).
fn add_assign_slice<E: Elem>(dst: &mut [E], src: &[E]) {
    dst.par_chunks_mut(PAR_CHUNK)
        .zip(src.par_chunks(PAR_CHUNK))
        .for_each(|(d, s)| {
            zip1(d, s, |d, s| E::narrow(d.widen() + s.widen()));
        });
}

fn unsupported(op: &str, s: &CpuStorage) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: dtype {:?} unsupported (f32, f64, bf16 only, all operands one dtype)",
        s.dtype()
    ))
}

struct ReluInplace;
impl InplaceOp1 for ReluInplace {
    fn name(&self) -> &'static str {
        "relu-inplace"
    }
    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        let (a, b) = contiguous_range(l, self.name())?;
        match s {
            CpuStorage::F32(v) => relu_slice(&mut v[a..b]),
            CpuStorage::F64(v) => relu_slice(&mut v[a..b]),
            CpuStorage::BF16(v) => relu_slice(&mut v[a..b]),
            other => return Err(unsupported(self.name(), other)),
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> candle_core::Result<()> {
        crate::ops::cuda::elementwise::relu_inplace(self.name(), s, l)
    }
}

struct ReluCopy;
impl CustomOp1 for ReluCopy {
    fn name(&self) -> &'static str {
        "relu"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (a, b) = contiguous_range(l, self.name())?;
        let out = match s {
            CpuStorage::F32(v) => CpuStorage::F32(relu_new(&v[a..b])),
            CpuStorage::F64(v) => CpuStorage::F64(relu_new(&v[a..b])),
            CpuStorage::BF16(v) => CpuStorage::BF16(relu_new(&v[a..b])),
            other => return Err(unsupported(self.name(), other)),
        };
        Ok((out, l.shape().clone()))
    }
}

struct ReluBwd;
impl CustomOp2 for ReluBwd {
    fn name(&self) -> &'static str {
        "relu-bwd"
    }
    fn cpu_fwd(
        &self,
        g: &CpuStorage,
        lg: &Layout,
        out: &CpuStorage,
        lo: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (ga, gb) = contiguous_range(lg, self.name())?;
        let (oa, ob) = contiguous_range(lo, self.name())?;
        let res = match (g, out) {
            (CpuStorage::F32(g), CpuStorage::F32(o)) => {
                CpuStorage::F32(relu_bwd_new(&g[ga..gb], &o[oa..ob]))
            }
            (CpuStorage::F64(g), CpuStorage::F64(o)) => {
                CpuStorage::F64(relu_bwd_new(&g[ga..gb], &o[oa..ob]))
            }
            (CpuStorage::BF16(g), CpuStorage::BF16(o)) => {
                CpuStorage::BF16(relu_bwd_new(&g[ga..gb], &o[oa..ob]))
            }
            (other, _) => return Err(unsupported(self.name(), other)),
        };
        Ok((res, lg.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        g: &candle_core::CudaStorage,
        lg: &Layout,
        out: &candle_core::CudaStorage,
        lo: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::ops::cuda::elementwise::relu_bwd(self.name(), g, lg, out, lo)
    }
}

struct ReluBwdInplace;
impl InplaceOp2 for ReluBwdInplace {
    fn name(&self) -> &'static str {
        "relu-bwd-inplace"
    }
    fn cpu_fwd(
        &self,
        g: &mut CpuStorage,
        lg: &Layout,
        out: &CpuStorage,
        lo: &Layout,
    ) -> candle_core::Result<()> {
        let (ga, gb) = contiguous_range(lg, self.name())?;
        let (oa, ob) = contiguous_range(lo, self.name())?;
        match (g, out) {
            (CpuStorage::F32(g), CpuStorage::F32(o)) => {
                relu_bwd_inplace_slice(&mut g[ga..gb], &o[oa..ob])
            }
            (CpuStorage::F64(g), CpuStorage::F64(o)) => {
                relu_bwd_inplace_slice(&mut g[ga..gb], &o[oa..ob])
            }
            (CpuStorage::BF16(g), CpuStorage::BF16(o)) => {
                relu_bwd_inplace_slice(&mut g[ga..gb], &o[oa..ob])
            }
            (other, _) => return Err(unsupported(self.name(), other)),
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        g: &mut candle_core::CudaStorage,
        lg: &Layout,
        out: &candle_core::CudaStorage,
        lo: &Layout,
    ) -> candle_core::Result<()> {
        use crate::ops::cuda::elementwise::{inplace2, Inplace2};
        inplace2(Inplace2::ReluBwd, self.name(), g, lg, out, lo)
    }
}

struct AddAssign;
impl InplaceOp2 for AddAssign {
    fn name(&self) -> &'static str {
        "add-assign"
    }
    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        ld: &Layout,
        src: &CpuStorage,
        ls: &Layout,
    ) -> candle_core::Result<()> {
        let (da, db) = contiguous_range(ld, self.name())?;
        let (sa, sb) = contiguous_range(ls, self.name())?;
        match (dst, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => {
                add_assign_slice(&mut d[da..db], &s[sa..sb])
            }
            (CpuStorage::F64(d), CpuStorage::F64(s)) => {
                add_assign_slice(&mut d[da..db], &s[sa..sb])
            }
            (CpuStorage::BF16(d), CpuStorage::BF16(s)) => {
                add_assign_slice(&mut d[da..db], &s[sa..sb])
            }
            (other, _) => return Err(unsupported(self.name(), other)),
        }
        Ok(())
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        ld: &Layout,
        src: &candle_core::CudaStorage,
        ls: &Layout,
    ) -> candle_core::Result<()> {
        use crate::ops::cuda::elementwise::{inplace2, Inplace2};
        inplace2(Inplace2::AddAssign, self.name(), dst, ld, src, ls)
    }
}

fn same_shape(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dims() != b.dims() {
        return Err(crate::error::Error::ShapeMismatch {
            name: format!("{op} operand"),
            expected: a.dims().to_vec(),
            found: b.dims().to_vec(),
        });
    }
    Ok(())
}

/// ReLU in place: **overwrites `x`** with max(x, 0) and returns it. Taking `x` by value means the
/// pre-activation handle is gone; backward must use the output mask ([`relu_bwd`]).
pub fn relu_inplace(x: Tensor) -> Result<Tensor> {
    x.inplace_op1(&ReluInplace).ctx("relu-inplace")?;
    Ok(x)
}

/// How an f32 operand becomes TF32 (1 sign, 8 exponent, 10 mantissa bits) before a tensor-core
/// product: NVIDIA's `cvt.rna.tf32.f32` rounds to nearest with ties away from zero; tensor cores
/// fed raw f32 bits ignore the 13 low mantissa bits (truncation). Which one cuBLAS applies is
/// not documented, so the emulation offers both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tf32Rounding {
    /// Round to nearest, ties away from zero (`cvt.rna`).
    Nearest,
    /// Drop the 13 low mantissa bits (toward zero).
    Truncate,
}

/// `t` (f32, on the CPU) rounded to TF32, as a new contiguous tensor: 10 explicit mantissa bits
/// kept, by [`Tf32Rounding`]; zeros, infinities and NaNs unchanged, a finite
/// value that rounds past the largest TF32 value becomes infinite (as `cvt.rna` does).
pub fn round_tf32(t: &Tensor, rounding: Tf32Rounding) -> Result<Tensor> {
    if !t.device().is_cpu() || t.dtype() != candle_core::DType::F32 {
        return Err(crate::error::Error::Unsupported {
            device: format!("{:?} {:?}", t.device().location(), t.dtype()),
            what: "TF32 emulation (f32 on the CPU only)".to_string(),
        });
    }
    let v: Vec<f32> = t
        .flatten_all()
        .and_then(|f| f.to_vec1())
        .ctx("round to tf32")?;
    let low = (1u32 << 13) - 1;
    let v: Vec<f32> = v
        .into_iter()
        .map(|x| {
            if !x.is_finite() {
                return x;
            }
            let bits = x.to_bits();
            let bits = match rounding {
                Tf32Rounding::Nearest => bits.wrapping_add(1 << 12) & !low,
                Tf32Rounding::Truncate => bits & !low,
            };
            f32::from_bits(bits)
        })
        .collect();
    Tensor::from_vec(v, t.shape(), t.device()).ctx("round to tf32")
}

/// ReLU into a new tensor, `max(x, 0)` (NaN to 0, the values [`relu_inplace`] writes): on the
/// CPU in parallel (candle's `relu` is one thread's element-wise map: ~9% of a BC-100 step with
/// `copy` ReLU), elsewhere candle's.
pub fn relu(x: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && x.is_contiguous() {
        x.apply_op1_no_bwd(&ReluCopy).ctx("relu")
    } else {
        x.relu().ctx("relu")
    }
}

/// A new `[n, cols]` tensor whose row `j` is `values[j]` repeated (a bias broadcast over the
/// columns of a channel-major map, `values` of shape `[n]`). On the CPU each row is one fill;
/// candle's broadcast-then-copy indexed every element (1.6% of an mlp step, perf).
pub fn repeat_rows(values: &Tensor, cols: usize) -> Result<Tensor> {
    let n = values.dims1().ctx("repeat-rows")?;
    if crate::ops::cpu::shared::cpu_kernels(values.device()) {
        values
            .apply_op1_no_bwd(&RepeatRows { cols })
            .ctx("repeat-rows")
    } else {
        // `force_contiguous`, not `contiguous`: with one column the broadcast keeps the
        // values' strides, counts as contiguous, and `contiguous` would return a view of
        // `values` (the bias parameter, which the product is then added into).
        values
            .reshape((n, 1))
            .and_then(|v| v.broadcast_as((n, cols)))
            .and_then(|v| v.force_contiguous())
            .ctx("repeat-rows")
    }
}

struct RepeatRows {
    cols: usize,
}
impl CustomOp1 for RepeatRows {
    fn name(&self) -> &'static str {
        "repeat-rows"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        fn go<T: Copy>(v: &[T], l: &Layout, cols: usize) -> Vec<T> {
            let (n, step) = (l.dims()[0], l.stride()[0]);
            let mut out = Vec::with_capacity(n * cols);
            for j in 0..n {
                out.extend(std::iter::repeat_n(v[l.start_offset() + j * step], cols));
            }
            out
        }
        let (n, cols) = (l.dims()[0], self.cols);
        let out = match s {
            CpuStorage::F32(v) => CpuStorage::F32(go(v, l, cols)),
            CpuStorage::F64(v) => CpuStorage::F64(go(v, l, cols)),
            CpuStorage::BF16(v) => CpuStorage::BF16(go(v, l, cols)),
            other => return Err(unsupported(self.name(), other)),
        };
        Ok((out, Shape::from((n, cols))))
    }
}

/// The sum of each row of a contiguous `[C, M]` map of bf16 (or f32) features as a new f32
/// `[C]`: each row summed in f64 and rounded once to f32. A parameter gradient of bf16
/// features: the Linear bias's, `Σ_M gy`, kept in f32 under mixed precision (candle's `sum`
/// of bf16 adds in bf16). CPU only; f32 and f64 rows take candle's `sum` in the layer maths.
pub fn row_sums_f32(x: &Tensor) -> Result<Tensor> {
    x.dims2().ctx("row-sums-f32")?;
    x.apply_op1_no_bwd(&RowSumsF32).ctx("row-sums-f32")
}

struct RowSumsF32;
impl CustomOp1 for RowSumsF32 {
    fn name(&self) -> &'static str {
        "row-sums-f32"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        fn go<E: Elem>(v: &[E], cols: usize) -> Vec<f32> {
            use crate::ops::cpu::shared::{lane_sums, Float};
            v.par_chunks(cols.max(1))
                .map(|row| lane_sums(row, row, |x, _| [x.widen().f64()])[0] as f32)
                .collect()
        }
        let (a, b) = contiguous_range(l, self.name())?;
        let (rows, cols) = (l.dims()[0], l.dims()[1]);
        let out = match s {
            _ if cols == 0 => vec![0.0; rows],
            CpuStorage::BF16(v) => go(&v[a..b], cols),
            CpuStorage::F32(v) => go(&v[a..b], cols),
            other => {
                return Err(candle_core::Error::Msg(format!(
                    "{}: dtype {:?} unsupported (bf16 or f32 rows into f32)",
                    self.name(),
                    other.dtype()
                )))
            }
        };
        Ok((CpuStorage::F32(out), Shape::from(rows)))
    }
}

/// ReLU backward into a new tensor: `out > 0 ? g : 0`.
pub fn relu_bwd(g: &Tensor, out: &Tensor) -> Result<Tensor> {
    same_shape("relu-bwd", g, out)?;
    g.apply_op2_no_bwd(out, &ReluBwd).ctx("relu-bwd")
}

/// ReLU backward in place: **overwrites `g`** with `out > 0 ? g : 0` and returns it.
pub fn relu_bwd_inplace(g: Tensor, out: &Tensor) -> Result<Tensor> {
    same_shape("relu-bwd-inplace", &g, out)?;
    g.inplace_op2(out, &ReluBwdInplace)
        .ctx("relu-bwd-inplace")?;
    Ok(g)
}

/// `dst += src`, **writing into `dst`'s storage** (which may be a view of a larger buffer).
pub fn add_assign(dst: &Tensor, src: &Tensor) -> Result<()> {
    same_shape("add-assign", dst, src)?;
    dst.inplace_op2(src, &AddAssign).ctx("add-assign")
}

/// `src` copied to `dst` (`len` elements, not overlapping) by a loop of 16-byte vector loads and
/// stores on x86-64, not glibc's `memcpy`: at a parallel task's chunk size (128 KiB) glibc
/// copies with `rep movsb`, which ran at about 5 GB/s here (AMD EPYC, Zen 3) where this loop
/// runs at 15–18. The mlp's 32 forward concatenations (688 MB) took 256–380 ms with `memcpy`
/// and 85–100 ms with this loop at 1 thread (`step_timing -- cat-parts`); a whole mlp
/// `cat-store-copy` step was 1.11× faster (median of 5 paired runs), bc's 1.08×. Ordinary
/// stores, not streamed (non-temporal) ones: the next layer reads the copy right away, and
/// streaming was no faster over a whole mlp step (paired medians 0.90× and 1.03× of this loop's
/// time, spreads 0.83–1.27).
///
/// # Safety
/// `src` and `dst` must each be valid for `len` elements and must not overlap.
unsafe fn copy_chunk<T: Copy>(src: *const T, dst: *mut T, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
        const LANE: usize = 16;
        let (s, d) = (src as *const u8, dst as *mut u8);
        let n = len * std::mem::size_of::<T>();
        // SAFETY (whole block): every access is inside [0, n) of both, the caller's contract;
        // SSE2 is part of x86-64's baseline; the stores are 16-byte aligned.
        unsafe {
            let head = ((LANE - d as usize % LANE) % LANE).min(n);
            std::ptr::copy_nonoverlapping(s, d, head);
            let mut i = head;
            while i + 4 * LANE <= n {
                for j in 0..4 {
                    let v = _mm_loadu_si128(s.add(i + j * LANE) as *const __m128i);
                    _mm_storeu_si128(d.add(i + j * LANE) as *mut __m128i, v);
                }
                i += 4 * LANE;
            }
            std::ptr::copy_nonoverlapping(s.add(i), d.add(i), n - i);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}

/// A new row-major `rows × cols` vector whose row `r` holds `fill(r)`'s values in order, the
/// rows written in parallel into memory that is not zeroed first: a zeroed vector costs a pass
/// over heap memory glibc hands back dirty. On `[204, 65536]` f32 (best of 20, the harness's
/// glibc tunables) BN apply + ReLU took 4.55 → 3.36 ms on 1 thread and 3.14 → 1.65 ms on 2, BN
/// backward's dx 5.99 → 4.94 and 3.43 → 2.47 ms. For the fused element-wise ops' outputs
/// (`fused.rs`), as `dense` and `conv3x3` make theirs.
///
/// # Panics
/// If a row's iterator ends before `cols` values (a bug of the caller's): no element of the
/// vector is then ever read, its length is still 0.
pub(crate) fn new_rows<T, I>(rows: usize, cols: usize, fill: impl Fn(usize) -> I + Sync) -> Vec<T>
where
    T: Copy + Send,
    I: Iterator<Item = T>,
{
    let len = rows
        .checked_mul(cols)
        .expect("new_rows: rows × cols overflows");
    new_chunks(len, cols, fill)
}

/// A new vector of `len` elements whose chunk `r` (elements `r·chunk ..`, the last one
/// shorter) holds `fill(r)`'s values in order, the chunks written in parallel into memory that
/// is not zeroed first (see [`new_rows`]). The loop is [`fill_from`]'s, compiled for this
/// CPU's widest vectors, `fill`'s iterator inlined into it.
///
/// # Panics
/// If a chunk's iterator ends before the chunk is full (a bug of the caller's): no element of
/// the vector is then ever read, its length is still 0.
fn new_chunks<T, I>(len: usize, chunk: usize, fill: impl Fn(usize) -> I + Sync) -> Vec<T>
where
    T: Copy + Send,
    I: Iterator<Item = T>,
{
    let mut out: Vec<T> = Vec::with_capacity(len);
    if len == 0 {
        return out;
    }
    out.spare_capacity_mut()[..len]
        .par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(r, part)| {
            let written = fill_from(part, fill(r));
            assert_eq!(
                written,
                part.len(),
                "new_rows: row {r} got {written} of {} values",
                part.len()
            );
        });
    // SAFETY: every chunk wrote all its elements (asserted above; a panic there leaves the
    // length 0), and T is Copy.
    unsafe { out.set_len(len) };
    out
}

/// The slices one after the other in a new vector, copied in parallel chunks ([`copy_chunk`]).
pub(crate) fn concat_slices<T: Copy + Send + Sync>(parts: &[&[T]]) -> Vec<T> {
    let n = parts.iter().map(|p| p.len()).sum();
    let mut out: Vec<T> = Vec::with_capacity(n);
    let mut jobs = Vec::new();
    let mut at = 0;
    for p in parts {
        jobs.extend(
            p.chunks(PAR_CHUNK)
                .enumerate()
                .map(|(i, c)| (c, at + i * PAR_CHUNK)),
        );
        at += p.len();
    }
    let dst = SharedPtr(out.as_mut_ptr());
    jobs.par_iter().for_each(|&(c, at)| {
        // SAFETY: the chunks tile [0, n) without overlap and out has capacity n.
        unsafe { copy_chunk(c.as_ptr(), dst.get().add(at), c.len()) }
    });
    // SAFETY: every element of [0, n) was written above (T is Copy, no drop).
    unsafe { out.set_len(n) };
    out
}

/// `Tensor::cat(pieces, 0)` of 2-D tensors: on the CPU, for contiguous f32/f64/bf16 pieces, one new
/// tensor copied in parallel chunks (candle's copy is single-threaded, and the concatenations
/// of `cat` variants copy O(L²) bytes); bitwise the same values and the same bytes allocated.
/// Anything else goes to candle's `cat`.
pub fn cat_rows(pieces: &[&Tensor]) -> Result<Tensor> {
    match cat_rows_cpu(pieces) {
        Some(t) => t,
        // candle's `cat` of one piece is that piece (its storage shared): a new tensor, as on
        // the CPU and as the memory model counts it
        None if pieces.len() == 1 => pieces[0].force_contiguous().ctx("concatenate"),
        None => Tensor::cat(pieces, 0).ctx("concatenate"),
    }
}

/// `x [N, C, S]` (row-major) as `[C, N·S]`: `out[c, n·S + s] = x[n, c, s]`, in parallel over
/// blocks of channels, each block walking the batch in blocks so reads and writes stay in cache.
fn channel_major_slice<T: Copy + Send + Sync>(x: &[T], (n, c, s): (usize, usize, usize)) -> Vec<T> {
    const BLOCK: usize = 32;
    let total = n * c * s;
    let mut out: Vec<T> = Vec::with_capacity(total);
    let dst = SharedPtr(out.as_mut_ptr());
    (0..c.div_ceil(BLOCK)).into_par_iter().for_each(|cb| {
        let (c0, c1) = (cb * BLOCK, ((cb + 1) * BLOCK).min(c));
        for b0 in (0..n).step_by(BLOCK) {
            let b1 = (b0 + BLOCK).min(n);
            if s == 1 {
                // A transpose: row ch of out from column ch of x, one cache-resident block of
                // rows at a time (the general loop below slices per element, 5× a copy's time).
                let block = &x[b0 * c..b1 * c];
                for ch in c0..c1 {
                    // SAFETY: this task alone writes rows c0..c1 of out; (ch, b0..b1) is inside
                    // row ch.
                    let to = unsafe {
                        std::slice::from_raw_parts_mut(dst.get().add(ch * n + b0), b1 - b0)
                    };
                    for (o, row) in to.iter_mut().zip(block.chunks_exact(c)) {
                        *o = row[ch];
                    }
                }
                continue;
            }
            for ch in c0..c1 {
                for b in b0..b1 {
                    let from = &x[(b * c + ch) * s..(b * c + ch + 1) * s];
                    // SAFETY: this task alone writes rows c0..c1 of out (capacity n·c·s), and
                    // element (ch, b·s .. (b + 1)·s) lies inside row ch.
                    unsafe {
                        let to = dst.get().add(ch * n * s + b * s);
                        if s == 1 {
                            *to = from[0];
                        } else {
                            std::ptr::copy_nonoverlapping(from.as_ptr(), to, s);
                        }
                    }
                }
            }
        }
    });
    // SAFETY: the channel blocks cover every row, each row every (b, s): all n·c·s written.
    unsafe { out.set_len(total) };
    out
}

/// A row-major `[rows, cols]` slice transposed: a new row-major `[cols, rows]` vector.
pub(crate) fn transpose_slice<T: Copy + Send + Sync>(
    x: &[T],
    (rows, cols): (usize, usize),
) -> Vec<T> {
    channel_major_slice(x, (rows, cols, 1))
}

/// A canonical `[N, C, …]` CPU tensor (contiguous, f32/f64/bf16) as a new channel-major `[C, N·S]`
/// tensor (S the product of the trailing dims), copied in parallel; `None` where it does not
/// qualify (the caller takes candle's strided copy).
pub fn to_channel_major(t: &Tensor) -> Option<Result<Tensor>> {
    let dims = t.dims();
    if dims.len() < 2 || !t.device().is_cpu() || !t.is_contiguous() {
        return None;
    }
    let (n, c) = (dims[0], dims[1]);
    let s: usize = dims[2..].iter().product();
    let (storage, layout) = t.storage_and_layout();
    let (a, b) = layout.contiguous_offsets()?;
    let (shape, dev) = ((c, n * s), t.device());
    let out = match &*storage {
        Storage::Cpu(CpuStorage::F32(v)) => {
            Tensor::from_vec(channel_major_slice(&v[a..b], (n, c, s)), shape, dev)
        }
        Storage::Cpu(CpuStorage::F64(v)) => {
            Tensor::from_vec(channel_major_slice(&v[a..b], (n, c, s)), shape, dev)
        }
        Storage::Cpu(CpuStorage::BF16(v)) => {
            Tensor::from_vec(channel_major_slice(&v[a..b], (n, c, s)), shape, dev)
        }
        _ => return None,
    };
    drop(storage);
    Some(out.ctx("to channel-major"))
}

/// A fresh contiguous copy of a 2-D tensor, copied in parallel on the CPU like [`cat_rows`];
/// candle's `force_contiguous` elsewhere. Always a new allocation of exactly `t`'s elements,
/// never a view of `t`. (Not candle's `copy`: it clones `t`'s whole storage, on a GPU all of a
/// buffer `t` is a prefix of.)
pub fn copy_rows(t: &Tensor) -> Result<Tensor> {
    match cat_rows_cpu(&[t]) {
        Some(t) => t,
        None => t.force_contiguous().ctx("copy"),
    }
}

/// [`cat_rows`] on the CPU, or `None` where the pieces do not qualify.
fn cat_rows_cpu(pieces: &[&Tensor]) -> Option<Result<Tensor>> {
    let first = pieces.first()?;
    let cols = match first.dims() {
        [_, c] => *c,
        _ => return None,
    };
    // (`cpu_kernels`, not `is_cpu`: a CPU taking the GPU's path, `layer::with_tap_stack_on_cpu`,
    // takes the GPU's branches here too, so the memory model's check of that path sees them)
    let eligible = pieces.iter().all(|p| {
        crate::ops::cpu::shared::cpu_kernels(p.device())
            && p.dtype() == first.dtype()
            && matches!(p.dims(), [_, c] if *c == cols)
            && p.is_contiguous()
    });
    if !eligible {
        return None;
    }
    let rows: usize = pieces.iter().map(|p| p.dims()[0]).sum();
    // Read locks only, taken one after the other on this thread (no writer can be waiting:
    // the step is single-threaded at the tensor level).
    let guards: Vec<_> = pieces.iter().map(|p| p.storage_and_layout()).collect();
    fn slices<'a, T: Elem>(
        guards: &'a [(candle_core::StorageRef<'_>, &Layout)],
    ) -> Option<Vec<&'a [T]>> {
        guards
            .iter()
            .map(|(s, l)| match &**s {
                Storage::Cpu(c) => {
                    let (a, b) = l.contiguous_offsets()?;
                    T::in_storage(c).map(|v| &v[a..b])
                }
                _ => None,
            })
            .collect()
    }
    let dev = first.device().clone();
    let out =
        match first.dtype() {
            candle_core::DType::F32 => slices::<f32>(&guards)
                .map(|s| Tensor::from_vec(concat_slices(&s), (rows, cols), &dev)),
            candle_core::DType::F64 => slices::<f64>(&guards)
                .map(|s| Tensor::from_vec(concat_slices(&s), (rows, cols), &dev)),
            candle_core::DType::BF16 => slices::<half::bf16>(&guards)
                .map(|s| Tensor::from_vec(concat_slices(&s), (rows, cols), &dev)),
            _ => None,
        };
    drop(guards);
    out.map(|t| t.ctx("concatenate"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    use crate::ops::cpu::shared::{bits, randn, Float};

    /// The parallel ReLU into a new tensor equals candle's on ordinary values and, NaN and
    /// signed zeros included, the in-place kernel bit for bit; its input is left as it was.
    #[test]
    fn relu_copy_matches_candle_and_the_inplace_kernel() {
        let dev = Device::Cpu;
        for dtype in [DType::F32, DType::F64] {
            let x = randn((70, 1000), dtype);
            let before = bits(&x);
            let y = relu(&x).unwrap();
            assert_eq!(bits(&x), before, "relu wrote its input");
            assert_eq!(bits(&y), bits(&x.relu().unwrap()));
            let odd = Tensor::new(&[f64::NAN, -0.0, 0.0, -1.5, 2.5, f64::INFINITY], &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let inplace = relu_inplace(odd.copy().unwrap()).unwrap();
            assert_eq!(bits(&relu(&odd).unwrap()), bits(&inplace));
        }
    }

    /// The parallel channel-major copy equals candle's transpose + copy, for mlp `[N, C]` and bc
    /// `[N, C, H, W]` shapes that do not divide into blocks, and is fresh storage.
    #[test]
    fn to_channel_major_matches_candle() {
        for dtype in [DType::F32, DType::F64] {
            for dims in [
                vec![33usize, 70],
                vec![5, 37, 3, 7],
                vec![1, 1, 1, 1],
                vec![70, 2, 1, 1],
            ] {
                let x = randn(dims.as_slice(), dtype);
                let c = dims[1];
                let before = bits(&x);
                let want = x
                    .transpose(0, 1)
                    .unwrap()
                    .force_contiguous()
                    .unwrap()
                    .reshape((c, x.elem_count() / c))
                    .unwrap();
                let got = to_channel_major(&x).unwrap().unwrap();
                assert_eq!(got.dims(), want.dims(), "{dims:?}");
                assert_eq!(bits(&got), bits(&want), "{dims:?}");
                add_assign(&got, &got.copy().unwrap()).unwrap();
                assert_eq!(
                    bits(&x),
                    before,
                    "{dims:?}: the copy shares the input's storage"
                );
            }
        }
    }

    /// The bias broadcast equals candle's broadcast-then-copy, for a strided view too.
    #[test]
    fn repeat_rows_matches_candle_broadcast() {
        let dev = Device::Cpu;
        for dtype in [DType::F32, DType::F64] {
            let m = randn((5, 3), dtype);
            // a strided column view and a contiguous vector
            for v in [
                m.narrow(1, 1, 1).unwrap().squeeze(1).unwrap(),
                m.flatten_all().unwrap(),
            ] {
                let n = v.dims1().unwrap();
                let theirs = v.reshape((n, 1)).unwrap().broadcast_as((n, 7)).unwrap();
                let ours = repeat_rows(&v, 7).unwrap();
                assert_eq!(ours.dims(), &[n, 7]);
                assert_eq!(bits(&ours), bits(&theirs.contiguous().unwrap()));
            }
        }
        let matrix = Tensor::zeros((2, 2), DType::F32, &dev).unwrap();
        assert!(repeat_rows(&matrix, 3).is_err(), "values must be 1-D");
    }

    /// Every row gets its own values, in order, at shapes of one row, one column, empty and
    /// more rows than threads, in pools of 1 and 3 threads.
    #[test]
    fn new_rows_writes_each_row_from_its_iterator() {
        for threads in [1, 3] {
            crate::ops::cpu::shared::in_pool(threads, || {
                for (rows, cols) in [(0, 5), (4, 0), (1, 7), (5, 1), (37, 300)] {
                    let v: Vec<f64> = new_rows(rows, cols, |r| {
                        (0..cols).map(move |c| (r * 1000 + c) as f64)
                    });
                    assert_eq!(v.len(), rows * cols, "{rows}×{cols}");
                    for (i, x) in v.iter().enumerate() {
                        assert_eq!(
                            *x,
                            ((i / cols) * 1000 + i % cols) as f64,
                            "{rows}×{cols} at {i}"
                        );
                    }
                }
            });
        }
    }

    /// A row with fewer values than columns is a bug of the caller's: it panics, and the
    /// unwritten memory is never exposed as elements.
    #[test]
    #[should_panic(expected = "new_rows: row 2 got 3 of 4 values")]
    fn new_rows_refuses_a_short_row() {
        let _: Vec<f32> = new_rows(3, 4, |r| (0..if r == 2 { 3 } else { 4 }).map(|c| c as f32));
    }

    /// Lengths around the 64-byte loop's step and every misalignment of source and destination,
    /// f32 and f64: the head, the vector loop and the tail must tile the copy.
    #[test]
    fn copy_chunk_copies_every_length_and_alignment() {
        fn check<T: Float + std::fmt::Debug>(from: impl Fn(usize) -> T) {
            let src: Vec<T> = (0..300).map(&from).collect();
            for len in [0, 1, 3, 4, 5, 15, 16, 17, 31, 32, 33, 63, 64, 65, 130, 257] {
                for s0 in 0..4 {
                    for d0 in 0..4 {
                        let mut dst = vec![T::ZERO; len + 8];
                        // SAFETY: src has 300 ≥ s0 + len elements, dst has len + 8 ≥ d0 + len.
                        unsafe { copy_chunk(src.as_ptr().add(s0), dst.as_mut_ptr().add(d0), len) };
                        assert_eq!(
                            &dst[d0..d0 + len],
                            &src[s0..s0 + len],
                            "len {len} +{s0} +{d0}"
                        );
                        assert!(dst[..d0]
                            .iter()
                            .chain(&dst[d0 + len..])
                            .all(|v| *v == T::ZERO));
                    }
                }
            }
        }
        check(|i| i as f32 + 1.0);
        check(|i| i as f64 + 1.0);
    }

    /// Parallel concatenation equals candle's, for pieces larger than one chunk and views;
    /// copies are fresh storage even where candle's `contiguous` would hand back the tensor.
    #[test]
    fn cat_rows_and_copy_rows_match_candle_and_never_alias() {
        for dtype in [DType::F32, DType::F64] {
            let a = randn((7, 9000), dtype);
            let b = randn((3, 9000), dtype);
            let view = a.narrow(0, 2, 4).unwrap();
            let ours = cat_rows(&[&a, &b, &view]).unwrap();
            let theirs = Tensor::cat(&[&a, &b, &view], 0).unwrap();
            assert_eq!(ours.dims(), theirs.dims());
            assert_eq!(bits(&ours), bits(&theirs));
            // a transposed (non-contiguous) piece takes candle's path and still matches
            let t = randn((9000, 2), dtype);
            let tt = t.t().unwrap();
            assert_eq!(
                bits(&cat_rows(&[&b, &tt]).unwrap()),
                bits(&Tensor::cat(&[&b, &tt], 0).unwrap())
            );
            let copy = copy_rows(&view).unwrap();
            assert_eq!(bits(&copy), bits(&view));
            let fresh = copy_rows(&a).unwrap();
            add_assign(&fresh, &a).unwrap();
            assert_eq!(bits(&fresh), bits(&(&a * 2.0).unwrap()));
            assert_ne!(
                bits(&fresh),
                bits(&a),
                "copy_rows must not share the input's storage"
            );
        }
    }
}
