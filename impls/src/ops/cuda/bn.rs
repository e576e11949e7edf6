//! CUDA launchers of the fused BatchNorm kernels (`ops/cuda/bn.cu`): the `cuda_fwd` of every op
//! in [`crate::ops::bn`] and [`crate::ops::bn_backward`], so that on a GPU each fused op is one
//! kernel launch that allocates exactly what its CPU twin allocates (one output) or writes in
//! place. The shift kernels' launcher is [`crate::ops::cuda::shift`].
//!
//! Geometry (documented in the `.cu` files too): per-channel reductions run one block of
//! [`crate::ops::cuda::src::REDUCE_THREADS`] per channel with a fixed-shape tree (deterministic, no
//! atomics); row-wise and shift kernels run [`crate::ops::cuda::src::ELEMENTWISE_THREADS`] threads
//! over the columns of a row, the grid's y dimension over the rows.
//!
//! Operands must be contiguous (any start offset) and hold exactly the elements their shapes
//! say (BN apply's input may also be rows of unit column stride); anything else is an `Err`,
//! never an out-of-bounds read or a silent copy.
//! Features are f32, f64 or bf16 (`T`); per-channel tables, statistics and scalars are
//! `T::Acc` (f32 for bf16 features, as on the CPU). Only compiled with the `cuda` feature.

use crate::ops::cuda::launch::{
    by_dtype, contiguous_range, elementwise_config, expect_len, function, reduce_config,
    rows_config, unsupported, view, view_mut, Float,
};
use crate::ops::cuda::src::BN;
use crate::ops::layout::matrix::Mat;
use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::cuda_backend::{CudaStorage, WrapErr};
use candle_core::{DType, Layout, Shape};

/// `(rows, cols)` of a 2-D layout and its contiguous element range with exactly
/// `rows · cols` elements.
fn matrix(op: &str, what: &str, l: &Layout) -> candle_core::Result<(usize, usize, (usize, usize))> {
    let (rows, cols) = l.shape().dims2()?;
    let r = contiguous_range(l, op)?;
    expect_len(op, what, r, rows * cols)?;
    Ok((rows, cols, r))
}

/// The contiguous range of a planar per-channel coefficient table `[width, rows]`.
fn coefficients(
    op: &str,
    l: &Layout,
    rows: usize,
    width: usize,
) -> candle_core::Result<(usize, usize)> {
    let r = contiguous_range(l, op)?;
    expect_len(op, "the coefficient table", r, rows * width)?;
    Ok(r)
}

/// The contiguous ranges of a BN forward step's per-channel vectors γ, β, running mean and
/// running variance, `c` elements each.
fn per_channel(
    op: &str,
    c: usize,
    layouts: [&Layout; 4],
) -> candle_core::Result<[(usize, usize); 4]> {
    let names = ["gamma", "beta", "running mean", "running var"];
    let mut out = [(0, 0); 4];
    for ((r, l), what) in out.iter_mut().zip(layouts).zip(names) {
        *r = contiguous_range(l, op)?;
        expect_len(op, what, *r, c)?;
    }
    Ok(out)
}

/// Per-row `(mean; biased variance)` of `x [C, M]` → a new planar `[2, C]` (in `T::Acc`).
pub(crate) fn bn_stats(
    op: &str,
    s: &CudaStorage,
    l: &Layout,
) -> candle_core::Result<(CudaStorage, Shape)> {
    fn run<T: Float>(op: &str, s: &CudaStorage, l: &Layout) -> candle_core::Result<CudaStorage> {
        let (c, m, r) = matrix(op, "x", l)?;
        let dev = &s.device;
        // SAFETY: the kernel writes all 2·c elements (thread 0 of each of the c blocks, two
        // each) before anything reads them.
        let mut out = unsafe { dev.alloc::<T::Acc>(2 * c) }?;
        if c > 0 {
            let func = function::<T>(dev, &BN, "bn_stats")?;
            let x = view(op, s.as_cuda_slice::<T>()?, r)?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            b.arg(&x).arg(&mut out).arg(&c).arg(&m);
            // SAFETY: block c reads row c of x (c·m .. (c+1)·m, inside the c·m elements of the
            // view) and writes out[c], out[C + c]; grid = c blocks.
            unsafe { b.launch(reduce_config(op, c)?) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    let c = l.shape().dims2()?.0;
    Ok((by_dtype!(op, s, run(op, s, l))?, Shape::from((2, c))))
}

/// BN forward's per-channel step: operands `mv [2, C]`, γ, β, running mean, running var (`[C]`
/// each) → a new planar `[6, C]` = (mean; invstd; scale; shift; new running mean; new running
/// var), see `bn_prepare` in `bn.cu`; tables only, f32 or f64 (bf16 features have f32
/// statistics). With `here` (the op's `Measured::Here`) the first operand is the features
/// `x [C, M]` (f32, f64 or bf16), whose statistics the same launch measures
/// (`bn_stats_prepare`, one block per channel). `scalars` = `[eps, keep, mom, mom_unbias]` as
/// f64, rounded to the table type here (the CPU twin's `PrepareScalars`).
pub(crate) fn bn_prepare(
    op: &str,
    here: bool,
    operands: [(&CudaStorage, &Layout); 5],
    scalars: [f64; 4],
) -> candle_core::Result<(CudaStorage, Shape)> {
    fn run<T: Float>(
        op: &str,
        here: bool,
        [(ms, ml), (gs, gl), (bs, bl), (rms, rml), (rvs, rvl)]: [(&CudaStorage, &Layout); 5],
        scalars: [f64; 4],
    ) -> candle_core::Result<CudaStorage> {
        let (rows, cols, r0) = matrix(op, if here { "x" } else { "the statistics" }, ml)?;
        if !here && rows != 2 {
            return Err(crate::ops::cuda::launch::msg(format!(
                "{op} (cuda): statistics must be [2, C] (mean; var), got [{rows}, {cols}]"
            )));
        }
        let (c, m) = if here { (rows, cols) } else { (cols, 0) };
        let [rg, rb, rrm, rrv] = per_channel(op, c, [gl, bl, rml, rvl])?;
        let dev = &ms.device;
        // SAFETY: the kernel writes all 6·c elements (six per channel).
        let mut out = unsafe { dev.alloc::<T::Acc>(6 * c) }?;
        if c > 0 {
            let kernel = if here {
                "bn_stats_prepare"
            } else {
                "bn_prepare"
            };
            let func = function::<T>(dev, &BN, kernel)?;
            let first = view(op, ms.as_cuda_slice::<T>()?, r0)?;
            let g = view(op, gs.as_cuda_slice::<T::Acc>()?, rg)?;
            let b_ = view(op, bs.as_cuda_slice::<T::Acc>()?, rb)?;
            let rm = view(op, rms.as_cuda_slice::<T::Acc>()?, rrm)?;
            let rv = view(op, rvs.as_cuda_slice::<T::Acc>()?, rrv)?;
            // the output in two views: the table rows 0..4 and the running rows 4..6
            let (mut table, mut running) = out.split_at_mut(4 * c);
            let [eps, keep, mom, mom_unbias] =
                scalars.map(<T::Acc as candle_core::WithDType>::from_f64);
            let stream = dev.cuda_stream();
            let mut l = stream.launch_builder(&func);
            l.arg(&first)
                .arg(&g)
                .arg(&b_)
                .arg(&rm)
                .arg(&rv)
                .arg(&mut table)
                .arg(&mut running)
                .arg(&c);
            if here {
                l.arg(&m);
            }
            l.arg(&eps).arg(&keep).arg(&mom).arg(&mom_unbias);
            let config = if here {
                reduce_config(op, c)?
            } else {
                elementwise_config(c)
            };
            // SAFETY: the first operand holds 2·c (mv) or c·m (x, row c read by block c)
            // elements, γ, β and the running stats c each, table 4·c and running 2·c (disjoint
            // parts of out); channel c's thread writes only channel c of each.
            unsafe { l.launch(config) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    let (ms, ml) = operands[0];
    let (rows, cols) = ml.shape().dims2()?;
    let res = if here {
        by_dtype!(op, ms, run(op, here, operands, scalars))?
    } else {
        match ms.dtype() {
            DType::F32 => run::<f32>(op, here, operands, scalars),
            DType::F64 => run::<f64>(op, here, operands, scalars),
            other => Err(unsupported(op, other)),
        }?
    };
    let c = if here { rows } else { cols };
    Ok((res, Shape::from((6, c))))
}

/// `x [C, M] · scale + shift` per row (planar `coef [2, C]`), with `relu` also `max(·, 0)`: a
/// new contiguous `[C, M]`; `x` may be a column range of a wider map (rows of unit column
/// stride).
pub(crate) fn affine_rows(
    op: &str,
    relu: bool,
    (s, l): (&CudaStorage, &Layout),
    (cs, cl): (&CudaStorage, &Layout),
) -> candle_core::Result<(CudaStorage, Shape)> {
    fn run<T: Float>(
        op: &str,
        relu: bool,
        (s, l): (&CudaStorage, &Layout),
        (cs, cl): (&CudaStorage, &Layout),
    ) -> candle_core::Result<CudaStorage> {
        // x: rows of unit column stride (a whole map, or a column range of whole images of a
        // wider one: the split front's chunks, `layer::bn_relu_conv1_chunked`)
        let xv = Mat::rows_of(l, s.as_cuda_slice::<T>()?.len(), op, "x")?;
        let (c, m, r) = (xv.rows, xv.cols, xv.span());
        let ld_x = xv.rs;
        let rc = coefficients(op, cl, c, 2)?;
        let dev = &s.device;
        // SAFETY: every one of the c·m elements is written by the kernel below.
        let mut out = unsafe { dev.alloc::<T>(c * m) }?;
        if c * m > 0 {
            let kernel = if relu {
                "affine_rows_relu"
            } else {
                "affine_rows"
            };
            let func = function::<T>(dev, &BN, kernel)?;
            let x = view(op, s.as_cuda_slice::<T>()?, r)?;
            let coef = view(op, cs.as_cuda_slice::<T::Acc>()?, rc)?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            b.arg(&x)
                .arg(&ld_x)
                .arg(&coef)
                .arg(&mut out)
                .arg(&c)
                .arg(&m);
            // SAFETY: x's view spans its c rows of m elements at stride ld_x (Mat::rows_of
            // checked it against the storage), out holds c·m elements, coef 2·c; the kernel
            // touches no others.
            unsafe { b.launch(rows_config(c, m)) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    let res = by_dtype!(op, s, run(op, relu, (s, l), (cs, cl)))?;
    Ok((res, l.shape().clone()))
}

/// A planar `[2, C]` (scale; shift) a fused ReLU's mask reads, when there is one.
type Affine<'a> = Option<(&'a CudaStorage, &'a Layout)>;

/// [`Affine`]'s storage and its range, checked as a planar `[2, c]` table.
fn affine_range<'a>(
    op: &str,
    affine: Affine<'a>,
    c: usize,
) -> candle_core::Result<Option<(&'a CudaStorage, (usize, usize))>> {
    affine
        .map(|(s, l)| Ok((s, coefficients(op, l, c, 2)?)))
        .transpose()
}

/// A row kernel of `bn.cu` that reads a gradient `g [C, M]` (`g_name` in errors), BN's input
/// `x` (as many elements), a planar `[q, C]` table and, where `affine` is given, a planar
/// `[2, C]` one, and writes every element of a new `[C, M]`: `kernel(g, x, coef[, affine],
/// out, C, M)`. [`relu_bwd_affine`] and [`bn_bwd_dx`].
#[allow(clippy::too_many_arguments)]
fn gx_table_into_new(
    op: &str,
    kernel: &str,
    g_name: &str,
    q: usize,
    (gs, gl): (&CudaStorage, &Layout),
    (xs, xl): (&CudaStorage, &Layout),
    (cs, cl): (&CudaStorage, &Layout),
    affine: Affine,
) -> candle_core::Result<(CudaStorage, Shape)> {
    #[allow(clippy::too_many_arguments)]
    fn run<T: Float>(
        op: &str,
        kernel: &str,
        g_name: &str,
        q: usize,
        (gs, gl): (&CudaStorage, &Layout),
        (xs, xl): (&CudaStorage, &Layout),
        (cs, cl): (&CudaStorage, &Layout),
        affine: Affine,
    ) -> candle_core::Result<CudaStorage> {
        let (c, m, rg) = matrix(op, g_name, gl)?;
        let rx = contiguous_range(xl, op)?;
        expect_len(op, "x", rx, c * m)?;
        let rc = coefficients(op, cl, c, q)?;
        let ra = affine_range(op, affine, c)?;
        let dev = &gs.device;
        // SAFETY: every one of the c·m elements is written by the kernel below.
        let mut out = unsafe { dev.alloc::<T>(c * m) }?;
        if c * m > 0 {
            let func = function::<T>(dev, &BN, kernel)?;
            let g = view(op, gs.as_cuda_slice::<T>()?, rg)?;
            let x = view(op, xs.as_cuda_slice::<T>()?, rx)?;
            let coef = view(op, cs.as_cuda_slice::<T::Acc>()?, rc)?;
            let aff = ra
                .map(|(s, r)| view(op, s.as_cuda_slice::<T::Acc>()?, r))
                .transpose()?;
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            b.arg(&g).arg(&x).arg(&coef);
            if let Some(aff) = &aff {
                b.arg(aff);
            }
            b.arg(&mut out).arg(&c).arg(&m);
            // SAFETY: g, x and out hold c·m elements, coef q·c, aff 2·c; out is fresh.
            unsafe { b.launch(rows_config(c, m)) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    let res = by_dtype!(
        op,
        gs,
        run(op, kernel, g_name, q, (gs, gl), (xs, xl), (cs, cl), affine)
    )?;
    Ok((res, gl.shape().clone()))
}

/// `(x·scale + shift > 0) ? g : 0` per row (planar `coef [2, C]` = (scale; shift)) into a new
/// tensor: ReLU's backward from BN's input.
pub(crate) fn relu_bwd_affine(
    op: &str,
    g: (&CudaStorage, &Layout),
    x: (&CudaStorage, &Layout),
    coef: (&CudaStorage, &Layout),
) -> candle_core::Result<(CudaStorage, Shape)> {
    gx_table_into_new(op, "relu_bwd_affine", "the gradient", 2, g, x, coef, None)
}

/// [`relu_bwd_affine`] **over the gradient `(gs, gl)` in place**.
pub(crate) fn relu_bwd_affine_inplace(
    op: &str,
    (gs, gl): (&mut CudaStorage, &Layout),
    (xs, xl): (&CudaStorage, &Layout),
    (cs, cl): (&CudaStorage, &Layout),
) -> candle_core::Result<()> {
    fn run<T: Float>(
        op: &str,
        (gs, gl): (&mut CudaStorage, &Layout),
        (xs, xl): (&CudaStorage, &Layout),
        (cs, cl): (&CudaStorage, &Layout),
    ) -> candle_core::Result<()> {
        let (c, m, rg) = matrix(op, "the gradient", gl)?;
        let rx = contiguous_range(xl, op)?;
        expect_len(op, "x", rx, c * m)?;
        let rc = coefficients(op, cl, c, 2)?;
        if c * m == 0 {
            return Ok(());
        }
        let dev = gs.device.clone();
        let func = function::<T>(&dev, &BN, "relu_bwd_affine_inplace")?;
        let mut g = view_mut(op, gs.as_cuda_slice_mut::<T>()?, rg)?;
        let x = view(op, xs.as_cuda_slice::<T>()?, rx)?;
        let coef = view(op, cs.as_cuda_slice::<T::Acc>()?, rc)?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&mut g).arg(&x).arg(&coef).arg(&c).arg(&m);
        // SAFETY: the gradient's range holds c·m elements, x c·m, coef 2·c; each element of the
        // gradient is read, then written, by one thread; candle hands it as `&mut` and x, coef
        // as other storages.
        unsafe { b.launch(rows_config(c, m)) }.w()?;
        Ok(())
    }
    match gs.dtype() {
        DType::F32 => run::<f32>(op, (gs, gl), (xs, xl), (cs, cl)),
        DType::F64 => run::<f64>(op, (gs, gl), (xs, xl), (cs, cl)),
        DType::BF16 => run::<half::bf16>(op, (gs, gl), (xs, xl), (cs, cl)),
        other => Err(unsupported(op, other)),
    }
}

/// BN backward's reductions and coefficients per row → a new planar `[5, C]` = (Σ gy; Σ gy·x̂;
/// A; B; C) in `T::Acc`; `st [2, C]` holds `(mean; invstd)`, `gamma` is `[C]`, both `T::Acc`.
/// With `relu`, `gy` is the gradient of ReLU(BN(x)), masked in the kernel: `st` is BN's saved
/// table `[4, C]` = (mean; invstd; scale; shift).
pub(crate) fn bn_bwd_reduce(
    op: &str,
    relu: bool,
    (gs, gl): (&CudaStorage, &Layout),
    (xs, xl): (&CudaStorage, &Layout),
    (ss, sl): (&CudaStorage, &Layout),
    (gms, gml): (&CudaStorage, &Layout),
) -> candle_core::Result<(CudaStorage, Shape)> {
    fn run<T: Float>(
        op: &str,
        relu: bool,
        (gs, gl): (&CudaStorage, &Layout),
        (xs, xl): (&CudaStorage, &Layout),
        (ss, sl): (&CudaStorage, &Layout),
        (gms, gml): (&CudaStorage, &Layout),
    ) -> candle_core::Result<CudaStorage> {
        let (c, m, rg) = matrix(op, "gy", gl)?;
        let rx = contiguous_range(xl, op)?;
        expect_len(op, "x", rx, c * m)?;
        let rs = coefficients(op, sl, c, if relu { 4 } else { 2 })?;
        let rgm = coefficients(op, gml, c, 1)?;
        let dev = &gs.device;
        // SAFETY: thread 0 of each of the c blocks writes its row's five outputs.
        let mut out = unsafe { dev.alloc::<T::Acc>(5 * c) }?;
        if c > 0 {
            let kernel = if relu {
                "bn_bwd_reduce_relu"
            } else {
                "bn_bwd_reduce"
            };
            let func = function::<T>(dev, &BN, kernel)?;
            let g = view(op, gs.as_cuda_slice::<T>()?, rg)?;
            let x = view(op, xs.as_cuda_slice::<T>()?, rx)?;
            let st = view(op, ss.as_cuda_slice::<T::Acc>()?, rs)?;
            let gamma = view(op, gms.as_cuda_slice::<T::Acc>()?, rgm)?;
            // candle's scalar multiply and divide by m, in the table type: A(−1/m), A(1/m)
            let neg_inv_m = <T::Acc as candle_core::WithDType>::from_f64(-1.0 / m as f64);
            let inv_m = <T::Acc as candle_core::WithDType>::from_f64(1.0 / m as f64);
            let stream = dev.cuda_stream();
            let mut b = stream.launch_builder(&func);
            b.arg(&g)
                .arg(&x)
                .arg(&st)
                .arg(&gamma)
                .arg(&mut out)
                .arg(&c)
                .arg(&m)
                .arg(&neg_inv_m)
                .arg(&inv_m);
            // SAFETY: block c reads row c of gy and x (c·m elements each), st[q·C + c] for
            // q < 2 (4 with relu), gamma[c], and writes out[q·C + c] for q < 5.
            unsafe { b.launch(reduce_config(op, c)?) }.w()?;
        }
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
    let c = gl.shape().dims2()?.0;
    let res = by_dtype!(
        op,
        gs,
        run(op, relu, (gs, gl), (xs, xl), (ss, sl), (gms, gml))
    )?;
    Ok((res, Shape::from((5, c))))
}

/// `A·gy + B·x + C` per row (planar `coef [3, C]`) → a new `[C, M]`; with `affine` (planar
/// `[2, C]` (scale; shift)), `gy` masked by the ReLU after BN.
pub(crate) fn bn_bwd_dx(
    op: &str,
    gy: (&CudaStorage, &Layout),
    x: (&CudaStorage, &Layout),
    coef: (&CudaStorage, &Layout),
    affine: Affine,
) -> candle_core::Result<(CudaStorage, Shape)> {
    let kernel = if affine.is_some() {
        "bn_bwd_dx_relu"
    } else {
        "bn_bwd_dx"
    };
    gx_table_into_new(op, kernel, "gy", 3, gy, x, coef, affine)
}

/// `dst += A·gy + B·x + C` per row, **writing into `dst`'s storage** (a view of the gradient
/// buffer); planar `coef [3, C]`, with `affine` as [`bn_bwd_dx`]'s.
pub(crate) fn bn_bwd_dx_accumulate(
    op: &str,
    (ds, dl): (&mut CudaStorage, &Layout),
    (gs, gl): (&CudaStorage, &Layout),
    (xs, xl): (&CudaStorage, &Layout),
    (cs, cl): (&CudaStorage, &Layout),
    affine: Affine,
) -> candle_core::Result<()> {
    fn run<T: Float>(
        op: &str,
        (ds, dl): (&mut CudaStorage, &Layout),
        (gs, gl): (&CudaStorage, &Layout),
        (xs, xl): (&CudaStorage, &Layout),
        (cs, cl): (&CudaStorage, &Layout),
        affine: Affine,
    ) -> candle_core::Result<()> {
        let (c, m, rg) = matrix(op, "gy", gl)?;
        let rd = contiguous_range(dl, op)?;
        expect_len(op, "the destination", rd, c * m)?;
        let rx = contiguous_range(xl, op)?;
        expect_len(op, "x", rx, c * m)?;
        let rc = coefficients(op, cl, c, 3)?;
        let ra = affine_range(op, affine, c)?;
        if c * m == 0 {
            return Ok(());
        }
        let dev = ds.device.clone();
        let kernel = if ra.is_some() {
            "bn_bwd_dx_accumulate_relu"
        } else {
            "bn_bwd_dx_accumulate"
        };
        let func = function::<T>(&dev, &BN, kernel)?;
        let mut d = view_mut(op, ds.as_cuda_slice_mut::<T>()?, rd)?;
        let g = view(op, gs.as_cuda_slice::<T>()?, rg)?;
        let x = view(op, xs.as_cuda_slice::<T>()?, rx)?;
        let coef = view(op, cs.as_cuda_slice::<T::Acc>()?, rc)?;
        let aff = ra
            .map(|(s, r)| view(op, s.as_cuda_slice::<T::Acc>()?, r))
            .transpose()?;
        let stream = dev.cuda_stream();
        let mut b = stream.launch_builder(&func);
        b.arg(&mut d).arg(&g).arg(&x).arg(&coef);
        if let Some(aff) = &aff {
            b.arg(aff);
        }
        b.arg(&c).arg(&m);
        // SAFETY: d, gy and x hold c·m elements, coef 3·c, aff 2·c. candle hands dst as `&mut` and the
        // sources as distinct storages (it rejects aliasing for this op), and the coefficient
        // table is a tensor of its own, so no operand aliases the destination.
        unsafe { b.launch(rows_config(c, m)) }.w()?;
        Ok(())
    }
    match ds.dtype() {
        DType::F32 => run::<f32>(op, (ds, dl), (gs, gl), (xs, xl), (cs, cl), affine),
        DType::F64 => run::<f64>(op, (ds, dl), (gs, gl), (xs, xl), (cs, cl), affine),
        DType::BF16 => run::<half::bf16>(op, (ds, dl), (gs, gl), (xs, xl), (cs, cl), affine),
        other => Err(unsupported(op, other)),
    }
}
