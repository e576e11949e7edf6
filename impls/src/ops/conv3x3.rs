//! The direct, cache-blocked 3×3 convolution (padding 1, stride 1, no bias) on channel-major
//! maps `[C, N·H·W]` for the CPU: forward, backward-data and backward-weight, without the 9×
//! tap stack of the whole map. H and W are separate throughout ([`Grid`]); nothing assumes a
//! square image.
//!
//! The image is cut into tiles of whole rows of one image. A tile copies its rows, plus one halo
//! row above and below, into a zero-padded scratch `[C, R+2, W+2]`; in that padded tile every
//! tap is a constant offset, and outputs are computed in padded-width columns (copied out
//! without the pad columns). Per tile, each pass is one to three `gemm` products of a useful
//! inner length, all in cache:
//!
//! - forward: for each kernel row dy, `Z_dy [3k, ·] = W_dy [3k, B] · tile[dy-th row on]` (the
//!   three taps of that row stacked), then `y = Σ_j Z_j` shifted by tap j's column, summed in
//!   tap order — the same sums, in the same order, as nine accumulated per-tap products;
//! - backward-data: the nine shifted copies of the gradient tile stacked, `G [9k, ·]`, then
//!   `ds = Wᵀ_flipped [B, 9k] · G`: one product of inner length 9k (per tap it was k = 12);
//! - backward-weight: the same `G` times the layer-input tile, `dW_taps [9k, B] += G · sᵀ`.
//!
//! Products run single-threaded inside a tile, tiles in parallel (rayon); every output element
//! is produced by one tile, and the weight gradient sums a fixed number of per-group partials in
//! order, so results do not depend on the thread count or on scheduling. The only workspace is
//! one scratch per thread ([`workspace_elems`]) and the stacked weight of the pass.
//!
//! Dtypes: all f32 or all f64, or bf16 operands (PyTorch autocast's convolution): where the CPU
//! has AVX-512 BF16, the passes run on its dot-product kernel with bf16 tiles
//! ([`crate::ops::cpu::conv3x3_bf16`], in the same allocations); elsewhere (or where a block's
//! packed operands do not fit them) the scratch tiles and the stacked weight are f32 — the bf16
//! operands widened (exact) as a tile is filled. Either way the products accumulate in f32,
//! and each output element is written once, rounded to bf16 (forward, backward-data) or not
//! rounded (backward-weight: an f32 parameter gradient). For bf16 the scratch is [`workspace_elems`] f32 elements (4 bytes each, not the
//! operands' 2) per thread and the stacked weight `9·k·B` f32 elements: the same element counts
//! as for f32 operands.

use crate::error::{CandleContext, Result};
pub use crate::ops::cpu::shared::Float;
use crate::ops::cpu::shared::{zip1, Elem, SharedPtr};
use crate::ops::layout::grid::Grid;
use crate::ops::layout::grid::TAPS;
use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

/// Padded columns per tile: about 400 columns keep a bc layer's tiles (the input tile and the
/// stacked products, ≈ 270 KB in f32) inside a core's L2 cache.
const TILE_COLS: usize = 400;

/// Tiles of the weight gradient are summed in this many groups, each accumulating its tiles in
/// order into one partial; the partials are then added in order. Fixed (not the thread count)
/// so the sum order, hence every bit of the result, is the same at any thread count.
pub const WEIGHT_GROUPS: usize = 16;

/// Rows per tile for `grid`: whole image rows, about [`TILE_COLS`] padded columns.
pub(crate) fn tile_rows(g: Grid) -> usize {
    TILE_COLS.div_ceil(g.w + 2).clamp(1, g.h.max(1))
}

/// The tiles of `grid`: `(image, first row, rows)`, in image-then-row order.
pub(crate) fn tiles(g: Grid) -> Vec<(usize, usize, usize)> {
    let r = tile_rows(g);
    (0..g.n)
        .flat_map(|n| (0..g.h).step_by(r).map(move |y0| (n, y0, r.min(g.h - y0))))
        .collect()
}

/// How many tiles [`tiles`] lists, without listing them.
fn tile_count(g: Grid) -> usize {
    g.n.saturating_mul(g.h.div_ceil(tile_rows(g)))
}

/// `(tiles per group, groups)` of the weight gradient for `tiles` tiles: at most
/// [`WEIGHT_GROUPS`] groups of equal size but the last.
fn weight_groups(tiles: usize) -> (usize, usize) {
    let per = tiles.div_ceil(WEIGHT_GROUPS.min(tiles).max(1)).max(1);
    (per, tiles.div_ceil(per))
}

/// Which of the three products a pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// `(s [B, M], w [k, B, 3, 3]) → y [k, M]`.
    Forward,
    /// `(gy [k, M], w [k, B, 3, 3]) → ds [B, M]`.
    Data,
    /// `(gy [k, M], s [B, M]) → dW [k, B, 3, 3]`.
    Weight,
}

/// Sizes of one tile of `r` rows: padded width, padded tile length `(r + 2)·wp`, output
/// columns `r·wp − 2` (padded position c + 1 of rows 0..r is output column c).
pub(crate) fn tile_dims(g: Grid, r: usize) -> (usize, usize, usize) {
    let wp = g.w + 2;
    (wp, (r + 2) * wp, r * wp - 2)
}

/// Elements of scratch one thread holds while it works on tiles of `pass` between `b` (the
/// layer-input side) and `k` (the output side) channels:
/// forward the input tile and the stacked products `Z [9k, r·wp]`; backward-data the gradient
/// tile, its stacked shifts `G [9k, cols]` and the output tile `[B, cols]`; backward-weight
/// the input tile, the gradient tile and `G`. The memory model counts one per thread.
pub fn workspace_elems(g: Grid, pass: Pass, b: usize, k: usize) -> usize {
    let (_, tl, cols) = tile_dims(g, tile_rows(g));
    match pass {
        Pass::Forward => b * tl + 9 * k * (cols + 2),
        Pass::Data => k * tl + 9 * k * cols + b * cols,
        Pass::Weight => (b + k) * tl + 9 * k * cols,
    }
}

/// How many scratches a pass holds: one per thread of the current rayon pool that has a tile
/// (forward, backward-data) or a group of tiles (backward-weight) to work on.
fn scratch_count(g: Grid, pass: Pass) -> usize {
    let units = match pass {
        Pass::Weight => weight_groups(tile_count(g)).1,
        _ => tile_count(g),
    };
    rayon::current_num_threads().min(units).max(1)
}

/// Elements of scratch live at once during one pass: `scratch_count` × [`workspace_elems`].
pub fn scratch_elems(g: Grid, pass: Pass, b: usize, k: usize) -> usize {
    scratch_count(g, pass) * workspace_elems(g, pass, b, k)
}

/// Elements of the weight gradient's partial sums: one `[9k, B]` per group.
pub fn weight_partial_elems(g: Grid, k: usize, b: usize) -> usize {
    weight_groups(tile_count(g)).1 * k * b * 9
}

/// The scratches of one pass, one per worker that has work ([`scratch_elems`] in all),
/// allocated before the pass starts, so the pass holds exactly what the memory model counts
/// however rayon schedules its tiles (a pool may run a small pass on one thread alone).
pub(crate) struct Scratches<T>(Vec<std::sync::Mutex<Vec<T>>>);

impl<T: Float> Scratches<T> {
    pub(crate) fn new(g: Grid, pass: Pass, b: usize, k: usize) -> Self {
        let one = workspace_elems(g, pass, b, k);
        Scratches(
            (0..scratch_count(g, pass))
                .map(|_| std::sync::Mutex::new(vec![T::default(); one]))
                .collect(),
        )
    }

    /// Runs `f` on the current worker's scratch. A worker runs one tile at a time (the tile
    /// code never yields to rayon), so its scratch is free; a pool with more workers than
    /// scratches shares them through the lock.
    pub(crate) fn with(&self, f: impl FnOnce(&mut [T])) {
        let i = rayon::current_thread_index().unwrap_or(0) % self.0.len();
        let mut scratch = self.0[i].lock().unwrap_or_else(|e| e.into_inner());
        f(&mut scratch)
    }
}

/// Copies rows `y0 − 1 .. y0 + r + 1` of image `n` of every channel of `x [C, M]` into `tile
/// [C, r+2, W+2]` (widened to the compute type, exact), zero outside the image (the halo and
/// the two pad columns).
fn fill_tile<E: Elem<Acc = T>, T: Float>(
    tile: &mut [T],
    x: &[E],
    c: usize,
    g: Grid,
    pos: (usize, usize, usize),
) {
    fill_tile_as(tile, x, c, g, pos, T::default(), E::widen);
}

/// [`fill_tile`] with each element taken by `conv` (exact) and `zero` outside the image: the
/// bf16 dot path keeps its tiles in bf16.
pub(crate) fn fill_tile_as<E: Copy, T: Copy>(
    tile: &mut [T],
    x: &[E],
    c: usize,
    g: Grid,
    (n, y0, r): (usize, usize, usize),
    zero: T,
    conv: impl Fn(E) -> T,
) {
    let (wp, plane, m) = (g.w + 2, g.h * g.w, g.n * g.h * g.w);
    let rows = r + 2;
    for ch in 0..c {
        let src = &x[ch * m + n * plane..ch * m + (n + 1) * plane];
        for tr in 0..rows {
            let dst = &mut tile[(ch * rows + tr) * wp..(ch * rows + tr + 1) * wp];
            let iy = (y0 + tr).checked_sub(1).filter(|&iy| iy < g.h);
            match iy {
                Some(iy) => {
                    dst[0] = zero;
                    let src = &src[iy * g.w..(iy + 1) * g.w];
                    zip1(&mut dst[1..=g.w], src, |_, v| conv(v));
                    dst[g.w + 1] = zero;
                }
                None => dst.fill(zero),
            }
        }
    }
}

/// `stack [9k, cols]`: row `j·k + o` is channel o of the padded gradient tile `gyt [k, tl]`
/// shifted by tap j, `gyt[o, c + dy·wp + dx]` for output column c.
fn stack_shifts<T: Float>(
    stack: &mut [T],
    gyt: &[T],
    k: usize,
    (wp, tl, cols): (usize, usize, usize),
) {
    for (j, &(dy, dx)) in TAPS.iter().enumerate() {
        for o in 0..k {
            let from = o * tl + dy * wp + dx;
            stack[(j * k + o) * cols..(j * k + o + 1) * cols]
                .copy_from_slice(&gyt[from..from + cols]);
        }
    }
}

/// A row-major matrix operand for `gemm`: base offset and strides, in elements.
#[derive(Clone, Copy)]
struct Mat {
    off: usize,
    rs: usize,
    cs: usize,
}

impl Mat {
    /// Row-major with rows `rs` apart, from `off`.
    fn rows(off: usize, rs: usize) -> Mat {
        Mat { off, rs, cs: 1 }
    }
}

/// `dst (m×n) = [dst +] lhs (m×k) · rhs (k×n)`, single-threaded.
///
/// # Safety
/// Every element the strides address must lie inside the slices; `dst` must not alias the
/// operands.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_acc<T: Float>(
    (m, n, k): (usize, usize, usize),
    dst: *mut T,
    d: Mat,
    accumulate: bool,
    lhs: *const T,
    l: Mat,
    rhs: *const T,
    r: Mat,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst.add(d.off),
        d.cs as isize,
        d.rs as isize,
        accumulate,
        lhs.add(l.off),
        l.cs as isize,
        l.rs as isize,
        rhs.add(r.off),
        r.cs as isize,
        r.rs as isize,
        T::ONE,
        T::ONE,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
}

/// Copies the output tile `acc [c_out, cols]` (padded-width columns, rows `ld ≥ cols` apart)
/// of tile `(n, y0, r)` into `out [c_out, M]` without the pad columns, each element rounded
/// once to `E`.
///
/// # Safety
/// `out` must address `c_out · M` elements, and no other task may write rows y0 .. y0 + r of
/// image n.
pub(crate) unsafe fn write_tile<E: Elem<Acc = T>, T: Float>(
    out: SharedPtr<E>,
    (acc, ld): (&[T], usize),
    c_out: usize,
    g: Grid,
    (n, y0, r): (usize, usize, usize),
) {
    let (wp, plane, m) = (g.w + 2, g.h * g.w, g.n * g.h * g.w);
    for co in 0..c_out {
        for row in 0..r {
            let src = &acc[co * ld + row * wp..co * ld + row * wp + g.w];
            let at = co * m + n * plane + (y0 + row) * g.w;
            // SAFETY: the caller's contract.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(at), g.w) };
            zip1(dst, src, |_, v| E::narrow(v));
        }
    }
}

/// `y [k, M] = Σ_j W_j [k, B] · shift_j(s [B, M])`, tap j reading pixel `(y + dy − 1, x + dx − 1)`.
fn forward_tiles<E: Elem<Acc = T>, T: Float>(
    s: &[E],
    w: &[E],
    b: usize,
    k: usize,
    g: Grid,
) -> Vec<E> {
    let (plane, m) = (g.h * g.w, g.n * g.h * g.w);
    // The taps stacked, row j·k + o = W[o, :, j] ([9k, B]).
    let mut wst = vec![T::default(); 9 * k * b];
    for j in 0..9 {
        for o in 0..k {
            for c in 0..b {
                wst[(j * k + o) * b + c] = w[(o * b + c) * 9 + j].widen();
            }
        }
    }
    // Uninitialised: the tiles cover every row of every image, so each element is written
    // once below (a zeroed vector cost a memset pass over heap memory glibc hands back dirty).
    let mut out: Vec<E> = Vec::with_capacity(k * m);
    let shared = SharedPtr(out.as_mut_ptr());
    let ws = Scratches::<T>::new(g, Pass::Forward, b, k);
    tiles(g).into_par_iter().for_each(|(n, y0, r)| {
        ws.with(|scratch| {
            let (wp, tl, cols) = tile_dims(g, r);
            let zc = cols + 2;
            let (tile, z) = scratch.split_at_mut(b * tl);
            fill_tile(tile, s, b, g, (n, y0, r));
            for dy in 0..3 {
                // Z rows (3dy .. 3dy + 3)·k: the three taps of kernel row dy on every column
                // from padded row dy on.
                // SAFETY: Z has 9k rows of zc; the tile columns read are dy·wp + q for
                // q < zc = r·wp, ≤ (r + 2)·wp − 1 < tl; wst is 9k × b.
                unsafe {
                    gemm_acc(
                        (3 * k, zc, b),
                        z.as_mut_ptr(),
                        Mat::rows(3 * dy * k * zc, zc),
                        false,
                        wst.as_ptr(),
                        Mat::rows(3 * dy * k * b, b),
                        tile.as_ptr(),
                        Mat::rows(dy * wp, tl),
                    );
                }
            }
            // y[o, (row, x)] = Σ_j Z[j·k + o, row·wp + x + dx_j], in tap order from tap 0's
            // value (no +0 first), in T, rounded once to E.
            for o in 0..k {
                for row in 0..r {
                    let at = o * m + n * plane + (y0 + row) * g.w;
                    // SAFETY: rows y0..y0 + r of image n of channel o belong to this tile only.
                    let dst = unsafe { std::slice::from_raw_parts_mut(shared.get().add(at), g.w) };
                    let tap = |j: usize| {
                        let from = (j * k + o) * zc + row * wp + TAPS[j].1;
                        &z[from..from + g.w]
                    };
                    let taps: [&[T]; 9] = std::array::from_fn(tap);
                    for (x, d) in dst.iter_mut().enumerate() {
                        let mut v = taps[0][x];
                        for t in &taps[1..] {
                            v = v + t[x];
                        }
                        *d = E::narrow(v);
                    }
                }
            }
        })
    });
    drop(ws);
    drop(wst);
    // SAFETY: every element of [0, k·m) was written by exactly one tile (T is Copy).
    unsafe { out.set_len(k * m) };
    out
}

/// `ds [B, M] = Σ_j W_jᵀ · shift_j⁻¹(gy)` as one product per tile of inner length 9k.
fn data_tiles<E: Elem<Acc = T>, T: Float>(
    gy: &[E],
    w: &[E],
    b: usize,
    k: usize,
    g: Grid,
) -> Vec<E> {
    let m = g.n * g.h * g.w;
    // The flipped kernel, row c = [W[o, c, 8 − j] for j, o] ([B, 9k]), matching the rows of
    // the stacked shifts.
    let mut wt = vec![T::default(); 9 * k * b];
    for c in 0..b {
        for j in 0..9 {
            for o in 0..k {
                wt[c * 9 * k + j * k + o] = w[(o * b + c) * 9 + 8 - j].widen();
            }
        }
    }
    // Uninitialised: every element is written once by its tile (see forward_tiles).
    let mut out: Vec<E> = Vec::with_capacity(b * m);
    let shared = SharedPtr(out.as_mut_ptr());
    let ws = Scratches::<T>::new(g, Pass::Data, b, k);
    tiles(g).into_par_iter().for_each(|(n, y0, r)| {
        ws.with(|scratch| {
            let dims @ (_, tl, cols) = tile_dims(g, r);
            let (gyt, rest) = scratch.split_at_mut(k * tl);
            let (stack, acc) = rest.split_at_mut(9 * k * cols);
            fill_tile(gyt, gy, k, g, (n, y0, r));
            stack_shifts(stack, gyt, k, dims);
            // SAFETY: acc is b × cols, wt b × 9k, stack 9k × cols.
            unsafe {
                gemm_acc(
                    (b, cols, 9 * k),
                    acc.as_mut_ptr(),
                    Mat::rows(0, cols),
                    false,
                    wt.as_ptr(),
                    Mat::rows(0, 9 * k),
                    stack.as_ptr(),
                    Mat::rows(0, cols),
                );
                write_tile(shared, (acc, cols), b, g, (n, y0, r));
            }
        })
    });
    drop(ws);
    drop(wt);
    // SAFETY: every element of [0, b·m) was written by exactly one tile (T is Copy).
    unsafe { out.set_len(b * m) };
    out
}

/// `dW [k, B, 3, 3]` with `dW[o, c, dy, dx] = Σ_p gy[o, p] · s[c, p + (dy − 1, dx − 1)]`, from
/// `dW_taps [9k, B] = G · sᵀ` per tile (`G` the stacked shifts of the gradient: row `j·k + o`
/// holds `gy[o, q + off_j]`, and `−off_j = off_{8−j}`).
fn weight_grad<E: Elem<Acc = T>, T: Float>(
    gy: &[E],
    s: &[E],
    k: usize,
    b: usize,
    g: Grid,
) -> Vec<T> {
    weight_by_groups(g, k, b, |part, scratch, t, (n, y0, r)| {
        let dims @ (wp, tl, cols) = tile_dims(g, r);
        let (st, rest) = scratch.split_at_mut(b * tl);
        let (gyt, stack) = rest.split_at_mut(k * tl);
        fill_tile(st, s, b, g, (n, y0, r));
        fill_tile(gyt, gy, k, g, (n, y0, r));
        stack_shifts(stack, gyt, k, dims);
        // SAFETY: part is 9k × b; stack 9k × cols; sᵀ reads st[c·tl + wp + 1 + q] for q <
        // cols, ≤ (r + 1)·wp − 1 + wp < tl (zero in the pad columns).
        unsafe {
            gemm_acc(
                (9 * k, b, cols),
                part.as_mut_ptr(),
                Mat::rows(0, b),
                t > 0,
                stack.as_ptr(),
                Mat::rows(0, cols),
                st.as_ptr(),
                Mat {
                    off: wp + 1,
                    rs: 1,
                    cs: tl,
                },
            );
        }
    })
}

/// The weight gradient's frame, for either kernel: every group's partial `dW_taps [9k, B]`
/// made up front, then the scratches (the memory model's order); `tile(partial, scratch, t,
/// tile)` adds the group's t-th tile into its partial (t = 0: writes it), the groups in
/// parallel; then [`sum_weight_partials`].
pub(crate) fn weight_by_groups<T: Float>(
    g: Grid,
    k: usize,
    b: usize,
    tile: impl Fn(&mut [T], &mut [T], usize, (usize, usize, usize)) + Sync,
) -> Vec<T> {
    let all = tiles(g);
    let (per, groups) = weight_groups(all.len());
    let mut partials: Vec<Vec<T>> = (0..groups).map(|_| vec![T::default(); 9 * k * b]).collect();
    let ws = Scratches::<T>::new(g, Pass::Weight, b, k);
    partials
        .par_iter_mut()
        .zip(all.par_chunks(per))
        .for_each(|(part, chunk)| {
            ws.with(|scratch| {
                for (t, &pos) in chunk.iter().enumerate() {
                    tile(part, scratch, t, pos);
                }
            })
        });
    drop(ws);
    sum_weight_partials(partials, k, b)
}

/// The weight gradient from its groups' partial `dW_taps [9k, B]` sums: added in group order,
/// then reordered into PyTorch's `[k, B, 3, 3]`.
fn sum_weight_partials<T: Float>(partials: Vec<Vec<T>>, k: usize, b: usize) -> Vec<T> {
    let mut it = partials.into_iter();
    let mut sum = it.next().unwrap_or_else(|| vec![T::default(); 9 * k * b]);
    for p in it {
        for (d, v) in sum.iter_mut().zip(p) {
            *d = *d + v;
        }
    }
    // dW[o, c, j] = dW_taps[(8 − j)·k + o, c].
    let mut dw = vec![T::default(); 9 * k * b];
    for o in 0..k {
        for c in 0..b {
            for j in 0..9 {
                dw[(o * b + c) * 9 + j] = sum[((8 - j) * k + o) * b + c];
            }
        }
    }
    dw
}

struct Conv3x3Op {
    grid: Grid,
    pass: Pass,
}

impl CustomOp2 for Conv3x3Op {
    fn name(&self) -> &'static str {
        match self.pass {
            Pass::Forward => "conv3x3-forward",
            Pass::Data => "conv3x3-backward-data",
            Pass::Weight => "conv3x3-backward-weight",
        }
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        crate::ops::cpu::shared::tune_gemm();
        let name = self.name();
        let g = self.grid;
        let (c1, m) = l1.shape().dims2()?;
        if m != g.n * g.h * g.w {
            return Err(candle_core::Error::Msg(format!(
                "{name}: {m} columns, grid {}×{}×{} wants {}",
                g.n,
                g.h,
                g.w,
                g.n * g.h * g.w
            )));
        }
        let d2 = l2.shape().dims();
        let (out_shape, k, b) = match self.pass {
            Pass::Forward | Pass::Data => {
                let (k, b) = match d2 {
                    [k, b, 3, 3] => (*k, *b),
                    _ => {
                        return Err(candle_core::Error::Msg(format!(
                            "{name}: weight {d2:?}, expected [k, B, 3, 3]"
                        )))
                    }
                };
                let (want, out) = match self.pass {
                    Pass::Forward => (b, k),
                    _ => (k, b),
                };
                if c1 != want {
                    return Err(candle_core::Error::Msg(format!(
                        "{name}: {c1} input channels, weight {d2:?} wants {want}"
                    )));
                }
                (Shape::from((out, m)), k, b)
            }
            Pass::Weight => {
                let (b, m2) = l2.shape().dims2()?;
                if m2 != m {
                    return Err(candle_core::Error::Msg(format!(
                        "{name}: gradient has {m} columns, input {m2}"
                    )));
                }
                (Shape::from((c1, b, 3, 3)), c1, b)
            }
        };
        // features out as E (rounded once), the weight gradient as E::Acc (f32 for bf16)
        fn go<E: Elem<Acc = T>, T: Float>(
            p: Pass,
            a: &[E],
            w: &[E],
            (k, b): (usize, usize),
            g: Grid,
        ) -> CpuStorage {
            match p {
                Pass::Forward => E::storage(forward_tiles(a, w, b, k, g)),
                Pass::Data => E::storage(data_tiles(a, w, b, k, g)),
                Pass::Weight => T::storage(weight_grad(a, w, k, b, g)),
            }
        }
        let sl = |l: &Layout| {
            l.contiguous_offsets().ok_or_else(|| {
                candle_core::Error::Msg(format!("{name}: operand must be contiguous"))
            })
        };
        let ((a1, b1), (a2, b2)) = (sl(l1)?, sl(l2)?);
        let p = self.pass;
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => go(p, &x[a1..b1], &y[a2..b2], (k, b), g),
            (CpuStorage::F64(x), CpuStorage::F64(y)) => go(p, &x[a1..b1], &y[a2..b2], (k, b), g),
            (CpuStorage::BF16(x), CpuStorage::BF16(y)) => {
                let (x, y) = (&x[a1..b1], &y[a2..b2]);
                // the dot-product kernel where the CPU has it and the pass's blocks fit
                let dot = crate::ops::cpu::bf16_dot::enabled()
                    .then(|| crate::ops::cpu::conv3x3_bf16::run(p, x, y, (k, b), g))
                    .flatten();
                dot.unwrap_or_else(|| go(p, x, y, (k, b), g))
            }
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "{name}: operands must all be f32, all f64 or all bf16, got {:?} and {:?}",
                    s1.dtype(),
                    s2.dtype()
                )))
            }
        };
        Ok((out, out_shape))
    }
}

fn apply(a: &Tensor, b: &Tensor, grid: Grid, pass: Pass, what: &'static str) -> Result<Tensor> {
    let a = a.contiguous().ctx(what)?;
    let b = b.contiguous().ctx(what)?;
    a.apply_op2_no_bwd(&b, &Conv3x3Op { grid, pass }).ctx(what)
}

/// `y [k, M]` of `s [B, M]` and a PyTorch weight `w [k, B, 3, 3]` (CPU tensors): f32, f64,
/// or bf16 (f32 accumulation, rounded once to bf16).
pub fn forward(s: &Tensor, w: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(s, w, grid, Pass::Forward, "conv3x3 forward")
}

/// `ds [B, M]` of the upstream gradient `gy [k, M]` and the weight `w [k, B, 3, 3]`: f32, f64,
/// or bf16 (f32 accumulation, rounded once to bf16).
pub fn backward_data(gy: &Tensor, w: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(gy, w, grid, Pass::Data, "conv3x3 backward data")
}

/// `dW [k, B, 3, 3]` of the upstream gradient `gy [k, M]` and the layer input `s [B, M]`:
/// f32 or f64 in their own dtype; of bf16 operands an f32 gradient (f32 accumulation, not
/// rounded).
pub fn backward_weight(gy: &Tensor, s: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(gy, s, grid, Pass::Weight, "conv3x3 backward weight")
}
