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

use crate::error::{CandleContext, Result};
use crate::shared::Float;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, InplaceOp3, Layout, Shape, Tensor};
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

/// Per-row mean and biased variance of `x [C, M]` → `[C, 2]`, two passes in f64.
struct BnStatsOp;
impl Kernel1 for BnStatsOp {
    const NAME: &'static str = "bn-stats";
    fn run<T: Float>(&self, x: &[T], _rows: usize, m: usize) -> Vec<T> {
        x.par_chunks(m)
            .flat_map_iter(|row| {
                let mean = row.iter().map(|v| v.f64()).sum::<f64>() / m as f64;
                let var = row.iter().map(|v| (v.f64() - mean).powi(2)).sum::<f64>() / m as f64;
                [T::of(mean), T::of(var)]
            })
            .collect()
    }
}
impl CustomOp1 for BnStatsOp {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let c = l.shape().dims2()?.0;
        Ok((map1(self, s, l)?, Shape::from((c, 2))))
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

/// `y = x·scale + shift` per row, with `coef [C, 2] = (scale, shift)`; with `relu`, also
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
        let (_, m) = l.shape().dims2()?;
        fn go<T: Float + std::ops::Mul<Output = T> + std::ops::Add<Output = T>>(
            x: &[T],
            coef: &[T],
            m: usize,
            relu: bool,
        ) -> Vec<T> {
            let mut out = vec![T::ZERO; x.len()];
            out.par_chunks_mut(m)
                .zip(x.par_chunks(m))
                .zip(coef.par_chunks(2))
                .for_each(|((o, x), c)| {
                    if relu {
                        // A select, not a branch around the store (see kernels.rs).
                        for (o, x) in o.iter_mut().zip(x) {
                            let v = *x * c[0] + c[1];
                            *o = if v > T::ZERO { v } else { T::ZERO };
                        }
                    } else {
                        for (o, x) in o.iter_mut().zip(x) {
                            *o = *x * c[0] + c[1];
                        }
                    }
                });
            out
        }
        let (n, relu) = (self.name(), self.relu);
        let out = match (s, cs) {
            (CpuStorage::F32(v), CpuStorage::F32(c)) => {
                CpuStorage::F32(go(slice(v, l, n)?, slice(c, cl, n)?, m, relu))
            }
            (CpuStorage::F64(v), CpuStorage::F64(c)) => {
                CpuStorage::F64(go(slice(v, l, n)?, slice(c, cl, n)?, m, relu))
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

/// BN backward reductions: `[C, 2] = (Σ gy, Σ gy·x̂)` with `x̂ = (x − mean)·invstd`,
/// `stats [C, 2] = (mean, invstd)`; f64 accumulators.
struct BnBwdReduceOp;
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
        let (c, m) = gl.shape().dims2()?;
        fn go<T: Float>(g: &[T], x: &[T], st: &[T], m: usize) -> Vec<T> {
            g.par_chunks(m)
                .zip(x.par_chunks(m))
                .zip(st.par_chunks(2))
                .flat_map_iter(|((g, x), st)| {
                    let (mean, invstd) = (st[0].f64(), st[1].f64());
                    let (mut sg, mut sgx) = (0f64, 0f64);
                    for (g, x) in g.iter().zip(x) {
                        let g = g.f64();
                        sg += g;
                        sgx += g * (x.f64() - mean) * invstd;
                    }
                    [T::of(sg), T::of(sgx)]
                })
                .collect()
        }
        let n = self.name();
        let out = match (gs, xs, ss) {
            (CpuStorage::F32(g), CpuStorage::F32(x), CpuStorage::F32(s)) => {
                CpuStorage::F32(go(slice(g, gl, n)?, slice(x, xl, n)?, slice(s, sl, n)?, m))
            }
            (CpuStorage::F64(g), CpuStorage::F64(x), CpuStorage::F64(s)) => {
                CpuStorage::F64(go(slice(g, gl, n)?, slice(x, xl, n)?, slice(s, sl, n)?, m))
            }
            _ => return Err(bad_dtype(n)),
        };
        Ok((out, Shape::from((c, 2))))
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
        crate::fused_cuda::bn_bwd_reduce(self.name(), (gs, gl), (xs, xl), (ss, sl))
    }
}

/// `dx = A·gy + B·x + C` per row with `coef [C, 3] = (A, B, C)`, evaluated in f64.
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
        let (_, m) = gl.shape().dims2()?;
        fn go<T: Float>(g: &[T], x: &[T], coef: &[T], m: usize) -> Vec<T> {
            let mut out = vec![T::ZERO; g.len()];
            out.par_chunks_mut(m)
                .zip(g.par_chunks(m).zip(x.par_chunks(m)))
                .zip(coef.par_chunks(3))
                .for_each(|((o, (g, x)), c)| {
                    let (a, b, cc) = (c[0].f64(), c[1].f64(), c[2].f64());
                    for ((o, g), x) in o.iter_mut().zip(g).zip(x) {
                        *o = T::of(a * g.f64() + b * x.f64() + cc);
                    }
                });
            out
        }
        let n = self.name();
        let out = match (gs, xs, cs) {
            (CpuStorage::F32(g), CpuStorage::F32(x), CpuStorage::F32(c)) => {
                CpuStorage::F32(go(slice(g, gl, n)?, slice(x, xl, n)?, slice(c, cl, n)?, m))
            }
            (CpuStorage::F64(g), CpuStorage::F64(x), CpuStorage::F64(c)) => {
                CpuStorage::F64(go(slice(g, gl, n)?, slice(x, xl, n)?, slice(c, cl, n)?, m))
            }
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
    /// `(A, B, C)` per row, `[C, 3]` in the operands' dtype and on their device. An in-place op
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
        let (_, m) = gl.shape().dims2()?;
        fn go<T: Float + std::ops::Add<Output = T>>(
            d: &mut [T],
            g: &[T],
            x: &[T],
            coef: &[T],
            m: usize,
        ) {
            d.par_chunks_mut(m)
                .zip(g.par_chunks(m).zip(x.par_chunks(m)))
                .zip(coef.par_chunks(3))
                .for_each(|((d, (g, x)), c)| {
                    let (a, b, c) = (c[0].f64(), c[1].f64(), c[2].f64());
                    for ((d, g), x) in d.iter_mut().zip(g).zip(x) {
                        *d = *d + T::of(a * g.f64() + b * x.f64() + c);
                    }
                });
        }
        let n = self.name();
        let (da, db) = dl.contiguous_offsets().ok_or_else(|| {
            candle_core::Error::Msg(format!("{n}: destination must be contiguous"))
        })?;
        let (cs, cl) = self.coef.storage_and_layout();
        let candle_core::Storage::Cpu(cs) = &*cs else {
            return Err(candle_core::Error::Msg(format!(
                "{n}: coefficients on {:?}, destination on the CPU",
                self.coef.device().location()
            )));
        };
        match (ds, gs, xs, cs) {
            (CpuStorage::F32(d), CpuStorage::F32(g), CpuStorage::F32(x), CpuStorage::F32(c)) => go(
                &mut d[da..db],
                slice(g, gl, n)?,
                slice(x, xl, n)?,
                slice(c, cl, n)?,
                m,
            ),
            (CpuStorage::F64(d), CpuStorage::F64(g), CpuStorage::F64(x), CpuStorage::F64(c)) => go(
                &mut d[da..db],
                slice(g, gl, n)?,
                slice(x, xl, n)?,
                slice(c, cl, n)?,
                m,
            ),
            _ => return Err(bad_dtype(n)),
        }
        Ok(())
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
            return Err(candle_core::Error::Msg(format!(
                "{n}: coefficients on {:?}, destination on a CUDA device",
                self.coef.device().location()
            )));
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
        let x0 = (-ox).max(0);
        let x1 = (w - ox).min(w);
        if !ADD {
            drow[..x0.max(0) as usize].fill(T::ZERO);
            drow[x1.max(x0) as usize..].fill(T::ZERO);
        }
        for x in x0..x1 {
            let v = srow[(x + ox) as usize];
            let d = &mut drow[x as usize];
            *d = if ADD { *d + v } else { v };
        }
    }
}

/// `out [9C, M]`: block j is `t` shifted by `offsets[j]` (zero padded).
struct ShiftStackOp {
    grid: Grid,
    offsets: [(isize, isize); 9],
}
impl Kernel1 for ShiftStackOp {
    const NAME: &'static str = "shift-stack";
    fn run<T: Float + std::ops::Add<Output = T>>(&self, t: &[T], c: usize, m: usize) -> Vec<T> {
        let plane = self.grid.h * self.grid.w;
        let mut out = vec![T::ZERO; 9 * c * m];
        out.par_chunks_mut(m).enumerate().for_each(|(row, dst)| {
            let (j, ch) = (row / c, row % c);
            let (oy, ox) = self.offsets[j];
            let src = &t[ch * m..(ch + 1) * m];
            for (d, s) in dst.chunks_mut(plane).zip(src.chunks(plane)) {
                shift_plane::<T, false>(d, s, self.grid, oy, ox);
            }
        });
        out
    }
}
impl CustomOp1 for ShiftStackOp {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (c, m) = l.shape().dims2()?;
        Ok((map1(self, s, l)?, Shape::from((9 * c, m))))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use crate::fused_cuda::{shift, Shift};
        shift(Self::NAME, Shift::Stack, (s, l), self.grid, &self.offsets)
    }
}

/// `out [C, M] = Σ_j shift(p[jC..(j+1)C], offsets[j])`, j in order 0..9.
struct ShiftSumOp {
    grid: Grid,
    offsets: [(isize, isize); 9],
}
impl Kernel1 for ShiftSumOp {
    const NAME: &'static str = "shift-sum";
    fn run<T: Float + std::ops::Add<Output = T>>(&self, p: &[T], c9: usize, m: usize) -> Vec<T> {
        let (c, plane) = (c9 / 9, self.grid.h * self.grid.w);
        let mut out = vec![T::ZERO; c * m];
        out.par_chunks_mut(m).enumerate().for_each(|(ch, dst)| {
            for (j, &(oy, ox)) in self.offsets.iter().enumerate() {
                let src = &p[(j * c + ch) * m..(j * c + ch + 1) * m];
                for (d, s) in dst.chunks_mut(plane).zip(src.chunks(plane)) {
                    shift_plane::<T, true>(d, s, self.grid, oy, ox);
                }
            }
        });
        out
    }
}
impl CustomOp1 for ShiftSumOp {
    fn name(&self) -> &'static str {
        Self::NAME
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (c9, m) = l.shape().dims2()?;
        Ok((map1(self, s, l)?, Shape::from((c9 / 9, m))))
    }
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use crate::fused_cuda::{shift, Shift};
        shift(Self::NAME, Shift::Sum, (s, l), self.grid, &self.offsets)
    }
}

/// Whether `t` lives where the fused kernels run: the CPU, or a CUDA device with the `cuda`
/// feature (without it no CUDA tensor can exist). Others take the `generic_*` path.
fn has_kernels(t: &Tensor) -> bool {
    t.device().is_cpu() || (cfg!(feature = "cuda") && t.device().is_cuda())
}

/// Per-row (mean, biased variance) of `x [C, M]`, each `[C, 1]`.
pub fn bn_stats(x: &Tensor) -> Result<(Tensor, Tensor)> {
    if has_kernels(x) && x.is_contiguous() {
        let mv = x.apply_op1_no_bwd(&BnStatsOp).ctx("bn stats")?;
        Ok((
            mv.narrow(1, 0, 1).ctx("bn mean")?,
            mv.narrow(1, 1, 1).ctx("bn var")?,
        ))
    } else {
        generic_bn_stats(x)
    }
}

/// [`bn_stats`] from candle ops (any device).
pub fn generic_bn_stats(x: &Tensor) -> Result<(Tensor, Tensor)> {
    let m = x.dims()[1] as f64;
    let mean = (x.sum_keepdim(1).ctx("bn mean")? / m).ctx("bn mean")?;
    let xc = x.broadcast_sub(&mean).ctx("bn centre")?;
    let var = (xc.sqr().ctx("bn var")?.sum_keepdim(1).ctx("bn var")? / m).ctx("bn var")?;
    Ok((mean, var))
}

/// `x [C, M] · scale [C, 1] + shift [C, 1]`, one new tensor.
pub fn affine_rows(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    fused_affine_rows(x, scale, shift, false)
        .unwrap_or_else(|| generic_affine_rows(x, scale, shift))
}

/// The fused kernel of [`affine_rows`] (`relu`: and of [`affine_rows_relu`]), or `None` where
/// there is none (another device, a strided `x`) and the caller composes candle ops.
fn fused_affine_rows(
    x: &Tensor,
    scale: &Tensor,
    shift: &Tensor,
    relu: bool,
) -> Option<Result<Tensor>> {
    if !(has_kernels(x) && x.is_contiguous()) {
        return None;
    }
    let what = if relu { "bn apply relu" } else { "bn apply" };
    Some(
        Tensor::cat(&[scale, shift], 1)
            .ctx("bn coef")
            .and_then(|coef| x.apply_op2_no_bwd(&coef, &AffineRowsOp { relu }).ctx(what)),
    )
}

/// `max(x [C, M] · scale [C, 1] + shift [C, 1], 0)`, one new tensor: BN apply and ReLU in one
/// pass, bitwise [`affine_rows`] followed by an in-place ReLU (NaN → 0 like
/// [`crate::kernels::relu_inplace`]). Only for where the BN output before the ReLU is not
/// needed (an in-place ReLU would overwrite it anyway).
pub fn affine_rows_relu(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    fused_affine_rows(x, scale, shift, true)
        .unwrap_or_else(|| generic_affine_rows_relu(x, scale, shift))
}

/// [`affine_rows_relu`] from candle ops (any device).
pub fn generic_affine_rows_relu(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    generic_affine_rows(x, scale, shift)?
        .relu()
        .ctx("bn apply relu")
}

pub fn generic_affine_rows(x: &Tensor, scale: &Tensor, shift: &Tensor) -> Result<Tensor> {
    x.broadcast_mul(scale)
        .ctx("bn apply")?
        .broadcast_add(shift)
        .ctx("bn apply")
}

/// BN backward reductions `(Σ gy, Σ gy·x̂)`, each `[C, 1]`.
pub fn bn_bwd_reduce(
    gy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
) -> Result<(Tensor, Tensor)> {
    if has_kernels(x) && x.is_contiguous() && gy.is_contiguous() {
        let st = Tensor::cat(&[mean, invstd], 1).ctx("bn bwd stats")?;
        let r = gy
            .apply_op3_no_bwd(x, &st, &BnBwdReduceOp)
            .ctx("bn bwd reduce")?;
        Ok((
            r.narrow(1, 0, 1).ctx("bn bwd")?,
            r.narrow(1, 1, 1).ctx("bn bwd")?,
        ))
    } else {
        generic_bn_bwd_reduce(gy, x, mean, invstd)
    }
}

pub fn generic_bn_bwd_reduce(
    gy: &Tensor,
    x: &Tensor,
    mean: &Tensor,
    invstd: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let xhat = x
        .broadcast_sub(mean)
        .ctx("bn bwd x̂")?
        .broadcast_mul(invstd)
        .ctx("bn bwd x̂")?;
    let sg = gy.sum_keepdim(1).ctx("bn bwd Σgy")?;
    let sgx = gy
        .mul(&xhat)
        .ctx("bn bwd")?
        .sum_keepdim(1)
        .ctx("bn bwd Σgy·x̂")?;
    Ok((sg, sgx))
}

/// `A·gy + B·x + C` per row (`a`, `b`, `c` each `[C, 1]`), one new tensor.
pub fn bn_bwd_dx(gy: &Tensor, x: &Tensor, a: &Tensor, b: &Tensor, c: &Tensor) -> Result<Tensor> {
    if has_kernels(x) && x.is_contiguous() && gy.is_contiguous() {
        let coef = Tensor::cat(&[a, b, c], 1).ctx("bn bwd coef")?;
        gy.apply_op3_no_bwd(x, &coef, &BnBwdDxOp).ctx("bn bwd dx")
    } else {
        generic_bn_bwd_dx(gy, x, a, b, c)
    }
}

pub fn generic_bn_bwd_dx(
    gy: &Tensor,
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
) -> Result<Tensor> {
    let t = gy.broadcast_mul(a).ctx("bn bwd dx")?;
    let u = x.broadcast_mul(b).ctx("bn bwd dx")?;
    (t + u).ctx("bn bwd dx")?.broadcast_add(c).ctx("bn bwd dx")
}

/// `dst += A·gy + B·x + C` per row, **writing into `dst`** (a view of the gradient buffer):
/// [`bn_bwd_dx`] and an in-place add in one pass, with no `[C, M]` temporary. Bitwise the same
/// as the two-step path.
pub fn bn_bwd_dx_accumulate(
    dst: &Tensor,
    gy: &Tensor,
    x: &Tensor,
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
) -> Result<()> {
    if has_kernels(x) && x.is_contiguous() && gy.is_contiguous() && dst.is_contiguous() {
        let coef = Tensor::cat(&[a, b, c], 1).ctx("bn bwd coef")?;
        dst.inplace_op3(gy, x, &BnBwdDxAccumulateOp { coef })
            .ctx("bn bwd dx accumulate")
    } else {
        let dx = generic_bn_bwd_dx(gy, x, a, b, c)?;
        crate::kernels::add_assign(dst, &dx)
    }
}

/// `[9C, M]`: block j holds `t [C, M]` shifted by `offsets[j]`: `out_j[c, n, y, x] =
/// t[c, n, y + oy_j, x + ox_j]`, zero outside the image.
pub fn shift_stack(t: &Tensor, grid: Grid, offsets: [(isize, isize); 9]) -> Result<Tensor> {
    if has_kernels(t) && t.is_contiguous() {
        t.apply_op1_no_bwd(&ShiftStackOp { grid, offsets })
            .ctx("shift stack")
    } else {
        generic_shift_stack(t, grid, offsets)
    }
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

/// `[C, M] = Σ_j shift(p_j, offsets[j])` where `p [9C, M]` stacks the nine `p_j`.
pub fn shift_sum(p: &Tensor, grid: Grid, offsets: [(isize, isize); 9]) -> Result<Tensor> {
    if has_kernels(p) && p.is_contiguous() {
        p.apply_op1_no_bwd(&ShiftSumOp { grid, offsets })
            .ctx("shift sum")
    } else {
        generic_shift_sum(p, grid, offsets)
    }
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
