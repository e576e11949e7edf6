//! The analytic memory model against the allocator: on CPU every candle allocation passes
//! through the global allocator, so the measured peak is exact, not noisy. One test only in
//! this binary, so no other test thread allocates while it measures.

use candle_core::{DType, Device};
use impls::memory::predict_peak_bytes;
use impls::{step, Case, Config, Family, NoProbe, Spatial, Variant};
use std::sync::atomic::Ordering::Relaxed;

mod counting;

use counting::{Counting, LIVE, PEAK};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The model ignores per-channel vectors and tensor headers and carries one allowance for gemm's
/// packing buffers (±150 KiB, under 2% of these configs' ≥ 9 MB peaks); issue 5's target is ±5%.
const MODEL_REL_TOL: f64 = 0.05;

#[test]
fn predicted_peak_matches_the_allocator_within_5_percent() {
    let configs = [
        Config {
            batch: 16,
            size: Spatial::square(16),
            depth: 6,
            dtype: DType::F32,
            ..Config::bc100_block()
        },
        // Non-square maps: M = N·H·W = 16·12·20, not N·H² or N·W².
        Config {
            batch: 16,
            size: Spatial::new(12, 20),
            depth: 6,
            dtype: DType::F32,
            ..Config::bc100_block()
        },
        Config {
            family: Family::Mlp,
            batch: 2048,
            channels: 64,
            growth: 32,
            depth: 6,
            bn_size: 1,
            size: Spatial::square(1),
            activation: true,
            dtype: DType::F64,
            seed: 1,
        },
        Config {
            family: Family::Mlp,
            batch: 4096,
            channels: 96,
            growth: 16,
            depth: 5,
            bn_size: 1,
            size: Spatial::square(1),
            activation: false,
            dtype: DType::F32,
            seed: 2,
        },
    ];
    for cfg in configs {
        let case = Case::random(&cfg, &Device::Cpu).unwrap();
        for v in Variant::for_config(&cfg) {
            let Some(predicted) = predict_peak_bytes(v, &cfg) else {
                assert_eq!(v, Variant::Autograd, "only autograd is not modelled");
                continue;
            };
            let run = || {
                step(
                    v,
                    &cfg,
                    &case.params,
                    &case.input,
                    &case.grad_output,
                    &mut NoProbe,
                )
                .unwrap()
            };
            drop(run()); // warm-up: settles gemm's thread-local scratch
            let base = LIVE.load(Relaxed);
            PEAK.store(base, Relaxed);
            let r = run();
            let measured = PEAK.load(Relaxed) - base;
            drop(r);
            let ratio = measured as f64 / predicted as f64;
            assert!(
                (ratio - 1.0).abs() <= MODEL_REL_TOL,
                "{v} on {}: measured {measured} B, predicted {predicted} B (×{ratio:.4})",
                cfg.describe()
            );
        }
    }
}
