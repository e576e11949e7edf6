//! One training step (`impls::step`: forward, backward, every gradient) of each variant on a few
//! canonical configurations. One criterion group per family and config, named by
//! `densebench::results::criterion::group_name` (e.g. `bc-N16-C24-k12-bn4-8x8`); the benchmark id
//! is the variant's stable name and the depth. The case (parameters, input, upstream gradient)
//! is built once per config, outside the timed region, and shared by every variant.
//!
//! Every group samples flat (the same iteration count per sample, at least one): a step takes
//! 20 ms to 5 s here, and criterion's default linear sampling would run 55 steps for 10 samples.
//! The machine is shared, so read ratios within one run rather than absolute times.

use super::{device, full, time_iters};
use candle_core::{DType, Device};
use criterion::{BenchmarkId, Criterion, SamplingMode};
use densebench::results::criterion::group_name;
use impls::{Case, Config, Family, NoProbe, Spatial, Variant};
use std::time::Duration;

/// The forum's block: Linear(C0 + i·k → k) + ReLU on a batch of 4096 features.
const MLP_BATCH: usize = 4096;
const MLP_CHANNELS: usize = 256;
const MLP_GROWTH: usize = 64;
/// Default depths of the mlp block (a step takes 0.2–1.5 s on 2 cores).
const MLP_DEPTHS: &[usize] = &[8, 16];
/// Added by `DENSEBENCH_BENCH_FULL=1` (1.5–3 s per step).
const MLP_DEPTHS_FULL: &[usize] = &[32];

/// DenseNet-BC on 16 images of 8×8: the sweep's depth series at a size criterion can sample.
const BC_SMALL_BATCH: usize = 16;
const BC_SMALL_CHANNELS: usize = 24;
const BC_SMALL_GROWTH: usize = 12;
const BC_SMALL_BN_SIZE: usize = 4;
const BC_SMALL_SIZE: Spatial = Spatial::square(8);
/// Default depths (20 ms–1.2 s per step), and those added by the full set.
const BC_SMALL_DEPTHS: &[usize] = &[8, 16];
const BC_SMALL_DEPTHS_FULL: &[usize] = &[32];

/// Variants of DenseNet-BC-100's block (N=64, 32×32, L=16; about 2 s per step on 2 cores, up to
/// 5 s when loaded) in the default set: the naive one and the linear-memory one (shared buffer +
/// recompute + in-place ReLU), the two ends of the trade-off. The full set runs every manual variant. `autograd` is never run at this
/// size (about 50 s per step, so 10 samples take over 9 minutes); harness rows cover it.
const BC100_DEFAULT_VARIANTS: &[&str] = &["cat-store-copy", "buffer-recompute-inplace"];

/// Criterion's minimum sample count, used everywhere: a step is long enough that 10 samples
/// already give a usable median, and the default (100) would take hours.
const SAMPLES: usize = 10;

/// Warm-up and measurement time per benchmark. Warm-up settles the allocator and gemm's scratch;
/// one step is enough for it, which is what a warm-up shorter than a step gives.
const FAST_WARM_UP: Duration = Duration::from_millis(500);
const FAST_MEASUREMENT: Duration = Duration::from_secs(2);
const SLOW_WARM_UP: Duration = Duration::from_secs(1);
const SLOW_MEASUREMENT: Duration = Duration::from_secs(5);
/// DenseNet-BC-100: one warm-up step, then 10 samples of one step (criterion warns that 10
/// samples do not fit; they are taken anyway).
const BC100_WARM_UP: Duration = Duration::from_millis(100);
const BC100_MEASUREMENT: Duration = Duration::from_secs(20);

fn mlp(depth: usize) -> Config {
    Config {
        family: Family::Mlp,
        batch: MLP_BATCH,
        channels: MLP_CHANNELS,
        growth: MLP_GROWTH,
        depth,
        bn_size: 1,
        size: Spatial::square(1),
        activation: true,
        dtype: DType::F32,
        seed: 0,
    }
}

fn bc_small(depth: usize) -> Config {
    Config {
        family: Family::Bc,
        batch: BC_SMALL_BATCH,
        channels: BC_SMALL_CHANNELS,
        growth: BC_SMALL_GROWTH,
        depth,
        bn_size: BC_SMALL_BN_SIZE,
        size: BC_SMALL_SIZE,
        activation: true,
        dtype: DType::F32,
        seed: 0,
    }
}

/// One group: for each depth, build the case, then time one step of each variant `pick` keeps.
fn bench_config(
    c: &mut Criterion,
    dev: &Device,
    make: fn(usize) -> Config,
    depths: &[usize],
    pick: impl Fn(&Variant) -> bool,
    (warm_up, measurement): (Duration, Duration),
) {
    let Some(first) = depths.first() else { return };
    let mut group = c.benchmark_group(group_name(&make(*first)));
    group
        .sample_size(SAMPLES)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(warm_up)
        .measurement_time(measurement);
    for &depth in depths {
        let cfg = make(depth);
        let case = Case::random(&cfg, dev)
            .unwrap_or_else(|e| panic!("building the case of {}: {e}", cfg.describe()));
        for v in Variant::for_config(&cfg).into_iter().filter(&pick) {
            group.bench_with_input(BenchmarkId::new(v.name(), depth), &case, |b, case| {
                b.iter_custom(|iters| {
                    time_iters(dev, iters, || {
                        impls::step(
                            v,
                            &case.cfg,
                            &case.params,
                            &case.input,
                            &case.grad_output,
                            &mut NoProbe,
                        )
                        .unwrap_or_else(|e| panic!("{v} on {}: {e}", case.cfg.describe()))
                    })
                })
            });
        }
    }
    group.finish();
}

fn depths(default: &[usize], extra: &[usize]) -> Vec<usize> {
    let mut d = default.to_vec();
    if full() {
        d.extend_from_slice(extra);
    }
    d
}

pub fn bench_steps(c: &mut Criterion) {
    let dev = device();
    let every = |_: &Variant| true;
    bench_config(
        c,
        &dev,
        mlp,
        &depths(MLP_DEPTHS, MLP_DEPTHS_FULL),
        every,
        (SLOW_WARM_UP, SLOW_MEASUREMENT),
    );
    bench_config(
        c,
        &dev,
        bc_small,
        &depths(BC_SMALL_DEPTHS, BC_SMALL_DEPTHS_FULL),
        every,
        (FAST_WARM_UP, FAST_MEASUREMENT),
    );
    let full = full();
    bench_config(
        c,
        &dev,
        |depth| Config {
            depth,
            ..Config::bc100_block()
        },
        &[Config::bc100_block().depth],
        |v: &Variant| {
            if full {
                *v != Variant::Autograd
            } else {
                BC100_DEFAULT_VARIANTS.contains(&v.name().as_str())
            }
        },
        (BC100_WARM_UP, BC100_MEASUREMENT),
    );
}

criterion::criterion_group!(benches, bench_steps);
