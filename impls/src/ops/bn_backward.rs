//! BatchNorm backward as fused kernels: the gradient through a ReLU that follows BN apply,
//! masked from BN's input ([`relu_bwd_affine`], also in place), the per-channel reductions of
//! the gradient ([`bn_bwd_reduce`]) and the data gradient ([`bn_bwd_dx`], also accumulated into
//! a gradient buffer's view); the last two also with that ReLU's backward fused in
//! (`*_relu`: the mask applied as they read the gradient, one pass over it fewer). One pass,
//! exactly one output or in place, on the CPU and (`cuda` feature) on CUDA through the same
//! custom ops, as [`crate::ops::bn`]'s forward; `generic_*` are the oracles from candle ops.
//!
//! Dtypes on the CPU: all f32, all f64, or bf16 features (`gy`, `x`, the ReLU gradient, `dx` and
//! its destination) with f32 tables (`coef`, `st`, γ, and [`bn_bwd_reduce`]'s output): computed
//! in f32 from the widened features, each feature written rounded once ([`Elem`]): the data
//! gradient's `A·gy + B·x + C` in f32 arithmetic and the sums' terms in f32, folded in f32
//! blocks before f64 (`dx_value`, `shared::block_sums`), where f32 and f64 features take f64
//! throughout — as PyTorch autocast's kernels compute bf16 features.
//! Any other combination is an error naming the op.

use crate::error::{CandleContext, Result};
use crate::ops::bn::{coef_rows, column, generic_affine_rows_relu, planar};
use crate::ops::cpu::shared::{block_sums, lane_sums, zip1, zip2, zip3, Elem, Float};
#[cfg(feature = "cuda")]
use crate::ops::cpu::storage::not_on_cuda;
use crate::ops::cpu::storage::{bad_dtype, carried, cpu_of, features, has_kernels, Operand};
use candle_core::{CpuStorage, CustomOp3, InplaceOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

/// `g = (x·scale + shift > 0) ? g : 0` per row, in place, `coef` planar `(scale; shift)` of
/// `c` rows of `m`: the mask of a ReLU after BN apply, from BN's input. `v = x·scale + shift`
/// is [`AffineRowsOp`]'s value (rounded to `E` as it rounds it), so the mask is the one the
/// ReLU's output gives, bit for bit, bf16 included.
///
/// [`AffineRowsOp`]: crate::ops::bn::AffineRowsOp
pub(crate) fn relu_mask_rows<E: Elem<Acc = T>, T: Float>(
    g: &mut [E],
    x: &[E],
    coef: &[T],
    c: usize,
    m: usize,
) {
    if c * m == 0 {
        return;
    }
    let (scales, shifts) = coef.split_at(c);
    g.par_chunks_mut(m)
        .zip(x.par_chunks(m))
        .zip(scales.par_iter().zip(shifts))
        .for_each(|((g, x), (&scale, &shift))| {
            zip1(g, x, |g, x| {
                let v = E::narrow(x.widen() * scale + shift);
                if v.is_positive() {
                    g
                } else {
                    E::POS_ZERO
                }
            });
        });
}

/// The gradient a BN backward reads at `(g, x)`: `g` itself, or with `RELU` (the backward of a
/// ReLU after BN apply, fused into BN's backward) `g` where `x·scale + shift > 0` and `+0`
/// elsewhere, [`relu_mask_rows`]'s value: the fused kernels compute bitwise what the mask
/// followed by the plain kernel computes. CPU twin of `db_masked` in `bn.cu`.
#[inline(always)]
pub(crate) fn masked<const RELU: bool, E: Elem<Acc = T>, T: Float>(
    g: E,
    x: E,
    scale: T,
    shift: T,
) -> E {
    if !RELU || E::narrow(x.widen() * scale + shift).is_positive() {
        g
    } else {
        E::POS_ZERO
    }
}

/// ReLU backward from BN's input (see [`relu_bwd_affine`]) into a new tensor.
pub(crate) struct ReluBwdAffineOp;
impl CustomOp3 for ReluBwdAffineOp {
    fn name(&self) -> &'static str {
        "relu-bwd-affine"
    }
    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        xs: &CpuStorage,
        xl: &Layout,
        cs: &CpuStorage,
        cl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (c, m) = gl.shape().dims2()?;
        fn go<E: Elem<Acc = T>, T: Float>(
            n: &str,
            [g, x, coef]: [Operand; 3],
            c: usize,
            m: usize,
        ) -> candle_core::Result<CpuStorage> {
            let (g, x) = gy_and_x::<E>(n, g, x)?;
            let coef = table::<T>(coef.0, coef.1, 2, c, n)?;
            // the crate's parallel vector copy, then the mask in place: 32 ms for [204, 65536]
            // f32 on one thread, where writing the masked values into a new vector took 65–70
            // (and made a BC-100 L=16 `cat-store-copy` step 1.4× slower)
            let mut out = crate::ops::elementwise::concat_slices(&[g]);
            relu_mask_rows(&mut out, x, coef, c, m);
            Ok(E::storage(out))
        }
        let n = self.name();
        let ops = [(gs, gl), (xs, xl), (cs, cl)];
        let out = match gs {
            CpuStorage::F32(_) => go::<f32, f32>(n, ops, c, m)?,
            CpuStorage::F64(_) => go::<f64, f64>(n, ops, c, m)?,
            CpuStorage::BF16(_) => go::<half::bf16, f32>(n, ops, c, m)?,
            _ => return Err(bad_dtype(n)),
        };
        Ok((out, gl.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        cs: &candle_core::CudaStorage,
        cl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::ops::cuda::bn::relu_bwd_affine(self.name(), (gs, gl), (xs, xl), (cs, cl))
    }
}

/// ReLU backward from BN's input (see [`relu_bwd_affine_inplace`]), over the gradient.
pub(crate) struct ReluBwdAffineInplaceOp;
impl InplaceOp3 for ReluBwdAffineInplaceOp {
    fn name(&self) -> &'static str {
        "relu-bwd-affine-inplace"
    }
    fn cpu_fwd(
        &self,
        gs: &mut CpuStorage,
        gl: &Layout,
        xs: &CpuStorage,
        xl: &Layout,
        cs: &CpuStorage,
        cl: &Layout,
    ) -> candle_core::Result<()> {
        let (c, m) = gl.shape().dims2()?;
        fn go<E: Elem<Acc = T>, T: Float>(
            n: &str,
            g: &mut [E],
            [x, coef]: [Operand; 2],
            c: usize,
            m: usize,
        ) -> candle_core::Result<()> {
            let x = features::<E>(x.0, x.1, n)?;
            let coef = table::<T>(coef.0, coef.1, 2, c, n)?;
            if g.len() != x.len() {
                return Err(candle_core::Error::Msg(format!(
                    "{n}: the gradient has {} elements, the input {}",
                    g.len(),
                    x.len()
                )));
            }
            relu_mask_rows(g, x, coef, c, m);
            Ok(())
        }
        let n = self.name();
        let (ga, gb) = gl.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{n}: the gradient must be contiguous"))
        })?;
        let ops = [(xs, xl), (cs, cl)];
        match gs {
            CpuStorage::F32(g) => go::<f32, f32>(n, &mut g[ga..gb], ops, c, m),
            CpuStorage::F64(g) => go::<f64, f64>(n, &mut g[ga..gb], ops, c, m),
            CpuStorage::BF16(g) => go::<half::bf16, f32>(n, &mut g[ga..gb], ops, c, m),
            _ => Err(bad_dtype(n)),
        }
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gs: &mut candle_core::CudaStorage,
        gl: &Layout,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        cs: &candle_core::CudaStorage,
        cl: &Layout,
    ) -> candle_core::Result<()> {
        crate::ops::cuda::bn::relu_bwd_affine_inplace(self.name(), (gs, gl), (xs, xl), (cs, cl))
    }
}

/// [`coef_rows`] of a storage as `T`, or the op's dtype error.
pub(crate) fn table<'a, T: Float>(
    s: &'a CpuStorage,
    l: &Layout,
    q: usize,
    c: usize,
    op: &str,
) -> candle_core::Result<&'a [T]> {
    coef_rows(T::in_storage(s).ok_or_else(|| bad_dtype(op))?, l, q, c, op)
}

/// The gradient and input operands of a BN backward op as features `E`: as many elements each,
/// or an error (the kernels walk them row by row together).
pub(crate) fn gy_and_x<'a, E: Elem>(
    op: &str,
    (gs, gl): Operand<'a>,
    (xs, xl): Operand<'a>,
) -> candle_core::Result<(&'a [E], &'a [E])> {
    let (g, x) = (features::<E>(gs, gl, op)?, features::<E>(xs, xl, op)?);
    if g.len() != x.len() {
        return Err(candle_core::Error::Msg(format!(
            "{op}: the gradient has {} elements, the input {}",
            g.len(),
            x.len()
        )));
    }
    Ok((g, x))
}

/// BN backward's per-channel coefficients of `dx = A·gy + B·x + C` from the sums `sg = Σ gy`,
/// `sgx = Σ gy·x̂` (in `T`), the batch mean and invstd and γ: in `T`, in the order of the candle
/// ops of [`generic_bn_bwd_coef`], with `neg_inv_m = T(−1/M)`, `inv_m = T(1/M)` (candle's
/// scalar multiply and divide are the affine `v·k + 0`). CPU twin of the end of
/// `bn_bwd_reduce` in `bn.cu`.
pub(crate) fn bwd_coef<T: Float>(
    [sg, sgx]: [T; 2],
    [mean, invstd, gamma]: [T; 3],
    [neg_inv_m, inv_m]: [T; 2],
) -> [T; 3] {
    let a = gamma * invstd;
    let b = ((a * invstd) * sgx) * neg_inv_m + T::ZERO;
    let t = (mean * invstd) * sgx;
    let cc = (a * (t - sg)) * inv_m + T::ZERO;
    [a, b, cc]
}

/// BN backward's reduction and coefficients: operands `gy`, `x` (`[C, M]`) and
/// `st [2, C]` = (mean; invstd); the op carries γ (`[C]`). Output planar `[5, C]` =
/// (Σ gy = dβ; Σ gy·x̂ = dγ; A; B; C) with `x̂ = (x − mean)·invstd`, the sums in f64 (for bf16
/// features the terms in f32, folded in f32 blocks first: [`block_sums`]). With
/// `relu`, `gy` is the gradient of ReLU(BN(x)) ([`masked`]) and `st` BN's saved table
/// `[4, C]` = (mean; invstd; scale; shift).
pub(crate) struct BnBwdReduceOp {
    gamma: Tensor,
    relu: bool,
}
impl CustomOp3 for BnBwdReduceOp {
    fn name(&self) -> &'static str {
        "bn-bwd-reduce"
    }
    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        xs: &CpuStorage,
        xl: &Layout,
        ss: &CpuStorage,
        sl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let n = self.name();
        let (c, m) = gl.shape().dims2()?;
        let (gms, gml) = carried(n, &self.gamma)?;
        fn go<const RELU: bool, E: Elem<Acc = T>, T: Float>(
            n: &str,
            [g, x, st, gamma]: [Operand; 4],
            c: usize,
            m: usize,
        ) -> candle_core::Result<CpuStorage> {
            let (g, x) = gy_and_x::<E>(n, g, x)?;
            let st = table::<T>(st.0, st.1, if RELU { 4 } else { 2 }, c, n)?;
            let gamma = table::<T>(gamma.0, gamma.1, 1, c, n)?;
            let (means, rest) = st.split_at(c);
            let (invstds, affine) = rest.split_at(c);
            let per_m = [T::of(-1.0 / m as f64), T::of(1.0 / m as f64)];
            // straight into the planar rows: the output is the op's only allocation
            let mut out = vec![T::ZERO; 5 * c];
            let (sgs, rest) = out.split_at_mut(c);
            let (sgxs, rest) = rest.split_at_mut(c);
            let (aas, rest) = rest.split_at_mut(c);
            let (bbs, ccs) = rest.split_at_mut(c);
            let outs = (
                sgs.par_iter_mut(),
                sgxs.par_iter_mut(),
                aas.par_iter_mut(),
                bbs.par_iter_mut(),
                ccs.par_iter_mut(),
            );
            g.par_chunks(m)
                .zip(x.par_chunks(m))
                .zip(means.par_iter().zip(invstds).zip(gamma))
                .zip((0..c).into_par_iter())
                .zip(outs.into_par_iter())
                .for_each(|((((g, x), ((&mean, &invstd), &gamma)), r), row)| {
                    let (scale, shift) = affine_row::<RELU, T>(affine, c, r);
                    let [sg, sgx] = if E::NARROW {
                        // bf16: the terms in f32 (autocast's), blocks folded in f32
                        let (mean, invstd) = (mean.f32(), invstd.f32());
                        block_sums(g, x, |g, x| {
                            let g = masked::<RELU, E, T>(g, x, scale, shift).widen().f32();
                            [g, g * (x.widen().f32() - mean) * invstd]
                        })
                    } else {
                        let (mean64, invstd64) = (mean.f64(), invstd.f64());
                        lane_sums(g, x, |g, x| {
                            let g = masked::<RELU, E, T>(g, x, scale, shift).widen().f64();
                            [g, g * (x.widen().f64() - mean64) * invstd64]
                        })
                    };
                    let (sg, sgx) = (T::of(sg), T::of(sgx));
                    let [a, b, cc] = bwd_coef([sg, sgx], [mean, invstd, gamma], per_m);
                    (*row.0, *row.1, *row.2, *row.3, *row.4) = (sg, sgx, a, b, cc);
                });
            Ok(T::storage(out))
        }
        let ops = [(gs, gl), (xs, xl), (ss, sl), (cpu_of(&gms), gml)];
        let out = match (gs, self.relu) {
            (CpuStorage::F32(_), false) => go::<false, f32, f32>(n, ops, c, m)?,
            (CpuStorage::F64(_), false) => go::<false, f64, f64>(n, ops, c, m)?,
            (CpuStorage::BF16(_), false) => go::<false, half::bf16, f32>(n, ops, c, m)?,
            (CpuStorage::F32(_), true) => go::<true, f32, f32>(n, ops, c, m)?,
            (CpuStorage::F64(_), true) => go::<true, f64, f64>(n, ops, c, m)?,
            (CpuStorage::BF16(_), true) => go::<true, half::bf16, f32>(n, ops, c, m)?,
            _ => return Err(bad_dtype(n)),
        };
        Ok((out, Shape::from((5, c))))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        ss: &candle_core::CudaStorage,
        sl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let n = self.name();
        let (gms, gml) = self.gamma.storage_and_layout();
        let candle_core::Storage::Cuda(gms) = &*gms else {
            return Err(not_on_cuda(n, "gamma"));
        };
        crate::ops::cuda::bn::bn_bwd_reduce(n, self.relu, (gs, gl), (xs, xl), (ss, sl), (gms, gml))
    }
}

/// Row `r`'s (scale; shift) of a fused ReLU's planar `[2, C]` table; zeros, never read,
/// without one.
#[inline(always)]
fn affine_row<const RELU: bool, T: Float>(affine: &[T], c: usize, r: usize) -> (T, T) {
    if RELU {
        (affine[r], affine[c + r])
    } else {
        (T::ZERO, T::ZERO)
    }
}

/// A fused ReLU's `[2, C]` (scale; shift) as `T`, or an empty slice without one.
fn affine_table<'a, T: Float>(
    affine: Option<Operand<'a>>,
    c: usize,
    n: &str,
) -> candle_core::Result<&'a [T]> {
    match affine {
        Some((s, l)) => table::<T>(s, l, 2, c, n),
        None => Ok(&[]),
    }
}

/// `A·gy + B·x + C` of one element as `((A·gy) + (B·x)) + C` from the widened features: for
/// f32 and f64 features in f64, rounded once to the compute type `E::Acc`; for bf16 features
/// ([`Elem::NARROW`]) in f32, each operation rounded, as PyTorch autocast's BN backward computes
/// it (the result is then rounded to bf16 when written). f64 arithmetic there ran at half the
/// rate for no visible gain: `bn_shapes` (BC-100's widest BN1, `[204, 65536]`, 1 thread, AMD
/// EPYC Zen 4) 6.6 → 3.4 ms for dx, 7.6 → 4.2 ms for dx-accumulate. CPU twin of
/// `bn_dx_value` in `bn.cu`.
#[inline(always)]
pub(crate) fn dx_value<E: Elem>([a, b, cc]: [E::Acc; 3], g: E, x: E) -> E::Acc {
    if E::NARROW {
        a * g.widen() + b * x.widen() + cc
    } else {
        <E::Acc>::of(a.f64() * g.widen().f64() + b.f64() * x.widen().f64() + cc.f64())
    }
}

/// `f` of a fused ReLU's carried (scale; shift) on CUDA, `None` without one; an error if it is
/// not on CUDA.
#[cfg(feature = "cuda")]
fn on_cuda_affine<R>(
    n: &str,
    affine: Option<&Tensor>,
    f: impl FnOnce(Option<(&candle_core::CudaStorage, &Layout)>) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let Some(t) = affine else {
        return f(None);
    };
    let (s, l) = t.storage_and_layout();
    match &*s {
        candle_core::Storage::Cuda(s) => f(Some((s, l))),
        _ => Err(not_on_cuda(n, "the ReLU's (scale; shift)")),
    }
}

/// `dx = A·gy + B·x + C` per row with planar `coef [3, C] = (A; B; C)`, evaluated in f64 (in f32
/// for bf16 features: [`dx_value`]); with
/// `affine`, BN's `[2, C]` (scale; shift), `gy` is [`masked`] by the ReLU after BN.
pub(crate) struct BnBwdDxOp {
    /// A fused ReLU's (scale; shift), carried (a custom op takes at most three operands).
    affine: Option<Tensor>,
}
impl CustomOp3 for BnBwdDxOp {
    fn name(&self) -> &'static str {
        "bn-bwd-dx"
    }
    fn cpu_fwd(
        &self,
        gs: &CpuStorage,
        gl: &Layout,
        xs: &CpuStorage,
        xl: &Layout,
        cs: &CpuStorage,
        cl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (c, m) = gl.shape().dims2()?;
        fn go<const RELU: bool, E: Elem<Acc = T>, T: Float>(
            n: &str,
            [g, x, coef]: [Operand; 3],
            affine: Option<Operand>,
            c: usize,
            m: usize,
        ) -> candle_core::Result<CpuStorage> {
            let (g, x) = gy_and_x::<E>(n, g, x)?;
            let coef = table::<T>(coef.0, coef.1, 3, c, n)?;
            let affine = affine_table::<T>(affine, c, n)?;
            Ok(E::storage(crate::ops::elementwise::new_rows(c, m, |r| {
                let abc = [coef[r], coef[c + r], coef[2 * c + r]];
                let (scale, shift) = affine_row::<RELU, T>(affine, c, r);
                let (g, x) = (&g[r * m..][..m], &x[r * m..][..m]);
                g.iter().zip(x).map(move |(&g, &x)| {
                    let g = masked::<RELU, E, T>(g, x, scale, shift);
                    E::narrow(dx_value(abc, g, x))
                })
            })))
        }
        let n = self.name();
        let ops = [(gs, gl), (xs, xl), (cs, cl)];
        let carried_affine = self.affine.as_ref().map(|t| carried(n, t)).transpose()?;
        let a = carried_affine.as_ref().map(|(s, l)| (cpu_of(s), *l));
        let out = match (gs, a.is_some()) {
            (CpuStorage::F32(_), false) => go::<false, f32, f32>(n, ops, a, c, m)?,
            (CpuStorage::F64(_), false) => go::<false, f64, f64>(n, ops, a, c, m)?,
            (CpuStorage::BF16(_), false) => go::<false, half::bf16, f32>(n, ops, a, c, m)?,
            (CpuStorage::F32(_), true) => go::<true, f32, f32>(n, ops, a, c, m)?,
            (CpuStorage::F64(_), true) => go::<true, f64, f64>(n, ops, a, c, m)?,
            (CpuStorage::BF16(_), true) => go::<true, half::bf16, f32>(n, ops, a, c, m)?,
            _ => return Err(bad_dtype(n)),
        };
        Ok((out, gl.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
        cs: &candle_core::CudaStorage,
        cl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let n = self.name();
        on_cuda_affine(n, self.affine.as_ref(), |affine| {
            crate::ops::cuda::bn::bn_bwd_dx(n, (gs, gl), (xs, xl), (cs, cl), affine)
        })
    }
}

/// `dst += T(A·gy + B·x + C)` per row, **in place**: the same rounding as [`BnBwdDxOp`]
/// followed by an add, so results are bitwise those of the two-step path (f32, f64). A bf16
/// `dst` is `bf16(f32(dst) + f32(A·gy + B·x + C))`, rounded to bf16 once (not the two-step
/// path's twice).
pub(crate) struct BnBwdDxAccumulateOp {
    /// `(A; B; C)`, planar `[3, C]` in the operands' dtype and on their device. An in-place op
    /// takes at most two tensor operands besides the destination, so the op carries the third
    /// and reads its storage itself (a tensor of its own: it cannot alias the destination).
    coef: Tensor,
    /// Where the destination's old values come from instead of the destination itself
    /// ([`bn_bwd_dx_accumulate_from`], CPU only): `dst = from + dx`, the destination written
    /// whole and never read. Carried like `coef`; it must not alias the destination.
    from: Option<Tensor>,
    /// A fused ReLU's (scale; shift), `gy` [`masked`] by it (see [`BnBwdDxOp`]). Carried like
    /// `coef`.
    affine: Option<Tensor>,
}
impl InplaceOp3 for BnBwdDxAccumulateOp {
    fn name(&self) -> &'static str {
        "bn-bwd-dx-accumulate"
    }
    fn cpu_fwd(
        &self,
        ds: &mut CpuStorage,
        dl: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
        xs: &CpuStorage,
        xl: &Layout,
    ) -> candle_core::Result<()> {
        let (c, m) = gl.shape().dims2()?;
        #[allow(clippy::too_many_arguments)]
        fn go<const RELU: bool, E: Elem<Acc = T>, T: Float>(
            n: &str,
            d: &mut [E],
            [g, x, coef]: [Operand; 3],
            from: Option<Operand>,
            affine: Option<Operand>,
            c: usize,
            m: usize,
        ) -> candle_core::Result<()> {
            let (g, x) = gy_and_x::<E>(n, g, x)?;
            let coef = table::<T>(coef.0, coef.1, 3, c, n)?;
            let affine = affine_table::<T>(affine, c, n)?;
            let from = from.map(|(s, l)| features::<E>(s, l, n)).transpose()?;
            for (what, len) in [
                ("destination", d.len()),
                ("source", from.map_or(d.len(), <[E]>::len)),
            ] {
                if len != g.len() {
                    return Err(candle_core::Error::Msg(format!(
                        "{n}: the {what} has {len} elements, the gradient {}",
                        g.len()
                    )));
                }
            }
            let row = |r: usize, d: &mut [E], g: &[E], x: &[E]| {
                let abc = [coef[r], coef[c + r], coef[2 * c + r]];
                let (scale, shift) = affine_row::<RELU, T>(affine, c, r);
                let dx = |g, x| dx_value(abc, masked::<RELU, E, T>(g, x, scale, shift), x);
                match from {
                    // dst = from + dx: the same roundings as copying `from` into dst first
                    Some(f) => {
                        let f = &f[r * m..(r + 1) * m];
                        zip3(d, g, x, f, |_, g, x, f| E::narrow(f.widen() + dx(g, x)));
                    }
                    None => {
                        // in the compute type, rounded once (the identity for f32 and f64)
                        zip2(d, g, x, |d, g, x| E::narrow(d.widen() + dx(g, x)));
                    }
                }
            };
            d.par_chunks_mut(m)
                .zip(g.par_chunks(m).zip(x.par_chunks(m)))
                .enumerate()
                .for_each(|(r, (d, (g, x)))| row(r, d, g, x));
            Ok(())
        }
        let n = self.name();
        let (da, db) = dl.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{n}: destination must be contiguous"))
        })?;
        let (cs, cl) = carried(n, &self.coef)?;
        let ops = [(gs, gl), (xs, xl), (cpu_of(&cs), cl)];
        let from = self.from.as_ref().map(|f| carried(n, f)).transpose()?;
        let from = from.as_ref().map(|(s, l)| (cpu_of(s), *l));
        let carried_affine = self.affine.as_ref().map(|t| carried(n, t)).transpose()?;
        let a = carried_affine.as_ref().map(|(s, l)| (cpu_of(s), *l));
        let f = from;
        match (ds, a.is_some()) {
            (CpuStorage::F32(d), false) => {
                go::<false, f32, f32>(n, &mut d[da..db], ops, f, a, c, m)
            }
            (CpuStorage::F64(d), false) => {
                go::<false, f64, f64>(n, &mut d[da..db], ops, f, a, c, m)
            }
            (CpuStorage::BF16(d), false) => {
                go::<false, half::bf16, f32>(n, &mut d[da..db], ops, f, a, c, m)
            }
            (CpuStorage::F32(d), true) => go::<true, f32, f32>(n, &mut d[da..db], ops, f, a, c, m),
            (CpuStorage::F64(d), true) => go::<true, f64, f64>(n, &mut d[da..db], ops, f, a, c, m),
            (CpuStorage::BF16(d), true) => {
                go::<true, half::bf16, f32>(n, &mut d[da..db], ops, f, a, c, m)
            }
            _ => Err(bad_dtype(n)),
        }
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        ds: &mut candle_core::CudaStorage,
        dl: &Layout,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
        xs: &candle_core::CudaStorage,
        xl: &Layout,
    ) -> candle_core::Result<()> {
        let n = self.name();
        if self.from.is_some() {
            return Err(candle_core::Error::Msg(format!(
                "{n}: a separate source (bn_bwd_dx_accumulate_from) is CPU only"
            )));
        }
        let (cs, cl) = self.coef.storage_and_layout();
        let candle_core::Storage::Cuda(cs) = &*cs else {
            return Err(not_on_cuda(n, "coefficients"));
        };
        on_cuda_affine(n, self.affine.as_ref(), |affine| {
            crate::ops::cuda::bn::bn_bwd_dx_accumulate(
                n,
                (ds, dl),
                (gs, gl),
                (xs, xl),
                (cs, cl),
                affine,
            )
        })
    }
}

/// The gradient through a ReLU that follows BN apply, masked from BN's **input**:
/// `(x·scale + shift > 0) ? g : 0` per row (`coef [2, C]` = (scale; shift), the table
/// [`crate::ops::bn::affine_rows`] applied), into a new tensor. Bitwise `relu_bwd(g, affine_rows_relu(x, coef))`
/// (the same `v`, the same predicate), without the ReLU's output: a backward that has BN's
/// input at hand (the feature buffer's view) need not keep it.
pub fn relu_bwd_affine(g: &Tensor, x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    if [g, x, coef]
        .iter()
        .all(|t| has_kernels(t) && t.is_contiguous())
    {
        g.apply_op3_no_bwd(x, coef, &ReluBwdAffineOp)
            .ctx("relu bwd affine")
    } else {
        generic_relu_bwd_affine(g, x, coef)
    }
}

/// [`relu_bwd_affine`] **over `g`** (returned): the in-place ReLU backward. Contiguous
/// operands on a device with kernels only: anything else is an error, never a silent copy
/// (like [`crate::ops::elementwise::relu_bwd_inplace`]).
pub fn relu_bwd_affine_inplace(g: Tensor, x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    g.inplace_op3(x, coef, &ReluBwdAffineInplaceOp)
        .ctx("relu bwd affine inplace")?;
    Ok(g)
}

/// [`relu_bwd_affine`] from the ReLU's output, recomputed with candle ops (any device): the
/// oracle.
pub fn generic_relu_bwd_affine(g: &Tensor, x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    let out = generic_affine_rows_relu(x, coef)?;
    let mask = out.gt(0.0).ctx("relu bwd affine")?;
    mask.where_cond(g, &g.zeros_like().ctx("relu bwd affine")?)
        .ctx("relu bwd affine")
}

/// BN backward's reductions and coefficients in one op: `st [2, C]` = (mean; invstd) of the
/// forward, γ `[C]`; returns planar `[5, C]` = (Σ gy = dβ; Σ gy·x̂ = dγ; A; B; C) with
/// `x̂ = (x − mean)·invstd` (sums in f64, rounded to the dtype) and `dx = A·gy + B·x + C`
/// ([`bn_bwd_dx`] takes rows 2..5 as its coefficients). The coefficients are bitwise
/// [`generic_bn_bwd_coef`] of the two sums.
pub fn bn_bwd_reduce(gy: &Tensor, x: &Tensor, st: &Tensor, gamma: &Tensor) -> Result<Tensor> {
    reduce(gy, x, st, gamma, false)
}

/// [`bn_bwd_reduce`] of ReLU(BN(x)), from the gradient `gy` of the ReLU's output, the ReLU's
/// backward fused in (the mask: `gy` where `x·scale + shift > 0`, else `+0`): `table` is BN's
/// saved `[4, C]` = (mean; invstd; scale; shift). Returns the `[5, C]` of the masked gradient;
/// its rows 2..5 and the table's rows 2..4 are what [`bn_bwd_dx_relu`] and its accumulating
/// forms read. Bitwise [`relu_bwd_affine`] followed by [`bn_bwd_reduce`] (the same terms in
/// the same order), one pass over `[C, M]` and one `[C, M]` tensor fewer.
pub fn bn_bwd_reduce_relu(
    gy: &Tensor,
    x: &Tensor,
    table: &Tensor,
    gamma: &Tensor,
) -> Result<Tensor> {
    reduce(gy, x, table, gamma, true)
}

fn reduce(gy: &Tensor, x: &Tensor, st: &Tensor, gamma: &Tensor, relu: bool) -> Result<Tensor> {
    let operands = [gy, x, st, gamma];
    if operands.iter().all(|t| has_kernels(t) && t.is_contiguous()) {
        let op = BnBwdReduceOp {
            gamma: gamma.clone(),
            relu,
        };
        gy.apply_op3_no_bwd(x, st, &op).ctx("bn bwd reduce")
    } else if relu {
        let g = generic_relu_bwd_affine(gy, x, &st.narrow(0, 2, 2).ctx("bn bwd reduce")?)?;
        generic_bn_bwd_reduce(&g, x, &st.narrow(0, 0, 2).ctx("bn bwd reduce")?, gamma)
    } else {
        generic_bn_bwd_reduce(gy, x, st, gamma)
    }
}

/// [`bn_bwd_reduce`] from candle ops (any device): the sums in the dtype (not f64), then
/// [`generic_bn_bwd_coef`].
pub fn generic_bn_bwd_reduce(
    gy: &Tensor,
    x: &Tensor,
    st: &Tensor,
    gamma: &Tensor,
) -> Result<Tensor> {
    let xhat = x
        .broadcast_sub(&column(st, 0)?)
        .ctx("bn bwd x̂")?
        .broadcast_mul(&column(st, 1)?)
        .ctx("bn bwd x̂")?;
    let sg = gy.sum_keepdim(1).ctx("bn bwd Σgy")?;
    let sgx = gy
        .mul(&xhat)
        .ctx("bn bwd")?
        .sum_keepdim(1)
        .ctx("bn bwd Σgy·x̂")?;
    let [a, b, cc] = generic_bn_bwd_coef(&sg, &sgx, st, gamma, x.dims()[1])?;
    planar(&[&sg, &sgx, &a, &b, &cc])
}

/// The coefficients `(A, B, C)` of `dx = A·gy + B·x + C` (each `[C, 1]`) from the sums `sg`,
/// `sgx` (`[C, 1]`), `st [2, C]` = (mean; invstd) and γ, over `m` values per channel, from
/// candle ops: `A = γ·invstd`, `B = −A·invstd·sgx/m`, `C = A·(mean·invstd·sgx − sg)/m` — op for
/// op what the layer maths computed before the fused reduction (the oracle of its last step).
pub fn generic_bn_bwd_coef(
    sg: &Tensor,
    sgx: &Tensor,
    st: &Tensor,
    gamma: &Tensor,
    m: usize,
) -> Result<[Tensor; 3]> {
    let (c, m) = (st.dims()[1], m as f64);
    let (mean, invstd) = (column(st, 0)?, column(st, 1)?);
    let a = gamma
        .reshape((c, 1))
        .ctx("bn bwd")?
        .mul(&invstd)
        .ctx("bn bwd A")?;
    let b =
        (a.mul(&invstd).ctx("bn bwd B")?.mul(sgx).ctx("bn bwd B")? * (-1.0 / m)).ctx("bn bwd B")?;
    let cc = {
        let t = mean
            .mul(&invstd)
            .ctx("bn bwd C")?
            .mul(sgx)
            .ctx("bn bwd C")?;
        (a.mul(&t.sub(sg).ctx("bn bwd C")?).ctx("bn bwd C")? / m).ctx("bn bwd C")?
    };
    Ok([a, b, cc])
}

/// `A·gy + B·x + C` per row (`coef [3, C]` = (A; B; C)), one new tensor.
pub fn bn_bwd_dx(gy: &Tensor, x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    dx(gy, x, coef, None)
}

/// [`bn_bwd_dx`] of ReLU(BN(x)) from the ReLU output's gradient `gy`, masked in the same pass
/// (the same mask) by `affine [2, C]` = (scale; shift), BN's table rows 2..4; `coef [3, C]` from
/// [`bn_bwd_reduce_relu`]. Bitwise [`relu_bwd_affine`] then [`bn_bwd_dx`].
pub fn bn_bwd_dx_relu(gy: &Tensor, x: &Tensor, coef: &Tensor, affine: &Tensor) -> Result<Tensor> {
    dx(gy, x, coef, Some(affine))
}

fn dx(gy: &Tensor, x: &Tensor, coef: &Tensor, affine: Option<&Tensor>) -> Result<Tensor> {
    let kernels = [gy, x, coef].into_iter().chain(affine);
    if has_kernels(x) && kernels.into_iter().all(Tensor::is_contiguous) {
        let op = BnBwdDxOp {
            affine: affine.cloned(),
        };
        gy.apply_op3_no_bwd(x, coef, &op).ctx("bn bwd dx")
    } else {
        generic_dx(gy, x, coef, affine)
    }
}

/// [`generic_bn_bwd_dx`] of `gy`, first masked by a fused ReLU's `affine` (scale; shift) where
/// there is one: the oracle of the dx ops.
fn generic_dx(gy: &Tensor, x: &Tensor, coef: &Tensor, affine: Option<&Tensor>) -> Result<Tensor> {
    match affine {
        Some(affine) => generic_bn_bwd_dx(&generic_relu_bwd_affine(gy, x, affine)?, x, coef),
        None => generic_bn_bwd_dx(gy, x, coef),
    }
}

/// [`bn_bwd_dx`] from candle ops (any device).
pub fn generic_bn_bwd_dx(gy: &Tensor, x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    let t = gy.broadcast_mul(&column(coef, 0)?).ctx("bn bwd dx")?;
    let u = x.broadcast_mul(&column(coef, 1)?).ctx("bn bwd dx")?;
    (t + u)
        .ctx("bn bwd dx")?
        .broadcast_add(&column(coef, 2)?)
        .ctx("bn bwd dx")
}

/// `dst += A·gy + B·x + C` per row (`coef [3, C]`), **writing into `dst`** (a view of the
/// gradient buffer): [`bn_bwd_dx`] and an in-place add in one pass, with no `[C, M]` temporary.
/// Bitwise the same as the two-step path.
pub fn bn_bwd_dx_accumulate(dst: &Tensor, gy: &Tensor, x: &Tensor, coef: &Tensor) -> Result<()> {
    dx_accumulate(dst, gy, x, coef, None)
}

/// [`bn_bwd_dx_accumulate`] with the ReLU after BN fused in, as [`bn_bwd_dx_relu`].
pub fn bn_bwd_dx_accumulate_relu(
    dst: &Tensor,
    gy: &Tensor,
    x: &Tensor,
    coef: &Tensor,
    affine: &Tensor,
) -> Result<()> {
    dx_accumulate(dst, gy, x, coef, Some(affine))
}

fn dx_accumulate(
    dst: &Tensor,
    gy: &Tensor,
    x: &Tensor,
    coef: &Tensor,
    affine: Option<&Tensor>,
) -> Result<()> {
    let operands = [dst, gy, x, coef].into_iter().chain(affine);
    if operands
        .into_iter()
        .all(|t| has_kernels(t) && t.is_contiguous())
    {
        let op = BnBwdDxAccumulateOp {
            coef: coef.clone(),
            from: None,
            affine: affine.cloned(),
        };
        dst.inplace_op3(gy, x, &op).ctx("bn bwd dx accumulate")
    } else {
        crate::ops::elementwise::add_assign(dst, &generic_dx(gy, x, coef, affine)?)
    }
}

/// `dst = from + (A·gy + B·x + C)` per row, **writing `dst` whole** without reading it (it may
/// be unfilled memory): [`bn_bwd_dx_accumulate`] into a copy of `from`, in one pass instead of
/// a copy and a read-modify-write — bitwise the same (the copy is exact, the add rounds as
/// [`bn_bwd_dx_accumulate`]'s). The CPU kernels only (contiguous operands, `from` not aliasing
/// `dst`); anything else is an error, never a silent fallback. A cat variant's new input
/// gradient, the previous one's prefix plus this layer's `dx` (`strategies::block`).
pub fn bn_bwd_dx_accumulate_from(
    dst: &Tensor,
    from: &Tensor,
    gy: &Tensor,
    x: &Tensor,
    coef: &Tensor,
) -> Result<()> {
    dx_accumulate_from(dst, from, gy, x, coef, None)
}

/// [`bn_bwd_dx_accumulate_from`] with the ReLU after BN fused in, as [`bn_bwd_dx_relu`].
pub fn bn_bwd_dx_accumulate_from_relu(
    dst: &Tensor,
    from: &Tensor,
    gy: &Tensor,
    x: &Tensor,
    coef: &Tensor,
    affine: &Tensor,
) -> Result<()> {
    dx_accumulate_from(dst, from, gy, x, coef, Some(affine))
}

fn dx_accumulate_from(
    dst: &Tensor,
    from: &Tensor,
    gy: &Tensor,
    x: &Tensor,
    coef: &Tensor,
    affine: Option<&Tensor>,
) -> Result<()> {
    const OP: &str = "bn bwd dx accumulate from";
    let operands = [dst, from, gy, x, coef].into_iter().chain(affine);
    if !operands
        .into_iter()
        .all(|t| t.device().is_cpu() && has_kernels(t) && t.is_contiguous())
    {
        return Err(candle_core::Error::Msg(
            "contiguous CPU operands only (a GPU copies, then accumulates)".to_string(),
        ))
        .ctx(OP);
    }
    if from.dims() != dst.dims() {
        return Err(candle_core::Error::Msg(format!(
            "source {:?}, destination {:?}",
            from.dims(),
            dst.dims()
        )))
        .ctx(OP);
    }
    let op = BnBwdDxAccumulateOp {
        coef: coef.clone(),
        from: Some(from.clone()),
        affine: affine.cloned(),
    };
    dst.inplace_op3(gy, x, &op).ctx(OP)
}
