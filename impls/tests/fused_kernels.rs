//! The fused CPU kernels against the same maths composed from candle ops (the path other
//! devices take), in f64 on odd shapes so every border of the shifted views is exercised; and
//! the copies `kernels` makes being new tensors on the CPU's kernels and the GPU's path alike.

use candle_core::{DType, Device, Tensor};
use impls::ops::elementwise;
use impls::ops::layout::grid::{Grid, TAPS};
use impls::ops::{bn, bn_backward, shift};

/// f64 results of two summation orders of the same sums of O(1) terms: ~1e-15 apart.
const TOL: f64 = 1e-12;

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let d = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(d <= TOL, "{what}: max |fused − generic| = {d:e}");
}

fn rand(shape: (usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1;
    Tensor::from_vec(
        impls::config::params::uniform(seed, "t", n, -2.0, 2.0),
        shape,
        &Device::Cpu,
    )
    .unwrap()
}

/// Every element's bits (as f64, exact for f32), for bit-for-bit comparisons.
fn bits(t: &Tensor) -> Vec<u64> {
    impls::ops::cpu::shared::tensor_bits(t).unwrap()
}

fn assert_bitwise(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let (a, b) = (bits(a), bits(b));
    let diff = a.iter().zip(&b).position(|(x, y)| x != y);
    assert!(
        diff.is_none(),
        "{what}: element {} differs: {:e} vs {:e}",
        diff.unwrap_or(0),
        f64::from_bits(a[diff.unwrap_or(0)]),
        f64::from_bits(b[diff.unwrap_or(0)])
    );
}

#[test]
fn fused_kernels_match_generic_candle_ops() {
    let (c, grid) = (5, Grid { n: 2, h: 3, w: 4 });
    let m = grid.n * grid.h * grid.w;
    let x = rand((c, m), 1);
    let gy = rand((c, m), 2);
    let mv = bn::bn_stats(&x).unwrap();
    assert_eq!(mv.dims(), [2, c], "statistics are planar (mean; var)");
    close(&mv, &bn::generic_bn_stats(&x).unwrap(), "bn mean and var");
    let coef = rand((2, c), 3);
    close(
        &bn::affine_rows(&x, &coef).unwrap(),
        &bn::generic_affine_rows(&x, &coef).unwrap(),
        "bn apply",
    );
    let invstd = (bn::row(&mv, 1).unwrap() + 1e-5)
        .unwrap()
        .sqrt()
        .unwrap()
        .recip()
        .unwrap();
    let st = Tensor::stack(&[bn::row(&mv, 0).unwrap(), invstd], 0).unwrap();
    let gamma = rand((1, c), 10).flatten_all().unwrap();
    let r1 = bn_backward::bn_bwd_reduce(&gy, &x, &st, &gamma).unwrap();
    let r2 = bn_backward::generic_bn_bwd_reduce(&gy, &x, &st, &gamma).unwrap();
    assert_eq!(r1.dims(), [5, c], "(Σgy; Σgy·x̂; A; B; C)");
    close(&r1, &r2, "bn backward sums and coefficients");
    let coef3 = rand((3, c), 5);
    close(
        &bn_backward::bn_bwd_dx(&gy, &x, &coef3).unwrap(),
        &bn_backward::generic_bn_bwd_dx(&gy, &x, &coef3).unwrap(),
        "bn dx",
    );
    // In-place accumulation: dst + (A·gy + B·x + C), against the two-step path bit for bit.
    let dst = rand((c, m), 9);
    let expected = (&dst + bn_backward::bn_bwd_dx(&gy, &x, &coef3).unwrap()).unwrap();
    bn_backward::bn_bwd_dx_accumulate(&dst, &gy, &x, &coef3).unwrap();
    assert_bitwise(&dst, &expected, "fused accumulate against dx then add");
    for sign in [1isize, -1] {
        let offsets = TAPS.map(|(dy, dx)| (sign * (dy as isize - 1), sign * (dx as isize - 1)));
        close(
            &shift::shift_stack(&x, grid, offsets).unwrap(),
            &shift::generic_shift_stack(&x, grid, offsets).unwrap(),
            "shift stack",
        );
        let p = rand((9 * c, m), 8);
        close(
            &shift::shift_sum(&p, grid, offsets).unwrap(),
            &shift::generic_shift_sum(&p, grid, offsets).unwrap(),
            "shift sum",
        );
    }
    // A hand-checked value: shifting by (+1, 0) moves row y+1 up to row y and zeroes the last.
    let t = Tensor::arange(0f64, 12.0, &Device::Cpu)
        .unwrap()
        .reshape((1, 12))
        .unwrap();
    let g = Grid { n: 1, h: 3, w: 4 };
    let mut offs = [(0isize, 0isize); 9];
    offs[0] = (1, 0);
    let s = shift::shift_stack(&t, g, offs)
        .unwrap()
        .narrow(0, 0, 1)
        .unwrap();
    let v = s.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    assert_eq!(v, [4., 5., 6., 7., 8., 9., 10., 11., 0., 0., 0., 0.]);
}

/// The fused BN apply + ReLU (what `inplace` strategies run) is bitwise BN apply followed by the
/// in-place ReLU kernel, including NaN → 0, and matches the candle-op oracle.
#[test]
fn fused_affine_relu_is_affine_then_inplace_relu_bitwise() {
    let x = rand((4, 37), 21);
    // Channel 1 has a NaN scale: every value of it is NaN before the ReLU, 0 after.
    let scale = Tensor::new(&[1.0f64, f64::NAN, -0.5, 0.0], &Device::Cpu).unwrap();
    let shift = rand((1, 4), 22).flatten_all().unwrap();
    let coef = Tensor::stack(&[&scale, &shift], 0).unwrap();
    let fused_out = bn::affine_rows_relu(&x, &coef).unwrap();
    let two_step =
        impls::ops::elementwise::relu_inplace(bn::affine_rows(&x, &coef).unwrap()).unwrap();
    assert_bitwise(
        &fused_out,
        &two_step,
        "fused apply+relu against apply then relu",
    );
    let row1 = fused_out.narrow(0, 1, 1).unwrap().flatten_all().unwrap();
    assert!(row1.to_vec1::<f64>().unwrap().iter().all(|v| *v == 0.0));
    // Rows without NaN against the candle-op oracle (relu of the composed affine).
    for r in [0usize, 2, 3] {
        close(
            &fused_out.narrow(0, r, 1).unwrap(),
            &bn::generic_affine_rows_relu(
                &x.narrow(0, r, 1).unwrap(),
                &coef.narrow(1, r, 1).unwrap().contiguous().unwrap(),
            )
            .unwrap(),
            "bn apply relu",
        );
    }
    // Half the outputs of a random affine are clipped: the ReLU ran.
    let zeros = fused_out
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
        .iter()
        .filter(|v| **v == 0.0)
        .count();
    assert!(zeros > 37 + 10, "only {zeros} zeros");
}

#[test]
fn bn_apply_reads_a_column_range_of_a_wider_map() {
    // The CPU's split front applies BN1 to column chunks of the layer input: row-strided
    // views, read in place (no copy), with the values of the whole map's columns.
    let x = rand((5, 41), 31);
    let coef = rand((2, 5), 32);
    for (c0, n) in [(0, 13), (13, 20), (33, 8), (40, 1)] {
        let view = x.narrow(1, c0, n).unwrap();
        assert!(!view.is_contiguous());
        let copy = view.contiguous().unwrap();
        for relu in [false, true] {
            let (a, b) = if relu {
                (
                    bn::affine_rows_relu(&view, &coef).unwrap(),
                    bn::affine_rows_relu(&copy, &coef).unwrap(),
                )
            } else {
                (
                    bn::affine_rows(&view, &coef).unwrap(),
                    bn::affine_rows(&copy, &coef).unwrap(),
                )
            };
            assert!(a.is_contiguous());
            assert_bitwise(&a, &b, "bn apply of a column range");
            let whole = bn::affine_rows(&x, &coef).unwrap();
            if !relu {
                assert_bitwise(
                    &a,
                    &whole.narrow(1, c0, n).unwrap(),
                    "its columns of the whole",
                );
            }
        }
    }
}

/// Per-channel inputs of BN's forward step with the awkward values it must survive: variance
/// zero, a variance of -0, tiny and huge values, γ = 0, β negative.
fn per_channel(dtype: DType) -> [Tensor; 5] {
    let c = 7;
    let mean = Tensor::new(&[0.5f64, -3.25, 0.0, 1e-30, -1e6, 2.0, 7.0], &Device::Cpu).unwrap();
    let var = Tensor::new(
        &[1.0f64, 0.0, -0.0, 1e-12, 4e12, 0.3, 123.456],
        &Device::Cpu,
    )
    .unwrap();
    let mv = Tensor::stack(&[mean, var], 0).unwrap();
    let gamma = Tensor::new(&[1.0f64, 0.0, -2.5, 3.0, 0.1, 1e-3, 0.7], &Device::Cpu).unwrap();
    let beta = Tensor::new(&[0.0f64, -1.0, 0.25, 5.0, -0.0, 2.0, -7.5], &Device::Cpu).unwrap();
    let rm = rand((1, c), 31).flatten_all().unwrap();
    let rv = (rand((1, c), 32).flatten_all().unwrap().abs().unwrap() + 0.5).unwrap();
    [mv, gamma, beta, rm, rv].map(|t| t.to_dtype(dtype).unwrap())
}

/// BN forward's per-channel step as one fused op (one launch on a GPU instead of a dozen) gives
/// bit for bit what the candle ops it replaced computed — invstd, scale, shift and the running
/// stats — in f32 and f64, so every step result is unchanged by the fusion.
#[test]
fn bn_prepare_is_bitwise_the_candle_ops_it_replaces() {
    for dtype in [DType::F32, DType::F64] {
        for m in [2usize, 24, 65536] {
            let [mv, gamma, beta, rm, rv] = per_channel(dtype);
            let (table, running) = bn::bn_prepare(&mv, &gamma, &beta, &rm, &rv, m).unwrap();
            let (t2, r2) = bn::generic_bn_prepare(&mv, &gamma, &beta, &rm, &rv, m).unwrap();
            assert_eq!(table.dims(), [4, 7], "(mean; invstd; scale; shift)");
            assert_eq!(running.dims(), [2, 7], "(running mean; running var)");
            assert_bitwise(&table, &t2, &format!("bn prepare table {dtype:?} m={m}"));
            assert_bitwise(
                &running,
                &r2,
                &format!("bn prepare running {dtype:?} m={m}"),
            );
        }
    }
    // A value worked by hand: var = 3 - eps ⇒ invstd = 1/√3; γ = 2, β = 1, mean = 0.5 ⇒
    // scale = 2/√3, shift = 1 − 1/√3; running (0, 1), M = 4 ⇒ (0.05, 0.9 + 0.1·(3 − eps)·4/3).
    let mv = Tensor::new(&[[0.5f64], [3.0 - 1e-5]], &Device::Cpu).unwrap();
    let one = |v: f64| Tensor::new(&[v], &Device::Cpu).unwrap();
    let (t, r) = bn::bn_prepare(&mv, &one(2.0), &one(1.0), &one(0.0), &one(1.0), 4).unwrap();
    let t = t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let r = r.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    let s3 = 3f64.sqrt();
    for (got, want) in t.iter().zip([0.5, 1.0 / s3, 2.0 / s3, 1.0 - 1.0 / s3]) {
        assert!((got - want).abs() < 1e-12, "table {t:?}");
    }
    assert!((r[0] - 0.05).abs() < 1e-15, "running mean {r:?}");
    let want_var = 0.9 + 0.1 * (3.0 - 1e-5) * 4.0 / 3.0;
    assert!((r[1] - want_var).abs() < 1e-12, "running var {r:?}");
}

/// BN backward's coefficients computed at the end of the fused reduction are bit for bit what
/// the candle ops they replaced compute from the same sums (f32 and f64), and the sums are the
/// reduction's own (rows 0 and 1 unchanged by the fusion).
#[test]
fn bn_bwd_coefficients_are_bitwise_the_candle_ops_they_replace() {
    for dtype in [DType::F32, DType::F64] {
        let (c, m) = (7, 150);
        let x = rand((c, m), 41).to_dtype(dtype).unwrap();
        let gy = rand((c, m), 42).to_dtype(dtype).unwrap();
        let [mv, gamma, beta, rm, rv] = per_channel(dtype);
        let (table, _) = bn::bn_prepare(&mv, &gamma, &beta, &rm, &rv, m).unwrap();
        let st = table.narrow(0, 0, 2).unwrap();
        let r = bn_backward::bn_bwd_reduce(&gy, &x, &st, &gamma).unwrap();
        let (sg, sgx) = (bn::column(&r, 0).unwrap(), bn::column(&r, 1).unwrap());
        let want = bn_backward::generic_bn_bwd_coef(&sg, &sgx, &st, &gamma, m).unwrap();
        for (q, (w, name)) in want.iter().zip(["A", "B", "C"]).enumerate() {
            assert_bitwise(
                &bn::column(&r, 2 + q).unwrap(),
                w,
                &format!("bn bwd {name} {dtype:?}"),
            );
        }
        // the sums: f64 accumulation against the candle-op sums in the dtype, relative to the
        // largest sum (invstd reaches 1/√eps ≈ 316 on the zero-variance channels)
        let g = bn_backward::generic_bn_bwd_reduce(&gy, &x, &st, &gamma).unwrap();
        let max_abs = |t: Tensor| {
            t.abs()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        let sums = r.narrow(0, 0, 2).unwrap();
        let d = max_abs((&sums - g.narrow(0, 0, 2).unwrap()).unwrap()) / max_abs(sums).max(1.0);
        // f32: sums of 150 terms rounded in f32 by candle (≈ 150 · 2⁻²⁴); f64: orders only
        let tol = if dtype == DType::F32 { 1e-5 } else { TOL };
        assert!(d <= tol, "bn bwd sums {dtype:?}: relative {d:e}");
    }
}

/// A coefficient table of the wrong size is an error naming the table, never an out-of-bounds
/// read.
#[test]
fn short_coefficient_tables_are_refused() {
    let x = rand((3, 10), 51);
    let e = bn::affine_rows(&x, &rand((2, 2), 52))
        .unwrap_err()
        .to_string();
    assert!(e.contains("coefficient table"), "{e}");
    let e = bn_backward::bn_bwd_dx(&x, &x, &rand((2, 3), 53))
        .unwrap_err()
        .to_string();
    assert!(e.contains("coefficient table"), "{e}");
}

/// Operands of different sizes are an error naming both, never a partial result: the CPU
/// kernels walk the gradient, the input and the destination row by row together.
#[test]
fn bn_backward_kernels_refuse_operands_of_different_sizes() {
    let (c, m) = (3, 40);
    let g = rand((c, m), 31);
    let short = rand((c, m - 1), 32);
    let coef = rand((3, c), 33);
    let e = bn_backward::bn_bwd_dx(&g, &short, &coef).expect_err("a short input accepted");
    assert!(format!("{e:#}").contains("elements"), "{e:#}");
    let e = bn_backward::bn_bwd_dx_accumulate(&short.copy().unwrap(), &g, &g, &coef)
        .expect_err("a short destination accepted");
    assert!(format!("{e:#}").contains("destination has"), "{e:#}");
    let st = rand((2, c), 34);
    let gamma = rand((1, c), 35).flatten_all().unwrap();
    let e =
        bn_backward::bn_bwd_reduce(&g, &short, &st, &gamma).expect_err("a short input accepted");
    assert!(format!("{e:#}").contains("elements"), "{e:#}");
}

/// ReLU1's backward masked from BN1's input and table (`relu_bwd_affine`, new and in place) is
/// bit for bit the ReLU backward masked from the ReLU's output, whether that output came from
/// the fused BN → ReLU (`inplace` strategies) or BN apply then a ReLU copy (`copy`), on values
/// where the mask is delicate: `x·scale + shift` exactly 0, ±0, tiny, ±∞, NaN (a NaN scale
/// masks its whole row), and NaN gradients (passed where the mask is open); and the candle-op
/// oracle agrees.
#[test]
fn relu_backward_from_the_bn_input_is_the_backward_from_the_relu_output() {
    use impls::ops::elementwise;
    let (c, m) = (5, 301);
    let mut x: Vec<f64> = impls::config::params::uniform(40, "x", c * m, -2.0, 2.0);
    let mut g: Vec<f64> = impls::config::params::uniform(41, "g", c * m, -2.0, 2.0);
    for (i, v) in [
        f64::NAN,
        0.0,
        -0.0,
        1e-300,
        -1e-300,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ]
    .into_iter()
    .enumerate()
    {
        x[i * 3] = v;
        g[i * 5 + 1] = f64::NAN;
    }
    // channel 1: scale 0.5, shift −0.5, x = 1 → v = 0 exactly (closed), x = 1 + 2⁻⁵² → open
    x[m] = 1.0;
    x[m + 1] = 1.0 + f64::EPSILON;
    let scale = [1.5, 0.5, -0.75, f64::NAN, 0.0];
    let shift = [0.1, -0.5, 0.0, 0.2, -0.0];
    let coef: Vec<f64> = scale.iter().chain(&shift).copied().collect();
    for dtype in [DType::F32, DType::F64] {
        let t = |v: &[f64], shape: (usize, usize)| {
            Tensor::from_vec(v.to_vec(), shape, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let (x, g, coef) = (t(&x, (c, m)), t(&g, (c, m)), t(&coef, (2, c)));
        let fused_out = bn::affine_rows_relu(&x, &coef).unwrap();
        let copied_out = elementwise::relu(&bn::affine_rows(&x, &coef).unwrap()).unwrap();
        let want = elementwise::relu_bwd(&g, &fused_out).unwrap();
        let what = |s: &str| format!("{dtype:?}: {s}");
        assert_bitwise(
            &elementwise::relu_bwd(&g, &copied_out).unwrap(),
            &want,
            &what("masks of the two ReLU outputs"),
        );
        assert_bitwise(
            &bn_backward::relu_bwd_affine(&g, &x, &coef).unwrap(),
            &want,
            &what("relu_bwd_affine"),
        );
        let inplace = g.copy().unwrap();
        let back = bn_backward::relu_bwd_affine_inplace(inplace, &x, &coef).unwrap();
        assert_bitwise(&back, &want, &what("relu_bwd_affine_inplace"));
        assert_bitwise(
            &bn_backward::generic_relu_bwd_affine(&g, &x, &coef).unwrap(),
            &want,
            &what("the candle-op oracle"),
        );
        // the delicate channel: v = 0 closes the mask, the next value up opens it
        let row1 = bn_backward::relu_bwd_affine(&g, &x, &coef)
            .unwrap()
            .narrow(0, 1, 1)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let g1 = g.narrow(0, 1, 1).unwrap().flatten_all().unwrap();
        let g1 = g1.to_dtype(DType::F64).unwrap().to_vec1::<f64>().unwrap();
        assert_eq!(row1[0], 0.0, "{dtype:?}: v = 0 must close the mask");
        if dtype == DType::F64 {
            assert_eq!(row1[1], g1[1], "v = 2⁻⁵³ must open it");
        }
    }
}

/// `repeat_rows`, `copy_rows` and a one-piece `cat_rows` make new tensors on the CPU's
/// kernels and on the GPU's path (taken on the CPU): writing into the result leaves the
/// source as it was. (On the GPU's path `repeat_rows` of one column was a view of the
/// values — the bias the product is added into — and a one-piece `cat` the piece itself.)
#[test]
fn new_tensors_are_new_on_either_path() {
    let v = Tensor::new(&[1f32, 2., 3.], &Device::Cpu).expect("values");
    let m = v.reshape((3, 1)).expect("[3, 1]");
    for gpu_path in [false, true] {
        let made = || {
            [
                elementwise::repeat_rows(&v, 1),
                elementwise::copy_rows(&m),
                elementwise::cat_rows(&[&m]),
            ]
            .map(|t| t.expect("made"))
        };
        let outs = if gpu_path {
            impls::layer::with_tap_stack_on_cpu(made)
        } else {
            made()
        };
        for (name, out) in ["repeat_rows", "copy_rows", "cat_rows"].iter().zip(&outs) {
            elementwise::add_assign(out, &out.ones_like().expect("ones")).expect("add");
            assert_eq!(
                v.to_vec1::<f32>().expect("values"),
                [1., 2., 3.],
                "{name} (GPU path: {gpu_path}) wrote into its source"
            );
            assert_eq!(
                out.flatten_all()
                    .and_then(|t| t.to_vec1::<f32>())
                    .expect("out"),
                [2., 3., 4.],
                "{name} (GPU path: {gpu_path})"
            );
        }
    }
}

/// BN backward's `dx` added into a new tensor in one pass (`bn_bwd_dx_accumulate_from`, a cat
/// variant's new input gradient) is bit for bit a copy of the source followed by the in-place
/// accumulation it replaces, in f32, f64 and bf16 (features rounded once), over unfilled
/// memory; the source is unchanged; a source of another shape is an error.
#[test]
fn bn_bwd_dx_accumulate_from_is_bitwise_copy_then_accumulate() {
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let table = if dtype == DType::BF16 {
            DType::F32
        } else {
            dtype
        };
        let (c, m) = (6, 133);
        let x = rand((c, m), 51).to_dtype(dtype).unwrap();
        let gy = rand((c, m), 52).to_dtype(dtype).unwrap();
        let from = rand((c, m), 53).to_dtype(dtype).unwrap();
        let coef = rand((3, c), 54).to_dtype(table).unwrap();
        let want = from.copy().unwrap();
        bn_backward::bn_bwd_dx_accumulate(&want, &gy, &x, &coef).unwrap();
        // NaN-filled, so an element the kernel fails to write shows
        let got = Tensor::full(f32::NAN, (c, m), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let before = bits(&from);
        bn_backward::bn_bwd_dx_accumulate_from(&got, &from, &gy, &x, &coef).unwrap();
        assert_bitwise(&got, &want, &format!("dx from {dtype:?}"));
        assert_eq!(bits(&from), before, "{dtype:?}: the source was written");
        let short = from.narrow(0, 0, c - 1).unwrap();
        let e = bn_backward::bn_bwd_dx_accumulate_from(&got, &short, &gy, &x, &coef)
            .expect_err("a source of another shape");
        assert!(format!("{e}").contains("source"), "{e}");
    }
}
