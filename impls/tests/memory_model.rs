//! The analytic memory model against the allocator: on CPU every candle allocation passes
//! through the global allocator, so the measured peak is exact, not noisy. One test only in
//! this binary, so no other test thread allocates while it measures.

use candle_core::{DType, Device};
use impls::maths;
use impls::memory::predict_peak_bytes;
use impls::{step, Case, Config, NoProbe, Spatial, Variant};
use std::sync::atomic::Ordering::Relaxed;

mod counting;

use counting::{model_configs, Counting, LIVE, PEAK};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The model ignores tensor headers and carries one allowance for gemm's
/// packing buffers (±150 KiB, under 2% of these configs' ≥ 9 MB peaks); issue 5's target is ±5%.
const MODEL_REL_TOL: f64 = 0.05;

#[test]
fn predicted_peak_matches_the_allocator_within_5_percent() {
    // wide and large enough for the CPU's split front: r in column chunks (M = 9216,
    // `maths::front_chunks`), its backward in channel blocks (C_i ≥ 170, `maths::channel_blocks`)
    let split = Config {
        batch: 2,
        channels: 170,
        size: Spatial::new(64, 72),
        depth: 3,
        dtype: DType::F32,
        ..Config::bc100_block()
    };
    assert!(maths::front_chunks(split.m()).len() > 1);
    assert!(maths::channel_blocks(split.channels).len() > 1);
    for cfg in model_configs().into_iter().chain([split]) {
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
            eprintln!("{v} on {}: ×{ratio:.4}", cfg.describe());
            assert!(
                (ratio - 1.0).abs() <= MODEL_REL_TOL,
                "{v} on {}: measured {measured} B, predicted {predicted} B (×{ratio:.4})",
                cfg.describe()
            );
        }
    }
}
