//! The direct 3×3 convolution's tiling, shared by both kernels ([`super::widened`] and
//! [`super::bf16`]): tiles of whole image rows, their padded sizes, the per-thread scratches the
//! memory model counts, filling a tile and writing an output tile, and the weight gradient's
//! fixed groups.

use crate::ops::cpu::shared::{zip1, Elem, Float, SharedPtr};
use crate::ops::layout::grid::Grid;
use rayon::prelude::*;

/// Padded columns per tile: about 400 columns keep a bc layer's tiles (the input tile and the
/// stacked products, ≈ 270 KB in f32) inside a core's L2 cache.
const TILE_COLS: usize = 400;

/// Tiles of the weight gradient are summed in this many groups, each accumulating its tiles in
/// order into one partial; the partials are then added in order. Fixed (not the thread count)
/// so the sum order, hence every bit of the result, is the same at any thread count.
pub const WEIGHT_GROUPS: usize = 16;

/// Rows per tile for `grid`: whole image rows, about [`TILE_COLS`] padded columns.
pub(super) fn tile_rows(g: Grid) -> usize {
    TILE_COLS.div_ceil(g.w + 2).clamp(1, g.h.max(1))
}

/// The tiles of `grid`: `(image, first row, rows)`, in image-then-row order.
pub(super) fn tiles(g: Grid) -> Vec<(usize, usize, usize)> {
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
pub(super) fn tile_dims(g: Grid, r: usize) -> (usize, usize, usize) {
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
pub(super) struct Scratches<T>(Vec<std::sync::Mutex<Vec<T>>>);

impl<T: Float> Scratches<T> {
    pub(super) fn new(g: Grid, pass: Pass, b: usize, k: usize) -> Self {
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
    pub(super) fn with(&self, f: impl FnOnce(&mut [T])) {
        let i = rayon::current_thread_index().unwrap_or(0) % self.0.len();
        let mut scratch = self.0[i].lock().unwrap_or_else(|e| e.into_inner());
        f(&mut scratch)
    }
}

/// `fill_tile` (`super::widened`) with each element taken by `conv` (exact) and `zero` outside the image: the
/// bf16 dot path keeps its tiles in bf16.
pub(super) fn fill_tile_as<E: Copy, T: Copy>(
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

/// Copies the output tile `acc [c_out, cols]` (padded-width columns, rows `ld ≥ cols` apart)
/// of tile `(n, y0, r)` into `out [c_out, M]` without the pad columns, each element rounded
/// once to `E`.
///
/// # Safety
/// `out` must address `c_out · M` elements, and no other task may write rows y0 .. y0 + r of
/// image n.
pub(super) unsafe fn write_tile<E: Elem<Acc = T>, T: Float>(
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

/// The forward and data passes' frame, for either kernel: the output `[c_out, M]` allocated
/// uninitialised (a zeroed vector cost a memset pass over heap memory glibc hands back dirty),
/// then the pass's scratches (the memory model's order), then `tile(out, scratch, tile)` on
/// every tile in parallel.
///
/// # Safety
/// `tile` must write every element of rows y0 .. y0 + r of image n in each of the `c_out`
/// channels of `out` (`c_out · M` elements, e.g. through [`write_tile`]) and nothing else: the
/// tiles cover every row of every image, so every element is then written exactly once.
pub(super) unsafe fn by_tiles<E: Copy + Send, T: Float>(
    g: Grid,
    (pass, b, k): (Pass, usize, usize),
    c_out: usize,
    tile: impl Fn(SharedPtr<E>, &mut [T], (usize, usize, usize)) + Sync,
) -> Vec<E> {
    let len = c_out * g.n * g.h * g.w;
    let mut out: Vec<E> = Vec::with_capacity(len);
    let shared = SharedPtr(out.as_mut_ptr());
    let ws = Scratches::<T>::new(g, pass, b, k);
    tiles(g)
        .into_par_iter()
        .for_each(|pos| ws.with(|scratch| tile(shared, scratch, pos)));
    drop(ws);
    // SAFETY: every element of [0, len) was written by exactly one tile (the caller's
    // contract; E is Copy).
    unsafe { out.set_len(len) };
    out
}

/// The weight gradient's frame, for either kernel: every group's partial `dW_taps [9k, B]`
/// made up front, then the scratches (the memory model's order); `tile(partial, scratch, t,
/// tile)` adds the group's t-th tile into its partial (t = 0: writes it), the groups in
/// parallel; then [`sum_weight_partials`].
pub(super) fn weight_by_groups<T: Float>(
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
