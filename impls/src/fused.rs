//! Fused kernels for the two ops that dominate a bc layer: BatchNorm (statistics, apply with or
//! without ReLU, backward) and the 3×3 convolution's shifted views. Each makes one pass over its
//! input and allocates exactly its output (or writes in place into a buffer view) — no hidden
//! full-size temporaries, so memory is predictable and one model holds on every device.
//!
//! Every public function dispatches on the device: contiguous CPU tensors run the CPU kernels
//! below, contiguous CUDA tensors (`cuda` feature) the CUDA twins in `src/cuda/*.cu` through the
//! same candle custom ops (`cuda_fwd`, launched by `fused_cuda.rs`). The `generic_*` functions
//! compute the same maths from candle ops: they are the test oracles for both kernels, and the
//! fallback for strided operands and devices without kernels (the block's own calls are all
//! contiguous). Reductions accumulate in f64 whatever the dtype.

use crate::config::{BN_EPS, BN_MOMENTUM};
use crate::error::{CandleContext, Result};
use crate::matrix::Mat;
use crate::shared::{unfilled, Float};
use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, InplaceOp2, InplaceOp3, Layout, Shape, Tensor,
};
use rayon::prelude::*;

fn slice<'a, T>(v: &'a [T], l: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg(format!(
            "{op}: operand must be contiguous, got strides {:?}",
            l.stride()
        ))
    })?;
    Ok(&v[a..b])
}

/// The elements of `s` as `T` within layout `l`, or the op's dtype or layout error.
fn elems<'a, T: Float>(s: &'a CpuStorage, l: &Layout, op: &str) -> candle_core::Result<&'a [T]> {
    slice(T::slice(s).ok_or_else(|| bad_dtype(op))?, l, op)
}

/// A CPU operand of an op: its storage and its layout.
type Operand<'a> = (&'a CpuStorage, &'a Layout);

fn bad_dtype(op: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{op}: operands must all be f32 or all f64"))
}

/// A one-input kernel written once, generic over the float type (candle's `Map1` pattern):
/// [`map1`] does the dtype dispatch and the layout checks.
trait Kernel1 {
    const NAME: &'static str;
    fn run<T: Float + std::ops::Add<Output = T>>(
        &self,
        x: &[T],
        rows: usize,
        cols: usize,
    ) -> Vec<T>;
}

fn map1<K: Kernel1>(k: &K, s: &CpuStorage, l: &Layout) -> candle_core::Result<CpuStorage> {
    let (rows, cols) = l.shape().dims2()?;
    Ok(match s {
        CpuStorage::F32(v) => CpuStorage::F32(k.run(slice(v, l, K::NAME)?, rows, cols)),
        CpuStorage::F64(v) => CpuStorage::F64(k.run(slice(v, l, K::NAME)?, rows, cols)),
        _ => return Err(bad_dtype(K::NAME)),
    })
}

/// Per-row mean and biased variance of `x [C, M]` → planar `[2, C]` = (mean; var), two passes
/// in f64.
struct BnStatsOp;
impl Kernel1 for BnStatsOp {
    const NAME: &'static str = "bn-stats";
    fn run<T: Float>(&self, x: &[T], c: usize, m: usize) -> Vec<T> {
        // straight into the planar rows: the output is the op's only allocation (the memory
        // model counts one tensor per op, and a pool would hold nothing else)
        let mut out = vec![T::ZERO; 2 * c];
        let (means, vars) = out.split_at_mut(c);
        x.par_chunks(m)
            .zip(means.par_iter_mut().zip(vars.par_iter_mut()))
            .for_each(|(row, (mean_out, var_out))| {
                let mean = row.iter().map(|v| v.f64()).sum::<f64>() / m as f64;
                let var = row.iter().map(|v| (v.f64() - mean).powi(2)).sum::<f64>() / m as f64;
                (*mean_out, *var_out) = (T::of(mean), T::of(var));
            });
        out
    }
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
        crate::fused_cuda::bn_stats(Self::NAME, s, l)
    }
}

/// The scalars of BN forward's per-channel step, as f64 (each side rounds them to the tensors'
/// type, as candle does with a scalar operand): `eps`, the running stats' `keep = 1 − μ`,
/// `mom = μ` and `mom_unbias = μ·M/(M−1)` (PyTorch's unbiased running variance).
#[derive(Debug, Clone, Copy)]
struct PrepareScalars {
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
fn prepare_rows<T: Float>(
    mv: &[T],
    [gamma, beta, rmean, rvar]: [&[T]; 4],
    c: usize,
    k: PrepareScalars,
) -> Vec<T> {
    let (eps, keep, mom, mom_unbias) = (
        T::of(k.eps),
        T::of(k.keep),
        T::of(k.mom),
        T::of(k.mom_unbias),
    );
    let mut out = vec![T::ZERO; 6 * c];
    for ch in 0..c {
        let (mean, var) = (mv[ch], mv[c + ch]);
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
    out
}

/// The CPU elements of a tensor an op carries besides its operands (a lock guard on its storage
/// and its layout), or an error naming the op and where the tensor lives.
fn carried<'a>(
    op: &str,
    t: &'a Tensor,
) -> candle_core::Result<(
    impl std::ops::Deref<Target = candle_core::Storage> + 'a,
    &'a Layout,
)> {
    let (s, l) = t.storage_and_layout();
    if !matches!(&*s, candle_core::Storage::Cpu(_)) {
        return Err(candle_core::Error::Msg(format!(
            "{op}: operand on {:?}, the others on the CPU",
            t.device().location()
        )));
    }
    Ok((s, l))
}

/// The CPU storage behind a guard of [`carried`].
fn cpu_of(s: &candle_core::Storage) -> &CpuStorage {
    match s {
        candle_core::Storage::Cpu(c) => c,
        // `carried` checked the device
        _ => unreachable!("carried() returns CPU storages only"),
    }
}

/// The error for a carried tensor that is not on the CUDA device of the op's operands.
#[cfg(feature = "cuda")]
fn not_on_cuda(op: &str, what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("{op}: {what} not on the operands' CUDA device"))
}

/// BN forward's per-channel step ([`prepare_rows`]): operands `mv [2, C]`, γ and β (`[C]`); the
/// op carries the running mean and variance (a custom op takes at most three operands).
struct BnPrepareOp {
    running_mean: Tensor,
    running_var: Tensor,
    scalars: PrepareScalars,
}
impl CustomOp3 for BnPrepareOp {
    fn name(&self) -> &'static str {
        "bn-prepare"
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
        let (two, c) = ml.shape().dims2()?;
        if two != 2 {
            return Err(candle_core::Error::Msg(format!(
                "{n}: statistics must be [2, C] (mean; var), got [{two}, {c}]"
            )));
        }
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
        // One dtype for all five; `elems` checks each operand holds it.
        fn go<T: Float>(
            n: &str,
            ops: [Operand; 5],
            c: usize,
            k: PrepareScalars,
        ) -> candle_core::Result<Vec<T>> {
            let [mv, g, b, rm, rv] = ops.map(|(s, l)| elems::<T>(s, l, n));
            Ok(prepare_rows(mv?, [g?, b?, rm?, rv?], c, k))
        }
        let ops = [
            (ms, ml),
            (gs, gl),
            (bs, bl),
            (cpu_of(&rms), rml),
            (cpu_of(&rvs), rvl),
        ];
        let out = match ms {
            CpuStorage::F32(_) => CpuStorage::F32(go(n, ops, c, self.scalars)?),
            CpuStorage::F64(_) => CpuStorage::F64(go(n, ops, c, self.scalars)?),
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
        let (rms, rml) = self.running_mean.storage_and_layout();
        let (rvs, rvl) = self.running_var.storage_and_layout();
        let (candle_core::Storage::Cuda(rms), candle_core::Storage::Cuda(rvs)) = (&*rms, &*rvs)
        else {
            return Err(not_on_cuda(n, "running stats"));
        };
        let k = self.scalars;
        crate::fused_cuda::bn_prepare(
            n,
            [(ms, ml), (gs, gl), (bs, bl), (rms, rml), (rvs, rvl)],
            [k.eps, k.keep, k.mom, k.mom_unbias],
        )
    }
}

/// `y = x·scale + shift` per row, with planar `coef [2, C] = (scale; shift)`; with `relu`, also
/// `y = y > 0 ? y : 0` (NaN → 0, as [`crate::kernels::relu_inplace`]) in the same pass.
struct AffineRowsOp {
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
        // x: rows of unit column stride (a whole map, or a column range of a wider one)
        fn go<T: Float>(x: &[T], xv: Mat, coef: &[T], c: usize, m: usize, relu: bool) -> Vec<T> {
            if relu {
                rows::<T, true>(x, xv, coef, c, m)
            } else {
                rows::<T, false>(x, xv, coef, c, m)
            }
        }
        // one loop per mode, its branch resolved at compile time
        fn rows<T: Float, const RELU: bool>(
            x: &[T],
            xv: Mat,
            coef: &[T],
            c: usize,
            m: usize,
        ) -> Vec<T> {
            let (scales, shifts) = coef.split_at(c);
            crate::kernels::new_rows(c, m, |r| {
                let (scale, shift) = (scales[r], shifts[r]);
                x[xv.off + r * xv.rs..][..m].iter().map(move |&x| {
                    let v = x * scale + shift;
                    // A select, not a branch around the store (see kernels.rs).
                    if !RELU || v > T::ZERO {
                        v
                    } else {
                        T::ZERO
                    }
                })
            })
        }
        let (n, relu) = (self.name(), self.relu);
        let out = match (s, cs) {
            (CpuStorage::F32(v), CpuStorage::F32(k)) => {
                let xv = Mat::rows_of(l, v.len(), n, "input")?;
                CpuStorage::F32(go(v, xv, coef_rows(k, cl, 2, c, n)?, c, m, relu))
            }
            (CpuStorage::F64(v), CpuStorage::F64(k)) => {
                let xv = Mat::rows_of(l, v.len(), n, "input")?;
                CpuStorage::F64(go(v, xv, coef_rows(k, cl, 2, c, n)?, c, m, relu))
            }
            _ => return Err(bad_dtype(n)),
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
        crate::fused_cuda::affine_rows(self.name(), self.relu, (s, l), (cs, cl))
    }
}

/// `g = (x·scale + shift > 0) ? g : 0` per row, in place, `coef` planar `(scale; shift)` of
/// `c` rows of `m`: the mask of a ReLU after BN apply, from BN's input. `v = x·scale + shift`
/// is [`AffineRowsOp`]'s value, so the mask is the one the ReLU's output gives, bit for bit.
fn relu_mask_rows<T: Float>(g: &mut [T], x: &[T], coef: &[T], c: usize, m: usize) {
    if c * m == 0 {
        return;
    }
    let (scales, shifts) = coef.split_at(c);
    g.par_chunks_mut(m)
        .zip(x.par_chunks(m))
        .zip(scales.par_iter().zip(shifts))
        .for_each(|((g, x), (&scale, &shift))| {
            for (g, x) in g.iter_mut().zip(x) {
                let v = *x * scale + shift;
                *g = if v > T::ZERO { *g } else { T::ZERO };
            }
        });
}

/// ReLU backward from BN's input (see [`relu_bwd_affine`]) into a new tensor.
struct ReluBwdAffineOp;
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
        fn go<T: Float>(
            n: &str,
            [g, x, coef]: [Operand; 3],
            c: usize,
            m: usize,
        ) -> candle_core::Result<Vec<T>> {
            let (g, x) = gy_and_x::<T>(n, g, x)?;
            let coef = table::<T>(coef.0, coef.1, 2, c, n)?;
            // the crate's parallel vector copy, then the mask in place: 32 ms for [204, 65536]
            // f32 on one thread, where writing the masked values into a new vector took 65–70
            // (and made a BC-100 L=16 `cat-store-copy` step 1.4× slower)
            let mut out = crate::kernels::concat_slices(&[g]);
            relu_mask_rows(&mut out, x, coef, c, m);
            Ok(out)
        }
        let n = self.name();
        let ops = [(gs, gl), (xs, xl), (cs, cl)];
        let out = match gs {
            CpuStorage::F32(_) => CpuStorage::F32(go(n, ops, c, m)?),
            CpuStorage::F64(_) => CpuStorage::F64(go(n, ops, c, m)?),
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
        crate::fused_cuda::relu_bwd_affine(self.name(), (gs, gl), (xs, xl), (cs, cl))
    }
}

/// ReLU backward from BN's input (see [`relu_bwd_affine_inplace`]), over the gradient.
struct ReluBwdAffineInplaceOp;
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
        fn go<T: Float>(
            n: &str,
            g: &mut [T],
            [x, coef]: [Operand; 2],
            c: usize,
            m: usize,
        ) -> candle_core::Result<()> {
            let x = elems::<T>(x.0, x.1, n)?;
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
            CpuStorage::F32(g) => go(n, &mut g[ga..gb], ops, c, m),
            CpuStorage::F64(g) => go(n, &mut g[ga..gb], ops, c, m),
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
        crate::fused_cuda::relu_bwd_affine_inplace(self.name(), (gs, gl), (xs, xl), (cs, cl))
    }
}

/// The elements of a planar coefficient table `[q, c]`, or an error naming the op: the kernels
/// index it from `c`, so a table of another size would be read out of bounds.
fn coef_rows<'a, T>(
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

/// [`coef_rows`] of a storage as `T`, or the op's dtype error.
fn table<'a, T: Float>(
    s: &'a CpuStorage,
    l: &Layout,
    q: usize,
    c: usize,
    op: &str,
) -> candle_core::Result<&'a [T]> {
    coef_rows(T::slice(s).ok_or_else(|| bad_dtype(op))?, l, q, c, op)
}

/// The gradient and input operands of a BN backward op as `T`: as many elements each, or an
/// error (the kernels walk them row by row together).
fn gy_and_x<'a, T: Float>(
    op: &str,
    (gs, gl): Operand<'a>,
    (xs, xl): Operand<'a>,
) -> candle_core::Result<(&'a [T], &'a [T])> {
    let (g, x) = (elems::<T>(gs, gl, op)?, elems::<T>(xs, xl, op)?);
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
fn bwd_coef<T: Float>(
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
/// (Σ gy = dβ; Σ gy·x̂ = dγ; A; B; C) with `x̂ = (x − mean)·invstd`, the sums in f64.
struct BnBwdReduceOp {
    gamma: Tensor,
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
        fn go<T: Float>(
            n: &str,
            [g, x, st, gamma]: [Operand; 4],
            c: usize,
            m: usize,
        ) -> candle_core::Result<Vec<T>> {
            let (g, x) = gy_and_x::<T>(n, g, x)?;
            let st = table::<T>(st.0, st.1, 2, c, n)?;
            let gamma = table::<T>(gamma.0, gamma.1, 1, c, n)?;
            let (means, invstds) = st.split_at(c);
            let per_m = [T::of(-1.0 / m as f64), T::of(1.0 / m as f64)];
            // straight into the five planar rows: the output is the op's only allocation
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
                .zip(outs.into_par_iter())
                .for_each(|(((g, x), ((&mean, &invstd), &gamma)), row)| {
                    let (mean64, invstd64) = (mean.f64(), invstd.f64());
                    let (mut sg, mut sgx) = (0f64, 0f64);
                    for (g, x) in g.iter().zip(x) {
                        let g = g.f64();
                        sg += g;
                        sgx += g * (x.f64() - mean64) * invstd64;
                    }
                    let (sg, sgx) = (T::of(sg), T::of(sgx));
                    let [a, b, cc] = bwd_coef([sg, sgx], [mean, invstd, gamma], per_m);
                    (*row.0, *row.1, *row.2, *row.3, *row.4) = (sg, sgx, a, b, cc);
                });
            Ok(out)
        }
        let ops = [(gs, gl), (xs, xl), (ss, sl), (cpu_of(&gms), gml)];
        let out = match gs {
            CpuStorage::F32(_) => CpuStorage::F32(go(n, ops, c, m)?),
            CpuStorage::F64(_) => CpuStorage::F64(go(n, ops, c, m)?),
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
        crate::fused_cuda::bn_bwd_reduce(n, (gs, gl), (xs, xl), (ss, sl), (gms, gml))
    }
}

/// `A·gy + B·x + C` of one element, in f64, rounded to `T` once.
fn dx_value<T: Float>(a: f64, b: f64, cc: f64, g: T, x: T) -> T {
    T::of(a * g.f64() + b * x.f64() + cc)
}

/// `dx = A·gy + B·x + C` per row with planar `coef [3, C] = (A; B; C)`, evaluated in f64.
struct BnBwdDxOp;
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
        fn go<T: Float>(
            n: &str,
            [g, x, coef]: [Operand; 3],
            c: usize,
            m: usize,
        ) -> candle_core::Result<Vec<T>> {
            let (g, x) = gy_and_x::<T>(n, g, x)?;
            let coef = table::<T>(coef.0, coef.1, 3, c, n)?;
            Ok(crate::kernels::new_rows(c, m, |r| {
                let (a, b, cc) = (coef[r].f64(), coef[c + r].f64(), coef[2 * c + r].f64());
                let (g, x) = (&g[r * m..][..m], &x[r * m..][..m]);
                g.iter()
                    .zip(x)
                    .map(move |(&g, &x)| dx_value(a, b, cc, g, x))
            }))
        }
        let n = self.name();
        let ops = [(gs, gl), (xs, xl), (cs, cl)];
        let out = match gs {
            CpuStorage::F32(_) => CpuStorage::F32(go(n, ops, c, m)?),
            CpuStorage::F64(_) => CpuStorage::F64(go(n, ops, c, m)?),
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
        crate::fused_cuda::bn_bwd_dx(self.name(), (gs, gl), (xs, xl), (cs, cl))
    }
}

/// `dst += T(A·gy + B·x + C)` per row, **in place**: the same rounding as [`BnBwdDxOp`]
/// followed by an add, so results are bitwise those of the two-step path.
struct BnBwdDxAccumulateOp {
    /// `(A; B; C)`, planar `[3, C]` in the operands' dtype and on their device. An in-place op
    /// takes at most two tensor operands besides the destination, so the op carries the third
    /// and reads its storage itself (a tensor of its own: it cannot alias the destination).
    coef: Tensor,
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
        fn go<T: Float>(
            n: &str,
            d: &mut [T],
            [g, x, coef]: [Operand; 3],
            c: usize,
            m: usize,
        ) -> candle_core::Result<()> {
            let (g, x) = gy_and_x::<T>(n, g, x)?;
            let coef = table::<T>(coef.0, coef.1, 3, c, n)?;
            if d.len() != g.len() {
                return Err(candle_core::Error::Msg(format!(
                    "{n}: the destination has {} elements, the gradient {}",
                    d.len(),
                    g.len()
                )));
            }
            d.par_chunks_mut(m)
                .zip(g.par_chunks(m).zip(x.par_chunks(m)))
                .enumerate()
                .for_each(|(r, (d, (g, x)))| {
                    let (a, b, cc) = (coef[r].f64(), coef[c + r].f64(), coef[2 * c + r].f64());
                    for ((d, g), x) in d.iter_mut().zip(g).zip(x) {
                        *d = *d + dx_value(a, b, cc, *g, *x);
                    }
                });
            Ok(())
        }
        let n = self.name();
        let (da, db) = dl.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{n}: destination must be contiguous"))
        })?;
        let (cs, cl) = carried(n, &self.coef)?;
        let ops = [(gs, gl), (xs, xl), (cpu_of(&cs), cl)];
        match ds {
            CpuStorage::F32(d) => go(n, &mut d[da..db], ops, c, m),
            CpuStorage::F64(d) => go(n, &mut d[da..db], ops, c, m),
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
        let (cs, cl) = self.coef.storage_and_layout();
        let candle_core::Storage::Cuda(cs) = &*cs else {
            return Err(not_on_cuda(n, "coefficients"));
        };
        crate::fused_cuda::bn_bwd_dx_accumulate(n, (ds, dl), (gs, gl), (xs, xl), (cs, cl))
    }
}

/// The nine (dy, dx) ∈ {0,1,2}² taps of a 3×3 kernel, in PyTorch weight order (j = 3·dy + dx).
pub const TAPS: [(usize, usize); 9] = [
    (0, 0),
    (0, 1),
    (0, 2),
    (1, 0),
    (1, 1),
    (1, 2),
    (2, 0),
    (2, 1),
    (2, 2),
];

pub use crate::grid::Grid;

/// Copies image plane `src` shifted by (oy, ox) into `dst` (zero where the source is outside):
/// `dst[y, x] = src[y + oy, x + ox]`; with `ADD`, adds instead of writing.
fn shift_plane<T: Float + std::ops::Add<Output = T>, const ADD: bool>(
    dst: &mut [T],
    src: &[T],
    g: Grid,
    oy: isize,
    ox: isize,
) {
    let (h, w) = (g.h as isize, g.w as isize);
    for y in 0..h {
        let sy = y + oy;
        let drow = &mut dst[(y * w) as usize..((y + 1) * w) as usize];
        if sy < 0 || sy >= h {
            if !ADD {
                drow.fill(T::ZERO);
            }
            continue;
        }
        let srow = &src[(sy * w) as usize..((sy + 1) * w) as usize];
        // Columns x0..x1 have their source x + ox inside the row (none when |ox| >= w).
        let x0 = (-ox).clamp(0, w);
        let x1 = (w - ox).clamp(x0, w);
        if !ADD {
            drow[..x0 as usize].fill(T::ZERO);
            drow[x1 as usize..].fill(T::ZERO);
        }
        for x in x0..x1 {
            let v = srow[(x + ox) as usize];
            let d = &mut drow[x as usize];
            *d = if ADD { *d + v } else { v };
        }
    }
}

pub use crate::grid::Shift;

/// `dst = stack(src)` or `dst = sum(src)` (see [`Shift`]), **written into `dst`'s storage**:
/// both operands are rows of unit column stride (a whole map or a range of whole images of a
/// wider one, [`Mat::rows_of`]); every element of `dst`'s view is written, nothing else.
struct ShiftIntoOp {
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

    fn run<T: Float + std::ops::Add<Output = T>>(
        &self,
        d: &mut [T],
        dv: Mat,
        s: &[T],
        sv: Mat,
    ) -> candle_core::Result<()> {
        let (c, m) = self.dims((dv.rows, dv.cols), (sv.rows, sv.cols))?;
        if dv.rows == 0 || m == 0 {
            return Ok(());
        }
        let plane = self.grid.h * self.grid.w;
        let src_row = |r: usize| &s[sv.off + r * sv.rs..][..m];
        let (start, end) = dv.span();
        // Row r of dst is the first m elements of the r-th chunk of rs elements from its start.
        let rows = d[start..end].par_chunks_mut(dv.rs);
        match self.kind {
            Shift::Stack => rows.enumerate().for_each(|(row, dst)| {
                let (j, ch) = (row / c, row % c);
                let (oy, ox) = self.offsets[j];
                for (d, s) in dst[..m].chunks_mut(plane).zip(src_row(ch).chunks(plane)) {
                    shift_plane::<T, false>(d, s, self.grid, oy, ox);
                }
            }),
            Shift::Sum => rows.enumerate().for_each(|(ch, dst)| {
                let dst = &mut dst[..m];
                dst.fill(T::ZERO);
                for (j, &(oy, ox)) in self.offsets.iter().enumerate() {
                    for (d, s) in dst.chunks_mut(plane).zip(src_row(j * c + ch).chunks(plane)) {
                        shift_plane::<T, true>(d, s, self.grid, oy, ox);
                    }
                }
            }),
        }
        Ok(())
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
        fn go<T: Float + std::ops::Add<Output = T>>(
            op: &ShiftIntoOp,
            d: &mut [T],
            dl: &Layout,
            s: &CpuStorage,
            sl: &Layout,
        ) -> candle_core::Result<()> {
            let n = op.name();
            let s = T::slice(s).ok_or_else(|| bad_dtype(n))?;
            let dv = Mat::rows_of(dl, d.len(), n, "the destination")?;
            let sv = Mat::rows_of(sl, s.len(), n, "the source")?;
            op.run(d, dv, s, sv)
        }
        match d {
            CpuStorage::F32(d) => go(self, d, dl, s, sl),
            CpuStorage::F64(d) => go(self, d, dl, s, sl),
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
        crate::fused_cuda::shift_into(
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

/// Whether `t` lives where the fused kernels run: the CPU, or a CUDA device with the `cuda`
/// feature (without it no CUDA tensor can exist). Others take the `generic_*` path.
fn has_kernels(t: &Tensor) -> bool {
    t.device().is_cpu() || (cfg!(feature = "cuda") && t.device().is_cuda())
}

/// Whether `t` is 2-D rows of unit column stride ([`Mat::rows_of`]'s test: a contiguous map
/// or a column range of a wider one; its storage bounds are checked when the kernel runs).
fn unit_column_stride(t: &Tensor) -> bool {
    Mat::rows_of(t.layout(), usize::MAX, "", "").is_ok()
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
fn planar(cols: &[&Tensor]) -> Result<Tensor> {
    let rows = cols
        .iter()
        .map(|t| t.flatten_all().and_then(|t| t.unsqueeze(0)))
        .collect::<candle_core::Result<Vec<_>>>()
        .ctx("planar table")?;
    Tensor::cat(&rows, 0).ctx("planar table")
}

/// Per-row mean and biased variance of `x [C, M]`: planar `[2, C]` = (mean; var).
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
        let op = BnPrepareOp {
            running_mean: running_mean.clone(),
            running_var: running_var.clone(),
            scalars: PrepareScalars::new(m),
        };
        let all = mv.apply_op3_no_bwd(gamma, beta, &op).ctx("bn prepare")?;
        Ok((
            all.narrow(0, 0, 4).ctx("bn prepare")?,
            all.narrow(0, 4, 2).ctx("bn prepare")?,
        ))
    } else {
        generic_bn_prepare(mv, gamma, beta, running_mean, running_var, m)
    }
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

/// `x [C, M] · scale + shift` per row, `coef [2, C]` = (scale; shift): one new tensor.
pub fn affine_rows(x: &Tensor, coef: &Tensor) -> Result<Tensor> {
    fused_affine_rows(x, coef, false).unwrap_or_else(|| generic_affine_rows(x, coef))
}

/// The fused kernel of [`affine_rows`] (`relu`: and of [`affine_rows_relu`]), or `None` where
/// there is none (another device, a strided operand) and the caller composes candle ops.
fn fused_affine_rows(x: &Tensor, coef: &Tensor, relu: bool) -> Option<Result<Tensor>> {
    // the CPU kernel also reads a column range of a wider map (rows of unit column stride: the
    // recomputed front's column chunks, `maths::bn_relu_conv1_chunked`); the CUDA twin takes
    // contiguous maps only
    let layout_ok = x.is_contiguous() || (x.device().is_cpu() && unit_column_stride(x));
    if !(has_kernels(x) && layout_ok && coef.is_contiguous()) {
        return None;
    }
    let what = if relu { "bn apply relu" } else { "bn apply" };
    Some(x.apply_op2_no_bwd(coef, &AffineRowsOp { relu }).ctx(what))
}

/// `max(x [C, M] · scale + shift, 0)` (`coef [2, C]`), one new tensor: BN apply and ReLU in one
/// pass, bitwise [`affine_rows`] followed by an in-place ReLU (NaN → 0 like
/// [`crate::kernels::relu_inplace`]). Only for where the BN output before the ReLU is not
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

/// The gradient through a ReLU that follows BN apply, masked from BN's **input**:
/// `(x·scale + shift > 0) ? g : 0` per row (`coef [2, C]` = (scale; shift), the table
/// [`affine_rows`] applied), into a new tensor. Bitwise `relu_bwd(g, affine_rows_relu(x, coef))`
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
/// (like [`crate::kernels::relu_bwd_inplace`]).
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
    let operands = [gy, x, st, gamma];
    if operands.iter().all(|t| has_kernels(t) && t.is_contiguous()) {
        gy.apply_op3_no_bwd(
            x,
            st,
            &BnBwdReduceOp {
                gamma: gamma.clone(),
            },
        )
        .ctx("bn bwd reduce")
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
    if has_kernels(x) && x.is_contiguous() && gy.is_contiguous() && coef.is_contiguous() {
        gy.apply_op3_no_bwd(x, coef, &BnBwdDxOp).ctx("bn bwd dx")
    } else {
        generic_bn_bwd_dx(gy, x, coef)
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
    let operands = [dst, gy, x, coef];
    if operands.iter().all(|t| has_kernels(t) && t.is_contiguous()) {
        dst.inplace_op3(gy, x, &BnBwdDxAccumulateOp { coef: coef.clone() })
            .ctx("bn bwd dx accumulate")
    } else {
        let dx = generic_bn_bwd_dx(gy, x, coef)?;
        crate::kernels::add_assign(dst, &dx)
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
/// order), **in place**, as [`shift_stack_into`].
pub fn shift_sum_into(
    dst: &Tensor,
    p: &Tensor,
    grid: Grid,
    offsets: [(isize, isize); 9],
) -> Result<()> {
    shift_into(Shift::Sum, dst, p, grid, offsets).ctx("shift sum")
}

fn shift_into(
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
fn generic_shift(t: &Tensor, grid: Grid, (oy, ox): (isize, isize)) -> Result<Tensor> {
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
    acc.ok_or_else(|| crate::Error::Unsupported {
        device: "any".to_string(),
        what: "shift sum of zero taps".to_string(),
    })
}
