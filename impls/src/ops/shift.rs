//! The 3×3 convolution's shifted views of a channel-major map: [`Shift::Stack`] (the nine
//! shifted copies a tap-stack product reads) and [`Shift::Sum`] (their adjoint, the data
//! gradient's scatter), written in place into a destination view, one kernel on a GPU and no
//! allocation; with `generic_*` oracles from candle ops for the tests and strided operands.
//!
//! Both take f32, f64 or bf16 (destination and source one dtype; the sum also f32 tap products
//! into bf16, a bf16 convolution's): the stack is a copy (exact); the sum adds the nine taps in
//! the compute type ([`Elem::Acc`], f32 for bf16) — on the CPU in a per-task scratch of one
//! image plane (`H·W` elements of `Acc`) — and rounds once.

use crate::error::{CandleContext, Result};
use crate::ops::cpu::shared::{unfilled, Elem, Float};
use crate::ops::cpu::storage::{bad_dtype, has_kernels};
use crate::ops::layout::grid::{Grid, Shift};
use crate::ops::layout::matrix::Mat;
use candle_core::{CpuStorage, InplaceOp2, Layout, Tensor};
use rayon::prelude::*;

/// Writes image plane `src` shifted by (oy, ox) into `dst`: `dst[y, x] = take(dst[y, x],
/// src[y + oy, x + ox])` where the source is inside the image; elsewhere `zero`, or, with
/// `ADD`, left as it is. (The stack: `take` the source value; the sum: add it to the
/// destination.)
pub(crate) fn shift_plane<S: Copy, D: Copy, const ADD: bool>(
    dst: &mut [D],
    src: &[S],
    (g, oy, ox): (Grid, isize, isize),
    zero: D,
    take: impl Fn(D, S) -> D,
) {
    let (h, w) = (g.h as isize, g.w as isize);
    for y in 0..h {
        let sy = y + oy;
        let drow = &mut dst[(y * w) as usize..((y + 1) * w) as usize];
        if sy < 0 || sy >= h {
            if !ADD {
                drow.fill(zero);
            }
            continue;
        }
        let srow = &src[(sy * w) as usize..((sy + 1) * w) as usize];
        // Columns x0..x1 have their source x + ox inside the row (none when |ox| >= w).
        let x0 = (-ox).clamp(0, w);
        let x1 = (w - ox).clamp(x0, w);
        if !ADD {
            drow[..x0 as usize].fill(zero);
            drow[x1 as usize..].fill(zero);
        }
        for x in x0..x1 {
            let v = srow[(x + ox) as usize];
            let d = &mut drow[x as usize];
            *d = take(*d, v);
        }
    }
}

/// `dst = stack(src)` or `dst = sum(src)` (see [`Shift`]), **written into `dst`'s storage**:
/// both operands are rows of unit column stride (a whole map or a range of whole images of a
/// wider one, [`Mat::rows_of`]); every element of `dst`'s view is written, nothing else.
pub(crate) struct ShiftIntoOp {
    kind: Shift,
    grid: Grid,
    offsets: [(isize, isize); 9],
}

impl ShiftIntoOp {
    fn name(&self) -> &'static str {
        match self.kind {
            Shift::Stack => "shift-stack",
            Shift::Sum => "shift-sum",
        }
    }

    /// `(C, m)` of the shift from its operands' shapes, or an error naming the mismatch.
    fn dims(
        &self,
        dst: (usize, usize),
        src: (usize, usize),
    ) -> candle_core::Result<(usize, usize)> {
        let op = self.name();
        let (c, m) = match self.kind {
            Shift::Stack => (src.0, src.1),
            Shift::Sum => (dst.0, dst.1),
        };
        let (want_dst, want_src) = match self.kind {
            Shift::Stack => ((9 * c, m), (c, m)),
            Shift::Sum => ((c, m), (9 * c, m)),
        };
        if dst != want_dst || src != want_src {
            return Err(candle_core::Error::Msg(format!(
                "{op}: destination {dst:?} and source {src:?} do not fit (expected {want_dst:?} from {want_src:?})"
            )));
        }
        if self.grid.n * self.grid.h * self.grid.w != m {
            return Err(candle_core::Error::Msg(format!(
                "{op}: {m} columns, but the grid is N={} × H={} × W={}",
                self.grid.n, self.grid.h, self.grid.w
            )));
        }
        Ok((c, m))
    }

    fn run<E: Elem>(&self, d: &mut [E], dv: Mat, s: &[E], sv: Mat) -> candle_core::Result<()> {
        let (c, m) = self.dims((dv.rows, dv.cols), (sv.rows, sv.cols))?;
        if dv.rows == 0 || m == 0 {
            return Ok(());
        }
        if self.kind == Shift::Sum {
            self.sum_rows(d, dv, s, sv, (c, m), E::widen);
            return Ok(());
        }
        let plane = self.grid.h * self.grid.w;
        let src_row = |r: usize| &s[sv.off + r * sv.rs..][..m];
        let (start, end) = dv.span();
        // Row r of dst is the first m elements of the r-th chunk of rs elements from its start.
        d[start..end]
            .par_chunks_mut(dv.rs)
            .enumerate()
            .for_each(|(row, dst)| {
                let (j, ch) = (row / c, row % c);
                let (oy, ox) = self.offsets[j];
                for (d, s) in dst[..m].chunks_mut(plane).zip(src_row(ch).chunks(plane)) {
                    shift_plane::<E, E, false>(d, s, (self.grid, oy, ox), E::POS_ZERO, |_, v| v);
                }
            });
        Ok(())
    }

    /// [`Shift::Sum`] of f32 tap products into bf16 features (a bf16 convolution's products,
    /// accumulated in f32 as autocast's are): each output the f32 sum of its taps rounded once,
    /// bitwise the f32 sum of the same products rounded to bf16.
    fn run_wide(
        &self,
        d: &mut [half::bf16],
        dv: Mat,
        s: &[f32],
        sv: Mat,
    ) -> candle_core::Result<()> {
        let (c, m) = self.dims((dv.rows, dv.cols), (sv.rows, sv.cols))?;
        if self.kind != Shift::Sum {
            return Err(candle_core::Error::Msg(format!(
                "{}: an f32 source into a bf16 destination is a sum's (f32 tap products), not \
                 a stack's",
                self.name()
            )));
        }
        if dv.rows > 0 && m > 0 {
            self.sum_rows(d, dv, s, sv, (c, m), |v| v);
        }
        Ok(())
    }

    /// The sum of `(c, m)` (nonzero) into `d` from tap products of type `S`, each taken into
    /// the destination's compute type by `widen`.
    fn sum_rows<E: Elem, S: Copy + Sync>(
        &self,
        d: &mut [E],
        dv: Mat,
        s: &[S],
        sv: Mat,
        (c, m): (usize, usize),
        widen: impl Fn(S) -> E::Acc + Sync,
    ) {
        let plane = self.grid.h * self.grid.w;
        let src_row = |r: usize| &s[sv.off + r * sv.rs..][..m];
        let (start, end) = dv.span();
        // Plane by plane: the nine taps summed into a plane of E::Acc from +0, j in order,
        // then rounded once into the destination (for f32 and f64 the same additions in
        // the same order as summing in the destination itself: the same bits).
        d[start..end]
            .par_chunks_mut(dv.rs)
            .enumerate()
            .for_each_init(
                || vec![<E::Acc as Float>::ZERO; plane],
                |acc, (ch, dst)| {
                    for (p, dplane) in dst[..m].chunks_mut(plane).enumerate() {
                        let acc = &mut acc[..dplane.len()];
                        acc.fill(<E::Acc as Float>::ZERO);
                        for (j, &(oy, ox)) in self.offsets.iter().enumerate() {
                            let s = &src_row(j * c + ch)[p * plane..][..dplane.len()];
                            shift_plane::<S, E::Acc, true>(
                                acc,
                                s,
                                (self.grid, oy, ox),
                                <E::Acc as Float>::ZERO,
                                |a, v| a + widen(v),
                            );
                        }
                        for (d, a) in dplane.iter_mut().zip(acc.iter()) {
                            *d = E::narrow(*a);
                        }
                    }
                },
            );
    }
}

impl InplaceOp2 for ShiftIntoOp {
    fn name(&self) -> &'static str {
        ShiftIntoOp::name(self)
    }
    fn cpu_fwd(
        &self,
        d: &mut CpuStorage,
        dl: &Layout,
        s: &CpuStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        fn go<E: Elem>(
            op: &ShiftIntoOp,
            d: &mut [E],
            dl: &Layout,
            s: &CpuStorage,
            sl: &Layout,
        ) -> candle_core::Result<()> {
            let n = op.name();
            let s = E::in_storage(s).ok_or_else(|| bad_dtype(n))?;
            let dv = Mat::rows_of(dl, d.len(), n, "the destination")?;
            let sv = Mat::rows_of(sl, s.len(), n, "the source")?;
            op.run(d, dv, s, sv)
        }
        match (d, s) {
            (CpuStorage::BF16(d), CpuStorage::F32(s)) => {
                let n = self.name();
                let dv = Mat::rows_of(dl, d.len(), n, "the destination")?;
                let sv = Mat::rows_of(sl, s.len(), n, "the source")?;
                self.run_wide(d, dv, s, sv)
            }
            (CpuStorage::F32(d), s) => go(self, d, dl, s, sl),
            (CpuStorage::F64(d), s) => go(self, d, dl, s, sl),
            (CpuStorage::BF16(d), s) => go(self, d, dl, s, sl),
            _ => Err(bad_dtype(self.name())),
        }
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        d: &mut candle_core::CudaStorage,
        dl: &Layout,
        s: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> candle_core::Result<()> {
        let dims = |l: &Layout| l.shape().dims2();
        let (c, m) = self.dims(dims(dl)?, dims(sl)?)?;
        crate::ops::cuda::shift::shift_into(
            self.name(),
            self.kind,
            (d, dl),
            (s, sl),
            (c, m),
            self.grid,
            &self.offsets,
        )
    }
}

/// Writes [`Shift::Stack`] of `t [C, m]` into `dst [9C, m]` (block j: `t` shifted by
/// `offsets[j]`, `out_j[c, n, y, x] = t[c, n, y + oy_j, x + ox_j]`, zero outside the image),
/// **in place**: both may be column ranges of whole images of wider maps (rows of unit column
/// stride); `grid` is the range's images. One kernel on a GPU, no allocation.
pub fn shift_stack_into(
    dst: &Tensor,
    t: &Tensor,
    grid: Grid,
    offsets: [(isize, isize); 9],
) -> Result<()> {
    shift_into(Shift::Stack, dst, t, grid, offsets).ctx("shift stack")
}

/// Writes [`Shift::Sum`] of `p [9C, m]` into `dst [C, m]` (`Σ_j shift(p_j, offsets[j])`, j in
/// order), **in place**, as [`shift_stack_into`]. `p` is of `dst`'s dtype, or f32 for a bf16
/// `dst`: a bf16 convolution's f32 tap products, summed in f32 and rounded once (the tap-stack
/// path under mixed precision, as autocast's convolution accumulates in f32).
pub fn shift_sum_into(
    dst: &Tensor,
    p: &Tensor,
    grid: Grid,
    offsets: [(isize, isize); 9],
) -> Result<()> {
    shift_into(Shift::Sum, dst, p, grid, offsets).ctx("shift sum")
}

pub(crate) fn shift_into(
    kind: Shift,
    dst: &Tensor,
    src: &Tensor,
    grid: Grid,
    offsets: [(isize, isize); 9],
) -> candle_core::Result<()> {
    let op = ShiftIntoOp {
        kind,
        grid,
        offsets,
    };
    if !(has_kernels(dst) && has_kernels(src)) {
        return Err(candle_core::Error::Msg(format!(
            "{}: no kernel on {:?} (the CPU and CUDA devices have one)",
            op.name(),
            dst.device().location()
        )));
    }
    dst.inplace_op2(src, &op)
}

/// [`shift_stack_into`] a new `[9C, M]` tensor (every element written, none read first).
pub fn shift_stack(t: &Tensor, grid: Grid, offsets: [(isize, isize); 9]) -> Result<Tensor> {
    if !(has_kernels(t) && t.is_contiguous()) {
        return generic_shift_stack(t, grid, offsets);
    }
    let (c, m) = t.dims2().ctx("shift stack")?;
    // SAFETY: the shift stack writes every element of its destination (zero where a tap's
    // source is outside the image) and reads none of it.
    let out = unsafe { unfilled((9 * c, m), t.dtype(), t.device(), "shift stack")? };
    shift_stack_into(&out, t, grid, offsets)?;
    Ok(out)
}

/// One shifted copy from candle ops: pad by one on every side, then narrow.
pub(crate) fn generic_shift(t: &Tensor, grid: Grid, (oy, ox): (isize, isize)) -> Result<Tensor> {
    let c = t.dims()[0];
    let t4 = t.reshape((c, grid.n, grid.h, grid.w)).ctx("shift")?;
    let p = t4
        .pad_with_zeros(2, 1, 1)
        .ctx("shift pad")?
        .pad_with_zeros(3, 1, 1)
        .ctx("shift pad")?;
    p.narrow(2, (1 + oy) as usize, grid.h)
        .ctx("shift")?
        .narrow(3, (1 + ox) as usize, grid.w)
        .ctx("shift")?
        .contiguous()
        .ctx("shift")?
        .reshape((c, grid.n * grid.h * grid.w))
        .ctx("shift")
}

pub fn generic_shift_stack(t: &Tensor, grid: Grid, offsets: [(isize, isize); 9]) -> Result<Tensor> {
    let parts = offsets
        .iter()
        .map(|&o| generic_shift(t, grid, o))
        .collect::<Result<Vec<_>>>()?;
    Tensor::cat(&parts, 0).ctx("shift stack")
}

/// [`shift_sum_into`] a new `[C, M]` tensor: `Σ_j shift(p_j, offsets[j])` where `p [9C, M]`
/// stacks the nine `p_j`.
pub fn shift_sum(p: &Tensor, grid: Grid, offsets: [(isize, isize); 9]) -> Result<Tensor> {
    if !(has_kernels(p) && p.is_contiguous()) {
        return generic_shift_sum(p, grid, offsets);
    }
    let (c9, m) = p.dims2().ctx("shift sum")?;
    // SAFETY: the shift sum writes every element of its destination (from +0) before it
    // reads it.
    let out = unsafe { unfilled((c9 / 9, m), p.dtype(), p.device(), "shift sum")? };
    shift_sum_into(&out, p, grid, offsets)?;
    Ok(out)
}

pub fn generic_shift_sum(p: &Tensor, grid: Grid, offsets: [(isize, isize); 9]) -> Result<Tensor> {
    let c = p.dims()[0] / 9;
    let mut acc: Option<Tensor> = None;
    for (j, &o) in offsets.iter().enumerate() {
        let s = generic_shift(&p.narrow(0, j * c, c).ctx("shift sum")?, grid, o)?;
        acc = Some(match acc {
            None => s,
            Some(a) => (a + s).ctx("shift sum")?,
        });
    }
    acc.ok_or_else(|| crate::error::Error::Unsupported {
        device: "any".to_string(),
        what: "shift sum of zero taps".to_string(),
    })
}
