//! GPU tests. Those named `gpu_*` need a usable `cuda:0` (a `--features cuda` build on a machine
//! with an NVIDIA GPU and driver); everywhere else they print why and return, so `cargo test`
//! passes on CPU-only machines. `no_gpu_*` tests run exactly where there is no usable GPU: the
//! behaviour a user without one sees. Run the GPU ones alone with `cargo test --features cuda
//! --test gpu -- --nocapture`.
//!
//! The test binary can run on a GPU machine without Rust: copy it and the `densebench` binary
//! there and point `DENSEBENCH_BIN` at the latter (see `common::bin`), e.g.
//! `DENSEBENCH_BIN=./densebench ./gpu-<hash> --nocapture`.

use candle_core::{DType, Device, Tensor};
use densebench::measure::gpu::{self, GpuInfo, PeakSource, PoolPeak};
use std::process::Command;

// Only `bin`, `BIN_ENV`, `TINY_RUN` and `TINY_MLP` are used here; the other helpers serve the CLI tests.
#[allow(dead_code)]
mod common;
use common::{bin, TINY_RUN};

/// `cuda:0` if it is usable; otherwise prints why the calling test is skipped. Only the
/// absence of a GPU skips (a build without `cuda`, no driver, no device): a GPU that is there
/// but fails its check (a driver call, an NVRTC newer than the driver) fails the test, so a GPU
/// session never reads a broken machine as a row of skips.
fn gpu_or_skip(test: &str) -> Option<GpuInfo> {
    match gpu::check_available(0) {
        Ok(info) => {
            println!("{test}: running on {}", info.describe());
            Some(info)
        }
        Err(e) => match e.downcast_ref::<gpu::GpuError>() {
            Some(
                gpu::GpuError::NotBuilt | gpu::GpuError::NoDriver | gpu::GpuError::NoDevice { .. },
            ) => {
                println!("{test}: skipped, no usable GPU: {e:#}");
                None
            }
            _ => panic!("{test}: cuda:0 is there but cannot be used: {e:#}"),
        },
    }
}

/// Where there is no usable GPU, asking for one fails at once with one line and no panic.
#[test]
fn no_gpu_run_on_cuda_fails_with_one_clear_line() {
    let why = match gpu::check_available(0) {
        Ok(info) => {
            println!("skipped: a GPU is present ({})", info.describe());
            return;
        }
        Err(e) => e.to_string(),
    };
    let o = Command::new(bin())
        .args(TINY_RUN)
        .args(["--device", "cuda:0"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("the densebench binary runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "exit status {:?}, stderr: {stderr}",
        o.status
    );
    // A panic exits with 101 and prints "panicked at" plus (with RUST_BACKTRACE=1) a backtrace.
    assert_ne!(o.status.code(), Some(101), "panicked: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("backtrace"), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    // The CLI must report the same reason the GPU module gives: "built without CUDA support"
    // without the feature, "device cuda:0 does not exist (0 devices)" or the failing driver
    // call with it.
    assert!(
        lines[0].contains(&why),
        "CLI said `{}`, gpu module says `{why}`",
        lines[0]
    );
}

/// `max-depth --device cuda:0` without a usable GPU: one line, exit status 2, before any run.
#[test]
fn no_gpu_max_depth_on_cuda_fails_with_one_clear_line() {
    let why = match gpu::check_available(0) {
        Ok(info) => {
            println!("skipped: a GPU is present ({})", info.describe());
            return;
        }
        Err(e) => e.to_string(),
    };
    let o = Command::new(bin())
        .arg("max-depth")
        .args(common::TINY_MLP)
        .args(["--budget", "1MiB", "--device", "cuda:0"])
        .output()
        .expect("the densebench binary runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line, got: {stderr}");
    assert!(
        lines[0].contains(&why),
        "CLI said `{}`, gpu module says `{why}`",
        lines[0]
    );
}

/// `max-depth --device cuda:0` on a GPU: every answer is confirmed by a measured run on the GPU
/// that fits the budget.
#[test]
fn gpu_max_depth_confirms_on_the_gpu() {
    if gpu_or_skip("gpu_max_depth_confirms_on_the_gpu").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("md.csv");
    let budget: u64 = 16 << 20;
    let o = Command::new(bin())
        .args([
            "max-depth",
            "--family",
            "mlp",
            "--batch",
            "256",
            "--channels",
            "16",
        ])
        .args([
            "--growth",
            "8",
            "--variants",
            "cat-store-copy,buffer-store-inplace",
        ])
        .args([
            "--budget",
            &budget.to_string(),
            "--device",
            "cuda:0",
            "--out",
        ])
        .arg(&out)
        .output()
        .expect("the densebench binary runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(stdout.contains("on cuda:0"), "{stdout}");
    let mut rdr = csv::Reader::from_path(&out).expect("csv");
    let rows: Vec<std::collections::HashMap<String, String>> =
        rdr.deserialize().map(|r| r.expect("row")).collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    for r in &rows {
        let at: u64 = r["measured_total_bytes"]
            .parse()
            .expect("measured at the answer");
        assert!(at <= budget, "{r:?}");
        assert!(
            r["max_depth"].parse::<usize>().expect("depth") >= 1,
            "{r:?}"
        );
    }
}

/// The typed error tells the cases apart for callers that must (skip vs fail).
#[test]
fn no_gpu_check_available_error_is_typed() {
    let Err(e) = gpu::check_available(0) else {
        println!("skipped: a GPU is present");
        return;
    };
    let typed = e.downcast_ref::<gpu::GpuError>();
    assert!(typed.is_some(), "untyped error: {e:#}");
    if cfg!(not(feature = "cuda")) {
        assert_eq!(typed, Some(&gpu::GpuError::NotBuilt));
    }
}

/// Held by every test that allocates on or measures the GPU in this process: the default
/// memory pool and its `USED_MEM_HIGH` are the process's, so a test's `reset` or its 64 MiB
/// tensors inside another test's measured window would fail that test (cargo runs tests on
/// several threads). Tests that measure in a `densebench` child process have a pool of their
/// own and need not hold it.
static POOL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A GPU opened as a measured run opens it (`DeviceSpec::open`: event tracking off, cuBLAS's
/// fixed workspace outside the pool), with [`POOL`] held for the test; or a skip.
fn cuda_device(test: &str) -> Option<(Device, std::sync::MutexGuard<'static, ()>)> {
    gpu_or_skip(test)?;
    // A test that failed while holding it poisoned it; the pool itself is fine.
    let serial = POOL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    use densebench::measure::device::{DeviceOps, DeviceSpec};
    match DeviceSpec::Cuda(0).open() {
        Ok(d) => Some((d, serial)),
        Err(e) => panic!("check_available(0) succeeded but densebench cannot open cuda:0: {e:#}"),
    }
}

const MIB: u64 = 1 << 20;

#[test]
fn gpu_pool_peak_sees_a_candle_allocation_and_its_free() {
    let Some((dev, _serial)) = cuda_device("gpu_pool_peak_sees_a_candle_allocation_and_its_free")
    else {
        return;
    };
    let peak = PoolPeak::new(0).expect("meter");
    dev.synchronize().expect("sync");
    let base = peak.reset().expect("reset");
    // 16 Mi f32 = 64 MiB, allocated through candle, then freed before the read.
    let t = Tensor::zeros((16 << 20,), DType::F32, &dev).expect("alloc");
    dev.synchronize().expect("sync");
    drop(t);
    let high = peak.read().expect("read");
    let grew = high.saturating_sub(base);
    println!("source {:?}, base {base} B, peak {high} B", peak.source());
    // The peak above the baseline is at least the tensor: the pool counts every byte candle
    // allocates from it. Pool allocations are rounded up to the pool's granularity (2 MiB),
    // so allow that much on top; the sampler is device-wide, so only the lower bound holds.
    assert!(grew >= 64 * MIB, "peak grew {grew} B, expected ≥ 64 MiB");
    if peak.source() == PeakSource::Pool {
        assert!(grew <= 66 * MIB, "peak grew {grew} B, expected ≤ 66 MiB");
        let now = peak.current().expect("current");
        assert!(
            now <= base + 2 * MIB,
            "{now} B still in use after the free, base {base} B"
        );
    } else {
        assert!(peak.warning().is_some());
    }
}

/// Runs the four in-place kernels on CUDA through narrowed views (non-zero start offsets) and
/// compares with the CPU kernels bit for bit: the ops are exact element-wise selections and
/// one IEEE addition each, so any difference is a bug, not rounding.
fn kernels_match_cpu(dev: &Device, dtype: DType) {
    use impls::ops::elementwise::{add_assign, relu_bwd, relu_bwd_inplace, relu_inplace};
    // Rows 0 and 3 of the [4, 1000] buffers are outside every view and must stay untouched.
    let (rows, cols) = (4usize, 1000usize);
    let make = |seed: f64, d: &Device| {
        let v: Vec<f64> = (0..rows * cols)
            .map(|i| ((i as f64 * 0.37 + seed).sin() * 3.0).round() / 2.0)
            .collect();
        Tensor::from_vec(v, (rows, cols), d)
            .and_then(|t| t.to_dtype(dtype))
            .expect("tensor")
    };
    let on = |d: &Device| {
        let (x, g, o, acc) = (make(0.0, d), make(1.0, d), make(2.0, d), make(3.0, d));
        let view = |t: &Tensor| t.narrow(0, 1, 2).expect("narrow");
        relu_inplace(view(&x)).expect("relu_inplace");
        let fresh = relu_bwd(&view(&g), &view(&o)).expect("relu_bwd");
        relu_bwd_inplace(view(&g), &view(&o)).expect("relu_bwd_inplace");
        add_assign(&view(&acc), &view(&o)).expect("add_assign");
        [x, fresh, g, acc].map(|t| {
            t.to_dtype(DType::F64)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f64>())
                .expect("to host")
        })
    };
    let (gpu, cpu) = (on(dev), on(&Device::Cpu));
    for (name, (a, b)) in ["relu_inplace", "relu_bwd", "relu_bwd_inplace", "add_assign"]
        .iter()
        .zip(gpu.iter().zip(cpu.iter()))
    {
        assert_eq!(a, b, "{name} ({dtype:?}): CUDA and CPU differ");
    }
}

#[test]
fn gpu_inplace_kernels_match_cpu_through_views() {
    let Some((dev, _serial)) = cuda_device("gpu_inplace_kernels_match_cpu_through_views") else {
        return;
    };
    kernels_match_cpu(&dev, DType::F32);
    kernels_match_cpu(&dev, DType::F64);
}

/// An in-place op allocates nothing on the GPU: the pool's peak does not move.
#[test]
fn gpu_inplace_add_allocates_nothing() {
    let Some((dev, _serial)) = cuda_device("gpu_inplace_add_allocates_nothing") else {
        return;
    };
    let peak = PoolPeak::new(0).expect("meter");
    if peak.source() != PeakSource::Pool {
        println!("skipped: no memory pools, the sampler cannot resolve a zero-byte difference");
        return;
    }
    let dst = Tensor::zeros((4, 1 << 20), DType::F32, &dev).expect("dst");
    let src = Tensor::ones((2, 1 << 20), DType::F32, &dev).expect("src");
    // Load the kernels (NVRTC + module load) outside the measured window.
    impls::ops::elementwise::add_assign(&dst.narrow(0, 0, 2).expect("view"), &src)
        .expect("warm-up");
    dev.synchronize().expect("sync");
    let base = peak.reset().expect("reset");
    impls::ops::elementwise::add_assign(&dst.narrow(0, 1, 2).expect("view"), &src).expect("add");
    let high = peak.read().expect("read");
    assert_eq!(
        high,
        base,
        "an in-place add allocated {} B",
        high.saturating_sub(base)
    );
}

/// The whole pipeline on the GPU: one checked row, exit status 0.
#[test]
fn gpu_run_prints_one_checked_row() {
    if gpu_or_skip("gpu_run_prints_one_checked_row").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    let o = Command::new(bin())
        .args(TINY_RUN)
        .args(["--device", "cuda:0", "--cache-dir"])
        .arg(&cache)
        .output()
        .expect("the densebench binary runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(stdout.lines().count(), 2, "header and one row: {stdout}");
}

/// Prints the binary the tests drive; run only by
/// [`densebench_bin_env_overrides_the_build_path`] (in a child process, with the variable set).
#[test]
#[ignore = "helper of densebench_bin_env_overrides_the_build_path"]
fn print_binary_under_test() {
    println!("binary under test: {}", bin().display());
}

/// A copied test binary finds `densebench` through `DENSEBENCH_BIN`, not the path it was built
/// at: the child run of this test binary reports the overriding path (any existing file will
/// do; this test binary itself is one).
#[test]
fn densebench_bin_env_overrides_the_build_path() {
    let me = std::env::current_exe().expect("the test binary's path");
    let o = Command::new(&me)
        .args([
            "--ignored",
            "--exact",
            "print_binary_under_test",
            "--nocapture",
        ])
        .env(common::BIN_ENV, &me)
        .output()
        .expect("the test binary runs");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let want = format!("binary under test: {}", me.display());
    assert!(out.contains(&want), "expected `{want}` in:\n{out}");
}

/// Pool bytes a fused op may take on top of its output: the pool rounds allocations up (2 MiB
/// granularity at most, measured above for a 64 MiB tensor) and some ops write per-channel
/// tables of a few KiB (`bn_stats`, `bn_prepare`, `bn_bwd_reduce`). 4 MiB covers two such
/// roundings, and is far below any hidden full-size temporary (8–64 MiB at these shapes).
const FUSED_POOL_SLACK_BYTES: u64 = 4 * MIB;

/// Each fused op on the GPU allocates its output and nothing else of the input's size, like
/// its CPU twin (the memory model holds on both devices): the pool's peak grows by the output's
/// bytes, within [`FUSED_POOL_SLACK_BYTES`]. The candle-op compositions these kernels replace
/// took one to three `[C, M]` temporaries (BN) or padded every tap (shift).
#[test]
fn gpu_fused_ops_allocate_only_their_output() {
    use impls::ops::layout::grid::{Grid, TAPS};
    use impls::ops::{bn, bn_backward, shift};
    let Some((dev, _serial)) = cuda_device("gpu_fused_ops_allocate_only_their_output") else {
        return;
    };
    let peak = PoolPeak::new(0).expect("meter");
    if peak.source() != PeakSource::Pool {
        println!("skipped: no memory pools, the sampler cannot resolve these differences");
        return;
    }
    // [C, M] f32 = 64 MiB; the shift ops on K = 8 channels (stack: 72 MiB out, sum: 8 MiB).
    const C: usize = 64;
    const K: usize = 8;
    let grid = Grid {
        n: 4,
        h: 256,
        w: 256,
    };
    let m = grid.n * grid.h * grid.w;
    let f32s = |rows: usize| (rows * m * 4) as u64;
    let rand =
        |rows: usize, cols: usize| Tensor::randn(0f32, 1.0, (rows, cols), &dev).expect("randn");
    let (x, gy, dst) = (rand(C, m), rand(C, m), rand(C, m));
    // planar per-channel tables: (scale; shift), (mean; invstd), (A; B; C), and γ, β, running
    let (coef2, st, coef3) = (rand(2, C), rand(2, C), rand(3, C));
    let vec_c = || rand(1, C).flatten_all().expect("vector");
    let (gamma, beta, rmean, rvar) = (vec_c(), vec_c(), vec_c(), vec_c());
    let mv = Tensor::stack(&[vec_c(), vec_c().abs().expect("abs")], 0).expect("mv");
    let (t, p) = (rand(K, m), rand(9 * K, m));
    let offsets = TAPS.map(|(dy, dx)| (dy as isize - 1, dx as isize - 1));

    let measure = |what: &str, expected: u64, op: &dyn Fn() -> Vec<Tensor>| {
        // Warm-up: NVRTC compilation and module loading happen outside the measured window.
        drop(op());
        dev.synchronize().expect("sync");
        let base = peak.reset().expect("reset");
        let out = op();
        dev.synchronize().expect("sync");
        let high = peak.read().expect("read");
        drop(out);
        let grew = high.saturating_sub(base);
        println!("{what}: peak grew {grew} B, output {expected} B");
        assert!(
            grew >= expected && grew <= expected + FUSED_POOL_SLACK_BYTES,
            "{what}: peak grew {grew} B, expected {expected} B + at most {FUSED_POOL_SLACK_BYTES}"
        );
    };
    measure("bn_stats", 0, &|| vec![bn::bn_stats(&x).expect("bn_stats")]);
    measure("bn_prepare", 0, &|| {
        let (t, r) = bn::bn_prepare(&mv, &gamma, &beta, &rmean, &rvar, m).expect("bn_prepare");
        vec![t, r]
    });
    measure("affine_rows", f32s(C), &|| {
        vec![bn::affine_rows(&x, &coef2).expect("affine")]
    });
    measure("affine_rows_relu", f32s(C), &|| {
        vec![bn::affine_rows_relu(&x, &coef2).expect("affine relu")]
    });
    measure("bn_bwd_reduce", 0, &|| {
        vec![bn_backward::bn_bwd_reduce(&gy, &x, &st, &gamma).expect("reduce")]
    });
    measure("bn_bwd_dx", f32s(C), &|| {
        vec![bn_backward::bn_bwd_dx(&gy, &x, &coef3).expect("dx")]
    });
    measure("bn_bwd_dx_accumulate", 0, &|| {
        bn_backward::bn_bwd_dx_accumulate(&dst, &gy, &x, &coef3).expect("accumulate");
        Vec::new()
    });
    // the ReLU after BN fused into its backward: the plain ops' allocations
    let table = rand(4, C);
    measure("bn_bwd_reduce_relu", 0, &|| {
        vec![bn_backward::bn_bwd_reduce_relu(&gy, &x, &table, &gamma).expect("reduce relu")]
    });
    measure("bn_bwd_dx_relu", f32s(C), &|| {
        vec![bn_backward::bn_bwd_dx_relu(&gy, &x, &coef3, &coef2).expect("dx relu")]
    });
    measure("bn_bwd_dx_accumulate_relu", 0, &|| {
        let acc = bn_backward::bn_bwd_dx_accumulate_relu(&dst, &gy, &x, &coef3, &coef2);
        acc.expect("accumulate relu");
        Vec::new()
    });
    // BN2's statistics and per-channel step in one op: a [6, C] table
    measure("bn_stats_prepare", 0, &|| {
        let p = bn::bn_stats_prepare(&x, &gamma, &beta, &rmean, &rvar).expect("stats prepare");
        vec![p.0, p.1]
    });
    measure("shift_stack", f32s(9 * K), &|| {
        vec![shift::shift_stack(&t, grid, offsets).expect("stack")]
    });
    measure("shift_sum", f32s(K), &|| {
        vec![shift::shift_sum(&p, grid, offsets).expect("sum")]
    });
}

/// The `run` arguments of a small bc block (N=16, 16×16, C0=24, k=12) of `depth` layers.
fn small_bc(depth: &'static str) -> [&'static str; 12] {
    [
        "--family",
        "bc",
        "--batch",
        "16",
        "--size",
        "16",
        "--channels",
        "24",
        "--growth",
        "12",
        "--depth",
        depth,
    ]
}

/// `densebench run ARGS --variant V --device cuda:0` through `cmd` (the binary, with any
/// environment already set; the reference cache in `dir`): its one row,
/// asserted `ok` with its gradients within tolerance.
fn checked_gpu_row(
    args: &[&str],
    v: impls::Variant,
    dir: &std::path::Path,
    mut cmd: Command,
) -> densebench::results::row::Row {
    let o = cmd
        .arg("run")
        .args(args)
        .args(["--variant", &v.name(), "--device", "cuda:0", "--cache-dir"])
        .arg(dir.join("cache"))
        .output()
        .expect("the densebench binary runs");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{v}: {stderr}");
    let out = dir.join("row.csv");
    std::fs::write(&out, &o.stdout).expect("write the row");
    let r = densebench::results::row::read_rows(&out)
        .expect("one valid row")
        .swap_remove(0);
    assert_eq!(r.status, "ok", "{}: {}", r.key, r.error);
    assert_eq!(r.grad_ok, Some(true), "{}: {:?}", r.key, r.max_rel_err);
    r
}

/// Issue 11, item 3: on the GPU's memory pool every modelled variant's measured peak is within
/// ±5% of the model charged with the pool's measured rounding (the child measures what the pool
/// charges for each allocation size the model makes; the CPU checks the charged model against a
/// rounding allocator in `impls/tests/memory_model_pool.rs`). Small bc and mlp blocks, whose
/// tensors (0.2–1.7 MiB) are the sizes a pool's rounding distorts most.
#[test]
fn gpu_rows_peak_within_5_percent_of_the_pool_charged_model() {
    if gpu_or_skip("gpu_rows_peak_within_5_percent_of_the_pool_charged_model").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let bc = small_bc("6");
    let configs: [&[&str]; 2] = [
        &bc,
        &[
            "--family",
            "mlp",
            "--batch",
            "2048",
            "--channels",
            "64",
            "--growth",
            "32",
            "--depth",
            "6",
        ],
    ];
    let mut worst = (0.0f64, String::new());
    for (args, family) in configs.iter().zip([impls::Family::Bc, impls::Family::Mlp]) {
        let cfg = impls::Config::tiny(family);
        for v in impls::Variant::for_config(&cfg) {
            if v == impls::Variant::Autograd {
                continue;
            }
            let r = &checked_gpu_row(args, v, dir.path(), Command::new(bin()));
            let why = || format!("{}: no peak or prediction; note: {}", r.key, r.note);
            let (peak, predicted) = (
                r.peak_bytes.unwrap_or_else(|| panic!("{}", why())),
                r.predicted_peak_bytes
                    .unwrap_or_else(|| panic!("{}", why())),
            );
            let ratio = peak as f64 / predicted as f64;
            println!(
                "{}: measured {peak} B, predicted {predicted} B, ×{ratio:.4} ({})",
                r.key, r.note
            );
            if (ratio - 1.0).abs() > worst.0 {
                worst = ((ratio - 1.0).abs(), r.key.clone());
            }
            assert!(
                (ratio - 1.0).abs() <= 0.05,
                "{}: measured {peak} B, predicted {predicted} B (×{ratio:.4}); {}",
                r.key,
                r.device_desc
            );
        }
    }
    println!(
        "worst |measured/predicted − 1| = {:.4} ({})",
        worst.0, worst.1
    );
}

/// Issue 38 item 1: the bc layer's 3×3 convolution in cuDNN (`DENSEBENCH_CONV=cudnn` in a
/// `cudnn` build), in densebench's direct kernels (`DENSEBENCH_CONV=direct`) and on the tap
/// stack (the default, and `DENSEBENCH_CONV=tap-stack`), each as a row of a small bc block:
/// every one `ok` with their gradients checked, each row's `note` naming the path it ran
/// (cuDNN's algorithms and workspaces, the direct kernels' partials, or neither), and each
/// measured peak equal to the model of that path charged with
/// the pool's rounding (×1.000 ± 0.001); in a `cudnn` build also cuDNN with every pass on
/// packed copies (`DENSEBENCH_CUDNN_STAGING=packed`, the fallback where cuDNN refuses the
/// channel-major strides: its copies counted in the workspaces the model charges). A binary
/// without the feature runs the tap stack for both and refuses `DENSEBENCH_CONV=cudnn` with
/// one line.
#[test]
fn gpu_conv_in_cudnn_and_on_the_tap_stack_are_both_checked_and_modelled() {
    if gpu_or_skip("gpu_conv_in_cudnn_and_on_the_tap_stack_are_both_checked_and_modelled").is_none()
    {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let args = small_bc("4");
    let cudnn_built = cfg!(feature = "cudnn");
    for v in ["cat-store-copy", "buffer-recompute-inplace"] {
        let v = impls::Variant::parse(v).expect("variant");
        let settings: &[&str] = if cudnn_built {
            &[
                "cudnn",
                "cudnn-packed",
                "direct",
                "direct-fma",
                "default",
                "tap-stack",
            ]
        } else {
            &["direct", "direct-fma", "default", "tap-stack"]
        };
        for &conv in settings {
            let mut cmd = Command::new(bin());
            // "default": unset even where the session exports it (gpu-session's
            // `DENSEBENCH_CONV=cudnn … tests`)
            cmd.env_remove("DENSEBENCH_CUDNN_STAGING");
            match conv {
                "default" => {
                    cmd.env_remove("DENSEBENCH_CONV");
                }
                "cudnn-packed" => {
                    cmd.env("DENSEBENCH_CONV", "cudnn")
                        .env("DENSEBENCH_CUDNN_STAGING", "packed");
                }
                _ => {
                    cmd.env("DENSEBENCH_CONV", conv);
                }
            }
            let r = checked_gpu_row(&args, v, dir.path(), cmd);
            let in_cudnn = r.note.contains("3×3 convolution in cuDNN");
            assert_eq!(
                in_cudnn,
                conv.starts_with("cudnn"),
                "{} ({conv}): note {}",
                r.key,
                r.note
            );
            let direct = r.note.contains("densebench's direct kernels");
            assert_eq!(
                direct,
                conv.starts_with("direct"),
                "{} ({conv}): note {}",
                r.key,
                r.note
            );
            // f32 in IEEE math: the direct kernels' fused multiply-adds either way
            assert!(
                !r.note.contains("tensor cores"),
                "{} ({conv}): tensor cores in IEEE math: {}",
                r.key,
                r.note
            );
            if conv == "cudnn-packed" {
                assert_eq!(
                    r.note.matches("on packed copies").count(),
                    3,
                    "{}: every pass on packed copies: {}",
                    r.key,
                    r.note
                );
            }
            let (peak, predicted) = (
                r.peak_bytes.expect("peak"),
                r.predicted_peak_bytes.expect("prediction"),
            );
            let ratio = peak as f64 / predicted as f64;
            println!("{} ({conv}): ×{ratio:.6}, {} B; {}", r.key, peak, r.note);
            assert!(
                (ratio - 1.0).abs() <= 0.001,
                "{} ({conv}): measured {peak} B, predicted {predicted} B (×{ratio:.6}); {}",
                r.key,
                r.note
            );
        }
    }
    // the direct kernels' tensor cores (sm_80+): f32 under `--math tf32`, bf16 features; checked
    // and modelled like every row, `direct-fma` the same rows without them
    for (extra, cores) in [
        (["--math", "tf32"], "direct kernels (TF32 tensor cores"),
        (["--dtype", "bf16"], "direct kernels (bf16 tensor cores"),
    ] {
        let v = impls::Variant::parse("buffer-recompute-inplace").expect("variant");
        let all: Vec<&str> = args.iter().copied().chain(extra).collect();
        for conv in ["direct", "direct-fma"] {
            let mut cmd = Command::new(bin());
            cmd.env_remove("DENSEBENCH_CUDNN_STAGING")
                .env("DENSEBENCH_CONV", conv);
            let r = checked_gpu_row(&all, v, dir.path(), cmd);
            assert_eq!(
                r.note.contains(cores),
                conv == "direct",
                "{} ({conv}, {extra:?}): note {}",
                r.key,
                r.note
            );
            let ratio = r.peak_bytes.expect("peak") as f64
                / r.predicted_peak_bytes.expect("prediction") as f64;
            println!("{} ({conv}, {extra:?}): ×{ratio:.6}; {}", r.key, r.note);
            assert!(
                (ratio - 1.0).abs() <= 0.001,
                "{} ({conv}, {extra:?}): ×{ratio:.6}; {}",
                r.key,
                r.note
            );
        }
    }
    if !cudnn_built {
        let o = Command::new(bin())
            .env("DENSEBENCH_CONV", "cudnn")
            .arg("run")
            .args(args)
            .args([
                "--variant",
                "cat-store-copy",
                "--device",
                "cuda:0",
                "--cache-dir",
            ])
            .arg(dir.path().join("cache"))
            .output()
            .expect("the densebench binary runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(
            text.contains("DENSEBENCH_CONV") && text.contains("--features cudnn"),
            "{text}"
        );
    }
}

/// Issue 11 item 5, as graph rows (issue 36): every hand-written variant of a small bc block,
/// as a `run --execution graph` row on `cuda:0`, is timed as one CUDA graph (`measure::graph`)
/// whose replayed results are bitwise the checked eager step's (the child reports a timing only
/// then; without one the row is an `error`): an `ok` row whose `execution` is `graph`, whose key
/// ends in `/graph`, with the replays' times in its timing columns and no forward/backward
/// split. Prints the eager (from the note) and the graph median side by side.
#[test]
fn gpu_rows_are_timed_as_a_cuda_graph_with_the_eager_results() {
    if gpu_or_skip("gpu_rows_are_timed_as_a_cuda_graph_with_the_eager_results").is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let cfg = impls::Config::tiny(impls::Family::Bc);
    for v in impls::Variant::for_config(&cfg) {
        if v == impls::Variant::Autograd {
            continue;
        }
        let mut args = small_bc("8").to_vec();
        args.extend(["--execution", "graph"]);
        let mut cmd = Command::new(bin());
        cmd.env_remove(densebench::measure::graph::ENV);
        let r = &checked_gpu_row(&args, v, dir.path(), cmd);
        assert_eq!(r.execution, "graph", "{}", r.key);
        assert!(r.key.ends_with("/cuda:0/graph"), "{}", r.key);
        assert_eq!(
            r.fwd_median_ns, None,
            "{}: a replay has no forward/backward split",
            r.key
        );
        let graph = r.median_ns.expect("graph median");
        println!(
            "{}: CUDA graph median {:.3} ms; {}",
            r.key,
            graph as f64 / 1e6,
            r.note
        );
    }
}

/// What the pool charges per allocation (issue 11 item 3's "pool's rounding measured"):
/// printed for a range of sizes, so the first GPU run records the rule; each charge is at
/// least the request and, for requests of a MiB and more, under 2 MiB above it.
#[test]
fn gpu_pool_charges_at_least_each_request() {
    let Some((dev, _serial)) = cuda_device("gpu_pool_charges_at_least_each_request") else {
        return;
    };
    let meter = densebench::measure::device::MemoryMeter::for_device(
        densebench::measure::device::DeviceSpec::Cuda(0),
    )
    .expect("meter");
    let sizes: std::collections::BTreeSet<u64> = [
        4,
        1000,
        4096,
        65_536,
        MIB - 4,
        MIB,
        3 * MIB,
        3 * MIB + 4,
        5 * MIB + 12_345,
        64 * MIB,
    ]
    .into_iter()
    .collect();
    let Some(charges) = meter.pool_charges(&dev, &sizes).expect("pool charges") else {
        println!("no memory pool on this device: nothing to measure");
        return;
    };
    // every size printed before any assertion: the rule is recorded even where it surprises
    for (bytes, charged) in &charges {
        println!(
            "request {bytes} B: charged {charged} B ({:+} B)",
            *charged as i64 - *bytes as i64
        );
    }
    assert_eq!(
        densebench::measure::device::undercharged(&charges),
        None,
        "{charges:?}"
    );
    for (bytes, charged) in &charges {
        if *bytes >= MIB {
            assert!(charged - bytes < 2 * MIB, "{bytes} B charged {charged} B");
        }
    }
}
