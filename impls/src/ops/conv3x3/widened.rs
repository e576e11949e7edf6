//! The direct 3×3 convolution's passes on `gemm` in the compute type: f32 and f64 operands as
//! they are, bf16 operands widened (exact) to f32 as a tile is filled (where the CPU has no
//! AVX-512 BF16, or a block's packed operands do not fit, see [`super::bf16`]).

use super::tiles::{by_tiles, fill_tile_as, tile_dims, weight_by_groups, write_tile, Pass};
use crate::ops::cpu::shared::{Elem, Float, SharedPtr};
use crate::ops::layout::grid::{Grid, TAPS};

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

/// `y [k, M] = Σ_j W_j [k, B] · shift_j(s [B, M])`, tap j reading pixel `(y + dy − 1, x + dx − 1)`.
pub(super) fn forward_tiles<E: Elem<Acc = T>, T: Float>(
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
    let tile = |shared: SharedPtr<E>, scratch: &mut [T], (n, y0, r): (usize, usize, usize)| {
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
    };
    // SAFETY: each tile writes rows y0..y0 + r of image n of every output channel, once.
    let out = unsafe { by_tiles(g, (Pass::Forward, b, k), k, tile) };
    drop(wst);
    out
}

/// `ds [B, M] = Σ_j W_jᵀ · shift_j⁻¹(gy)` as one product per tile of inner length 9k.
pub(super) fn data_tiles<E: Elem<Acc = T>, T: Float>(
    gy: &[E],
    w: &[E],
    b: usize,
    k: usize,
    g: Grid,
) -> Vec<E> {
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
    let tile = |shared: SharedPtr<E>, scratch: &mut [T], (n, y0, r): (usize, usize, usize)| {
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
    };
    // SAFETY: each tile writes rows y0..y0 + r of image n of every output channel, once.
    let out = unsafe { by_tiles(g, (Pass::Data, b, k), b, tile) };
    drop(wt);
    out
}

/// `dW [k, B, 3, 3]` with `dW[o, c, dy, dx] = Σ_p gy[o, p] · s[c, p + (dy − 1, dx − 1)]`, from
/// `dW_taps [9k, B] = G · sᵀ` per tile (`G` the stacked shifts of the gradient: row `j·k + o`
/// holds `gy[o, q + off_j]`, and `−off_j = off_{8−j}`).
pub(super) fn weight_grad<E: Elem<Acc = T>, T: Float>(
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
