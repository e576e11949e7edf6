//! The CPU matrix products of Linear and Conv1×1 layers on channel-major maps (`W·X`, `G·Xᵀ`,
//! `Wᵀ·G`), into a new tensor or accumulated into an existing one (a view of a gradient buffer),
//! with the work split into column panels that threads multiply independently.
//!
//! Why not candle's matmul: on a dense layer's skinny shapes (`[64, C] · [C, 4096]`, inner
//! dimension 64 for the input gradient) `gemm`'s own threading reached 40–90 GFLOP/s on 2 cores
//! where panels, each one single-threaded `gemm` product, reached 95–140 (`examples/gemm_shapes.rs`),
//! and a matmul cannot add into a buffer: the input gradient needed a `[C, M]` temporary and a
//! second pass to add it. Here `gemm` adds the product straight into the destination.
//!
//! Every output element is computed by one panel from the whole inner dimension, in `gemm`'s
//! order for that inner length, so results do not depend on the number of threads or panels.
//!
//! bf16 operands (PyTorch autocast's products): `gemm` 0.19 has no bf16, so `multiply_widened`
//! runs tiles of the product on the CPU's bf16 dot-product kernel where it can
//! ([`crate::ops::cpu::bf16_dot`]: operand blocks packed in bf16 pairs, on AVX-512 BF16's
//! `vdpbf16ps` or on AVX2 + FMA) and otherwise widens blocks of the operands to f32 (exact) for
//! the f32 `gemm`; either way it
//! accumulates in f32 and writes each output element once: rounded to bf16 for
//! a bf16 destination ([`product`], [`accumulate`] into bf16), unrounded into an f32 one
//! ([`product_f32`], [`accumulate`] of bf16 operands into f32: parameter gradients). The
//! scratch (packed or widened blocks and the tile's accumulator) is [`WIDEN_SCRATCH_BYTES`]
//! per thread, made on a thread's first bf16 product and
//! kept for the thread's life, like `gemm`'s own packing slab: [`settle_widen_scratch`] makes it
//! on every compute thread before a measured step, so no step allocates it. On the dot kernel an
//! operand that several tiles multiply (a Linear's weight `[64, C]`, which every one of the
//! forward's `M / 256` column tiles reads) is packed once per product, not once per tile, into
//! one process-wide buffer of 1 MiB made with the scratch (`WHOLE_PACKED`); the same packed
//! pairs, so the same bits.

use crate::error::{CandleContext, Result};
use crate::ops::cpu::bf16_dot;
use crate::ops::cpu::shared::{zip1, Elem, Float, SharedPtr};
#[cfg(feature = "cuda")]
pub use crate::ops::cuda::dense::{pin_cublas_workspace, CUBLAS_WORKSPACE_BYTES};
use crate::ops::elementwise;
use crate::ops::layout::matrix::{check_shapes, Mat};
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, InplaceOp2, InplaceOp3, Layout, Shape, Tensor};
use half::bf16;
use rayon::prelude::*;

/// Column panels per thread: a few per thread balance the load when one thread is slowed
/// (measured best at 4 on 2 cores, `examples/gemm_shapes.rs split`). Row panels are one per
/// thread: each packs all of the right operand (see [`multiply`]).
const PANELS_PER_THREAD: usize = 4;
/// Narrowest panel; a product with fewer than two panels' columns (or rows) is one `gemm` call
/// with `gemm`'s own threading. Above 64 on purpose: `gemm` blocks the inner dimension by a
/// length that depends on the inner dimension alone, except for products of at most 64 × 64
/// (its small-size path blocks by 512), so a panel of 64 or fewer next to a layer output of 64
/// channels would round differently from the same columns in one unsplit product.
const MIN_PANEL: usize = 80;
/// Multiply-adds below which a product too narrow for panels runs on the calling thread alone
/// rather than in `gemm`'s own threading (see [`multiply`]): about 0.1 ms of one core.
const SMALL_PRODUCT_MACS: usize = 1 << 23;
/// Shortest row panel when there are rows enough for one per thread (see [`multiply`]).
const MIN_ROW_PANEL: usize = 128;

/// Makes `gemm`'s per-thread packing slab on every thread of the current rayon pool and on
/// the calling thread. `gemm` allocates it (`gemm_common::gemm::L2_SLAB`: one L2 cache's bytes,
/// 1 MiB on this project's CI machine) on a thread's first product that packs, and keeps it
/// for the thread's life; which threads run a step's products varies from run to run, so a
/// measured step could count 0 to `threads` of them (seen: 5 of 12 runs of one tiny bc row
/// measured 1 MiB more than the other 7). Called before warm-up, the slabs are part of every
/// baseline, like the rest of the runtime; the products' own packing buffers stay in the
/// steps (the memory model's [`crate::model::trace::GEMM_PACKING_ALLOWANCE_BYTES`]).
pub fn settle_thread_scratch() {
    on_every_thread(|| {
        gemm_common::gemm::L2_SLAB.with(|slab| drop(slab.borrow()));
        RHS_SCRATCH.with(|s| drop(s.borrow()));
    });
}

/// Bytes of a thread's copy of a small right operand that sums along its contiguous axis
/// ([`multiply`]): a bc layer's Conv1×1 weight-gradient chunk `dzᵀ [512, 4k]` (96 KiB in f32,
/// 192 KiB in f64 at k = 12) fits.
const RHS_SCRATCH_BYTES: usize = 256 * 1024;

thread_local! {
    /// This thread's [`RHS_SCRATCH_BYTES`] (as f64s, aligned for f32 and f64 alike), made
    /// whole on first use or by [`settle_thread_scratch`] (part of the baseline, like `gemm`'s
    /// slab).
    static RHS_SCRATCH: std::cell::RefCell<Vec<f64>> =
        std::cell::RefCell::new(vec![0.0; RHS_SCRATCH_BYTES / 8]);
}

/// Runs `touch` on every thread of the current rayon pool and on the calling thread: what makes
/// a per-thread buffer there ([`settle_thread_scratch`], [`settle_widen_scratch`]).
fn on_every_thread(touch: impl Fn() + Sync) {
    rayon::broadcast(|_| touch());
    touch();
}

/// Makes the widening scratch of bf16-operand products ([`WIDEN_SCRATCH_BYTES`]) on every
/// thread of the current rayon pool and on the calling thread, as [`settle_thread_scratch`]
/// does `gemm`'s slab: a bf16 step's products then allocate no scratch of their own, whichever
/// threads run their tiles; the scratch is part of the baseline (runtime, not the step), as the
/// slab is. Called before warm-up where a step has bf16 features (an f32 or f64 step never makes
/// it, so its baseline is unchanged).
pub fn settle_widen_scratch() {
    on_every_thread(|| WIDEN_SCRATCH.with(|s| drop(s.borrow_mut())));
    if let Ok(mut whole) = WHOLE_PACKED.lock() {
        whole.resize(WHOLE_PACKED_ELEMS, 0);
    }
}

/// Copies the `cols` columns of `src` (column j from `src + j·cs`, `rows` contiguous elements)
/// into the rows of `dst` (`dst[kk·cols + j] = column j's element kk`): [`multiply`]'s copy of a
/// small right operand. In tiles of [`TRANSPOSE_TILE`] × [`TRANSPOSE_TILE`], each reading a
/// line's worth of [`TRANSPOSE_TILE`] columns and writing those of as many rows, all in L1:
/// a column at a time wrote one element to each of up to 512 rows' lines (96 KiB, twice L1)
/// per column, about 1 ns an element: 5 % of a 2-thread BC-100 L=16 f32 step's samples
/// (`perf`), 0.5 % in tiles. That step, side by side (`densebench step --bare-loop 5`, three
/// alternations, AMD EPYC Zen 4): `cat-store-copy` 0.84–0.90 → 0.77–0.80 s,
/// `buffer-recompute-inplace` 0.79–0.82 → 0.72–0.75 s; one thread ×0.99.
///
/// # Safety
/// `src + j·cs + kk` for `j < cols`, `kk < rows` must be readable, `dst` valid for
/// `rows · cols` writes and not overlapping them.
unsafe fn columns_to_rows<T: Copy>(
    dst: *mut T,
    src: *const T,
    rows: usize,
    cols: usize,
    cs: usize,
) {
    for j0 in (0..cols).step_by(TRANSPOSE_TILE) {
        let jn = TRANSPOSE_TILE.min(cols - j0);
        for k0 in (0..rows).step_by(TRANSPOSE_TILE) {
            let kn = TRANSPOSE_TILE.min(rows - k0);
            for j in j0..j0 + jn {
                // SAFETY: the caller's contract, j < cols and k0 + r < rows.
                unsafe {
                    let col = src.add(j * cs + k0);
                    let out = dst.add(k0 * cols + j);
                    for r in 0..kn {
                        *out.add(r * cols) = *col.add(r);
                    }
                }
            }
        }
    }
}

/// The side of [`columns_to_rows`]' square tiles: one 64-byte line of f32 per column.
const TRANSPOSE_TILE: usize = 16;

/// `dst [= or +=] a · b`, `dst` m×n, `a` m×k, `b` k×n.
///
/// # Safety
/// The three operands must lie inside the allocations the pointers address ([`Mat::of`] checks
/// this); `dst` must not overlap `a` or `b`.
unsafe fn multiply<T: Float>(
    dst: *mut T,
    d: Mat,
    accumulate: bool,
    a: *const T,
    am: Mat,
    b: *const T,
    bm: Mat,
) {
    crate::ops::cpu::shared::tune_gemm();
    let (dp, ap, bp) = (
        SharedPtr(dst),
        SharedPtr(a as *mut T),
        SharedPtr(b as *mut T),
    );
    // One gemm call on these blocks of dst, a and b (b at `bptr`).
    let gemm_call = move |dc: Mat, ac: Mat, bptr: *const T, bc: Mat, par: gemm::Parallelism| {
        // SAFETY: the caller's contract; a panel writes only its own rows or columns of dst.
        unsafe {
            gemm::gemm(
                dc.rows,
                dc.cols,
                ac.cols,
                dp.get().add(dc.off),
                dc.cs as isize,
                dc.rs as isize,
                accumulate,
                (ap.get() as *const T).add(ac.off),
                ac.cs as isize,
                ac.rs as isize,
                bptr.add(bc.off),
                bc.cs as isize,
                bc.rs as isize,
                T::ONE,
                T::ONE,
                false,
                false,
                false,
                par,
            )
        }
    };
    let call = move |dc: Mat, ac: Mat, bc: Mat, par: gemm::Parallelism| {
        let b = bp.get() as *const T;
        // A small right operand whose columns are contiguous (`dzᵀ` of a Conv1×1 weight
        // gradient chunk: 48 columns 65 536 elements apart, each 512 long) is read by `gemm` a
        // row at a time across the columns, one cache line of each, all in one cache set when
        // the columns are a power of two apart: the chunk products ran at 8–16 GFLOP/s. Copied
        // into the rows of this thread's scratch first ([`columns_to_rows`]), the same values in
        // the same order of the inner dimension: the same bits, and a BC-100 layer's 128 chunk
        // products (f32, 1 thread) in 4.1–4.4 ms instead of 9.4 at C = 24, 10.0 instead of 15.1
        // at C = 120, 16.1 instead of 21.0 at C = 204 (measured with a column-at-a-time copy,
        // since replaced by the tiled one; a copy 16 rows at a time had measured slower).
        // Only where `gemm` takes its general path (register tiles summing the inner dimension
        // in order) either way, whose results do not depend on the operands' strides: not for
        // a destination of at most 16 · 16 outputs (`gemm`'s horizontal kernels, for both operands
        // contiguous along the inner dimension: another order), one row or column (matrix ×
        // vector) or an inner dimension of at most 2.
        let small = bc.rows * bc.cols * std::mem::size_of::<T>() <= RHS_SCRATCH_BYTES;
        let general = dc.rows * dc.cols > 16 * 16 && dc.rows > 1 && dc.cols > 1 && bc.rows > 2;
        if !matches!(par, gemm::Parallelism::None) || bc.rs != 1 || bc.cs == 1 || !general || !small
        {
            return gemm_call(dc, ac, b, bc, par);
        }
        RHS_SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            let rows = scratch.as_mut_ptr() as *mut T;
            // SAFETY: b's columns lie in its allocation (the caller's contract); the copy,
            // bc.rows · bc.cols elements, lies in the scratch (`small`).
            unsafe { columns_to_rows(rows, b.add(bc.off), bc.rows, bc.cols, bc.cs) };
            let copy = Mat {
                rows: bc.rows,
                cols: bc.cols,
                off: 0,
                rs: bc.cols,
                cs: 1,
            };
            gemm_call(dc, ac, rows as *const T, copy, par)
        })
    };
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        return call(d, am, bm, gemm::Parallelism::None);
    }
    // Panels along the longer of dst's two dimensions: columns c0 .. c0 + n of dst from the
    // same columns of b, or rows r0 .. r0 + n of dst from the same rows of a.
    let by_rows = d.rows > d.cols;
    let long = if by_rows { d.rows } else { d.cols };
    if long < 2 * MIN_PANEL {
        // Too few rows and columns for panels: `gemm`'s own threading, unless the product is
        // so small that handing it between threads costs more than it saves (a bc layer's
        // Conv1×1 weight gradient is 128 products of `[C, 48]` over 512 columns a step: at
        // C = 24 on 2 threads, ×2.4 the one-thread time). `gemm` splits no inner dimension of
        // 512 or less either way: the same bits.
        let macs = d.rows.saturating_mul(d.cols).saturating_mul(am.cols);
        let par = if macs < SMALL_PRODUCT_MACS {
            gemm::Parallelism::None
        } else {
            gemm::Parallelism::Rayon(threads)
        };
        return call(d, am, bm, par);
    }
    // Row panels each pack all of b (a weight gradient's G, up to [48, 65536] in bc), so there
    // is one per thread, at least MIN_ROW_PANEL rows unless that leaves a thread without one:
    // four per thread packed b four times over (the mlp's weight gradient `(X·Gᵀ)ᵀ` on 2
    // threads, `examples/gemm_shapes.rs`: 8.7 → 6.7 ms at C = 2304, 4.5 → 2.8 ms at 768, 1.9 →
    // 1.5 ms at 320). Column panels pack only their columns of b. The last panel takes the
    // remainder, so every panel is at least MIN_PANEL wide (see MIN_PANEL for why that keeps
    // the sums).
    let (least, per_thread) = if by_rows {
        (MIN_ROW_PANEL.min(long.div_ceil(threads)), 1)
    } else {
        (MIN_PANEL, PANELS_PER_THREAD)
    };
    let mut width = long
        .div_ceil(threads * per_thread)
        .max(least)
        .next_multiple_of(16)
        .max(MIN_PANEL);
    // The rounding up to 16 must not leave a thread without a panel where each can have one of
    // MIN_PANEL or more (204 rows on 2 threads: one panel of 204 rounded from 102 to 112, so
    // one thread did Conv1×1's whole weight gradient; now 96 + 108).
    let fair = long / threads / 16 * 16;
    if long / width < threads && fair >= MIN_PANEL {
        width = fair;
    }
    let panels = (long / width).max(1);
    (0..panels).into_par_iter().for_each(|p| {
        let c0 = p * width;
        let n = if p + 1 == panels { long - c0 } else { width };
        if by_rows {
            call(d.rows(c0, n), am.rows(c0, n), bm, gemm::Parallelism::None)
        } else {
            call(
                d.columns(c0, n),
                am,
                bm.columns(c0, n),
                gemm::Parallelism::None,
            )
        }
    });
}

/// Output rows of one tile of a widened (bf16-operand) product ([`multiply_widened`]).
const WIDE_MB: usize = 128;
/// Output columns of one tile of a widened product.
const WIDE_NB: usize = 256;
/// Inner-dimension block of a widened product: the tile's f32 sums take `⌈k / WIDE_KB⌉`
/// `gemm` calls, each adding its block's products into the tile's f32 accumulator.
const WIDE_KB: usize = 256;

/// One thread's widening scratch of bf16-operand products, in bytes: the f32 copies of one left
/// block (`WIDE_MB × WIDE_KB`), one right block (`WIDE_KB × WIDE_NB`) and the f32 accumulator
/// of one output tile (`WIDE_MB × WIDE_NB`), `4·(128·256 + 256·256 + 128·256)` = 512 KiB, made
/// whole on the thread's first widened product and kept (see [`settle_widen_scratch`]); never a
/// whole-operand f32 copy. A product allocates nothing besides its output and `gemm`'s own
/// packing buffers (as for f32).
pub const WIDEN_SCRATCH_BYTES: usize = 4 * WIDEN_SCRATCH_ELEMS;

/// [`WIDEN_SCRATCH_BYTES`] in f32 elements.
const WIDEN_SCRATCH_ELEMS: usize = WIDE_MB * WIDE_KB + WIDE_KB * WIDE_NB + WIDE_MB * WIDE_NB;

/// u32 pairs of [`WHOLE_PACKED`]: 1 MiB, a `[64, 4096]` operand (the mlp's weight gradient's
/// `Gᵀ`; its weight at 64 layers, `[64, 4288]`).
const WHOLE_PACKED_ELEMS: usize = 1 << 18;

/// The operands a bf16 product packs once for all its tiles ([`multiply_widened`]): its left
/// operand where it has several column tiles, its right one where it has several row tiles
/// (e.g. the weight `[64, C]` of a Linear forward, which every one of the `M / 256` column
/// tiles multiplies), if they fit its [`WHOLE_PACKED_ELEMS`] together. One buffer for the
/// process, held by one product at a time (a product that finds it held packs per tile, with
/// the same bits); made by [`settle_widen_scratch`] (part of the baseline) or on first use.
static WHOLE_PACKED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Numbers the bf16 products (see [`PACKED`]).
static NEXT_PRODUCT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

thread_local! {
    /// Which blocks this thread's scratch holds packed for the dot-product kernel: the left
    /// block as (product, first row, first inner index) and the right one as (product, first
    /// column, first inner index), or `None`. Set by the tile that packed them, cleared by the
    /// widened path (which overwrites the scratch).
    static PACKED: std::cell::Cell<[Option<(u64, usize, usize)>; 2]> =
        const { std::cell::Cell::new([None; 2]) };
    /// This thread's widening scratch ([`WIDEN_SCRATCH_BYTES`]), made whole on first use.
    static WIDEN_SCRATCH: std::cell::RefCell<Vec<f32>> =
        std::cell::RefCell::new(vec![0.0; WIDEN_SCRATCH_ELEMS]);
}

/// `dst [= or +=] a · b` for bf16 operands computed in f32, `dst` stored as `D` (bf16, or f32
/// for a parameter gradient): tiles of `dst` of [`WIDE_MB`] × [`WIDE_NB`] in parallel, each
/// summed in an f32 accumulator (from `dst` widened, or +0) over blocks of [`WIDE_KB`] of the
/// inner dimension, then written to `dst` once, `D::narrow` (round to nearest even for bf16,
/// exact for f32). A block's products run on the CPU's bf16 dot-product kernel where it has one
/// ([`bf16_dot::enabled`]: operand blocks packed in bf16 pairs; a left block of contiguous rows
/// that at most two right panels multiply read in place on AVX-512 BF16,
/// [`bf16_dot::multiply_rows_a`]), else on the operand blocks
/// widened to f32 (exact) and multiplied by `gemm`. The tiling does not depend on the number of
/// threads, so neither do the results. Scratch: the running thread's [`WIDEN_SCRATCH`] (a
/// tile's work never yields to rayon, so no other tile of this thread holds it meanwhile;
/// should it be held anyway, the tile takes a scratch of its own).
///
/// # Safety
/// As [`multiply`]: the operands must lie inside the allocations the pointers address, and
/// no element of `dst` may be an element of `a` or `b` (they may share an allocation).
unsafe fn multiply_widened<D: Elem<Acc = f32>>(
    dst: *mut D,
    d: Mat,
    accumulate: bool,
    a: *const bf16,
    am: Mat,
    b: *const bf16,
    bm: Mat,
) {
    let dot = bf16_dot::enabled();
    if !dot {
        crate::ops::cpu::shared::tune_gemm();
    }
    // This product's number: a thread's packed blocks are reused by its next tile that has the
    // same rows (left block) or columns (right block) and inner block, within this product
    // only (`PACKED`)
    let product = NEXT_PRODUCT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (m, n, k) = (d.rows, d.cols, am.cols);
    // Operands several tiles multiply, packed once for the product (`WHOLE_PACKED`): block
    // (tile t, inner block q) of the left operand at `t·WIDE_MB·kp + rows(t)·q·WIDE_KB/2`, with
    // kp the pairs of the whole inner dimension (every tile and block but the last is whole, and
    // WIDE_MB, WIDE_NB and WIDE_KB are multiples of MR, NR and 2), the right one's likewise
    let kp = (k / WIDE_KB) * (WIDE_KB / 2) + (k % WIDE_KB).div_ceil(2);
    let (a_len, b_len) = (
        m.next_multiple_of(bf16_dot::MR) * kp,
        n.next_multiple_of(bf16_dot::NR) * kp,
    );
    let mut whole_a = dot && n > WIDE_NB && a_len <= WHOLE_PACKED_ELEMS;
    let mut whole_b =
        dot && m > WIDE_MB && b_len + if whole_a { a_len } else { 0 } <= WHOLE_PACKED_ELEMS;
    #[cfg(test)]
    if tests::PLAIN_PATH.with(std::cell::Cell::get) {
        (whole_a, whole_b) = (false, false);
    }
    let mut held_whole = if whole_a || whole_b {
        WHOLE_PACKED.try_lock().ok()
    } else {
        None
    };
    if let Some(buf) = held_whole.as_mut() {
        // (made already where `settle_widen_scratch` ran: then a no-op)
        buf.resize(WHOLE_PACKED_ELEMS, 0);
    } else {
        (whole_a, whole_b) = (false, false);
    }
    let whole = held_whole
        .as_mut()
        .map_or(std::ptr::null_mut(), |b| b.as_mut_ptr());
    let whole = SharedPtr(whole);
    let b_at = if whole_a { a_len } else { 0 };
    // where block (tile t, inner block q) of a whole operand begins: the left one's tiles are
    // WIDE_MB rows, the right one's WIDE_NB columns, each block's rows (columns) padded to the
    // kernel's MR (NR)
    let block_at = |left: bool, t: usize, q: usize| {
        let (step, len, unit, base) = if left {
            (WIDE_MB, m, bf16_dot::MR, 0)
        } else {
            (WIDE_NB, n, bf16_dot::NR, b_at)
        };
        let pad = step.min(len - t * step).next_multiple_of(unit);
        base + t * step * kp + pad * q * (WIDE_KB / 2)
    };
    if whole_a || whole_b {
        let k_blocks = k.div_ceil(WIDE_KB);
        let blocks = |left: bool, tiles: usize| {
            (0..tiles).flat_map(move |t| (0..k_blocks).map(move |q| (left, t, q)))
        };
        let jobs: Vec<(bool, usize, usize)> = blocks(true, m.div_ceil(WIDE_MB))
            .filter(|_| whole_a)
            .chain(blocks(false, n.div_ceil(WIDE_NB)).filter(|_| whole_b))
            .collect();
        let (ap, bp) = (SharedPtr(a as *mut bf16), SharedPtr(b as *mut bf16));
        jobs.into_par_iter().for_each(|(left, t, q)| {
            let k0 = q * WIDE_KB;
            let kc = WIDE_KB.min(k - k0);
            let at = block_at(left, t, q);
            // SAFETY: the block lies inside a (b) (the caller's contract); its packed pairs,
            // at its own offset below a_len (b_at + b_len), inside the held buffer and
            // written by this job alone
            unsafe {
                if left {
                    let rows = WIDE_MB.min(m - t * WIDE_MB);
                    let out = std::slice::from_raw_parts_mut(
                        whole.get().add(at),
                        bf16_dot::packed_a_len(rows, kc),
                    );
                    let a0 =
                        (ap.get() as *const bf16).add(am.off + t * WIDE_MB * am.rs + k0 * am.cs);
                    bf16_dot::pack_a(a0, am.rs, am.cs, rows, kc, out);
                } else {
                    let cols = WIDE_NB.min(n - t * WIDE_NB);
                    let out = std::slice::from_raw_parts_mut(
                        whole.get().add(at),
                        bf16_dot::packed_b_len(cols, kc),
                    );
                    let b0 =
                        (bp.get() as *const bf16).add(bm.off + k0 * bm.rs + t * WIDE_NB * bm.cs);
                    bf16_dot::pack_b(b0, bm.rs, bm.cs, kc, cols, out);
                }
            }
        });
    }
    // Column by column: consecutive tiles (which rayon mostly gives one thread) share their
    // columns, so a tall product packs each right block once per thread rather than once per
    // row tile; a product of one row tile shares its rows instead.
    let tiles: Vec<(usize, usize)> = (0..n)
        .step_by(WIDE_NB)
        .flat_map(|c0| (0..m).step_by(WIDE_MB).map(move |r0| (r0, c0)))
        .collect();
    // A tile of a bf16 destination that one inner block sums, in whole kernel blocks: the dot
    // kernel widens and rounds the destination in registers (`multiply_packed_into_bf16`), no
    // f32 accumulator in memory (the input gradients' products, inner length 64 or 48)
    let into_bf16 = dot
        && bf16_dot::fused_output()
        && (1..=WIDE_KB).contains(&k)
        && d.cs == 1
        && std::any::TypeId::of::<D>() == std::any::TypeId::of::<bf16>();
    #[cfg(test)]
    let into_bf16 = into_bf16 && !tests::PLAIN_PATH.with(std::cell::Cell::get);
    // A left operand of contiguous rows that at most two right panels multiply (a weight
    // gradient's `X`: `[C, M]` times `[M, 64]`) read in place by the kernel rather than packed
    // per tile: its packing (a register transpose of every element) was 7.5 % of a 2-thread
    // mlp bf16 step, and the packed panel's reuse by one or two right panels does not pay for it
    let rows_a = dot
        && bf16_dot::fused_output()
        && !whole_a
        && !into_bf16
        && am.cs == 1
        && am.rs.is_multiple_of(2)
        && k.is_multiple_of(2)
        && n <= 2 * bf16_dot::NR;
    #[cfg(test)]
    let rows_a = rows_a && !tests::PLAIN_PATH.with(std::cell::Cell::get);
    #[cfg(test)]
    tests::SHORTCUTS.with(|w| w.set((whole_a, whole_b, into_bf16, rows_a)));
    let (dp, ap, bp) = (
        SharedPtr(dst),
        SharedPtr(a as *mut bf16),
        SharedPtr(b as *mut bf16),
    );
    tiles.into_par_iter().for_each(|(r0, c0)| {
        WIDEN_SCRATCH.with(|cell| {
            let mut own = Vec::new();
            let mut held = cell.try_borrow_mut();
            let (scratch, mine): (&mut Vec<f32>, bool) = match &mut held {
                Ok(s) => (s, true),
                Err(_) => (&mut own, false),
            };
            scratch.resize(WIDEN_SCRATCH_ELEMS, 0.0);
            let (sa, rest) = scratch.split_at_mut(WIDE_MB * WIDE_KB);
            let (sb, acc) = rest.split_at_mut(WIDE_KB * WIDE_NB);
            let (mr, nc) = (WIDE_MB.min(m - r0), WIDE_NB.min(n - c0));
            let at = |x: Mat, i: usize, j: usize| x.off + i * x.rs + j * x.cs;
            // the dot kernel writes whole blocks of MR × NR: rows and columns padded to them
            // (WIDE_MB and WIDE_NB are multiples, so a tile's padded block fits the scratch)
            let (rows, ldc) = if dot {
                (
                    mr.next_multiple_of(bf16_dot::MR),
                    nc.next_multiple_of(bf16_dot::NR),
                )
            } else {
                (mr, nc)
            };
            let acc = &mut acc[..rows * ldc];
            let into_bf16 = into_bf16 && rows == mr && ldc == nc;
            if into_bf16 {
                // filled, summed and rounded in the kernel's registers (below)
            } else if !accumulate || rows > mr || ldc > nc {
                // (an accumulating tile without padding is all overwritten below)
                acc.fill(0.0);
            }
            if accumulate && !into_bf16 {
                for i in 0..mr {
                    // SAFETY: row r0 + i, columns c0 .. c0 + nc of dst (the caller's contract);
                    // this task alone writes this tile.
                    unsafe {
                        widen_row(
                            dp.get().add(at(d, r0 + i, c0)),
                            d.cs,
                            &mut acc[i * ldc..i * ldc + nc],
                        )
                    };
                }
            }
            for k0 in (0..k).step_by(WIDE_KB) {
                let kc = WIDE_KB.min(k - k0);
                // SAFETY: the blocks' origins and extents lie inside a and b (the caller's
                // contract); both are only read
                let (a0, b0) = unsafe {
                    (
                        (ap.get() as *const bf16).add(at(am, r0, k0)),
                        (bp.get() as *const bf16).add(at(bm, k0, c0)),
                    )
                };
                if dot {
                    // the packed pairs in the same slots (WIDEN_SCRATCH_ELEMS' parts hold kc·mr
                    // and kc·nc f32 elements, the packed pairs half as many plus the padding)
                    let (pa, pb) = (
                        bytemuck::cast_slice_mut::<f32, u32>(sa),
                        bytemuck::cast_slice_mut::<f32, u32>(sb),
                    );
                    let q = k0 / WIDE_KB;
                    // SAFETY: the whole operands' blocks, packed above and only read now
                    let (wa, wb) = unsafe {
                        (
                            whole_a.then(|| {
                                let at = block_at(true, r0 / WIDE_MB, q);
                                std::slice::from_raw_parts(
                                    whole.get().add(at) as *const u32,
                                    bf16_dot::packed_a_len(mr, kc),
                                )
                            }),
                            whole_b.then(|| {
                                let at = block_at(false, c0 / WIDE_NB, q);
                                std::slice::from_raw_parts(
                                    whole.get().add(at) as *const u32,
                                    bf16_dot::packed_b_len(nc, kc),
                                )
                            }),
                        )
                    };
                    // SAFETY: the blocks inside a and b as above; the kernel's instructions are
                    // present (bf16_dot::enabled)
                    unsafe {
                        // the thread's scratch may still hold a block packed by its previous
                        // tile (same product, rows or columns, and inner block): the operands
                        // are only read during a product, so the packed pairs are still theirs
                        let keys = [Some((product, r0, k0)), Some((product, c0, k0))];
                        let held = if mine {
                            PACKED.with(|p| p.get())
                        } else {
                            [None; 2]
                        };
                        // (a whole operand's block is not in the scratch: its slot keeps what
                        // it held, so nothing is packed into it; rows read in place leave the
                        // left slot to a partial panel's packing, so it holds no known block)
                        let keys = [
                            if rows_a {
                                None
                            } else if whole_a {
                                held[0]
                            } else {
                                keys[0]
                            },
                            if whole_b { held[1] } else { keys[1] },
                        ];
                        if held[0] != keys[0] && !rows_a {
                            bf16_dot::pack_a(a0, am.rs, am.cs, mr, kc, pa);
                        }
                        if held[1] != keys[1] {
                            bf16_dot::pack_b(b0, bm.rs, bm.cs, kc, nc, pb);
                        }
                        if mine {
                            PACKED.with(|p| p.set(keys));
                        }
                        if rows_a {
                            // the left block's rows read in place (even am.rs and kc, checked
                            // above; fused_output), the left slot the scratch of a last
                            // partial panel
                            let pb = wb.unwrap_or(pb);
                            bf16_dot::multiply_rows_a((a0, am.rs), mr, pb, nc, kc, acc, ldc, pa);
                            continue;
                        }
                        let (pa, pb) = (wa.unwrap_or(pa), wb.unwrap_or(pb));
                        if into_bf16 {
                            // the tile's only inner block (k ≤ WIDE_KB), D is bf16, rows of
                            // dst contiguous (checked above); this task alone writes the tile
                            let out = dp.get().add(at(d, r0, c0)) as *mut bf16;
                            bf16_dot::multiply_packed_into_bf16(
                                pa,
                                pb,
                                mr,
                                nc,
                                kc,
                                (out, d.rs),
                                accumulate,
                            );
                            continue;
                        }
                        bf16_dot::multiply_packed(pa, pb, mr, nc, kc, acc, ldc);
                    }
                    continue;
                }
                PACKED.with(|p| p.set([None; 2]));
                let sa = &mut sa[..mr * kc];
                let sb = &mut sb[..kc * nc];
                // SAFETY: the blocks inside a and b as above
                unsafe {
                    widen_block(a0, (am.rs, am.cs), (mr, kc), sa);
                    widen_block(b0, (bm.rs, bm.cs), (kc, nc), sb);
                }
                // SAFETY: three dense row-major f32 buffers of this task, mr×nc, mr×kc, kc×nc.
                unsafe {
                    gemm::gemm(
                        mr,
                        nc,
                        kc,
                        acc.as_mut_ptr(),
                        1,
                        nc as isize,
                        true,
                        sa.as_ptr(),
                        1,
                        kc as isize,
                        sb.as_ptr(),
                        1,
                        nc as isize,
                        1.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::None,
                    )
                };
            }
            for i in (0..mr).filter(|_| !into_bf16) {
                let row = &acc[i * ldc..i * ldc + nc];
                // SAFETY: as above: row r0 + i of dst's tile, written by this task alone.
                let out = unsafe { dp.get().add(at(d, r0 + i, c0)) };
                if d.cs == 1 {
                    // SAFETY: nc contiguous elements of that row
                    let out = unsafe { std::slice::from_raw_parts_mut(out, nc) };
                    zip1(out, row, |_, v| D::narrow(v));
                } else {
                    for (j, &v) in row.iter().enumerate() {
                        // SAFETY: column c0 + j of that row
                        unsafe { *out.add(j * d.cs) = D::narrow(v) };
                    }
                }
            }
        })
    });
}

/// `out[j] = widen(src[j·stride])` for every j of `out`.
///
/// # Safety
/// `src` must address `out.len()` readable elements `stride` apart.
#[inline(always)]
unsafe fn widen_row<E: Elem<Acc = f32>>(src: *const E, stride: usize, out: &mut [f32]) {
    if stride == 1 {
        // SAFETY: the caller's contract with stride 1
        let src = unsafe { std::slice::from_raw_parts(src, out.len()) };
        zip1(out, src, |_, v| v.widen());
    } else {
        for (j, o) in out.iter_mut().enumerate() {
            // SAFETY: the caller's contract
            *o = unsafe { *src.add(j * stride) }.widen();
        }
    }
}

/// The block `rows × cols` of `src` (element (i, j) at `src + i·rs + j·cs`) widened into
/// `out`, row-major: row by row where rows are contiguous, column by column where columns are
/// (a transposed operand), so the reads run along memory either way.
///
/// # Safety
/// Every element of the block must be readable; `out` holds `rows · cols`.
unsafe fn widen_block(
    src: *const bf16,
    (rs, cs): (usize, usize),
    (rows, cols): (usize, usize),
    out: &mut [f32],
) {
    if cs == 1 || rs != 1 {
        for (i, o) in out[..rows * cols].chunks_exact_mut(cols.max(1)).enumerate() {
            // SAFETY: row i of the block (the caller's contract)
            unsafe { widen_row(src.add(i * rs), cs, o) };
        }
    } else {
        for j in 0..cols {
            // SAFETY: column j of the block, contiguous (rs = 1)
            let col = unsafe { std::slice::from_raw_parts(src.add(j * cs), rows) };
            for (i, &v) in col.iter().enumerate() {
                out[i * cols + j] = v.widen();
            }
        }
    }
}

/// [`multiply`] or [`multiply_widened`], picked by dtype: `dst [= or +=] a · b`.
type Multiply<D, E> = unsafe fn(*mut D, Mat, bool, *const E, Mat, *const E, Mat);

/// `a · b` into a new row-major tensor, or with `transposed` its transpose `(a · b)ᵀ`: the
/// product computed row-major, then copied transposed into the output (the first is freed).
struct Product {
    transposed: bool,
    /// bf16 operands give an f32 output (a parameter gradient), not a bf16 one.
    f32_out: bool,
}
impl Product {
    /// `a · b` (or its transpose), in the operands' dtype or (`f32_out`) in f32.
    fn apply(a: &Tensor, b: &Tensor, transposed: bool, f32_out: bool) -> Result<Tensor> {
        let what = if f32_out {
            "dense product f32"
        } else {
            "dense product"
        };
        a.apply_op2_no_bwd(
            b,
            &Product {
                transposed,
                f32_out,
            },
        )
        .ctx(what)
    }
}

impl CustomOp2 for Product {
    fn name(&self) -> &'static str {
        if self.transposed {
            "dense-product-transposed"
        } else {
            "dense-product"
        }
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        /// The output stored as `D` of operands stored as `E`: `gemm` on them as they are
        /// where `D = E` is f32 or f64, [`multiply_widened`] for bf16 operands.
        fn go<D: Elem, E: Elem>(
            op: &str,
            transposed: bool,
            a: &[E],
            l1: &Layout,
            b: &[E],
            l2: &Layout,
            mul: Multiply<D, E>,
        ) -> candle_core::Result<(CpuStorage, Shape)> {
            let (am, bm) = (
                Mat::of(l1, a.len(), op, "lhs")?,
                Mat::of(l2, b.len(), op, "rhs")?,
            );
            check_shapes(op, None, am, bm)?;
            let len = am.rows * bm.cols;
            // Uninitialised: gemm without `read_dst` writes every element and reads none (a
            // zeroed vector cost a memset pass over heap memory glibc hands back dirty).
            let mut out: Vec<D> = Vec::with_capacity(len);
            let d = Mat {
                rows: am.rows,
                cols: bm.cols,
                off: 0,
                rs: bm.cols,
                cs: 1,
            };
            // SAFETY: Mat::of checked both operands against their slices; out is fresh with
            // capacity for d, and the product wrote all of it (`writes_every_element` tests it).
            unsafe {
                mul(out.as_mut_ptr(), d, false, a.as_ptr(), am, b.as_ptr(), bm);
                out.set_len(len);
            }
            if transposed {
                let t = elementwise::transpose_slice(&out, (am.rows, bm.cols));
                drop(out);
                return Ok((D::storage(t), Shape::from((bm.cols, am.rows))));
            }
            Ok((D::storage(out), Shape::from((am.rows, bm.cols))))
        }
        let (n, t) = (self.name(), self.transposed);
        match (s1, s2) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => go(n, t, a, l1, b, l2, multiply::<f32>),
            (CpuStorage::F64(a), CpuStorage::F64(b)) if !self.f32_out => {
                go(n, t, a, l1, b, l2, multiply::<f64>)
            }
            (CpuStorage::BF16(a), CpuStorage::BF16(b)) if self.f32_out => {
                go(n, t, a, l1, b, l2, multiply_widened::<f32>)
            }
            (CpuStorage::BF16(a), CpuStorage::BF16(b)) => {
                go(n, t, a, l1, b, l2, multiply_widened::<bf16>)
            }
            _ => Err(candle_core::Error::Msg(format!(
                "{n}: operands must both be f32, both f64 or both bf16 (f32 or bf16 for an f32 \
                 output), got {:?} and {:?}",
                s1.dtype(),
                s2.dtype()
            ))),
        }
    }
}

fn picked<'a, T: Elem>(op: &str, s: &'a CpuStorage) -> candle_core::Result<&'a [T]> {
    T::in_storage(s).ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "{op}: operands must all be f32 or all f64, or bf16 into a bf16 or f32 destination; \
             got {:?}",
            s.dtype()
        ))
    })
}

fn unsupported(op: &str, s: &CpuStorage) -> candle_core::Error {
    candle_core::Error::Msg(format!(
        "{op}: dtype {:?} unsupported (f32, f64, bf16 only)",
        s.dtype()
    ))
}

/// `dst += a · b` (`add`), or `dst = a · b` (dst's values not read), in place, on three
/// distinct storages.
struct Accumulate {
    add: bool,
}
impl InplaceOp3 for Accumulate {
    fn name(&self) -> &'static str {
        if self.add {
            "dense-accumulate"
        } else {
            "dense-product-into"
        }
    }
    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        a: &CpuStorage,
        al: &Layout,
        b: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<()> {
        fn go<D: Elem, E: Elem>(
            (op, add): (&str, bool),
            d: &mut [D],
            dl: &Layout,
            (a, al): (&CpuStorage, &Layout),
            (b, bl): (&CpuStorage, &Layout),
            mul: Multiply<D, E>,
        ) -> candle_core::Result<()> {
            let (a, b) = (picked::<E>(op, a)?, picked::<E>(op, b)?);
            let dm = Mat::of(dl, d.len(), op, "destination")?;
            let (am, bm) = (
                Mat::of(al, a.len(), op, "lhs")?,
                Mat::of(bl, b.len(), op, "rhs")?,
            );
            check_shapes(op, Some(dm), am, bm)?;
            // SAFETY: Mat::of checked all three against their slices; candle passes distinct
            // storages to an InplaceOp3 (it refuses operands sharing dst's).
            unsafe { mul(d.as_mut_ptr(), dm, add, a.as_ptr(), am, b.as_ptr(), bm) };
            Ok(())
        }
        let op = (self.name(), self.add);
        let (a, b) = ((a, al), (b, bl));
        // bf16 operands go to a bf16 destination or (a parameter gradient) an f32 one
        let bf16_operands = matches!(a.0, CpuStorage::BF16(_));
        match dst {
            CpuStorage::F32(d) if bf16_operands => go(op, d, dl, a, b, multiply_widened::<f32>),
            CpuStorage::F32(d) => go(op, d, dl, a, b, multiply::<f32>),
            CpuStorage::F64(d) => go(op, d, dl, a, b, multiply::<f64>),
            CpuStorage::BF16(d) => go(op, d, dl, a, b, multiply_widened::<bf16>),
            other => Err(unsupported(op.0, other)),
        }
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        a: &candle_core::CudaStorage,
        al: &Layout,
        b: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<()> {
        crate::ops::cuda::dense::accumulate(
            (self.name(), self.add),
            dst,
            dl,
            (a, al),
            Some((b, bl)),
            None,
        )
    }
}

/// `top += a · tail` on one tensor's rows: `rows [top + t, n]` is split after row `top`; the
/// first `top` rows are written, the last `t` rows are the right operand. The layer-output
/// gradient of a gradient buffer sits right after the prefix it is added into, in the same
/// storage, which an op over distinct tensors cannot take.
struct AccumulateTail {
    top: usize,
}
impl InplaceOp2 for AccumulateTail {
    fn name(&self) -> &'static str {
        "dense-accumulate-tail"
    }
    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dl: &Layout,
        a: &CpuStorage,
        al: &Layout,
    ) -> candle_core::Result<()> {
        fn go<T: Elem>(
            op: &str,
            top: usize,
            d: &mut [T],
            dl: &Layout,
            (a, al): (&CpuStorage, &Layout),
            mul: Multiply<T, T>,
        ) -> candle_core::Result<()> {
            let a = picked::<T>(op, a)?;
            let whole = Mat::of(dl, d.len(), op, "rows")?;
            if top > whole.rows {
                return Err(candle_core::Error::Msg(format!(
                    "{op}: cannot split {} rows after row {top}",
                    whole.rows
                )));
            }
            let dm = Mat { rows: top, ..whole };
            let bm = Mat {
                rows: whole.rows - top,
                off: whole.off + top * whole.rs,
                ..whole
            };
            let am = Mat::of(al, a.len(), op, "lhs")?;
            check_shapes(op, Some(dm), am, bm)?;
            let base = d.as_mut_ptr();
            // SAFETY: Mat::of checked the rows and the lhs against their slices; dst (rows
            // 0..top) and the right operand (rows top..) are disjoint rows of one tensor (a
            // layout with internal overlap is refused by candle before the op runs).
            unsafe { mul(base, dm, true, a.as_ptr(), am, base as *const T, bm) };
            Ok(())
        }
        let (op, top, a) = (self.name(), self.top, (a, al));
        match dst {
            CpuStorage::F32(d) => go(op, top, d, dl, a, multiply::<f32>),
            CpuStorage::F64(d) => go(op, top, d, dl, a, multiply::<f64>),
            CpuStorage::BF16(d) => go(op, top, d, dl, a, multiply_widened),
            other => Err(unsupported(op, other)),
        }
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        dst: &mut candle_core::CudaStorage,
        dl: &Layout,
        a: &candle_core::CudaStorage,
        al: &Layout,
    ) -> candle_core::Result<()> {
        crate::ops::cuda::dense::accumulate(
            (self.name(), true),
            dst,
            dl,
            (a, al),
            None,
            Some(self.top),
        )
    }
}

/// `a · b` (2-D CPU tensors, any strides, e.g. a transposed view) into a new `[m, n]` tensor
/// of the operands' dtype: f32, f64, or bf16 (bf16 operands, f32 accumulation, each output
/// element rounded to bf16 once; widening scratch [`WIDEN_SCRATCH_BYTES`] per thread).
pub fn product(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Product::apply(a, b, false, false)
}

/// `a · b` into a new f32 `[m, n]` tensor: of bf16 operands (f32 accumulation, the output not
/// rounded: a parameter gradient, kept in f32 under mixed precision; widening scratch
/// [`WIDEN_SCRATCH_BYTES`] per thread), or of f32 ones ([`product`]). f64 operands are an
/// error.
pub fn product_f32(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Product::apply(a, b, false, true)
}

/// `a · b` into a new `[m, n]` tensor (CPU), where the right operand `b [k, n]` is never made
/// whole: `chunk(c0, cols)` makes its columns `c0 .. c0 + cols` for each `(c0, cols)` of
/// `chunks`, which must tile `0 .. n` in order; each is multiplied into its columns of the
/// output and dropped before the next is made. The output is not zeroed first: every column
/// is written by its chunk's product (a zeroed `[m, n]` cost a memset pass per call). Bitwise
/// those columns of [`product`]`(a, b)` where every chunk is wider than 64 columns (see
/// `MIN_PANEL`); a bc layer's BN1 → ReLU → Conv1×1 on the CPU
/// (`layer::bn_relu_conv1_chunked`).
pub fn product_of_column_chunks(
    a: &Tensor,
    n: usize,
    chunks: &[(usize, usize)],
    mut chunk: impl FnMut(usize, usize) -> Result<Tensor>,
) -> Result<Tensor> {
    const OP: &str = "dense product of column chunks";
    let mut next = 0;
    for &(c0, cols) in chunks {
        if c0 != next || cols == 0 {
            return Err(candle_core::Error::Msg(format!(
                "chunks must tile 0..{n} in order; got {chunks:?}"
            )))
            .ctx(OP);
        }
        next += cols;
    }
    if next != n {
        return Err(candle_core::Error::Msg(format!(
            "chunks cover 0..{next}, not 0..{n}"
        )))
        .ctx(OP);
    }
    let (s, l) = a.storage_and_layout();
    match &*s {
        candle_core::Storage::Cpu(CpuStorage::F32(v)) => {
            chunked(OP, (v, l), n, chunks, &mut chunk, multiply::<f32>)
        }
        candle_core::Storage::Cpu(CpuStorage::F64(v)) => {
            chunked(OP, (v, l), n, chunks, &mut chunk, multiply::<f64>)
        }
        candle_core::Storage::Cpu(CpuStorage::BF16(v)) => chunked(
            OP,
            (v, l),
            n,
            chunks,
            &mut chunk,
            multiply_widened::<half::bf16>,
        ),
        _ => Err(crate::error::Error::Unsupported {
            device: format!("{:?}", a.device().location()),
            what: format!("{OP} (CPU f32/f64/bf16 only; got {:?})", a.dtype()),
        }),
    }
}

/// [`product_of_column_chunks`] for element type `T` (bf16: operands widened to f32 tile by
/// tile, each output element rounded once, as [`product`]).
fn chunked<T: Elem + candle_core::WithDType>(
    op: &str,
    (a, al): (&[T], &Layout),
    n: usize,
    chunks: &[(usize, usize)],
    chunk: &mut impl FnMut(usize, usize) -> Result<Tensor>,
    mul: Multiply<T, T>,
) -> Result<Tensor> {
    let am = Mat::of(al, a.len(), op, "lhs").ctx(op)?;
    let len = am.rows * n;
    let whole = Mat {
        rows: am.rows,
        cols: n,
        off: 0,
        rs: n,
        cs: 1,
    };
    let mut out: Vec<T> = Vec::with_capacity(len);
    for &(c0, cols) in chunks {
        let b = chunk(c0, cols)?;
        let (bs, bl) = b.storage_and_layout();
        let bv = match &*bs {
            candle_core::Storage::Cpu(s) => T::in_storage(s),
            _ => None,
        }
        .ok_or_else(|| {
            candle_core::Error::Msg(format!(
                "chunk {c0}+{cols} is {:?} on {:?}, not the left operand's type on the CPU",
                b.dtype(),
                b.device().location()
            ))
        })
        .ctx(op)?;
        let bm = Mat::of(bl, bv.len(), op, "rhs").ctx(op)?;
        let d = whole.columns(c0, cols);
        check_shapes(op, Some(d), am, bm).ctx(op)?;
        // SAFETY: Mat::of checked a and this chunk against their slices, check_shapes the
        // product's shape against columns c0 .. c0 + cols of `out`, whose capacity is
        // rows × n; out is a fresh allocation, distinct from both operands.
        unsafe { mul(out.as_mut_ptr(), d, false, a.as_ptr(), am, bv.as_ptr(), bm) };
    }
    // SAFETY: the chunks tile 0..n (checked by the caller), and a product that does not
    // accumulate writes every element of its columns (`writes_every_element`).
    unsafe { out.set_len(len) };
    Tensor::from_vec(out, (am.rows, n), &candle_core::Device::Cpu).ctx(op)
}

/// `(a · b)ᵀ` into a new row-major `[n, m]` tensor: the product row-major `[m, n]` (a temporary
/// of the output's size), then its transpose. A weight gradient `G·Xᵀ [out, in]` is taken as
/// `(X·Gᵀ)ᵀ`: `gemm` then packs the small `G` and streams `X` as it lies, where `G·Xᵀ` made it
/// repack all of `X` (`examples/gemm_shapes.rs`: 59 → 86 GFLOP/s for `[64, 4096]·[4096, 2304]`,
/// 52 → 77 for bc's `[48, 65536]·[65536, 204]`, 1 thread). The same sums in the same order.
pub fn product_transposed(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Product::apply(a, b, true, false)
}

/// [`product_transposed`] into f32: `(a · b)ᵀ` of bf16 operands (or f32 ones) as
/// [`product_f32`] computes `a · b`: a weight gradient taken transposed under mixed precision.
pub fn product_transposed_f32(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    Product::apply(a, b, true, true)
}

/// `dst += a · b`, **writing into `dst`'s storage** (which may be a view of a larger buffer);
/// `a` and `b` must not share `dst`'s storage (candle refuses them): see [`accumulate_tail`].
/// Dtypes: all f32, all f64, or bf16 operands into a bf16 `dst` (`bf16(f32(dst) + Σ)`, the
/// sum in f32, rounded once) or an f32 `dst` (a parameter gradient accumulated in f32, not
/// rounded to bf16); widening scratch: the thread's [`WIDEN_SCRATCH_BYTES`].
pub fn accumulate(dst: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    dst.inplace_op3(a, b, &Accumulate { add: true })
        .ctx("dense accumulate")
}

/// `dst = a · b`, **writing into `dst`'s storage** (a view: e.g. a column range of a wider
/// map); `dst`'s old values are not read (a NaN there does not propagate). As [`accumulate`]
/// otherwise (`gemm` without reading the destination; cuBLAS with β = 0).
pub fn product_into(dst: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    dst.inplace_op3(a, b, &Accumulate { add: false })
        .ctx("dense product into")
}

/// `rows[..top] += a · rows[top..]`, **writing into the first `top` rows of `rows`' storage**:
/// the product of a layer-output gradient with the rows right after the prefix it is added into
/// (one view of a gradient buffer).
pub fn accumulate_tail(rows: &Tensor, top: usize, a: &Tensor) -> Result<()> {
    rows.inplace_op2(a, &AccumulateTail { top })
        .ctx("dense accumulate")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu::shared::{bits, randn};
    use candle_core::DType;

    thread_local! {
        /// bf16 products on this thread take the plain path: every block packed per tile
        /// (never into `WHOLE_PACKED`), every tile summed in an f32 accumulator in memory.
        pub(super) static PLAIN_PATH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// What this thread's last bf16 product did: (left operand packed whole, right operand
        /// packed whole, tiles summed in the kernel's registers into bf16, left rows read in
        /// place).
        pub(super) static SHORTCUTS: std::cell::Cell<(bool, bool, bool, bool)> =
            const { std::cell::Cell::new((false, false, false, false)) };
    }

    /// A bf16 product on its shortcuts is bitwise the plain path (every block packed per tile,
    /// every tile summed in an f32 accumulator in memory): an operand packed once for all its
    /// tiles (`WHOLE_PACKED`) — the left one (a Linear forward `W·X`, one row tile), the right
    /// one (the mlp's weight gradient `(X·Gᵀ)ᵀ`, one column tile), both — and a tile of one
    /// inner block summed and rounded in the kernel's registers into bf16 (an input gradient
    /// `Wᵀ·G`, inner length 64 or 48; whole tiles only, the padded ones take the plain path),
    /// and a left operand's contiguous rows read in place by the kernel (the weight gradient's
    /// `X`, even inner length, at most 64 columns; not through a transposed view; a last panel
    /// of fewer than 8 rows packed).
    /// Inner lengths over one block and odd, rows and columns off the kernel's 8 × 32,
    /// transposed operands, into bf16 and f32, accumulating or not, destinations holding ±0,
    /// ±∞, NaN, subnormals and the largest bf16, at 1 and 3 threads.
    #[test]
    fn the_shortcuts_are_bitwise_the_plain_path() -> Result<()> {
        if !bf16_dot::enabled() {
            eprintln!("no bf16 dot kernel on this CPU: the widened path runs (no shortcuts)");
            return Ok(());
        }
        let fused = bf16_dot::fused_output();
        let cases = [
            // (m, n, k, left whole, right whole, fused into bf16, left rows in place unless
            // transposed)
            (64, 4096, 600, true, false, false, false),
            (45, 700, 257, true, false, false, false),
            (300, 64, 1023, false, true, false, false),
            (300, 64, 1024, false, true, false, fused),
            (203, 48, 514, false, true, false, fused),
            (100, 40, 130, false, false, fused, fused),
            (200, 50, 3, false, true, fused, false),
            (300, 600, 65, true, true, fused, false),
            (256, 512, 64, true, true, fused, false),
            (208, 1000, 48, true, true, fused, false),
            (8, 32, 1, false, false, fused, false),
            (7, 20, 2, false, false, fused, fused),
        ];
        let specials = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            -3e-39,
            3.38e38,
            -3.38e38,
        ];
        for (m, n, k, left, right, into_bf16, rows_a) in cases {
            for (a_t, b_t) in [(false, false), (true, true)] {
                // an operand stored transposed, read through its transposed view
                let operand = |rows, cols, t, seed| -> Result<Tensor> {
                    let x = randn(if t { (cols, rows) } else { (rows, cols) }, DType::F32);
                    let x = (x + seed as f64)?.to_dtype(DType::BF16)?;
                    Ok(if t { x.t()? } else { x })
                };
                let (a, b) = (operand(m, k, a_t, 1)?, operand(k, n, b_t, 2)?);
                let mut start: Vec<f32> = randn((m * n,), DType::F32).to_vec1()?;
                for (i, v) in specials.iter().enumerate() {
                    start[i * 7 % (m * n)] = *v;
                }
                let start = Tensor::from_vec(start, (m, n), &candle_core::Device::Cpu)?;
                for threads in [1, 3] {
                    type Took = (bool, bool, bool, bool);
                    let run = |plain: bool| -> Result<(Vec<u64>, Took)> {
                        crate::ops::cpu::shared::in_pool(threads, || {
                            PLAIN_PATH.with(|p| p.set(plain));
                            let mut out = Vec::new();
                            let mut took = (false, false, false, false);
                            let mut note = || {
                                let w = SHORTCUTS.with(std::cell::Cell::get);
                                took = (took.0 || w.0, took.1 || w.1, took.2 || w.2, took.3 || w.3);
                            };
                            let y = product(&a, &b)?;
                            note();
                            out.extend(bits(&y.to_dtype(DType::F32)?));
                            let y = product_f32(&a, &b)?;
                            note();
                            out.extend(bits(&y));
                            for dtype in [DType::BF16, DType::F32] {
                                // a copy: `to_dtype` to the same dtype shares the storage
                                let dst = start.to_dtype(dtype)?.copy()?;
                                accumulate(&dst, &a, &b)?;
                                note();
                                out.extend(bits(&dst.to_dtype(DType::F32)?));
                            }
                            PLAIN_PATH.with(|p| p.set(false));
                            Ok((out, took))
                        })
                    };
                    let (plain, none) = run(true)?;
                    assert_eq!(
                        none,
                        (false, false, false, false),
                        "{m}×{n}×{k}: a shortcut on the plain path"
                    );
                    // another test's product may hold the buffer for a moment: try again
                    let mut tries = 0;
                    let fast = loop {
                        let (fast, took) = run(false)?;
                        let want = (left, right, into_bf16, rows_a && !a_t);
                        if took == want || tries == 50 {
                            assert_eq!(took, want, "{m}×{n}×{k}: shortcuts taken");
                            break fast;
                        }
                        tries += 1;
                    };
                    assert!(
                        fast == plain,
                        "{m}×{n}×{k} (transposed {a_t}/{b_t}, {threads} threads): shortcuts ≠ plain path"
                    );
                }
            }
        }
        Ok(())
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// A product that does not accumulate ignores what its destination held (NaN here), so a
    /// new output may start uninitialised; every element is written, at every branch.
    #[test]
    fn writes_every_element() {
        for threads in [1, 3] {
            crate::ops::cpu::shared::in_pool(threads, || {
                for (m, n, k) in [
                    (3, 1, 5),
                    (4, 1000, 7),
                    (64, 4100, 0),
                    (48, 70, 30),
                    (300, 70, 9),
                ] {
                    let a: Vec<f64> = (0..m * k).map(|i| i as f64 * 0.5).collect();
                    let b: Vec<f64> = (0..k * n).map(|i| 1.0 - i as f64 * 0.25).collect();
                    let mut d = vec![f64::NAN; m * n];
                    let mat = |rows, cols| Mat {
                        rows,
                        cols,
                        off: 0,
                        rs: cols,
                        cs: 1,
                    };
                    // SAFETY: all three are dense row-major and sized for their shapes.
                    unsafe {
                        multiply(
                            d.as_mut_ptr(),
                            mat(m, n),
                            false,
                            a.as_ptr(),
                            mat(m, k),
                            b.as_ptr(),
                            mat(k, n),
                        )
                    };
                    for i in 0..m {
                        for j in 0..n {
                            let want: f64 = (0..k).map(|t| a[i * k + t] * b[t * n + j]).sum();
                            assert!(
                                (d[i * n + j] - want).abs() <= 1e-9 * want.abs().max(1.0),
                                "{m}×{n}×{k} at ({i}, {j})"
                            );
                        }
                    }
                }
            });
        }
    }

    /// A product made a column chunk of the right operand at a time is bitwise the whole
    /// product, at 1–3 threads, f32 and f64, with chunks of uneven widths over 64 (a bc
    /// bottleneck of 48 rows, an inner dimension over gemm's 512), each chunk made only when
    /// its turn comes.
    #[test]
    fn a_product_of_column_chunks_is_bitwise_the_whole_product() -> Result<()> {
        let (m, k, n) = (48, 600, 1100);
        let chunks = [(0, 400), (400, 365), (765, 335)];
        for dtype in [DType::F32, DType::F64] {
            let (a, b) = (randn((m, k), dtype), randn((k, n), dtype));
            for threads in [1, 2, 3] {
                crate::ops::cpu::shared::in_pool(threads, || -> Result<()> {
                    let whole = product(&a, &b)?;
                    let mut made = Vec::new();
                    let chunked = product_of_column_chunks(&a, n, &chunks, |c0, cols| {
                        made.push((c0, cols));
                        Ok(b.narrow(1, c0, cols)?.contiguous()?)
                    })?;
                    assert_eq!(made, chunks, "{dtype:?}, {threads} threads");
                    assert_eq!(chunked.dims(), &[m, n]);
                    assert!(
                        bits(&chunked) == bits(&whole),
                        "{dtype:?}, {threads} threads"
                    );
                    Ok(())
                })?;
            }
        }
        Ok(())
    }

    /// Chunks that do not tile the columns in order, a chunk of the wrong shape or type and a
    /// left operand the CPU does not hold are errors naming the op, never a partly written
    /// output.
    #[test]
    fn a_product_of_column_chunks_refuses_bad_chunks() {
        let (a, b) = (randn((4, 6), DType::F32), randn((6, 10), DType::F32));
        let cols = |c0: usize, n: usize| Ok(b.narrow(1, c0, n)?.contiguous()?);
        let err = |r: Result<Tensor>| r.unwrap_err().to_string();
        for bad in [
            vec![(0, 4), (5, 5)],
            vec![(0, 4), (4, 5)],
            vec![(0, 10), (10, 0)],
            vec![(4, 6), (0, 4)],
        ] {
            let e = err(product_of_column_chunks(&a, 10, &bad, cols));
            assert!(e.contains("dense product of column chunks"), "{bad:?}: {e}");
        }
        let e = err(product_of_column_chunks(&a, 10, &[(0, 10)], |_, _| {
            Ok(randn((5, 10), DType::F32))
        }));
        assert!(e.contains("dense product of column chunks"), "{e}");
        let e = err(product_of_column_chunks(&a, 10, &[(0, 10)], |_, _| {
            Ok(randn((6, 10), DType::F64))
        }));
        assert!(e.contains("not the left operand's type"), "{e}");
        let ok = product_of_column_chunks(&a, 10, &[(0, 3), (3, 7)], cols).unwrap();
        assert_eq!(ok.dims(), &[4, 10]);
    }

    /// The tiled copy of columns into rows puts every element where the plain loop does, at
    /// sizes on and off the tile's multiples (a single row or column, a stride past the rows).
    #[test]
    fn columns_copied_into_rows_in_tiles() {
        for (rows, cols, cs) in [
            (1, 1, 1),
            (512, 48, 600),
            (17, 33, 17),
            (16, 16, 40),
            (3, 70, 5),
        ] {
            let src: Vec<u32> = (0..cols * cs).map(|i| i as u32 * 7 + 1).collect();
            let mut got = vec![0u32; rows * cols];
            // SAFETY: column j's rows end at j·cs + rows ≤ cols·cs; got holds rows·cols.
            unsafe { columns_to_rows(got.as_mut_ptr(), src.as_ptr(), rows, cols, cs) };
            for kk in 0..rows {
                for j in 0..cols {
                    assert_eq!(
                        got[kk * cols + j],
                        src[j * cs + kk],
                        "{rows}×{cols}/{cs} at {kk},{j}"
                    );
                }
            }
        }
    }

    /// A small right operand whose columns are contiguous (a Conv1×1 weight-gradient chunk's
    /// `dzᵀ`) is copied row by row into the thread's scratch before `gemm` reads it: bitwise the
    /// product of the same values stored row by row, for the chunk's shapes (blocks of 16 and
    /// 204 rows, 512 inner, 48 columns), ragged ones, and one just over the scratch (f64 512 ×
    /// 65, read in place by `gemm`'s general path, which the copy relies on: its results do not
    /// depend on the strides), accumulating or not, at 1 and 3 threads. (At most 16 × 16
    /// outputs `gemm` sums an operand pair contiguous along the inner dimension in another
    /// order — 3 × 65 outputs over 512 differ in the last bits — so those are read in place.)
    #[test]
    fn a_right_operand_copied_row_by_row_keeps_the_bits() {
        for dtype in [DType::F32, DType::F64] {
            for (m, k, n) in [
                (16, 512, 48),
                (204, 512, 48),
                (7, 37, 40),
                (20, 512, 65),
                (90, 3, 5),
            ] {
                let a = randn((m, k), dtype);
                let b_cols = randn((n, k), dtype);
                let b_view = b_cols.t().unwrap();
                let b_rows = b_view.contiguous().unwrap();
                let start = randn((m, n), dtype);
                for threads in [1, 3] {
                    crate::ops::cpu::shared::in_pool(threads, || {
                        let at = format!("{m}×{k}×{n} {dtype:?}, {threads} threads");
                        let (p1, p2) =
                            (product(&a, &b_view).unwrap(), product(&a, &b_rows).unwrap());
                        assert_eq!(bits(&p1), bits(&p2), "product {at}");
                        let (d1, d2) = (start.copy().unwrap(), start.copy().unwrap());
                        accumulate(&d1, &a, &b_view).unwrap();
                        accumulate(&d2, &a, &b_rows).unwrap();
                        assert_eq!(bits(&d1), bits(&d2), "accumulate {at}");
                        let want = (&start + a.matmul(&b_rows).unwrap()).unwrap();
                        let tol = if dtype == DType::F32 { 1e-3 } else { 1e-10 };
                        assert!(max_diff(&d1, &want) < tol, "accumulate vs matmul {at}");
                    });
                }
            }
        }
    }

    /// The three products of a dense layer, as the maths passes them (views, transposes),
    /// against candle's matmul, at shapes that take every branch (one column, column panels,
    /// row panels, gemm's own threading, one thread for a small product) in pools of 1, 2 and 3 threads: bitwise the same at
    /// every thread count (panel widths next to gemm's 64 × 64 small-size path included), and
    /// the weight gradient taken transposed bitwise the direct one.
    #[test]
    fn products_match_matmul() {
        for dtype in [DType::F32, DType::F64] {
            for (out, c, m) in [
                (3, 5, 1),
                (3, 8, 2),
                (4, 7, 1000),
                (64, 300, 4100),
                (64, 70, 700),
                // dW [64, 70] over 4096: too narrow for panels and above SMALL_PRODUCT_MACS,
                // so gemm's own threading (the one at 700 is small: one thread)
                (64, 70, 4096),
                (48, 30, 70),
                (12, 200, 300),
            ] {
                let rand = |shape: (usize, usize)| randn(shape, dtype);
                let (w, x, g) = (rand((out, c)), rand((c, m)), rand((out, m)));
                let tol = if dtype == DType::F32 { 1e-3 } else { 1e-10 };
                let (xt, wt) = (x.t().unwrap(), w.t().unwrap());
                let products = || {
                    let y = product(&w, &x).unwrap();
                    let dw = product(&g, &xt).unwrap();
                    let dwt = product_transposed(&x, &g.t().unwrap()).unwrap();
                    let acc = x.copy().unwrap();
                    accumulate(&acc, &wt, &g).unwrap();
                    let rows = Tensor::cat(&[&x, &g], 0).unwrap();
                    accumulate_tail(&rows, c, &wt).unwrap();
                    [y, dw, dwt, acc, rows]
                };
                let mut first: Option<Vec<Vec<u64>>> = None;
                for threads in [1, 2, 3] {
                    let [y, dw, dwt, acc, rows] =
                        crate::ops::cpu::shared::in_pool(threads, products);
                    let at = format!("{out}×{c}×{m} {dtype:?}, {threads} threads");
                    assert!(max_diff(&y, &w.matmul(&x).unwrap()) < tol, "W·X {at}");
                    assert!(max_diff(&dw, &g.matmul(&xt).unwrap()) < tol, "G·Xᵀ {at}");
                    assert_eq!(dwt.dims(), dw.dims());
                    assert!(dwt.is_contiguous());
                    assert_eq!(bits(&dwt), bits(&dw), "(X·Gᵀ)ᵀ {at}");
                    let dx = wt.matmul(&g).unwrap();
                    assert!(max_diff(&acc, &(&x + &dx).unwrap()) < tol, "X + Wᵀ·G {at}");
                    assert_eq!(
                        bits(&rows.narrow(0, 0, c).unwrap()),
                        bits(&acc),
                        "tail form {at}"
                    );
                    assert_eq!(bits(&rows.narrow(0, c, out).unwrap()), bits(&g));
                    let all: Vec<Vec<u64>> = [&y, &dw, &acc].iter().map(|t| bits(t)).collect();
                    match &first {
                        None => first = Some(all),
                        Some(f) => assert!(f == &all, "thread count changed bits: {at}"),
                    }
                }
            }
        }
    }
}
