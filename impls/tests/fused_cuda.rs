//! The CUDA kernels of every fused op (`src/ops/cuda/bn.cu`, `src/ops/cuda/shift.cu`) and the in-place
//! element-wise kernels against their CPU twins and the `generic_*` candle-op oracles, through
//! views with non-zero start offsets, on a non-square grid; and two runs of each bitwise equal.
//! Also cuBLAS's accumulation into a view (`dense::accumulate` on a GPU) against `gemm`.
//!
//! Needs the `cuda` feature and a usable `cuda:0`; without a GPU every test prints why it is
//! skipped and returns. Run with `cargo test -p densebench-impls --features cuda --test
//! fused_cuda -- --nocapture`.
#![cfg(feature = "cuda")]

use candle_core::{DType, Device, Tensor};
use impls::ops::layout::grid::{Grid, TAPS};
use impls::ops::{bn, bn_backward, dense, shift};

/// f64 sums of the 3×3 convolution test (9·B products per output of y and ds, M = 1173 per
/// element of dW; |x| ≤ 2): two summation orders differ by a few ulps (a simulation of that
/// test's 270 dW sums: at most 2e-13); 1e-11 leaves margin without hiding a wrong term (O(1)).
const F64_REDUCTION_TOL: f64 = 1e-11;

/// f32 reductions: both kernels accumulate in f64 and round once to f32, so they agree to the
/// f64 order difference ([`assert_reduction_close`]) plus at most one f32 rounding step either
/// side of a rounding boundary: 2·ε_f32·|b|.
const F32_REDUCTION_REL_TOL: f64 = 2.0 * f32::EPSILON as f64;

/// Channels and grid: odd channel count, non-square images (H ≠ W) so that a swapped H/W would
/// read the wrong pixels, and M = N·H·W = 1173 > 1024 so each reduction block's threads (1024,
/// `cuda_src::REDUCE_THREADS`) loop over its row, some of them once more than others.
const C: usize = 37;
const GRID: Grid = Grid { n: 3, h: 17, w: 23 };

/// A long row for the reductions' strided loop, with few channels: several whole batches of
/// loads of every thread (8 f32 or 4 f64 per batch, 1024 threads) and a partial one.
const LONG_M: usize = 70_001;

/// `cuda:0`, or `None` after printing why the calling test is skipped.
fn gpu(test: &str) -> Option<Device> {
    match Device::new_cuda(0) {
        Ok(d) => {
            println!("{test}: running on cuda:0");
            Some(d)
        }
        Err(e) => {
            println!("{test}: skipped, no usable GPU (cuda:0): {e}");
            None
        }
    }
}

/// Deterministic values in [-2, 2] (the crate's seeded uniform generator), as `dtype`.
fn rand(shape: (usize, usize), seed: u64, dtype: DType) -> Tensor {
    let n = shape.0 * shape.1;
    Tensor::from_vec(
        impls::config::params::uniform(seed, "t", n, -2.0, 2.0),
        shape,
        &Device::Cpu,
    )
    .and_then(|t| t.to_dtype(dtype))
    .expect("tensor")
}

/// `t` (rows × cols) placed as rows 2.. of a buffer with 2 rows before and 3 after, returned as
/// the buffer and the view: kernels must honour the view's start offset.
fn in_buffer(t: &Tensor, dev: &Device) -> (Tensor, Tensor) {
    let (r, c) = t.dims2().expect("2-D");
    let pad = |n: usize| Tensor::full(7.0f64, (n, c), dev).and_then(|p| p.to_dtype(t.dtype()));
    let buf = Tensor::cat(
        &[
            &pad(2).expect("pad"),
            &t.to_device(dev).expect("to device"),
            &pad(3).expect("pad"),
        ],
        0,
    )
    .expect("buffer");
    let view = buf.narrow(0, 2, r).expect("view");
    (buf, view)
}

fn host(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f64>())
        .expect("to host")
}

fn bits(t: &Tensor) -> Vec<u64> {
    match t.dtype() {
        DType::BF16 => t
            .flatten_all()
            .and_then(|t| t.to_vec1::<half::bf16>())
            .expect("to host")
            .into_iter()
            .map(|v| u64::from(v.to_bits()))
            .collect(),
        DType::F32 => t
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("to host")
            .into_iter()
            .map(|v| u64::from(v.to_bits()))
            .collect(),
        _ => t
            .flatten_all()
            .and_then(|t| t.to_vec1::<f64>())
            .expect("to host")
            .into_iter()
            .map(f64::to_bits)
            .collect(),
    }
}

fn assert_bitwise(gpu: &Tensor, cpu: &Tensor, what: &str) {
    assert_eq!(gpu.dims(), cpu.dims(), "{what}: shapes");
    let (a, b) = (bits(gpu), bits(cpu));
    let bad = a.iter().zip(&b).filter(|(x, y)| x != y).count();
    assert_eq!(
        bad,
        0,
        "{what}: {bad} of {} elements differ bitwise",
        a.len()
    );
}

/// `gpu` and `cpu` are per-row sums (or means) of `m` terms computed in two f64 summation
/// orders (the kernel: 1024 strided partial sums and a fixed tree; the CPU: 16 interleaved
/// partial sums), where `scale[i]` is the sum of the terms' absolute values of element i (divided by
/// `m` like the element, for a mean). Each order's error is at most (m − 1)·2⁻⁵³·scale, so they
/// differ by at most m·ε_f64·scale; plus 2·ε_f64·scale for the candle oracle, which forms each
/// term with its roundings in another order (gy·((x − mean)·invstd)), and one rounding of the
/// result (ε_f64·|b|; in f32 one ulp either side, [`F32_REDUCTION_REL_TOL`]). Scaled by the row, not an absolute bound: the sum
/// of 70 001 values in [−2, 2] differs by up to ~1e-11 between 1024-strided and 16-strided
/// order, while a wrong or missing term is O(1) (O(1/m) in a mean: far above m·ε·scale).
fn assert_reduction_close(gpu: &Tensor, cpu: &Tensor, scale: &[f64], m: usize, what: &str) {
    assert_eq!(gpu.dims(), cpu.dims(), "{what}: shapes");
    let f32 = gpu.dtype() == DType::F32;
    let (a, b) = (host(gpu), host(cpu));
    assert_eq!(scale.len(), b.len(), "{what}: one scale per element");
    for (i, (a, b)) in a.iter().zip(b).enumerate() {
        let order = (m + 2) as f64 * f64::EPSILON * scale[i] + f64::EPSILON * b.abs();
        let tol = if f32 {
            order + F32_REDUCTION_REL_TOL * b.abs()
        } else {
            order
        };
        assert!(
            (a - b).abs() <= tol,
            "{what}[{i}]: cuda {a:e}, cpu {b:e} (tolerance {tol:e})"
        );
    }
}

/// Σ |f(i)| over each row of a `[c, m]` tensor given element by element (row-major index).
fn abs_row_sums(c: usize, m: usize, f: impl Fn(usize) -> f64) -> Vec<f64> {
    (0..c)
        .map(|r| (r * m..(r + 1) * m).map(|i| f(i).abs()).sum())
        .collect()
}

/// Runs `f` twice on the GPU and checks the two results bitwise equal (deterministic kernels).
fn twice(what: &str, f: impl Fn() -> Vec<Tensor>) -> Vec<Tensor> {
    let (a, b) = (f(), f());
    for (x, y) in a.iter().zip(&b) {
        assert_bitwise(x, y, &format!("{what}: run 1 vs run 2"));
    }
    a
}

fn bn_stats_case(dev: &Device, dtype: DType, (c, m): (usize, usize)) {
    let x = rand((c, m), 1, dtype);
    let (_buf, xv) = in_buffer(&x, dev);
    let g = twice("bn_stats", || {
        vec![bn::bn_stats(&xv).expect("cuda bn_stats")]
    });
    let cpu = bn::bn_stats(&x).expect("cpu bn_stats");
    // scales: Σ|x|/m for the mean, Σ(x − μ)²/m = the variance itself
    let xs = host(&x);
    let mut scale: Vec<f64> = abs_row_sums(c, m, |i| xs[i] / m as f64);
    scale.extend(host(&cpu)[c..].iter().map(|v| v.abs()));
    assert_reduction_close(
        &g[0],
        &cpu,
        &scale,
        m,
        &format!("bn (mean; var) {dtype:?} m={m}"),
    );
    if dtype == DType::F64 {
        // The candle-op oracle on the same GPU (its own summation order), f64 tolerance.
        let oracle = bn::generic_bn_stats(&xv).expect("oracle");
        assert_reduction_close(&g[0], &oracle, &scale, m, "bn (mean; var) vs oracle");
    }
}

/// `(mean; invstd)` of `x` on the CPU and γ, for the backward reduction.
fn st_and_gamma(x: &Tensor, dtype: DType) -> (Tensor, Tensor) {
    let mv = bn::bn_stats(x).expect("stats");
    let invstd = (bn::row(&mv, 1).expect("var") + 1e-5)
        .and_then(|v| v.sqrt())
        .and_then(|v| v.recip())
        .expect("invstd");
    let st = Tensor::stack(&[bn::row(&mv, 0).expect("mean"), invstd], 0).expect("st");
    let c = x.dims()[0];
    let gamma = rand((1, c), 19, dtype).flatten_all().expect("gamma");
    (st, gamma)
}

fn bn_bwd_reduce_case(dev: &Device, dtype: DType, (c, m): (usize, usize)) {
    let (x, gy) = (rand((c, m), 2, dtype), rand((c, m), 3, dtype));
    let (st, gamma) = st_and_gamma(&x, dtype);
    let (_bx, xv) = in_buffer(&x, dev);
    let (_bg, gv) = in_buffer(&gy, dev);
    let d = |t: &Tensor| t.to_device(dev).expect("to device");
    let (sd, gd) = (d(&st), d(&gamma));
    let g = twice("bn_bwd_reduce", || {
        vec![bn_backward::bn_bwd_reduce(&gv, &xv, &sd, &gd).expect("cuda reduce")]
    });
    let cpu = bn_backward::bn_bwd_reduce(&gy, &x, &st, &gamma).expect("cpu reduce");
    let sums = |t: &Tensor| t.narrow(0, 0, 2).expect("sums");
    // scales: Σ|gy| and Σ|gy·(x − mean)·invstd| per row
    let (gys, xs, sts) = (host(&gy), host(&x), host(&st));
    let mut scale = abs_row_sums(c, m, |i| gys[i]);
    scale.extend(abs_row_sums(c, m, |i| {
        let r = i / m;
        gys[i] * (xs[i] - sts[r]) * sts[c + r]
    }));
    assert_reduction_close(
        &sums(&g[0]),
        &sums(&cpu),
        &scale,
        m,
        &format!("(Σgy; Σgy·x̂) {dtype:?} m={m}"),
    );
    // A, B, C: the CPU twin's arithmetic on the kernel's own sums, bit for bit.
    let col = |q| bn::column(&g[0], q).expect("column");
    let want =
        bn_backward::generic_bn_bwd_coef(&col(0), &col(1), &sd, &gd, m).expect("coef oracle");
    for (q, w) in want.iter().enumerate() {
        assert_bitwise(
            &col(2 + q),
            w,
            &format!("bn bwd coefficient {q} {dtype:?} m={m}"),
        );
    }
    if dtype == DType::F64 {
        let oracle = bn_backward::generic_bn_bwd_reduce(&gv, &xv, &sd, &gd).expect("oracle");
        assert_reduction_close(
            &sums(&g[0]),
            &sums(&oracle),
            &scale,
            m,
            "(Σgy; Σgy·x̂) vs oracle",
        );
    }
}

/// BN forward's per-channel step (`bn_prepare`): element-wise per channel, T arithmetic in the
/// CPU's order, so bitwise the CPU twin (and the candle ops it replaced), both outputs.
fn bn_prepare_case(dev: &Device, dtype: DType, c: usize) {
    let mean = rand((1, c), 20, dtype);
    let var = rand((1, c), 21, dtype).abs().expect("abs");
    let mv = Tensor::cat(&[&mean, &var], 0).expect("mv");
    let v = |seed| rand((1, c), seed, dtype).flatten_all().expect("vector");
    let (gamma, beta, rm) = (v(22), v(23), v(24));
    let rv = v(25).abs().expect("abs");
    let d = |t: &Tensor| t.to_device(dev).expect("to device");
    let (mvd, gd, bd, rmd, rvd) = (d(&mv), d(&gamma), d(&beta), d(&rm), d(&rv));
    let m = 1173;
    let g = twice("bn_prepare", || {
        let (t, r) = bn::bn_prepare(&mvd, &gd, &bd, &rmd, &rvd, m).expect("cuda prepare");
        vec![t, r]
    });
    let (t, r) = bn::bn_prepare(&mv, &gamma, &beta, &rm, &rv, m).expect("cpu prepare");
    assert_bitwise(&g[0], &t, &format!("bn_prepare table {dtype:?} C={c}"));
    assert_bitwise(&g[1], &r, &format!("bn_prepare running {dtype:?} C={c}"));
}

#[test]
fn cuda_bn_reductions_match_cpu_and_oracle_and_repeat_bitwise() {
    let Some(dev) = gpu("cuda_bn_reductions_match_cpu_and_oracle_and_repeat_bitwise") else {
        return;
    };
    let m = GRID.n * GRID.h * GRID.w;
    for dtype in [DType::F32, DType::F64] {
        for shape in [(C, m), (3, LONG_M), (2, 1)] {
            bn_stats_case(&dev, dtype, shape);
            bn_bwd_reduce_case(&dev, dtype, shape);
        }
        // one channel, one block's worth, and more than the 1-D grid's first pass covers
        for c in [1, C, 70_001] {
            bn_prepare_case(&dev, dtype, c);
        }
    }
}

/// The element-wise BN kernels round exactly like the CPU kernels (explicitly rounded
/// arithmetic in the same order), so CUDA and CPU agree bit for bit.
#[test]
fn cuda_bn_elementwise_kernels_equal_cpu_bitwise() {
    let Some(dev) = gpu("cuda_bn_elementwise_kernels_equal_cpu_bitwise") else {
        return;
    };
    let m = GRID.n * GRID.h * GRID.w;
    for dtype in [DType::F32, DType::F64] {
        let (x, gy) = (rand((C, m), 4, dtype), rand((C, m), 5, dtype));
        // planar per-channel tables: (scale; shift) and (A; B; C)
        let (coef2, coef3) = (rand((2, C), 6, dtype), rand((3, C), 8, dtype));
        let d = |t: &Tensor| t.to_device(&dev).expect("to device");
        let (_bx, xv) = in_buffer(&x, &dev);
        let (_bg, gv) = in_buffer(&gy, &dev);
        let (k2, k3) = (d(&coef2), d(&coef3));

        let g = twice("affine_rows", || {
            vec![
                bn::affine_rows(&xv, &k2).expect("cuda affine"),
                bn::affine_rows_relu(&xv, &k2).expect("cuda affine relu"),
                bn_backward::bn_bwd_dx(&gv, &xv, &k3).expect("cuda dx"),
            ]
        });
        let cpu_affine = bn::affine_rows(&x, &coef2).expect("cpu affine");
        assert_bitwise(&g[0], &cpu_affine, &format!("affine_rows {dtype:?}"));
        let cpu_relu = bn::affine_rows_relu(&x, &coef2).expect("cpu affine relu");
        assert_bitwise(&g[1], &cpu_relu, &format!("affine_rows_relu {dtype:?}"));
        // About half the outputs are clipped: the ReLU really ran.
        let zeros = host(&g[1]).iter().filter(|v| **v == 0.0).count();
        assert!(zeros > C * m / 4, "affine_rows_relu: only {zeros} zeros");
        let cpu_dx = bn_backward::bn_bwd_dx(&gy, &x, &coef3).expect("cpu dx");
        assert_bitwise(&g[2], &cpu_dx, &format!("bn_bwd_dx {dtype:?}"));
        // a column range of the map, rows ld = m apart (the split front's chunks): the kernel
        // reads it row-strided, the CPU twin the same view
        let (c0, n) = (3, m - 7);
        let xs = xv.narrow(1, c0, n).expect("column range");
        let cx = x.narrow(1, c0, n).expect("column range");
        for (relu, f) in [
            (
                false,
                bn::affine_rows as fn(&Tensor, &Tensor) -> impls::Result<Tensor>,
            ),
            (true, bn::affine_rows_relu),
        ] {
            let got = f(&xs, &k2).expect("cuda affine of a column range");
            let want = f(&cx, &coef2).expect("cpu affine of a column range");
            assert_bitwise(
                &got,
                &want,
                &format!("affine_rows relu={relu} {dtype:?}, columns"),
            );
        }

        // In place into rows 2..2+C of a gradient buffer: the rows around stay untouched, the
        // view holds bitwise the CPU's accumulate (= dx then add).
        let acc0 = rand((C, m), 11, dtype);
        let acc_cpu = acc0.copy().expect("copy");
        bn_backward::bn_bwd_dx_accumulate(&acc_cpu, &gy, &x, &coef3).expect("cpu accumulate");
        let run = || {
            let (buf, view) = in_buffer(&acc0, &dev);
            bn_backward::bn_bwd_dx_accumulate(&view, &gv, &xv, &k3).expect("cuda acc");
            vec![buf]
        };
        let buf = &twice("bn_bwd_dx_accumulate", run)[0];
        assert_bitwise(
            &buf.narrow(0, 2, C).expect("view"),
            &acc_cpu,
            &format!("bn_bwd_dx_accumulate {dtype:?}"),
        );
        let outside = [
            host(&buf.narrow(0, 0, 2).expect("head")),
            host(&buf.narrow(0, 2 + C, 3).expect("tail")),
        ];
        assert!(
            outside.iter().flatten().all(|v| *v == 7.0),
            "bn_bwd_dx_accumulate wrote outside its view"
        );
    }
}

/// The shift kernels copy (stack) or add in the CPU's tap order (sum): bitwise equal to the
/// CPU, for the forward and the backward offsets, on a non-square grid.
#[test]
fn cuda_shift_kernels_equal_cpu_bitwise() {
    let Some(dev) = gpu("cuda_shift_kernels_equal_cpu_bitwise") else {
        return;
    };
    let m = GRID.n * GRID.h * GRID.w;
    for dtype in [DType::F32, DType::F64] {
        for sign in [1isize, -1] {
            let offsets = TAPS.map(|(dy, dx)| (sign * (dy as isize - 1), sign * (dx as isize - 1)));
            let t = rand((C, m), 12, dtype);
            let p = rand((9 * C, m), 13, dtype);
            let (_bt, tv) = in_buffer(&t, &dev);
            let (_bp, pv) = in_buffer(&p, &dev);
            let g = twice("shift", || {
                vec![
                    shift::shift_stack(&tv, GRID, offsets).expect("cuda stack"),
                    shift::shift_sum(&pv, GRID, offsets).expect("cuda sum"),
                ]
            });
            let cpu_stack = shift::shift_stack(&t, GRID, offsets).expect("cpu stack");
            assert_bitwise(
                &g[0],
                &cpu_stack,
                &format!("shift_stack {dtype:?} sign {sign}"),
            );
            let cpu_sum = shift::shift_sum(&p, GRID, offsets).expect("cpu sum");
            assert_bitwise(&g[1], &cpu_sum, &format!("shift_sum {dtype:?} sign {sign}"));
            // The candle-op oracle on the GPU: copies and the same additions in the same
            // order, so bitwise too.
            let oracle = shift::generic_shift_stack(&tv, GRID, offsets).expect("oracle stack");
            assert_bitwise(&g[0], &oracle, "shift_stack vs oracle");
        }
    }
}

/// The fused BN → ReLU of an `inplace` strategy equals BN apply then the in-place ReLU kernel,
/// bit for bit, including NaN → 0 (a NaN scale makes its whole row NaN before the ReLU).
#[test]
fn cuda_affine_relu_equals_affine_then_inplace_relu() {
    let Some(dev) = gpu("cuda_affine_relu_equals_affine_then_inplace_relu") else {
        return;
    };
    for dtype in [DType::F32, DType::F64] {
        let x = rand((4, 999), 14, dtype).to_device(&dev).expect("x");
        // (scale; shift), channel 1's scale NaN
        let coef = Tensor::new(&[[1.0f64, f64::NAN, -0.5, 0.0]], &Device::Cpu)
            .and_then(|scale| Tensor::cat(&[&scale, &rand((1, 4), 15, DType::F64)], 0))
            .and_then(|t| t.to_dtype(dtype))
            .and_then(|t| t.to_device(&dev))
            .expect("coef");
        let fused_out = bn::affine_rows_relu(&x, &coef).expect("fused");
        let two_step =
            impls::ops::elementwise::relu_inplace(bn::affine_rows(&x, &coef).expect("affine"))
                .expect("relu");
        assert_bitwise(&fused_out, &two_step, &format!("affine relu {dtype:?}"));
        let row1 = host(&fused_out.narrow(0, 1, 1).expect("row"));
        assert!(row1.iter().all(|v| *v == 0.0), "NaN row not mapped to 0");
    }
}

/// Mismatched operands are an error, never an out-of-bounds read.
#[test]
fn cuda_fused_ops_reject_short_operands() {
    let Some(dev) = gpu("cuda_fused_ops_reject_short_operands") else {
        return;
    };
    let x = rand((C, 100), 16, DType::F32).to_device(&dev).expect("x");
    let short = rand((C, 99), 17, DType::F32)
        .to_device(&dev)
        .expect("short");
    let coef = rand((3, C), 18, DType::F32).to_device(&dev).expect("coef");
    let e = bn_backward::bn_bwd_dx(&x, &short, &coef).expect_err("short x accepted");
    assert!(format!("{e:#}").contains("elements"), "{e:#}");
    let short_coef = rand((3, C - 1), 18, DType::F32)
        .to_device(&dev)
        .expect("coef");
    let e = bn_backward::bn_bwd_dx(&x, &x, &short_coef).expect_err("short table accepted");
    assert!(format!("{e:#}").contains("coefficient table"), "{e:#}");
    let bad_grid = Grid { n: 1, h: 9, w: 11 };
    let e = shift::shift_stack(&x, bad_grid, [(0, 0); 9]).expect_err("wrong grid accepted");
    assert!(format!("{e:#}").contains("grid"), "{e:#}");
}

/// cuBLAS with β = 1 (`dense::accumulate` and `accumulate_tail` on a GPU, `src/dense_cuda.rs`):
/// the mlp input gradient `dst += Wᵀ·gy` added into a buffer's view (Wᵀ a transposed view) and
/// into the first rows of one view from its last rows, against the CPU's `gemm`, f32 and f64.
/// The sums differ by order only: within 4·k·ε·(|dst| + Σ|w·gy|) (values in [−2, 2]; a wrong or
/// missing term is O(1)). The buffer's rows around the view stay untouched, and two runs on the
/// same inputs are bitwise equal (cuBLAS is deterministic on one stream without split-K atomics).
#[test]
fn cuda_dense_accumulate_matches_cpu_gemm() {
    let Some(dev) = gpu("cuda_dense_accumulate_matches_cpu_gemm") else {
        return;
    };
    let (k, c, m) = (64, C, GRID.n * GRID.h * GRID.w);
    for dtype in [DType::F32, DType::F64] {
        let eps = if dtype == DType::F32 {
            f32::EPSILON as f64
        } else {
            f64::EPSILON
        };
        let tol = 4.0 * k as f64 * eps * (2.0 + 4.0 * k as f64);
        let w = rand((k, c), 21, dtype);
        let gy = rand((k, m), 22, dtype);
        let d0 = rand((c, m), 23, dtype);
        let close = |gpu: &Tensor, cpu: &Tensor, what: &str| {
            let (a, b) = (host(gpu), host(cpu));
            assert_eq!(a.len(), b.len(), "{what}: sizes");
            let worst = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0f64, f64::max);
            println!("{what} {dtype:?}: max |cuBLAS − gemm| = {worst:.3e} (bound {tol:.1e})");
            assert!(
                worst <= tol,
                "{what} {dtype:?}: max difference {worst:e} > {tol:e}"
            );
        };
        // dst += Wᵀ · gy into rows 2.. of a buffer
        let cpu = d0.copy().expect("copy");
        impls::ops::dense::accumulate(&cpu, &w.t().expect("wt"), &gy).expect("cpu accumulate");
        let (wg, gyg) = (
            w.to_device(&dev).expect("w"),
            gy.to_device(&dev).expect("gy"),
        );
        let run = || {
            let (buf, view) = in_buffer(&d0, &dev);
            impls::ops::dense::accumulate(&view, &wg.t().expect("wt"), &gyg)
                .expect("cuda accumulate");
            (buf, view)
        };
        let (buf, view) = run();
        close(&view, &cpu, "accumulate");
        let pads = [buf.narrow(0, 0, 2), buf.narrow(0, 2 + c, 3)];
        for p in pads {
            assert!(
                host(&p.expect("pad")).iter().all(|v| *v == 7.0),
                "{dtype:?}: pad written"
            );
        }
        assert_bitwise(&run().1, &view, &format!("accumulate twice {dtype:?}"));
        // rows [0, c) += Wᵀ · rows [c, c + k) of one view
        let rows = Tensor::cat(&[&d0, &gy], 0).expect("rows");
        let cpu = rows.copy().expect("copy");
        impls::ops::dense::accumulate_tail(&cpu, c, &w.t().expect("wt")).expect("cpu tail");
        let (_buf, view) = in_buffer(&rows, &dev);
        impls::ops::dense::accumulate_tail(&view, c, &wg.t().expect("wt")).expect("cuda tail");
        close(&view, &cpu, "accumulate_tail");
        // the right operand's rows are read, not written
        assert_bitwise(
            &view.narrow(0, c, k).expect("tail"),
            &gy,
            &format!("accumulate_tail's right operand {dtype:?}"),
        );
    }
}

/// The GPU path's 3×3 convolution (tap stack, `layer::conv3x3_*_tap_stack`) in one chunk and a
/// few whole images at a time with a shorter last chunk (the shift kernels then read and write
/// column ranges, row-strided views, and cuBLAS writes and adds into column ranges) against the
/// CPU's direct kernel, in f64: forward and both gradients.
#[test]
fn cuda_tap_stack_conv_in_chunks_matches_the_cpu_direct_kernel() {
    use impls::layer::{self, with_tap_chunk_columns};
    use impls::ops::conv3x3;
    use impls::{Config, Family, Spatial};
    let Some(dev) = gpu("cuda_tap_stack_conv_in_chunks_matches_the_cpu_direct_kernel") else {
        return;
    };
    let (b, k, m) = (6, 5, GRID.n * GRID.h * GRID.w);
    let cfg = Config {
        batch: GRID.n,
        size: Spatial::new(GRID.h, GRID.w),
        ..Config::tiny(Family::Bc)
    };
    let s = rand((b, m), 31, DType::F64);
    let w = rand((k, b * 9), 32, DType::F64)
        .reshape((k, b, 3, 3))
        .expect("w");
    let gy = rand((k, m), 33, DType::F64);
    let cpu = [
        conv3x3::forward(&s, &w, GRID).expect("cpu y"),
        conv3x3::backward_data(&gy, &w, GRID).expect("cpu ds"),
        conv3x3::backward_weight(&gy, &s, GRID).expect("cpu dW"),
    ];
    let on = |t: &Tensor| t.to_device(&dev).expect("to gpu");
    let plane = GRID.h * GRID.w;
    // one chunk; 2 + 1 images
    for columns in [0, 2 * plane] {
        let got = with_tap_chunk_columns(columns, || {
            let y = layer::conv3x3_fwd_tap_stack(&cfg, &on(&s), &on(&w)).expect("gpu y");
            let (ds, dw) =
                layer::conv3x3_bwd_tap_stack(&cfg, &on(&gy), &on(&s), &on(&w)).expect("gpu bwd");
            [y, ds, dw]
        });
        for ((g, c), name) in got.iter().zip(&cpu).zip(["y", "ds", "dW"]) {
            let d = (g.to_device(&Device::Cpu).expect("to cpu") - c)
                .and_then(|t| t.abs())
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.max(0))
                .and_then(|t| t.to_scalar::<f64>())
                .expect("max diff");
            assert!(
                d <= F64_REDUCTION_TOL,
                "{columns} columns per chunk: {name}: max |gpu tap stack − cpu direct| = {d:e}"
            );
        }
    }
}

/// The GPU 3×3 convolution tests' dtypes and bounds on max |gpu − cpu| / max |cpu| per tensor:
/// two summation orders in f64 and f32 (1e-4 in f32: cuDNN may pick Winograd or FFT in IEEE
/// math, as for PyTorch, whose errors are some 1e-5 of the largest element), and in bf16 both
/// sides' f32 sums rounded once (two bf16 ulps).
const CONV_TOLERANCES: [(DType, f64); 3] = [
    (DType::F64, 1e-13),
    (DType::F32, 1e-4),
    (DType::BF16, 2.0 / 256.0),
];

/// Operands of a GPU 3×3 convolution test of `b` channels into `k` on [`GRID`], in `dtype`
/// (seeds from `seed`): on the GPU `s`, `w` and `gy` read through rows 2..2+k of a taller tensor
/// (a view past the storage's start, as the block reads a gradient buffer's rows), and the CPU's
/// direct kernel's `[y, ds, dW]` of the same values.
struct ConvCase {
    gpu: [Tensor; 3],
    cpu: [Tensor; 3],
}

fn conv_case(dev: &Device, (b, k): (usize, usize), dtype: DType, seed: u64) -> ConvCase {
    use impls::ops::conv3x3;
    let m = GRID.n * GRID.h * GRID.w;
    let s = rand((b, m), seed, DType::F64).to_dtype(dtype).expect("s");
    let w = rand((k, b * 9), seed + 1, DType::F64)
        .reshape((k, b, 3, 3))
        .and_then(|w| w.to_dtype(dtype))
        .expect("w");
    let tall = rand((k + 3, m), seed + 2, DType::F64)
        .to_dtype(dtype)
        .expect("gy");
    let gy = tall
        .narrow(0, 2, k)
        .and_then(|g| g.contiguous())
        .expect("gy rows");
    let cpu = [
        conv3x3::forward(&s, &w, GRID).expect("cpu y"),
        conv3x3::backward_data(&gy, &w, GRID).expect("cpu ds"),
        conv3x3::backward_weight(&gy, &s, GRID).expect("cpu dW"),
    ];
    let on = |t: &Tensor| t.to_device(dev).expect("to gpu");
    let gy_g = on(&tall).narrow(0, 2, k).expect("gy rows");
    ConvCase {
        gpu: [on(&s), on(&w), gy_g],
        cpu,
    }
}

/// `[y, ds, dW]` of a GPU convolution against the CPU's (max |gpu − cpu| / max |cpu| ≤ `tol`
/// each) and against a second run (bit for bit), named by `what`.
fn check_conv_runs(
    what: &str,
    first: &[Tensor; 3],
    second: &[Tensor; 3],
    cpu: &[Tensor; 3],
    tol: f64,
) {
    let f64s = |t: &Tensor| t.to_dtype(DType::F64).expect("f64");
    let max = |t: Tensor| {
        t.abs()
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.max(0))
            .and_then(|t| t.to_scalar::<f64>())
            .expect("max")
    };
    let bits = |t: &Tensor| {
        f64s(t)
            .flatten_all()
            .and_then(|t| t.to_vec1::<f64>())
            .expect("values")
            .into_iter()
            .map(f64::to_bits)
            .collect::<Vec<_>>()
    };
    for (i, name) in ["y", "ds", "dW"].into_iter().enumerate() {
        let (g, c) = (f64s(&first[i]), f64s(&cpu[i]));
        let rel = max((&g - &c).expect("diff")) / max(c.clone());
        assert!(
            rel <= tol,
            "{what}: {name}: max |gpu − cpu direct| / max |cpu| = {rel:e} > {tol:e}"
        );
        assert_eq!(
            first[i].dtype(),
            second[i].dtype(),
            "{what}: {name}: dtypes"
        );
        assert!(
            bits(&first[i]) == bits(&second[i]),
            "{what}: {name}: two runs differ"
        );
    }
}

/// cuDNN's 3×3 convolution (the `cudnn` feature: `ops::conv3x3::cudnn`, the layer's path on a
/// GPU with `DENSEBENCH_CONV=cudnn`) against the CPU's direct kernel: forward and both
/// gradients (the data gradient a forward convolution with the filter transposed), the output
/// gradient read through a row view with a start offset (as the block reads a gradient
/// buffer's rows), in f64 (to summation order), f32 in IEEE math (Winograd or FFT allowed) and
/// bf16 (cuDNN's f32 accumulation rounded once against the CPU's, and its bf16 filter gradient
/// widened to f32 as the layer widens it); two runs bitwise equal (deterministic algorithms);
/// each pass staged as cuDNN plans it (`auto`: on the strides where it can) and on packed
/// copies (the fallback, every pass).
/// The layer's dispatch by `DENSEBENCH_CONV` is `harness/tests/gpu.rs`'s (one process per row).
#[cfg(feature = "cudnn")]
#[test]
fn cuda_cudnn_conv_matches_the_cpu_direct_kernel() {
    use impls::ops::conv3x3;
    let Some(dev) = gpu("cuda_cudnn_conv_matches_the_cpu_direct_kernel") else {
        return;
    };
    let (b, k) = (6, 5);
    for (dtype, tol) in CONV_TOLERANCES {
        let ConvCase {
            gpu: [s_g, w_g, gy_g],
            cpu,
        } = conv_case(&dev, (b, k), dtype, 31);
        let param = impls::config::param_dtype(dtype);
        for staging in [None, Some(conv3x3::CudnnStaging::Packed)] {
            let run = || {
                conv3x3::with_cudnn_staging(staging, || {
                    let y = conv3x3::cudnn::forward(&s_g, &w_g, GRID).expect("gpu y");
                    let ds = conv3x3::cudnn::backward_data(&gy_g, &w_g, GRID).expect("gpu ds");
                    let dw = conv3x3::cudnn::backward_filter(&gy_g, &s_g, GRID)
                        .expect("gpu dW")
                        .to_dtype(param)
                        .expect("dW in the parameters' dtype");
                    [y, ds, dw].map(|t| t.to_device(&Device::Cpu).expect("to cpu"))
                })
            };
            let (first, second) = (run(), run());
            check_conv_runs(
                &format!("cuDNN {dtype:?} ({staging:?})"),
                &first,
                &second,
                &cpu,
                tol,
            );
            // parameter gradients are f32 under autocast: cuDNN's bf16 dW widened
            assert_eq!(first[2].dtype(), param, "{dtype:?}: dW's dtype");
            let (ws, algos) = conv3x3::with_cudnn_staging(staging, || {
                (
                    conv3x3::cudnn::workspaces(&dev, GRID, b, k, dtype).expect("workspaces"),
                    conv3x3::cudnn::algorithms(&dev, GRID, b, k, dtype).expect("algorithms"),
                )
            });
            if staging.is_some() {
                assert_eq!(algos.matches("on packed copies").count(), 3, "{algos}");
            }
            println!("{dtype:?} ({staging:?}): cuDNN {algos}; workspaces {ws:?}");
        }
    }
}

/// densebench's direct 3×3 kernels (`ops::conv3x3::gpu`, the layer's path on a GPU with
/// `DENSEBENCH_CONV=direct`) against the CPU's direct kernel: forward and both gradients, the
/// output gradient read through a row view with a start offset, in f64 and f32 (to summation
/// order: the GPU's fused multiply-adds in another order than the CPU's products) and bf16
/// (f32 sums rounded once); `dW` in the parameters' dtype; two runs bitwise equal (no
/// atomics). The host emulation (`cuda_emulated.rs`) checks the same kernels bit for bit
/// against their order restated; this is the driver, NVRTC's code and real concurrency.
#[test]
fn cuda_direct_conv_matches_the_cpu_direct_kernel() {
    use impls::ops::conv3x3;
    let Some(dev) = gpu("cuda_direct_conv_matches_the_cpu_direct_kernel") else {
        return;
    };
    // B > 16 and k > 4: several input chunks, output groups and weight-gradient channel groups
    for (dtype, tol) in CONV_TOLERANCES {
        let ConvCase {
            gpu: [s_g, w_g, gy_g],
            cpu,
        } = conv_case(&dev, (20, 6), dtype, 51);
        let run = || {
            let fma = conv3x3::gpu::Mma::Refused;
            let y = conv3x3::gpu::forward(&s_g, &w_g, GRID, fma).expect("gpu y");
            let ds = conv3x3::gpu::backward_data(&gy_g, &w_g, GRID, fma).expect("gpu ds");
            let dw = conv3x3::gpu::backward_weight(&gy_g, &s_g, GRID, fma).expect("gpu dW");
            [y, ds, dw].map(|t| t.to_device(&Device::Cpu).expect("to cpu"))
        };
        let (first, second) = (run(), run());
        check_conv_runs(&format!("direct {dtype:?}"), &first, &second, &cpu, tol);
        assert_eq!(first[0].dtype(), dtype, "{dtype:?}: y's dtype");
        let param = impls::config::param_dtype(dtype);
        assert_eq!(first[2].dtype(), param, "{dtype:?}: dW's dtype");
    }
}

/// The direct kernels' three passes on tensor cores (`conv3x3_mma`, `conv3x3_wgrad_mma`,
/// sm_80+). f32 features as TF32 operands (forced here, as `--math tf32` would pick them:
/// candle's math switch is global to the process and other tests run beside this one) against
/// the CPU's direct kernel on the same operands rounded to TF32 (to nearest, ties away: what
/// `cvt.rna` makes), so what remains is the tensor core's f32 accumulation in its own order:
/// within 1e-4 of the largest element (tensor cores align and truncate inside an mma, some
/// ulps of a partial sum each, and `dW` sums 1 173 pixels; a wrong fragment layout is off by
/// whole terms, some 1e-1); and within TF32's own error (4e-3) of the unrounded convolution.
/// bf16 features as bf16 (exact products, f32 sums rounded once: two bf16 ulps; `dW` in f32,
/// not rounded). Layouts with partial tiles, several chunks and column tiles (B = 20 into
/// k = 6, and the data gradient's 20 outputs); the output gradient through a row view; two
/// runs bitwise equal. The host emulation (`cuda_emulated.rs`) restates the same fragments bit
/// for bit; this is the tensor core.
#[test]
fn cuda_direct_conv_on_tensor_cores_matches_the_cpu_direct_kernel() {
    use impls::ops::conv3x3;
    use impls::ops::elementwise::{round_tf32, Tf32Rounding};
    let Some(dev) = gpu("cuda_direct_conv_on_tensor_cores_matches_the_cpu_direct_kernel") else {
        return;
    };
    let forced = conv3x3::gpu::Mma::Forced;
    for dtype in [DType::F32, DType::BF16] {
        let kernel = conv3x3::gpu::kernel(&dev, dtype, forced).expect("kernel");
        if kernel != conv3x3::gpu::ConvKernel::Mma {
            println!("{dtype:?}: no tensor-core path on this GPU (sm_80+), skipped");
            continue;
        }
        let ConvCase {
            gpu: [s_g, w_g, gy_g],
            cpu,
        } = conv_case(&dev, (20, 6), dtype, 61);
        let run = || {
            let y = conv3x3::gpu::forward(&s_g, &w_g, GRID, forced).expect("gpu y");
            let ds = conv3x3::gpu::backward_data(&gy_g, &w_g, GRID, forced).expect("gpu ds");
            let dw = conv3x3::gpu::backward_weight(&gy_g, &s_g, GRID, forced).expect("gpu dW");
            [y, ds, dw].map(|t| t.to_device(&Device::Cpu).expect("to cpu"))
        };
        let (first, second) = (run(), run());
        if dtype == DType::F32 {
            let host = |t: &Tensor| t.to_device(&Device::Cpu).expect("to cpu");
            let tf32 = |t: &Tensor| round_tf32(&host(t), Tf32Rounding::Nearest).expect("tf32");
            let (s, w, gy) = (
                tf32(&s_g),
                tf32(&w_g),
                tf32(&gy_g.contiguous().expect("gy")),
            );
            let rounded = [
                conv3x3::forward(&s, &w, GRID).expect("cpu y"),
                conv3x3::backward_data(&gy, &w, GRID).expect("cpu ds"),
                conv3x3::backward_weight(&gy, &s, GRID).expect("cpu dW"),
            ];
            check_conv_runs("direct F32 in TF32", &first, &second, &rounded, 1e-4);
            check_conv_runs(
                "direct F32 in TF32 (unrounded)",
                &first,
                &second,
                &cpu,
                4e-3,
            );
        } else {
            check_conv_runs(
                "direct BF16 on tensor cores",
                &first,
                &second,
                &cpu,
                2.0 / 256.0,
            );
        }
        assert_eq!(first[0].dtype(), dtype, "{dtype:?}: y's dtype");
    }
}

/// ReLU backward masked from BN's input and `(scale; shift)` (`relu_bwd_affine`, new and in
/// place through a view with a start offset) equals the CPU bit for bit, and the mask the
/// ReLU's output gives on the GPU.
#[test]
fn cuda_relu_bwd_affine_equals_cpu_bitwise() {
    let Some(dev) = gpu("cuda_relu_bwd_affine_equals_cpu_bitwise") else {
        return;
    };
    let m = GRID.n * GRID.h * GRID.w;
    for dtype in [DType::F32, DType::F64] {
        let g = rand((C, m), 41, dtype);
        let x = rand((C, m), 42, dtype);
        // (scale; shift)
        let coef = rand((2, C), 43, dtype);
        let cpu = bn_backward::relu_bwd_affine(&g, &x, &coef).expect("cpu");
        let (xg, cg) = (
            x.to_device(&dev).expect("x"),
            coef.to_device(&dev).expect("coef"),
        );
        let (_buf, gv) = in_buffer(&g, &dev);
        let fresh = bn_backward::relu_bwd_affine(&gv, &xg, &cg).expect("cuda");
        assert_bitwise(&fresh, &cpu, &format!("relu_bwd_affine {dtype:?}"));
        let via_output = impls::ops::elementwise::relu_bwd(
            &gv,
            &bn::affine_rows_relu(&xg, &cg).expect("cuda affine relu"),
        )
        .expect("cuda relu bwd");
        assert_bitwise(&via_output, &cpu, &format!("mask of the output {dtype:?}"));
        let (buf, gv) = in_buffer(&g, &dev);
        let back = bn_backward::relu_bwd_affine_inplace(gv, &xg, &cg).expect("cuda inplace");
        assert_bitwise(&back, &cpu, &format!("relu_bwd_affine_inplace {dtype:?}"));
        let outside = host(&buf.narrow(0, 0, 2).expect("head"));
        assert!(
            outside.iter().all(|v| *v == 7.0),
            "relu_bwd_affine_inplace wrote outside its view"
        );
    }
}

/// Issue 39 on a GPU: cuBLAS with bf16 operands and f32 accumulation (`ops::cuda::dense`) into
/// bf16 and f32 destinations, a transposed operand among them, and with β = 1, each element
/// within the bound of one f32 summation of its products (`k·2⁻²³·Σ|a||b|`) of the exact
/// product, plus half a bf16 ulp where the output is bf16; and `shift_sum_wide_bf16` (f32 tap
/// products into bf16) bitwise the CPU's mixed sum.
#[test]
fn cuda_bf16_products_and_the_wide_shift_sum_match_the_cpu() {
    let Some(dev) = gpu("cuda_bf16_products_and_the_wide_shift_sum_match_the_cpu") else {
        return;
    };
    let bf = |t: Tensor| t.to_dtype(DType::BF16).expect("bf16");
    let (m, k, n) = (48, 300, 700);
    let a = bf(rand((m, k), 21, DType::F32));
    let bt = bf(rand((n, k), 22, DType::F32));
    let wide = |t: &Tensor| t.to_dtype(DType::F64).expect("f64");
    let exact = wide(&a)
        .matmul(&wide(&bt).t().unwrap())
        .expect("f64 product");
    let scale = wide(&a)
        .abs()
        .unwrap()
        .matmul(&wide(&bt).abs().unwrap().t().unwrap())
        .expect("|a|·|b|");
    let (ag, btg) = (a.to_device(&dev).unwrap(), bt.to_device(&dev).unwrap());
    let b_t = btg.t().unwrap();
    for (out, add) in [
        (DType::F32, false),
        (DType::BF16, false),
        (DType::F32, true),
    ] {
        let dst = Tensor::ones((m, n), out, &dev).expect("dst");
        let r = if add {
            dense::accumulate(&dst, &ag, &b_t)
        } else {
            dense::product_into(&dst, &ag, &b_t)
        };
        r.unwrap_or_else(|e| panic!("cuBLAS bf16 into {out:?} (add {add}): {e}"));
        let got = host(&dst);
        let (want, s) = (host(&exact), host(&scale));
        let ulp = if out == DType::BF16 {
            2f64.powi(-8)
        } else {
            0.0
        };
        for (i, ((g, w), s)) in got.iter().zip(&want).zip(&s).enumerate() {
            let w = w + f64::from(u8::from(add));
            let bound = k as f64 * 2f64.powi(-23) * s + ulp * w.abs() + 1e-30;
            assert!(
                (g - w).abs() <= bound,
                "into {out:?} (add {add}), element {i}: {g} vs {w} (bound {bound:e})"
            );
        }
    }
    // f32 tap products summed into bf16 features: the CPU's bits
    let mm = GRID.n * GRID.h * GRID.w;
    let p = rand((9 * C, mm), 24, DType::F32);
    let offsets = TAPS.map(|(dy, dx)| (dy as isize - 1, dx as isize - 1));
    let cpu = Tensor::zeros((C, mm), DType::BF16, &Device::Cpu).unwrap();
    shift::shift_sum_into(&cpu, &p, GRID, offsets).expect("cpu wide sum");
    let got = twice("shift_sum_wide_bf16", || {
        let d = Tensor::zeros((C, mm), DType::BF16, &dev).unwrap();
        shift::shift_sum_into(&d, &p.to_device(&dev).unwrap(), GRID, offsets)
            .expect("cuda wide sum");
        vec![d]
    });
    assert_bitwise(&got[0], &cpu, "shift_sum_wide_bf16");
}

/// Issue 38 item 2 on a GPU: BN's backward with the backward of the ReLU after it fused in
/// (`bn_bwd_reduce_relu`, `bn_bwd_dx_relu`, `bn_bwd_dx_accumulate_relu`) is bitwise the two
/// steps on the GPU — `relu_bwd_affine`, then the plain kernel, whose summation order the
/// fused reduction keeps — and its element-wise results bitwise the CPU twin's; through views
/// with a start offset, f32, f64 and bf16 features.
#[test]
fn cuda_bn_backward_with_the_relu_fused_is_the_two_steps_bitwise() {
    let Some(dev) = gpu("cuda_bn_backward_with_the_relu_fused_is_the_two_steps_bitwise") else {
        return;
    };
    let c = 5;
    for dtype in [DType::F32, DType::F64, DType::BF16] {
        let table_dtype = if dtype == DType::BF16 {
            DType::F32
        } else {
            dtype
        };
        let (x, gy) = (rand((c, LONG_M), 61, dtype), rand((c, LONG_M), 62, dtype));
        // BN's saved table (mean; invstd; scale; shift) and γ, in the table type
        let table = rand((4, c), 63, table_dtype);
        let table = Tensor::cat(
            &[
                &table.narrow(0, 0, 1).unwrap(),
                &(table.narrow(0, 1, 1).unwrap().abs().unwrap() + 0.5).unwrap(),
                &table.narrow(0, 2, 2).unwrap(),
            ],
            0,
        )
        .expect("table");
        let gamma = rand((1, c), 64, table_dtype).flatten_all().expect("gamma");
        let (_bx, xv) = in_buffer(&x, &dev);
        let (_bg, gv) = in_buffer(&gy, &dev);
        let d = |t: &Tensor| t.to_device(&dev).expect("to device");
        let (td, gd) = (d(&table), d(&gamma));
        let (st, affine) = (td.narrow(0, 0, 2).unwrap(), td.narrow(0, 2, 2).unwrap());
        let masked = bn_backward::relu_bwd_affine(&gv, &xv, &affine).expect("cuda mask");
        let fused = bn_backward::bn_bwd_reduce_relu(&gv, &xv, &td, &gd).expect("fused reduce");
        let two = bn_backward::bn_bwd_reduce(&masked, &xv, &st, &gd).expect("reduce");
        assert_bitwise(&fused, &two, &format!("bn_bwd_reduce_relu {dtype:?}"));
        let coef3 = two.narrow(0, 2, 3).unwrap();
        let dx = bn_backward::bn_bwd_dx_relu(&gv, &xv, &coef3, &affine).expect("fused dx");
        let dx_two = bn_backward::bn_bwd_dx(&masked, &xv, &coef3).expect("dx");
        assert_bitwise(&dx, &dx_two, &format!("bn_bwd_dx_relu {dtype:?}"));
        let on_cpu = |t: &Tensor| t.to_device(&Device::Cpu).unwrap();
        let cpu = bn_backward::bn_bwd_dx_relu(&gy, &x, &on_cpu(&coef3), &on_cpu(&affine))
            .expect("cpu fused dx");
        assert_bitwise(
            &dx,
            &cpu,
            &format!("bn_bwd_dx_relu {dtype:?} against the CPU"),
        );
        let (_ba, acc) = in_buffer(&x, &dev);
        let (_bb, acc_two) = in_buffer(&x, &dev);
        bn_backward::bn_bwd_dx_accumulate_relu(&acc, &gv, &xv, &coef3, &affine).expect("fused acc");
        bn_backward::bn_bwd_dx_accumulate(&acc_two, &masked, &xv, &coef3).expect("acc");
        assert_bitwise(
            &acc,
            &acc_two,
            &format!("bn_bwd_dx_accumulate_relu {dtype:?}"),
        );
    }
}
