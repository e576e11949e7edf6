//! The direct, cache-blocked 3×3 convolution (padding 1, stride 1, no bias) on channel-major
//! maps `[C, N·H·W]` for the CPU: forward, backward-data and backward-weight, without the 9×
//! tap stack. H and W are separate throughout ([`Grid`]); nothing assumes a square image.
//!
//! The image is cut into tiles of whole rows of one image. A tile copies its rows, plus one halo
//! row above and below, into a zero-padded scratch `[C_in, R+2, W+2]`; in that padded tile
//! every tap is a constant offset, so each of the nine taps is one `gemm` product with strided
//! operands accumulated into the tile's output (`gemm`'s `read_dst`), computed in padded-width
//! columns and copied out without the pad columns. The tile stays in cache across its nine
//! products, and the only workspace is one scratch tile per thread (see [`workspace_elems`]).
//!
//! Products run single-threaded inside a tile, tiles in parallel (rayon); every output element
//! is produced by one tile, and the weight gradient sums a fixed number of per-group partials in
//! order, so results do not depend on the thread count or on scheduling.

use crate::error::{CandleContext, Result};
use crate::grid::Grid;
pub use crate::shared::Float;
use crate::shared::SharedPtr;
use candle_core::{CpuStorage, CustomOp2, Layout, Shape, Tensor};
use rayon::prelude::*;

/// Output columns per tile (padded width included): about 500 columns of 48 channels keep the
/// input tile and the output tile of a bc layer (≈ 150 KB in f32) inside a core's L2 cache.
const TILE_COLS: usize = 512;

/// Tiles of the weight gradient are summed in this many groups, each accumulating its tiles in
/// order into one partial; the partials are then added in order. Fixed (not the thread count)
/// so the sum order, hence every bit of the result, is the same at any thread count.
pub const WEIGHT_GROUPS: usize = 16;

/// Rows per tile for `grid`: whole image rows, about [`TILE_COLS`] padded columns.
fn tile_rows(g: Grid) -> usize {
    TILE_COLS.div_ceil(g.w + 2).clamp(1, g.h.max(1))
}

/// The tiles of `grid`: `(image, first row, rows)`, in image-then-row order.
fn tiles(g: Grid) -> Vec<(usize, usize, usize)> {
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

/// Elements of scratch one thread holds while it works on a tile of a convolution from `cin` to
/// `cout` channels: the padded input tile and the padded-width output tile. The memory model
/// counts one per thread.
pub fn workspace_elems(g: Grid, cin: usize, cout: usize) -> usize {
    let (r, wp) = (tile_rows(g), g.w + 2);
    cin * (r + 2) * wp + cout * (r * wp).saturating_sub(2)
}

/// Elements of scratch live at once during one pass from `cin` to `cout` channels: one
/// [`workspace_elems`] per thread that has a tile to work on (the current rayon pool's).
pub fn scratch_elems(g: Grid, cin: usize, cout: usize) -> usize {
    rayon::current_num_threads().min(tile_count(g)) * workspace_elems(g, cin, cout)
}

/// Elements of the weight gradient's partial sums: one `[k, B, 3, 3]` per group.
pub fn weight_partial_elems(g: Grid, k: usize, b: usize) -> usize {
    weight_groups(tile_count(g)).1 * k * b * 9
}

/// Copies rows `y0 − 1 .. y0 + r + 1` of image `n` of every channel of `x [C, M]` into `tile
/// [C, r+2, W+2]`, zero outside the image (the halo and the two pad columns).
fn fill_tile<T: Float>(
    tile: &mut [T],
    x: &[T],
    c: usize,
    g: Grid,
    (n, y0, r): (usize, usize, usize),
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
                    dst[0] = T::default();
                    dst[1..=g.w].copy_from_slice(&src[iy * g.w..(iy + 1) * g.w]);
                    dst[g.w + 1] = T::default();
                }
                None => dst.fill(T::default()),
            }
        }
    }
}

/// A matrix operand for `gemm`: base pointer offset and strides, in elements.
#[derive(Clone, Copy)]
struct Mat {
    off: usize,
    rs: isize,
    cs: isize,
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
        d.cs,
        d.rs,
        accumulate,
        lhs.add(l.off),
        l.cs,
        l.rs,
        rhs.add(r.off),
        r.cs,
        r.rs,
        T::ONE,
        T::ONE,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
}

/// How a tap's `[cout, cin]` matrix sits in a PyTorch weight `[k, B, 3, 3]`.
#[derive(Clone, Copy)]
enum Taps {
    /// Forward: tap j is `W[:, :, j]` (`[k, B]`) applied at offset j.
    Forward { b: usize },
    /// Backward-data: the tap at offset j is `W[:, :, 8 − j]ᵀ` (`[B, k]`), the flipped kernel.
    Transposed { b: usize },
}

impl Taps {
    fn mat(self, j: usize) -> Mat {
        match self {
            Taps::Forward { b } => Mat {
                off: j,
                rs: 9 * b as isize,
                cs: 9,
            },
            Taps::Transposed { b } => Mat {
                off: 8 - j,
                rs: 9,
                cs: 9 * b as isize,
            },
        }
    }
}

/// `out [cout, M] = Σ_j A_j [cout, cin] · shift_j(x [cin, M])` with shift_j reading pixel
/// `(y + dy_j − 1, x + dx_j − 1)`, zero outside the image, j = 3·dy + dx in order.
fn conv_taps<T: Float>(x: &[T], cin: usize, cout: usize, g: Grid, w: &[T], taps: Taps) -> Vec<T> {
    let (wp, plane, m) = (g.w + 2, g.h * g.w, g.n * g.h * g.w);
    // Uninitialised: the tiles cover every row of every image, so each element is written
    // once below (a zeroed vector cost a memset pass over heap memory glibc hands back dirty).
    let mut out: Vec<T> = Vec::with_capacity(cout * m);
    let shared = SharedPtr(out.as_mut_ptr());
    tiles(g).into_par_iter().for_each_init(
        || vec![T::default(); workspace_elems(g, cin, cout)],
        |scratch, (n, y0, r)| {
            let tile_len = cin * (r + 2) * wp;
            let (tile, acc) = scratch.split_at_mut(cin * (tile_rows(g) + 2) * wp);
            let tile = &mut tile[..tile_len];
            fill_tile(tile, x, cin, g, (n, y0, r));
            // Padded-width output column c is padded position c + 1 of rows 0..r.
            let cols = r * wp - 2;
            for (j, &(dy, dx)) in crate::fused::TAPS.iter().enumerate() {
                // SAFETY: the output tile is cout × cols; the input columns read are
                // c + dy·wp + dx ≤ cols − 1 + 2·wp + 2 = (r + 2)·wp − 1 < the tile's row length;
                // the tap matrices index w [cout·cin·9] within bounds.
                unsafe {
                    gemm_acc(
                        (cout, cols, cin),
                        acc.as_mut_ptr(),
                        Mat {
                            off: 0,
                            rs: cols as isize,
                            cs: 1,
                        },
                        j > 0,
                        w.as_ptr(),
                        taps.mat(j),
                        tile.as_ptr(),
                        Mat {
                            off: dy * wp + dx,
                            rs: ((r + 2) * wp) as isize,
                            cs: 1,
                        },
                    );
                }
            }
            for co in 0..cout {
                for row in 0..r {
                    let src = &acc[co * cols + row * wp..co * cols + row * wp + g.w];
                    let at = co * m + n * plane + (y0 + row) * g.w;
                    // SAFETY: rows y0..y0 + r of image n of channel co belong to this tile only.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src.as_ptr(), shared.get().add(at), g.w);
                    }
                }
            }
        },
    );
    // SAFETY: every element of [0, cout·m) was written by exactly one tile (T is Copy).
    unsafe { out.set_len(cout * m) };
    out
}

/// `dW [k, B, 3, 3]` with `dW[o, c, dy, dx] = Σ_p gy[o, p] · s[c, p + (dy − 1, dx − 1)]`.
fn weight_grad<T: Float>(gy: &[T], s: &[T], k: usize, b: usize, g: Grid) -> Vec<T> {
    let (wp, plane, m) = (g.w + 2, g.h * g.w, g.n * g.h * g.w);
    let all = tiles(g);
    let (per, _) = weight_groups(all.len());
    let rmax = tile_rows(g);
    let partials: Vec<Vec<T>> = all
        .par_chunks(per)
        .map(|chunk| {
            let mut part = vec![T::default(); k * b * 9];
            // The padded s tile and the padded-width gy tile (zero in the pad columns).
            let mut scratch = vec![T::default(); workspace_elems(g, b, k)];
            let (tile, gyp) = scratch.split_at_mut(b * (rmax + 2) * wp);
            for (t, &(n, y0, r)) in chunk.iter().enumerate() {
                let tile = &mut tile[..b * (r + 2) * wp];
                fill_tile(tile, s, b, g, (n, y0, r));
                let cols = r * wp - 2;
                let gyp = &mut gyp[..k * cols];
                gyp.fill(T::default());
                for o in 0..k {
                    for row in 0..r {
                        let at = o * m + n * plane + (y0 + row) * g.w;
                        gyp[o * cols + row * wp..o * cols + row * wp + g.w]
                            .copy_from_slice(&gy[at..at + g.w]);
                    }
                }
                for (j, &(dy, dx)) in crate::fused::TAPS.iter().enumerate() {
                    // SAFETY: part is k × b × 9 and tap j addresses o·9b + c·9 + j; gyp is
                    // k × cols; the s columns read are c + dy·wp + dx < (r + 2)·wp.
                    unsafe {
                        gemm_acc(
                            (k, b, cols),
                            part.as_mut_ptr(),
                            Mat {
                                off: j,
                                rs: 9 * b as isize,
                                cs: 9,
                            },
                            t > 0,
                            gyp.as_ptr(),
                            Mat {
                                off: 0,
                                rs: cols as isize,
                                cs: 1,
                            },
                            tile.as_ptr(),
                            Mat {
                                off: dy * wp + dx,
                                rs: 1,
                                cs: ((r + 2) * wp) as isize,
                            },
                        );
                    }
                }
            }
            part
        })
        .collect();
    let mut it = partials.into_iter();
    let mut dw = it.next().unwrap_or_else(|| vec![T::default(); k * b * 9]);
    for p in it {
        for (d, v) in dw.iter_mut().zip(p) {
            *d = *d + v;
        }
    }
    dw
}

/// Which of the three products a [`Conv3x3Op`] computes.
#[derive(Debug, Clone, Copy)]
enum Pass {
    /// `(s [B, M], w [k, B, 3, 3]) → y [k, M]`.
    Forward,
    /// `(gy [k, M], w [k, B, 3, 3]) → ds [B, M]`.
    Data,
    /// `(gy [k, M], s [B, M]) → dW [k, B, 3, 3]`.
    Weight,
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
        fn go<T: Float>(p: Pass, a: &[T], w: &[T], k: usize, b: usize, g: Grid) -> Vec<T> {
            match p {
                Pass::Forward => conv_taps(a, b, k, g, w, Taps::Forward { b }),
                Pass::Data => conv_taps(a, k, b, g, w, Taps::Transposed { b }),
                Pass::Weight => weight_grad(a, w, k, b, g),
            }
        }
        let sl = |l: &Layout| {
            l.contiguous_offsets().ok_or_else(|| {
                candle_core::Error::Msg(format!("{name}: operand must be contiguous"))
            })
        };
        let ((a1, b1), (a2, b2)) = (sl(l1)?, sl(l2)?);
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(y)) => {
                CpuStorage::F32(go(self.pass, &x[a1..b1], &y[a2..b2], k, b, g))
            }
            (CpuStorage::F64(x), CpuStorage::F64(y)) => {
                CpuStorage::F64(go(self.pass, &x[a1..b1], &y[a2..b2], k, b, g))
            }
            _ => {
                return Err(candle_core::Error::Msg(format!(
                    "{name}: operands must all be f32 or all f64"
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

/// `y [k, M]` of `s [B, M]` and a PyTorch weight `w [k, B, 3, 3]` (CPU tensors).
pub fn forward(s: &Tensor, w: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(s, w, grid, Pass::Forward, "conv3x3 forward")
}

/// `ds [B, M]` of the upstream gradient `gy [k, M]` and the weight `w [k, B, 3, 3]`.
pub fn backward_data(gy: &Tensor, w: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(gy, w, grid, Pass::Data, "conv3x3 backward data")
}

/// `dW [k, B, 3, 3]` of the upstream gradient `gy [k, M]` and the layer input `s [B, M]`.
pub fn backward_weight(gy: &Tensor, s: &Tensor, grid: Grid) -> Result<Tensor> {
    apply(gy, s, grid, Pass::Weight, "conv3x3 backward weight")
}
