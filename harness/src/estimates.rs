//! Analytic columns of a row that come from the config, not from the measurement: predicted
//! peak memory, FLOPs of a step, achieved and machine GFLOP/s. Each is one small function so
//! the memory model can be plugged in without touching the measurement code.

use impls::{Config, Variant};

/// Predicted `peak_bytes` of one training step of `variant` on `cfg`.
// TODO(issue 5): `impls::memory::predict_peak_bytes(variant, cfg)` once the model exists.
pub fn predicted_peak_bytes(_variant: Variant, _cfg: &Config) -> Option<u64> {
    None
}

/// Floating-point operations of one training step (matmuls and convolutions, both passes).
// TODO(issue 5): `impls::memory::flops(cfg)` once the model exists.
pub fn flops(_cfg: &Config) -> Option<u64> {
    None
}

/// Achieved rate: `flops / median_ns` (FLOP per ns = GFLOP/s).
pub fn gflops_per_s(flops: Option<u64>, median_ns: Option<u64>) -> Option<f64> {
    match (flops, median_ns) {
        (Some(f), Some(ns)) if ns > 0 => Some(f as f64 / ns as f64),
        _ => None,
    }
}

/// This machine's measured matmul rate, for the `machine_gflops` column.
// TODO(issue 5): measure once per run (a large square matmul in a child process).
pub fn machine_gflops() -> Option<f64> {
    None
}

/// Declared bytes kept for backward (from `impls::memory`), `None` for autograd.
pub fn declared_saved_bytes(variant: Variant, cfg: &Config) -> Option<u64> {
    impls::memory::declared_saved_bytes(variant, cfg).map(|b| b as u64)
}

/// A rough relative cost of one step, for the sweep's ETA only: multiply-adds of the layers'
/// matmuls and convolutions (forward; backward is about twice that, a constant factor).
// TODO(issue 5/7): use the FLOP model (and predicted time) once it exists.
pub fn relative_cost(variant: Variant, cfg: &Config) -> f64 {
    let m = cfg.m() as f64;
    let (k, b) = (cfg.growth as f64, cfg.bottleneck() as f64);
    let macs: f64 = (0..cfg.depth)
        .map(|i| {
            let c = cfg.c_in(i) as f64;
            match cfg.family {
                impls::Family::Mlp => m * c * k,
                // Conv1×1 (c → b), Conv3×3 (b → k), plus BN/ReLU passes over c and b channels.
                impls::Family::Bc => m * (c * b + 9.0 * b * k + 10.0 * (c + b)),
            }
        })
        .sum();
    // candle's autograd is the slowest path (every op through the graph, NCHW convolutions).
    let factor = if variant == Variant::Autograd {
        3.0
    } else {
        1.0
    };
    (macs * factor).max(1.0)
}
