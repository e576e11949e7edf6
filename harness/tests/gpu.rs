//! GPU tests. Those named `gpu_*` need a usable `cuda:0` (a `--features cuda` build on a machine
//! with an NVIDIA GPU and driver); everywhere else they print why and return, so `cargo test`
//! passes on CPU-only machines. `no_gpu_*` tests run exactly where there is no usable GPU: the
//! behaviour a user without one sees. Run the GPU ones alone with `cargo test --features cuda
//! --test gpu -- --nocapture`.

use candle_core::{DType, Device, Tensor};
use densebench::measure::gpu::{self, GpuInfo, PeakSource, PoolPeak};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_densebench");

/// The smallest `run` the CLI documents (README, `densebench run --help`).
const TINY_RUN: &[&str] = &[
    "run",
    "--family",
    "mlp",
    "--variant",
    "cat-store-copy",
    "--depth",
    "2",
    "--batch",
    "2",
    "--growth",
    "2",
    "--channels",
    "2",
];

/// `cuda:0` if it is usable; otherwise prints why the calling test is skipped.
fn gpu_or_skip(test: &str) -> Option<GpuInfo> {
    match gpu::check_available(0) {
        Ok(info) => {
            println!("{test}: running on {}", info.describe());
            Some(info)
        }
        Err(e) => {
            println!("{test}: skipped, no usable GPU: {e:#}");
            None
        }
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
    let o = Command::new(BIN)
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

/// A GPU as candle opens it, or a skip.
fn cuda_device(test: &str) -> Option<Device> {
    gpu_or_skip(test)?;
    match Device::new_cuda(0) {
        Ok(d) => Some(d),
        Err(e) => panic!("check_available(0) succeeded but candle cannot open cuda:0: {e}"),
    }
}

const MIB: u64 = 1 << 20;

#[test]
fn gpu_pool_peak_sees_a_candle_allocation_and_its_free() {
    let Some(dev) = cuda_device("gpu_pool_peak_sees_a_candle_allocation_and_its_free") else {
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
    use impls::kernels::{add_assign, relu_bwd, relu_bwd_inplace, relu_inplace};
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
    let Some(dev) = cuda_device("gpu_inplace_kernels_match_cpu_through_views") else {
        return;
    };
    kernels_match_cpu(&dev, DType::F32);
    kernels_match_cpu(&dev, DType::F64);
}

/// An in-place op allocates nothing on the GPU: the pool's peak does not move.
#[test]
fn gpu_inplace_add_allocates_nothing() {
    let Some(dev) = cuda_device("gpu_inplace_add_allocates_nothing") else {
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
    impls::kernels::add_assign(&dst.narrow(0, 0, 2).expect("view"), &src).expect("warm-up");
    dev.synchronize().expect("sync");
    let base = peak.reset().expect("reset");
    impls::kernels::add_assign(&dst.narrow(0, 1, 2).expect("view"), &src).expect("add");
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
    let o = Command::new(BIN)
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
