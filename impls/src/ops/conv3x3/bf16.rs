//! The direct 3×3 convolution's three passes for bf16 operands on the CPU's bf16 dot-product
//! kernel ([`crate::ops::cpu::bf16_dot`], AVX-512 BF16): the tiles of [`super::tiles`]
//! kept in bf16 (not widened to f32), each tile's products on `vdpbf16ps` with f32
//! accumulation, the outputs rounded once (forward, backward-data) or kept in f32 (the weight
//! gradient). The stacked products read the tile's shifted rows where they lie: the packers take
//! a row pointer per row of the operand (`pack_a_rows`, `pack_b_rows`), so no tap stack is
//! copied out.
//!
//! The same allocations as the widened path, so the memory model holds whichever path runs:
//! the packed weight fits in the `9·k·B` f32 elements of the widened path's stacked weight,
//! each tile's bf16 tile, packed blocks and f32 accumulators in its f32 scratch
//! ([`super::workspace_elems`]); where a shape does not fit (tiny blocks, odd sizes), the pass
//! returns `None` and the widened path runs. Results do not depend on the thread count or the
//! tiling (each output summed pair by pair in inner-dimension order by one tile; the weight
//! gradient's tiles added in a fixed order); they differ from the widened path's by rounding
//! only (`tests/bf16_kernels.rs`).

use super::tiles::{
    by_tiles, fill_tile_as, tile_dims, tile_rows, weight_by_groups, workspace_elems, write_tile,
    Pass,
};
use crate::ops::cpu::bf16_dot::{
    multiply_packed, pack_a_rows, pack_a_with, pack_b, pack_b_rows, packed_a_len, packed_b_len, MR,
    NR,
};
use crate::ops::cpu::shared::{zip1, Elem, SharedPtr};
use crate::ops::layout::grid::{Grid, TAPS};
use half::bf16;

/// f32 slots that hold `n` bf16 elements.
fn slots(n: usize) -> usize {
    n.div_ceil(2)
}

/// Cuts `scratch` into consecutive regions of `sizes` f32 slots (the last takes the rest).
fn regions<const N: usize>(scratch: &mut [f32], sizes: [usize; N]) -> [&mut [f32]; N] {
    let mut rest = scratch;
    let mut out: [&mut [f32]; N] = std::array::from_fn(|_| Default::default());
    for (o, &n) in out.iter_mut().zip(&sizes) {
        let (a, b) = std::mem::take(&mut rest).split_at_mut(n);
        *o = a;
        rest = b;
    }
    out
}

/// `n` bf16 elements in a region of [`slots`]`(n)` f32 slots.
fn as_bf16(r: &mut [f32], n: usize) -> &mut [bf16] {
    &mut bytemuck::cast_slice_mut::<f32, bf16>(r)[..n]
}

/// A region of f32 slots as packed pairs.
fn as_pairs(r: &mut [f32]) -> &mut [u32] {
    bytemuck::cast_slice_mut::<f32, u32>(r)
}

/// The pass on the dot kernel, or `None` where its blocks do not fit the widened path's
/// allocations (see the module) and that path must run. `a`, `w` as
/// [`crate::ops::conv3x3`]'s op takes them; the weight gradient comes back as f32.
pub(super) fn run(
    pass: Pass,
    a: &[bf16],
    w: &[bf16],
    (k, b): (usize, usize),
    g: Grid,
) -> Option<candle_core::CpuStorage> {
    use candle_core::CpuStorage;
    match pass {
        Pass::Forward => forward(a, w, b, k, g).map(CpuStorage::BF16),
        Pass::Data => data(a, w, b, k, g).map(CpuStorage::BF16),
        Pass::Weight => weight(a, w, k, b, g).map(CpuStorage::F32),
    }
}

/// `y [k, M]` of `s [B, M]`, `w [k, B, 3, 3]`: per tile and kernel row dy,
/// `Z_dy [3k, ·] = W_dy [3k, B] · tile[dy-th row on]`, its three taps added into the output
/// rows in tap order (tap j = 3·dy + dx, from tap 0's value, as the widened path), rounded once.
fn forward(s: &[bf16], w: &[bf16], b: usize, k: usize, g: Grid) -> Option<Vec<bf16>> {
    let (wp, tl, cols) = tile_dims(g, tile_rows(g));
    let zp = (cols + 2).next_multiple_of(NR);
    let (pa_len, pb_len) = (packed_a_len(3 * k, b), packed_b_len(cols + 2, b));
    let z_len = (3 * k).next_multiple_of(MR) * zp;
    let y_len = k * tile_rows(g) * g.w;
    let need = slots(b * tl) + pb_len + z_len + y_len;
    if 3 * pa_len > 9 * k * b || need > workspace_elems(g, Pass::Forward, b, k) {
        return None;
    }
    // the three kernel rows' weights packed, row dx·k + o of W_dy = W[o, :, dy, dx]; in the
    // widened path's stacked weight's allocation (9·k·B f32 elements)
    let mut pa = vec![0u32; 9 * k * b];
    for dy in 0..3 {
        pack_a_with(
            |i, c| w[((i % k) * b + c) * 9 + 3 * dy + i / k],
            3 * k,
            b,
            &mut pa[dy * pa_len..],
        );
    }
    let (plane, m) = (g.h * g.w, g.n * g.h * g.w);
    let tile = |shared: SharedPtr<bf16>, scratch: &mut [f32], (n, y0, r): (usize, usize, usize)| {
        let (_, tl, cols) = tile_dims(g, r);
        let (zc, zp) = (cols + 2, (cols + 2).next_multiple_of(NR));
        let [t, pb, z, y] = regions(scratch, [slots(b * tl), pb_len, z_len, y_len]);
        let tile = as_bf16(t, b * tl);
        fill_tile_as(tile, s, b, g, (n, y0, r), bf16::ZERO, |v| v);
        let (pb, tile) = (as_pairs(pb), &*tile);
        for dy in 0..3 {
            // SAFETY: rows p < b of the tile from column dy·wp on, zc columns: dy·wp + zc
            // = (dy + r)·wp ≤ tl; pb holds packed_b_len(zc, b) ≤ pb_len; the dot kernel is
            // enabled (the caller's check); z holds (3k rounded to MR) rows of zp ≥ zc
            // rounded to NR columns.
            unsafe {
                pack_b_rows(|p| tile.as_ptr().add(p * tl + dy * wp), 1, b, zc, pb);
                z.fill(0.0);
                multiply_packed(&pa[dy * pa_len..], pb, 3 * k, zc, b, z, zp);
            }
            for o in 0..k {
                for row in 0..r {
                    let acc = &mut y[(o * r + row) * g.w..][..g.w];
                    for dx in 0..3 {
                        let tap = &z[(dx * k + o) * zp + row * wp + dx..][..g.w];
                        if dy == 0 && dx == 0 {
                            acc.copy_from_slice(tap);
                        } else {
                            zip1(acc, tap, |a, v| a + v);
                        }
                    }
                }
            }
        }
        for o in 0..k {
            for row in 0..r {
                let at = o * m + n * plane + (y0 + row) * g.w;
                // SAFETY: rows y0..y0 + r of image n of channel o belong to this tile only.
                let dst = unsafe { std::slice::from_raw_parts_mut(shared.get().add(at), g.w) };
                zip1(dst, &y[(o * r + row) * g.w..][..g.w], |_, v| {
                    bf16::narrow(v)
                });
            }
        }
    };
    // SAFETY: each tile writes rows y0..y0 + r of image n of every output channel, once.
    let out = unsafe { by_tiles(g, (Pass::Forward, b, k), k, tile) };
    drop(pa);
    Some(out)
}

/// Row `q = j·k + o` of a tile's stacked shifts: channel o of the padded gradient tile `gyt
/// [k, tl]` shifted by tap j (the widened path's `stack_shifts`, read where it lies).
fn shifted_row(gyt: &[bf16], k: usize, (wp, tl): (usize, usize), q: usize) -> *const bf16 {
    let (dy, dx) = TAPS[q / k];
    gyt[(q % k) * tl + dy * wp + dx..].as_ptr()
}

/// `ds [B, M] = W_flippedᵀ [B, 9k] · G [9k, ·]` per tile, `G` the tile's stacked shifts.
fn data(gy: &[bf16], w: &[bf16], b: usize, k: usize, g: Grid) -> Option<Vec<bf16>> {
    let (_, tl, cols) = tile_dims(g, tile_rows(g));
    let cp = cols.next_multiple_of(NR);
    let (pa_len, pb_len) = (packed_a_len(b, 9 * k), packed_b_len(cols, 9 * k));
    let acc_len = b.next_multiple_of(MR) * cp;
    let need = slots(k * tl) + pb_len + acc_len;
    if pa_len > 9 * k * b || need > workspace_elems(g, Pass::Data, b, k) {
        return None;
    }
    // the flipped kernel, row c = [W[o, c, 8 − j] for j, o], packed
    let mut pa = vec![0u32; 9 * k * b];
    pack_a_with(
        |c, q| w[((q % k) * b + c) * 9 + 8 - q / k],
        b,
        9 * k,
        &mut pa,
    );
    let tile = |shared: SharedPtr<bf16>, scratch: &mut [f32], (n, y0, r): (usize, usize, usize)| {
        let (wp, tl, cols) = tile_dims(g, r);
        let cp = cols.next_multiple_of(NR);
        let [t, pb, acc] = regions(scratch, [slots(k * tl), pb_len, acc_len]);
        let gyt = as_bf16(t, k * tl);
        fill_tile_as(gyt, gy, k, g, (n, y0, r), bf16::ZERO, |v| v);
        let (pb, gyt) = (as_pairs(pb), &*gyt);
        // SAFETY: each shifted row has cols elements inside the tile (dy·wp + dx + cols ≤
        // tl, as the widened path's stack); pb holds packed_b_len(cols, 9k); acc (b
        // rounded to MR) rows of cp; the dot kernel is enabled (the caller's check).
        unsafe {
            pack_b_rows(|q| shifted_row(gyt, k, (wp, tl), q), 1, 9 * k, cols, pb);
            acc.fill(0.0);
            multiply_packed(&pa, pb, b, cols, 9 * k, acc, cp);
            write_tile(shared, (&*acc, cp), b, g, (n, y0, r));
        }
    };
    // SAFETY: each tile writes rows y0..y0 + r of image n of every output channel, once.
    let out = unsafe { by_tiles(g, (Pass::Data, b, k), b, tile) };
    drop(pa);
    Some(out)
}

/// `dW [k, B, 3, 3]` (f32) from `dW_taps [9k, B] = G · sᵀ` per tile, each tile's product added
/// into its group's partial in tile order, the partials summed in group order.
fn weight(gy: &[bf16], s: &[bf16], k: usize, b: usize, g: Grid) -> Option<Vec<f32>> {
    let (_, tl, cols) = tile_dims(g, tile_rows(g));
    let (pa_len, pb_len) = (packed_a_len(9 * k, cols), packed_b_len(b, cols));
    let bp = b.next_multiple_of(NR);
    let acc_len = (9 * k).next_multiple_of(MR) * bp;
    let need = slots(b * tl) + slots(k * tl) + pa_len + pb_len + acc_len;
    if need > workspace_elems(g, Pass::Weight, b, k) {
        return None;
    }
    Some(weight_by_groups(g, k, b, |part, scratch, t, (n, y0, r)| {
        let (wp, tl, cols) = tile_dims(g, r);
        let [st, gt, pa, pb, acc] = regions(
            scratch,
            [slots(b * tl), slots(k * tl), pa_len, pb_len, acc_len],
        );
        let st = as_bf16(st, b * tl);
        fill_tile_as(st, s, b, g, (n, y0, r), bf16::ZERO, |v| v);
        let gyt = as_bf16(gt, k * tl);
        fill_tile_as(gyt, gy, k, g, (n, y0, r), bf16::ZERO, |v| v);
        let (pa, pb, st, gyt) = (as_pairs(pa), as_pairs(pb), &*st, &*gyt);
        // SAFETY: the shifted rows as in `data`; sᵀ reads st[c·tl + wp + 1 + q] for q < cols,
        // < tl; pa, pb hold their packed lengths for cols ≤ the first tile's (the tallest);
        // acc (9k rounded to MR) rows of bp; the dot kernel is enabled (the caller's check).
        unsafe {
            pack_a_rows(|q| shifted_row(gyt, k, (wp, tl), q), 1, 9 * k, cols, pa);
            pack_b(st.as_ptr().add(wp + 1), 1, tl, cols, b, pb);
            acc.fill(0.0);
            multiply_packed(pa, pb, 9 * k, b, cols, acc, bp);
        }
        for (i, row) in part.chunks_exact_mut(b).enumerate() {
            let tile = &acc[i * bp..][..b];
            if t == 0 {
                row.copy_from_slice(tile);
            } else {
                zip1(row, tile, |a, v| a + v);
            }
        }
    }))
}
