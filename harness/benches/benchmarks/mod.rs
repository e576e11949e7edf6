//! What every bench theme shares: the device, the full-run switch and the timing loop that
//! synchronises the device before the clock stops.

pub mod layout;
pub mod steps;

use candle_core::Device;
use densebench::measure::device::{DeviceOps, DeviceSpec};
use std::time::{Duration, Instant};

/// Set to `1` to run the slow configurations too (deeper blocks, every manual variant of
/// DenseNet-BC-100's block): roughly 10 minutes more on 2 cores.
pub const FULL_ENV: &str = "DENSEBENCH_BENCH_FULL";
/// The device to bench on, `cpu` (default) or `cuda:N` (needs `--features cuda`).
pub const DEVICE_ENV: &str = "DENSEBENCH_BENCH_DEVICE";

/// Whether [`FULL_ENV`] asks for the full set.
pub fn full() -> bool {
    std::env::var(FULL_ENV).is_ok_and(|v| v == "1")
}

/// The device named by [`DEVICE_ENV`]; panics with the reason when it cannot be opened (a bench
/// has no other way to report a setup error).
pub fn device() -> Device {
    let name = std::env::var(DEVICE_ENV).unwrap_or_else(|_| "cpu".to_string());
    name.parse::<DeviceSpec>()
        .and_then(|spec| spec.open())
        .unwrap_or_else(|e| panic!("{DEVICE_ENV}={name}: {e:#}"))
}

/// Times `iters` calls of `f` for criterion's `iter_custom`: the device is synchronised before
/// the clock starts and before it stops, and what `f` returns is dropped after the clock stops
/// (as the harness does: freeing the step's results is not part of the step).
pub fn time_iters<T>(device: &Device, iters: u64, mut f: impl FnMut() -> T) -> Duration {
    let sync = || {
        densebench::measure::device::synchronize(device).unwrap_or_else(|e| panic!("{e:#}"));
    };
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        sync();
        let start = Instant::now();
        let out = f();
        sync();
        total += start.elapsed();
        drop(out);
    }
    total
}
