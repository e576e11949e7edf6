//! The analytic memory model against the allocator: on CPU every candle allocation passes
//! through the global allocator, so the measured peak is exact, not noisy. One test only in
//! this binary, so no other test thread allocates while it measures.

use candle_core::{DType, Device};
use impls::layer;
use impls::model::predict_peak_bytes;
use impls::{Case, Config, Spatial, Variant};

mod counting;

use counting::{model_configs, Counting};

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The model ignores tensor headers and carries one allowance for gemm's
/// packing buffers (±150 KiB, under 2% of these configs' ≥ 9 MB peaks); issue 5's target is ±5%.
const MODEL_REL_TOL: f64 = 0.05;

#[test]
fn predicted_peak_matches_the_allocator_within_5_percent() {
    // wide and large enough for the CPU's split front: r in column chunks (M = 9216,
    // `layer::front_chunks`), its backward in column groups, then channel blocks (C_i ≥ 170,
    // `layer::dw_groups`, `layer::grad_blocks`)
    let split = Config {
        batch: 2,
        channels: 170,
        size: Spatial::new(64, 72),
        depth: 3,
        dtype: DType::F32,
        ..Config::bc100_block()
    };
    assert!(layer::front_chunks(split.m()).len() > 1);
    assert!(layer::dw_groups(split.m()).len() > 1);
    assert!(layer::grad_blocks(split.channels).len() > 1);
    // the split config also with the front whole (a GPU's order, the CPU's kernels)
    // Below the model's scale (impls::model::MODEL_MIN_PEAK_BYTES): two of the quick sweep's
    // blocks (peaks of 10–300 KB), where a few KiB the model does not follow are a visible
    // fraction; they are held to the band README states (×0.5…×1.1, here ×0.4…×1.5), which a
    // packing allowance of 128 KiB per thread that gemm never allocates there broke (×0.03…×0.6).
    let tiny = [
        Config {
            family: impls::Family::Mlp,
            batch: 32,
            channels: 16,
            growth: 8,
            depth: 4,
            bn_size: 1,
            size: Spatial::square(1),
            activation: true,
            dtype: DType::F32,
            seed: 0,
        },
        Config {
            batch: 4,
            channels: 8,
            growth: 4,
            depth: 4,
            bn_size: 2,
            size: Spatial::square(8),
            dtype: DType::F32,
            ..Config::bc100_block()
        },
    ];
    for cfg in &tiny {
        assert!(
            predict_peak_bytes(Variant::NAIVE, cfg).unwrap() < impls::model::MODEL_MIN_PEAK_BYTES
        );
    }
    let cases = model_configs()
        .into_iter()
        .map(|c| (c, false))
        .chain([(split.clone(), false), (split, true)])
        .chain(tiny.into_iter().map(|c| (c, false)));
    for (cfg, whole) in cases {
        let small =
            predict_peak_bytes(Variant::NAIVE, &cfg).unwrap() < impls::model::MODEL_MIN_PEAK_BYTES;
        let case = Case::random(&cfg, &Device::Cpu).unwrap();
        let label = format!(
            "{}{}",
            cfg.describe(),
            if whole { ", front whole" } else { "" }
        );
        for v in Variant::for_config(&cfg) {
            let measure = || {
                let Some(predicted) = predict_peak_bytes(v, &cfg) else {
                    assert_eq!(v, Variant::Autograd, "only autograd is not modelled");
                    return None;
                };
                Some((counting::measured_peak(v, &case) as usize, predicted))
            };
            let got = if whole {
                layer::with_whole_front(measure)
            } else {
                measure()
            };
            let Some((measured, predicted)) = got else {
                continue;
            };
            let ratio = measured as f64 / predicted as f64;
            eprintln!("{v} on {label}: ×{ratio:.4}");
            let within = if small {
                (0.4..=1.5).contains(&ratio)
            } else {
                (ratio - 1.0).abs() <= MODEL_REL_TOL
            };
            assert!(
                within,
                "{v} on {label}: measured {measured} B, predicted {predicted} B (×{ratio:.4})"
            );
        }
    }
}
