//! BatchNorm forward as fused kernels: per-channel statistics ([`bn_stats`]), the per-channel
//! step that turns them and γ, β and the running statistics into one coefficient table
//! ([`bn_prepare`]), and apply with or without ReLU ([`affine_rows`], [`affine_rows_relu`]).
//! Each makes one pass over its input and allocates exactly its output — no hidden full-size
//! temporaries, so memory is predictable and one model holds on every device.
//!
//! Every public function dispatches on the device: contiguous CPU tensors run the CPU kernels
//! below, contiguous CUDA tensors (`cuda` feature) their twins in `ops/cuda/bn.cu` through the
//! same candle custom ops (`cuda_fwd`, launched by `ops/cuda/bn.rs`). The `generic_*` functions
//! compute the same maths from candle ops: they are the test oracles for both kernels, and the
//! fallback for strided operands and devices without kernels (the block's own calls are all
//! contiguous). Reductions accumulate in f64 whatever the dtype. The backward is
//! [`crate::ops::bn_backward`].
//!
//! Dtypes on the CPU: all f32, all f64, or (mixed precision, PyTorch autocast's rule) bf16
//! features with f32 tables — [`bn_stats`] of bf16 `x` is an f32 table, [`bn_prepare`] is all
//! f32, [`affine_rows`] of bf16 `x` with an f32 table is bf16, computed in f32 from the widened
//! input and rounded once ([`Elem`]). Any other combination is an error naming the op.

use crate::config::{BN_EPS, BN_MOMENTUM};
use crate::error::{CandleContext, Result};
use crate::ops::cpu::shared::{lane_sums, Elem, Float};
#[cfg(feature = "cuda")]
use crate::ops::cpu::storage::not_on_cuda;
use crate::ops::cpu::storage::{
    bad_dtype, carried, cpu_of, features, has_kernels, map1, slice, unit_column_stride, Kernel1,
    Operand,
};
use crate::ops::layout::matrix::Mat;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Shape, Tensor};
use rayon::prelude::*;

/// Per-row mean and biased variance of `x [C, M]` → planar `[2, C]` = (mean; var), two passes
/// in f64, the table in the compute type (f32 for bf16 `x`).
pub(crate) struct BnStatsOp;
impl Kernel1 for BnStatsOp {
    const NAME: &'static str = "bn-stats";
    fn run<E: Elem>(&self, x: &[E], c: usize, m: usize) -> Vec<E::Acc> {
        // straight into the planar rows: the output is the op's only allocation (the memory
        // model counts one tensor per op, and a pool would hold nothing else)
        let mut out = vec![<E::Acc as Float>::ZERO; 2 * c];
        let (means, vars) = out.split_at_mut(c);
        stats_into(x, m, means, vars);
        out
    }
}

/// Row r's (mean; biased variance) of `x [C, m]` into `means[r]`, `vars[r]`: two passes in
/// f64, rounded to the compute type (CPU twin of `bn_row_stats` in `bn.cu`).
fn stats_into<E: Elem>(x: &[E], m: usize, means: &mut [E::Acc], vars: &mut [E::Acc]) {
    x.par_chunks(m.max(1))
        .zip(means.par_iter_mut().zip(vars.par_iter_mut()))
        .for_each(|(row, (mean_out, var_out))| {
            let [sum] = lane_sums(row, row, |v, _| [v.widen().f64()]);
            let mean = sum / m as f64;
            let [ss] = lane_sums(row, row, |v, _| [(v.widen().f64() - mean).powi(2)]);
            let var = ss / m as f64;
            (*mean_out, *var_out) = (<E::Acc>::of(mean), <E::Acc>::of(var));
        });
}
impl CustomOp1 for BnStatsOp {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let c = l.shape().dims2()?.0;
        Ok((map1(self, s, l)?, Shape::from((2, c))))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::ops::cuda::bn::bn_stats(Self::NAME, s, l)
    }
}

/// The scalars of BN forward's per-channel step, as f64 (each side rounds them to the tensors'
/// type, as candle does with a scalar operand): `eps`, the running stats' `keep = 1 − μ`,
/// `mom = μ` and `mom_unbias = μ·M/(M−1)` (PyTorch's unbiased running variance).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrepareScalars {
    eps: f64,
    keep: f64,
    mom: f64,
    mom_unbias: f64,
}

impl PrepareScalars {
    /// For a BN over `m` values per channel.
    fn new(m: usize) -> Self {
        let m = m as f64;
        PrepareScalars {
            eps: BN_EPS,
            keep: 1.0 - BN_MOMENTUM,
            mom: BN_MOMENTUM,
            mom_unbias: BN_MOMENTUM * (m / (m - 1.0)),
        }
    }
}

/// The per-channel step of BN forward, CPU twin of `bn_prepare` in `bn.cu`: from
/// `mv [2, C]` = (mean; biased var), γ, β and the running stats, the `[6, C]` table
/// (mean; invstd; scale; shift; new running mean; new running var), in `T`, in the order of the
/// candle ops it replaces ([`generic_bn_prepare`]): bitwise the same values.
pub(crate) fn prepare_rows<T: Float>(
    mv: &[T],
    [gamma, beta, rmean, rvar]: [&[T]; 4],
    c: usize,
    k: PrepareScalars,
) -> Vec<T> {
    let mut out = vec![T::ZERO; 6 * c];
    for ch in 0..c {
        prepare_channel(
            &mut out,
            ch,
            c,
            [mv[ch], mv[c + ch]],
            [gamma, beta, rmean, rvar],
            k,
        );
    }
    out
}

/// Channel `ch` of [`prepare_rows`]' `[6, C]` table `out` from its `[mean, var]` (CPU twin of
/// `bn_prepare_channel` in `bn.cu`).
fn prepare_channel<T: Float>(
    out: &mut [T],
    ch: usize,
    c: usize,
    [mean, var]: [T; 2],
    [gamma, beta, rmean, rvar]: [&[T]; 4],
    k: PrepareScalars,
) {
    let (eps, keep, mom, mom_unbias) = (
        T::of(k.eps),
        T::of(k.keep),
        T::of(k.mom),
        T::of(k.mom_unbias),
    );
    // candle: (var + eps) is the affine v·1 + eps, then sqrt, then recip (1/v)
    let invstd = T::ONE / (var * T::ONE + eps).sqrt();
    let scale = gamma[ch] * invstd;
    let shift = beta[ch] - mean * scale;
    out[ch] = mean;
    out[c + ch] = invstd;
    out[2 * c + ch] = scale;
    out[3 * c + ch] = shift;
    // candle: a scalar multiply is the affine v·k + 0
    out[4 * c + ch] = (rmean[ch] * keep + T::ZERO) + (mean * mom + T::ZERO);
    out[5 * c + ch] = (rvar[ch] * keep + T::ZERO) + (var * mom_unbias + T::ZERO);
}

/// BN forward's per-channel step ([`prepare_rows`]): operands `mv [2, C]` (or, [`Measured`],
/// the features `x [C, M]` whose statistics it measures first: [`bn_stats_prepare`]), γ and β
/// (`[C]`); the op carries the running mean and variance (a custom op takes at most three
/// operands). Its `[6, C]` output is its only allocation either way: measured statistics are
/// made in its first two rows, then each channel's step overwrites them.
pub(crate) struct BnPrepareOp {
    running_mean: Tensor,
    running_var: Tensor,
    scalars: PrepareScalars,
    input: Measured,
}

/// What [`BnPrepareOp`]'s first operand is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Measured {
    /// The statistics `mv [2, C]` (mean; biased var), made before.
    Before,
    /// The features `x [C, M]`: measured in the same op (one launch on a GPU).
    Here,
}

impl CustomOp3 for BnPrepareOp {
    fn name(&self) -> &'static str {
        match self.input {
            Measured::Before => "bn-prepare",
            Measured::Here => "bn-stats-prepare",
        }
    }
    fn cpu_fwd(
        &self,
        ms: &CpuStorage,
        ml: &Layout,
        gs: &CpuStorage,
        gl: &Layout,
        bs: &CpuStorage,
        bl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let n = self.name();
        let (rows, cols) = ml.shape().dims2()?;
        let c = match self.input {
            Measured::Before if rows != 2 => {
                return Err(candle_core::Error::Msg(format!(
                    "{n}: statistics must be [2, C] (mean; var), got [{rows}, {cols}]"
                )))
            }
            Measured::Before => cols,
            Measured::Here => rows,
        };
        let (rms, rml) = carried(n, &self.running_mean)?;
        let (rvs, rvl) = carried(n, &self.running_var)?;
        for (what, l) in [
            ("gamma", gl),
            ("beta", bl),
            ("running mean", rml),
            ("running var", rvl),
        ] {
            if l.shape().elem_count() != c {
                return Err(candle_core::Error::Msg(format!(
                    "{n}: {what} has {} elements, expected {c}",
                    l.shape().elem_count()
                )));
            }
        }
        // Features `E`, everything else `T`; `features` checks each operand holds its type.
        fn go<E: Elem<Acc = T>, T: Float>(
            n: &str,
            input: Measured,
            [first, vectors @ ..]: [Operand; 5],
            (c, m): (usize, usize),
            k: PrepareScalars,
        ) -> candle_core::Result<CpuStorage> {
            let [g, b, rm, rv] = vectors.map(|(s, l)| features::<T>(s, l, n));
            let vectors = [g?, b?, rm?, rv?];
            let out = match input {
                Measured::Before => {
                    prepare_rows(features::<T>(first.0, first.1, n)?, vectors, c, k)
                }
                Measured::Here => {
                    let x = features::<E>(first.0, first.1, n)?;
                    let mut out = vec![T::ZERO; 6 * c];
                    let (means, rest) = out.split_at_mut(c);
                    stats_into(x, m, means, &mut rest[..c]);
                    for ch in 0..c {
                        let mv = [out[ch], out[c + ch]];
                        prepare_channel(&mut out, ch, c, mv, vectors, k);
                    }
                    out
                }
            };
            Ok(T::storage(out))
        }
        let ops = [
            (ms, ml),
            (gs, gl),
            (bs, bl),
            (cpu_of(&rms), rml),
            (cpu_of(&rvs), rvl),
        ];
        let (input, k) = (self.input, self.scalars);
        let out = match (ms, input) {
            (CpuStorage::F32(_), _) => go::<f32, f32>(n, input, ops, (c, cols), k)?,
            (CpuStorage::F64(_), _) => go::<f64, f64>(n, input, ops, (c, cols), k)?,
            (CpuStorage::BF16(_), Measured::Here) => {
                go::<half::bf16, f32>(n, input, ops, (c, cols), k)?
            }
            _ => return Err(bad_dtype(n)),
        };
        Ok((out, Shape::from((6, c))))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        ms: &candle_core::CudaStorage,
        ml: &Layout,
        gs: &candle_core::CudaStorage,
        gl: &Layout,
        bs: &candle_core::CudaStorage,
        bl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        let n = self.name();
        let k = self.scalars;
        let (rms, rml) = self.running_mean.storage_and_layout();
        let (rvs, rvl) = self.running_var.storage_and_layout();
        let (candle_core::Storage::Cuda(rms), candle_core::Storage::Cuda(rvs)) = (&*rms, &*rvs)
        else {
            return Err(not_on_cuda(n, "running stats"));
        };
        let operands = [(ms, ml), (gs, gl), (bs, bl), (rms, rml), (rvs, rvl)];
        let scalars = [k.eps, k.keep, k.mom, k.mom_unbias];
        let here = self.input == Measured::Here;
        crate::ops::cuda::bn::bn_prepare(n, here, operands, scalars)
    }
}

/// `y = x·scale + shift` per row, with planar `coef [2, C] = (scale; shift)`; with `relu`, also
/// `y = y > 0 ? y : 0` (NaN → 0, as [`crate::ops::elementwise::relu_inplace`]) in the same pass.
pub(crate) struct AffineRowsOp {
    relu: bool,
}
impl CustomOp2 for AffineRowsOp {
    fn name(&self) -> &'static str {
        if self.relu {
            "bn-apply-relu"
        } else {
            "bn-apply"
        }
    }
    fn cpu_fwd(
        &self,
        s: &CpuStorage,
        l: &Layout,
        cs: &CpuStorage,
        cl: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (c, m) = l.shape().dims2()?;
        // x: rows of unit column stride (a whole map, or a column range of a wider one); the
        // table in x's compute type
        fn go<E: Elem>(
            s: &CpuStorage,
            l: &Layout,
            cs: &CpuStorage,
            cl: &Layout,
            (c, m): (usize, usize),
            (n, relu): (&str, bool),
        ) -> candle_core::Result<CpuStorage> {
            let x = E::in_storage(s).ok_or_else(|| bad_dtype(n))?;
            let k = <E::Acc as Elem>::in_storage(cs).ok_or_else(|| bad_dtype(n))?;
            let xv = Mat::rows_of(l, x.len(), n, "input")?;
            let coef = coef_rows(k, cl, 2, c, n)?;
            Ok(E::storage(if relu {
                rows::<E, true>(x, xv, coef, c, m)
            } else {
                rows::<E, false>(x, xv, coef, c, m)
            }))
        }
        // one loop per mode, its branch resolved at compile time
        fn rows<E: Elem, const RELU: bool>(
            x: &[E],
            xv: Mat,
            coef: &[E::Acc],
            c: usize,
            m: usize,
        ) -> Vec<E> {
            let (scales, shifts) = coef.split_at(c);
            crate::ops::elementwise::new_rows(c, m, |r| {
                let (scale, shift) = (scales[r], shifts[r]);
                x[xv.off + r * xv.rs..][..m].iter().map(move |&x| {
                    // computed in E::Acc, rounded once; the ReLU selects on the rounded value
                    // (the same values as before rounding: rounding keeps the sign, and a
                    // positive value that rounds to +0 gives +0 either way)
                    let v = E::narrow(x.widen() * scale + shift);
                    // A select, not a branch around the store (see kernels.rs).
                    if !RELU || v.is_positive() {
                        v
                    } else {
                        E::POS_ZERO
                    }
                })
            })
        }
        let nr = (self.name(), self.relu);
        let out = match s {
            CpuStorage::F32(_) => go::<f32>(s, l, cs, cl, (c, m), nr)?,
            CpuStorage::F64(_) => go::<f64>(s, l, cs, cl, (c, m), nr)?,
            CpuStorage::BF16(_) => go::<half::bf16>(s, l, cs, cl, (c, m), nr)?,
            _ => return Err(bad_dtype(nr.0)),
        };
        Ok((out, l.shape().clone()))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
        cs: &candle_core::CudaStorage,
        cl: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        crate::ops::cuda::bn::affine_rows(self.name(), self.relu, (s, l), (cs, cl))
    }
}

/// Row `q` of a planar per-channel table `[Q, C]` as a column `[C, 1]` (a zero-copy view).
pub fn column(table: &Tensor, q: usize) -> Result<Tensor> {
    let c = table.dims().get(1).copied().unwrap_or(0);
    table
        .narrow(0, q, 1)
        .ctx("table row")?
        .reshape((c, 1))
        .ctx("table row")
}

/// Row `q` of a planar per-channel table `[Q, C]` as a vector `[C]` (a zero-copy view).
pub fn row(table: &Tensor, q: usize) -> Result<Tensor> {
    table.get(q).ctx("table row")
}

/// Planar `[Q, C]` from `Q` columns `[C, 1]` (for the oracles).
pub(crate) fn planar(cols: &[&Tensor]) -> Result<Tensor> {
    let rows = cols
        .iter()
        .map(|t| t.flatten_all().and_then(|t| t.unsqueeze(0)))
        .collect::<candle_core::Result<Vec<_>>>()
        .ctx("planar table")?;
    Tensor::cat(&rows, 0).ctx("planar table")
}

/// Per-row mean and biased variance of `x [C, M]`: planar `[2, C]` = (mean; var), summed in
/// f64; f32 for bf16 `x` (the CPU kernel; f32 and f64 `x` give their own dtype).
pub fn bn_stats(x: &Tensor) -> Result<Tensor> {
    if has_kernels(x) && x.is_contiguous() {
        x.apply_op1_no_bwd(&BnStatsOp).ctx("bn stats")
    } else {
        generic_bn_stats(x)
    }
}

/// [`bn_stats`] from candle ops (any device).
pub fn generic_bn_stats(x: &Tensor) -> Result<Tensor> {
    let m = x.dims()[1] as f64;
    let mean = (x.sum_keepdim(1).ctx("bn mean")? / m).ctx("bn mean")?;
    let xc = x.broadcast_sub(&mean).ctx("bn centre")?;
    let var = (xc.sqr().ctx("bn var")?.sum_keepdim(1).ctx("bn var")? / m).ctx("bn var")?;
    planar(&[&mean, &var])
}

/// BN forward's per-channel step, one op: from `mv [2, C]` = (mean; biased var) of a BN over
/// `m` values per channel, γ and β and the running stats (`[C]` each), returns the table
/// `[4, C]` = (mean; invstd; scale; shift) with `invstd = 1/√(var + eps)`, `scale = γ·invstd`,
/// `shift = β − mean·scale`, and PyTorch's running-stat update `[2, C]` =
/// (`(1−μ)·r_mean + μ·mean`; `(1−μ)·r_var + μ·var·m/(m−1)`). Both are views of one new `[6, C]`
/// tensor. Bitwise [`generic_bn_prepare`] (the candle ops it replaces, a dozen launches on a GPU).
pub fn bn_prepare(
    mv: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    m: usize,
) -> Result<(Tensor, Tensor)> {
    let operands = [mv, gamma, beta, running_mean, running_var];
    if operands.iter().all(|t| has_kernels(t) && t.is_contiguous()) {
        prepare_op(Measured::Before, operands, m)
    } else {
        generic_bn_prepare(mv, gamma, beta, running_mean, running_var, m)
    }
}

/// [`BnPrepareOp`] on `[first, γ, β, running mean, running var]` (`first` as `input` says) over
/// `m` values per channel: the table `[4, C]` and the running-stat update `[2, C]`, views of
/// its one `[6, C]` output.
fn prepare_op(input: Measured, operands: [&Tensor; 5], m: usize) -> Result<(Tensor, Tensor)> {
    let [first, gamma, beta, running_mean, running_var] = operands;
    let op = BnPrepareOp {
        running_mean: running_mean.clone(),
        running_var: running_var.clone(),
        scalars: PrepareScalars::new(m),
        input,
    };
    let what = op.name();
    let all = first.apply_op3_no_bwd(gamma, beta, &op).ctx(what)?;
    Ok((
        all.narrow(0, 0, 4).ctx(what)?,
        all.narrow(0, 4, 2).ctx(what)?,
    ))
}

/// [`bn_stats`] then [`bn_prepare`] over the `m` columns of `x [C, M]`, in one op (one launch
/// on a GPU, no `[2, C]` statistics between them): the table `[4, C]` and the running-stat
/// update `[2, C]`, views of one new `[6, C]`, bitwise the two ops'.
pub fn bn_stats_prepare(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let m = x.dims2().ctx("bn stats prepare")?.1;
    let operands = [x, gamma, beta, running_mean, running_var];
    if !operands.iter().all(|t| has_kernels(t) && t.is_contiguous()) {
        return bn_prepare(&bn_stats(x)?, gamma, beta, running_mean, running_var, m);
    }
    prepare_op(Measured::Here, operands, m)
}

/// [`bn_prepare`] from candle ops (any device), op for op what the layer maths computed before
/// the fused step: `invstd = recip(sqrt(var + eps))`, `scale = γ·invstd`, `shift = β −
/// mean·scale`, `r ← r·(1−μ) + s·μ` (running variance: `var·(μ·m/(m−1))`).
pub fn generic_bn_prepare(
    mv: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
    m: usize,
) -> Result<(Tensor, Tensor)> {
    // the scalars written out here, not taken from `PrepareScalars`: an independent oracle
    let (c, mf) = (mv.dims()[1], m as f64);
    let unbias = mf / (mf - 1.0);
    let (mean, var) = (column(mv, 0)?, column(mv, 1)?);
    let invstd = ((&var + BN_EPS)
        .ctx("bn eps")?
        .sqrt()
        .ctx("bn sqrt")?
        .recip())
    .ctx("bn invstd")?;
    let scale = gamma
        .reshape((c, 1))
        .ctx("bn scale")?
        .mul(&invstd)
        .ctx("bn scale")?;
    let shift = beta
        .reshape((c, 1))
        .ctx("bn shift")?
        .sub(&mean.mul(&scale).ctx("bn shift")?)
        .ctx("bn shift")?;
    let new_mean = ((running_mean.flatten_all().ctx("running mean")? * (1.0 - BN_MOMENTUM))
        .ctx("running mean")?
        + (mean.flatten_all().ctx("running mean")? * BN_MOMENTUM).ctx("running mean")?)
    .ctx("running mean")?;
    let new_var = ((running_var.flatten_all().ctx("running var")? * (1.0 - BN_MOMENTUM))
        .ctx("running var")?
        + (var.flatten_all().ctx("running var")? * (BN_MOMENTUM * unbias)).ctx("running var")?)
    .ctx("running var")?;
    Ok((
        planar(&[&mean, &invstd, &scale, &shift])?,
        planar(&[&new_mean, &new_var])?,
    ))
}

/// `x [C, M] · scale + shift` per row, `coef [2, C]` = (scale; shift): one new tensor. On the
/// CPU, bf16 `x` takes an f32 table and gives bf16, computed in f32 and rounded once.
pub fn affine_rows(x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    fused_affine_rows(x, coef, false).unwrap_or_else(|| generic_affine_rows(x, coef))
}

/// The fused kernel of [`affine_rows`] (`relu`: and of [`affine_rows_relu`]), or `None` where
/// there is none (another device, a strided operand) and the caller composes candle ops.
pub(crate) fn fused_affine_rows(x: &Tensor, coef: &Tensor, relu: bool) -> Option<Result<Tensor>> {
    // the kernels also read a column range of a wider map (rows of unit column stride: the
    // split front's column chunks, `layer::bn_relu_conv1_chunked`), on the CPU and on CUDA
    let layout_ok = x.is_contiguous() || unit_column_stride(x);
    if !(has_kernels(x) && layout_ok && coef.is_contiguous()) {
        return None;
    }
    let what = if relu { "bn apply relu" } else { "bn apply" };
    Some(x.apply_op2_no_bwd(coef, &AffineRowsOp { relu }).ctx(what))
}

/// `max(x [C, M] · scale + shift, 0)` (`coef [2, C]`), one new tensor: BN apply and ReLU in one
/// pass, bitwise [`affine_rows`] followed by an in-place ReLU (NaN → 0 like
/// [`crate::ops::elementwise::relu_inplace`]). Only for where the BN output before the ReLU is not
/// needed (an in-place ReLU would overwrite it anyway).
pub fn affine_rows_relu(x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    fused_affine_rows(x, coef, true).unwrap_or_else(|| generic_affine_rows_relu(x, coef))
}

/// [`affine_rows_relu`] from candle ops (any device).
pub fn generic_affine_rows_relu(x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    generic_affine_rows(x, coef)?.relu().ctx("bn apply relu")
}

/// [`affine_rows`] from candle ops (any device).
pub fn generic_affine_rows(x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    x.broadcast_mul(&column(coef, 0)?)
        .ctx("bn apply")?
        .broadcast_add(&column(coef, 1)?)
        .ctx("bn apply")
}

/// The elements of a planar coefficient table `[q, c]`, or an error naming the op: the kernels
/// index it from `c`, so a table of another size would be read out of bounds.
pub(crate) fn coef_rows<'a, T>(
    v: &'a [T],
    l: &Layout,
    q: usize,
    c: usize,
    op: &str,
) -> candle_core::Result<&'a [T]> {
    let t = slice(v, l, op)?;
    if t.len() != q * c {
        return Err(candle_core::Error::Msg(format!(
            "{op}: coefficient table has {} elements, expected [{q}, {c}]",
            t.len()
        )));
    }
    Ok(t)
}
