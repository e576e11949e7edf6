//! Analytic columns of a row that come from the config, not from the measurement: predicted
//! peak memory, FLOPs of a step, achieved and machine GFLOP/s. Each is one small function so
//! the memory model can be plugged in without touching the measurement code.

use impls::model::trace::Kernels;
use impls::{Config, Variant};

/// Predicted `peak_bytes` of one training step of `variant` on `cfg` (the analytic model,
/// `impls::model::predict_peak_bytes_with`; `None` for `autograd`): the CPU runs the direct 3×3
/// convolution and in-place dense products, a GPU the tap stack or cuDNN's convolution
/// ([`gpu_kernels_without_device`]) and matmuls, whose transients differ.
///
/// On the CPU the transients that exist once per compute thread (the 3×3 convolution's tiles,
/// gemm's packing) are counted for `threads`, the row's thread count, not this process's.
pub fn predicted_peak_bytes(
    variant: Variant,
    cfg: &Config,
    on_cpu: bool,
    threads: usize,
) -> Option<u64> {
    use impls::model::predict_peak_bytes_with;
    if !on_cpu {
        return predict_peak_bytes_with(variant, cfg, gpu_kernels_without_device(cfg));
    }
    let predict = || predict_peak_bytes_with(variant, cfg, Kernels::Cpu);
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
    {
        Ok(pool) => pool.install(predict),
        Err(_) => predict(),
    }
}

/// The GPU's kernels as far as they are known without opening a device: cuDNN's convolution
/// with workspaces of 0 bytes where the binary runs it ([`impls::model::gpu_kernels`];
/// the workspaces are asked of the device), else the tap stack. A GPU row's child predicts
/// again with the device's workspaces (`Measurement::predicted_peak_bytes`), which replaces this;
/// `max-depth` confirms its answer by measured runs.
pub fn gpu_kernels_without_device(cfg: &Config) -> Kernels {
    impls::model::gpu_kernels(cfg, || Ok(Default::default())).unwrap_or(Kernels::TapStack)
}

/// What a GPU row's `note` says of its step's schedule on `path` (the kernels the child runs,
/// [`impls::model::kernels_for`] on its device), from one [`impls::model::schedule::schedule_for`]:
///
/// - the tap-stack 3×3 convolution when it runs in several chunks of whole images (the fewest
///   chunks within 1% of the variant's least predicted peak, or `DENSEBENCH_TAP_CHUNK_COLUMNS`
///   forces them), e.g. `3×3 tap stack in 16 chunks of ≤ 2 images`; `None` for one chunk and for
///   cuDNN's convolution, which has no tap stack;
/// - the bc layers' fronts where the model splits them (`Schedule::split_front`: ReLU1's output
///   a column chunk at a time, its backward a column group then a channel block at a time, as
///   few as the peak allows, `Schedule::front_pieces`; `DENSEBENCH_WHOLE_FRONT=1` keeps them
///   whole), e.g. `bc layer fronts split (ReLU1's output in 4 chunks of ≤ 16384 columns, its
///   backward in blocks of ≤ 64 channels)` (BC-100 L=16 on cuDNN's path); `None` where they stay
///   whole.
///
/// Both `None` for the mlp, `autograd` and an unreadable override (the row's step reports that).
pub fn schedule_notes(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
) -> (Option<String>, Option<String>) {
    if variant == Variant::Autograd || cfg.family != impls::Family::Bc {
        return (None, None);
    }
    let Ok(s) = impls::model::schedule::schedule_for(variant, cfg, path) else {
        return (None, None);
    };
    let images = impls::layer::tap_chunk_images(impls::layer::grid(cfg), s.tap_chunk_columns);
    let chunks = cfg.batch.div_ceil(images.max(1));
    let chunks = (path == Kernels::TapStack && chunks > 1)
        .then(|| format!("3×3 tap stack in {chunks} chunks of ≤ {images} images"));
    let front = s.split_front.then(|| {
        let p = s.front_pieces.unwrap_or(impls::layer::FrontPieces::CPU);
        let columns = impls::layer::with_front_pieces(p, || impls::layer::front_chunks(cfg.m()));
        format!(
            "bc layer fronts split (ReLU1's output in {} chunks of ≤ {} columns, its backward in \
             blocks of ≤ {} channels)",
            columns.len(),
            p.columns,
            p.rows
        )
    });
    (chunks, front)
}

/// Floating-point operations of one training step (matmuls and convolutions, both passes;
/// recomputation not counted, so GFLOP/s compares variants on the same useful work).
pub fn flops(cfg: &Config) -> Option<u64> {
    Some(impls::model::flops(cfg))
}

/// Achieved rate: `flops / median_ns` (FLOP per ns = GFLOP/s).
pub fn gflops_per_s(flops: Option<u64>, median_ns: Option<u64>) -> Option<f64> {
    match (flops, median_ns) {
        (Some(f), Some(ns)) if ns > 0 => Some(f as f64 / ns as f64),
        _ => None,
    }
}

/// Side of the square matmul that measures the machine's rate: 2·1024³ FLOP, large enough for
/// gemm's steady state, small enough to take well under a second on 2 cores.
const RATE_MATMUL_SIDE: usize = 1024;
/// Repetitions; the best is kept (the machine's rate, not its noise).
const RATE_REPEATS: usize = 5;

/// This machine's matmul rate in GFLOP/s for `dtype` at `threads` compute threads (the
/// products of `impls::ops::dense` on a square matrix, in a pool of that many threads, best of
/// `RATE_REPEATS`), measured once per process, dtype and thread count, for the
/// `machine_gflops` column: a row's `gflops_per_s` over it says how close the step comes to
/// the matmul rate of the threads it ran on.
pub fn machine_gflops(dtype: candle_core::DType, threads: usize) -> Option<f64> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    type Rates = HashMap<(candle_core::DType, usize), Option<f64>>;
    static RATES: OnceLock<Mutex<Rates>> = OnceLock::new();
    let rates = RATES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut rates = rates.lock().ok()?;
    *rates
        .entry((dtype, threads))
        .or_insert_with(|| measure_matmul_rate(dtype, threads))
}

fn measure_matmul_rate(dtype: candle_core::DType, threads: usize) -> Option<f64> {
    use candle_core::{Device, Tensor};
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.max(1))
        .build()
        .ok()?;
    let n = RATE_MATMUL_SIDE;
    let a = Tensor::ones((n, n), dtype, &Device::Cpu).ok()?;
    let b = Tensor::ones((n, n), dtype, &Device::Cpu).ok()?;
    pool.install(|| {
        let _ = impls::ops::dense::product(&a, &b).ok()?; // warm-up: threads and packing buffers
        let best = (0..RATE_REPEATS)
            .filter_map(|_| {
                let t = std::time::Instant::now();
                let c = impls::ops::dense::product(&a, &b).ok()?;
                let ns = t.elapsed().as_nanos() as f64;
                drop(c);
                Some(ns)
            })
            .fold(f64::INFINITY, f64::min);
        (best.is_finite() && best > 0.0).then(|| 2.0 * (n as f64).powi(3) / best)
    })
}

/// Declared bytes kept for backward (from `impls::model`), `None` for autograd.
pub fn declared_saved_bytes(variant: Variant, cfg: &Config) -> Option<u64> {
    impls::model::declared_saved_bytes(variant, cfg).map(|b| b as u64)
}

/// Bytes of everything allocated before a step: parameters and BN buffers, input, upstream
/// gradient (the baseline, as the model counts it).
pub fn static_bytes(cfg: &Config) -> u64 {
    let elems: usize = impls::config::params::specs(cfg)
        .iter()
        .map(|s| s.shape.iter().product::<usize>())
        .sum::<usize>()
        + cfg.input_shape().iter().product::<usize>()
        + cfg.output_shape().iter().product::<usize>();
    (elems * cfg.dtype_size()) as u64
}

/// The fewest bytes any variant holds during one training step of `cfg`, by closed count
/// without building anything: the case (parameters and BN buffers, input, upstream gradient,
/// [`static_bytes`]) plus the step's results, all alive at its end (output, input gradient, a
/// gradient per parameter, the updated running stats). The parameters and BN buffers are
/// counted layer by layer ([`impls::config::params::layer_specs`]), so a block of 10^5 layers costs
/// milliseconds. A lower bound of every variant's footprint (activations saved for backward
/// come on top), in u128 so that no config overflows it.
pub fn min_step_bytes(cfg: &Config) -> u128 {
    let per_layer: u128 = (0..cfg.depth)
        .map(|i| {
            impls::config::params::layer_specs(cfg, i)
                .iter()
                .map(|s| s.shape.iter().map(|&d| d as u128).product::<u128>())
                .sum::<u128>()
        })
        .sum();
    let elems = |shape: Vec<usize>| shape.iter().map(|&d| d as u128).product::<u128>();
    let (input, output) = (elems(cfg.input_shape()), elems(cfg.output_shape()));
    // case: tensors + input + upstream gradient; results: the same tensors' gradients and
    // updated stats + input gradient + output.
    2 * (per_layer + input + output) * cfg.dtype_size() as u128
}

/// Refuses a config whose `needed` bytes (what it must hold at least, `what`: [`min_step_bytes`]
/// for a step, half of it for a case) exceed the memory `limit` (`limit_name` says where it came
/// from), before anything is allocated or any child starts: one line with the numbers, instead
/// of a child that grows for minutes or aborts. `None`: no limit known, nothing to check.
pub fn check_fits(
    cfg: &Config,
    needed: u128,
    what: &str,
    limit: Option<u64>,
    limit_name: &str,
) -> anyhow::Result<()> {
    let Some(limit) = limit else {
        return Ok(());
    };
    if needed > u128::from(limit) {
        let human =
            |b: u128| crate::progress::human_bytes(Some(u64::try_from(b).unwrap_or(u64::MAX)));
        anyhow::bail!(
            "{} needs at least {needed} bytes ({}: {what}), more than {limit_name}, {limit} \
             bytes ({}): lower --depth, --batch or the sizes, or raise the limit",
            cfg.describe(),
            human(needed),
            human(u128::from(limit))
        );
    }
    Ok(())
}

/// What [`min_step_bytes`] counts, for [`check_fits`]'s message.
pub const STEP_BYTES: &str = "parameters, input and output, and their gradients";
/// What half of [`min_step_bytes`] counts (a case file's tensors), for [`check_fits`].
pub const CASE_BYTES: &str = "parameters and BN buffers, input and upstream gradient";

/// Allocator headroom of a measured run above the budget: room for the process's runtime
/// overhead, so that a step that fits is never cut short (a quarter of the budget, at least
/// 64 MiB).
pub fn overhead_margin(budget: u64) -> u64 {
    (budget / 4).max(64 << 20)
}

#[cfg(test)]
mod tests {
    use super::*;
    use impls::model::trace::ConvWorkspaces;

    const TAP: Kernels = Kernels::TapStack;

    #[test]
    fn a_gpu_row_notes_the_tap_stack_chunks_only_when_there_are_several() {
        let bri = Variant::parse("buffer-recompute-inplace").unwrap();
        let torchvision = Config {
            batch: 32,
            channels: 64,
            growth: 32,
            depth: 6,
            size: impls::Spatial::square(56),
            ..Config::bc100_block()
        };
        assert_eq!(
            schedule_notes(bri, &torchvision, TAP).0.as_deref(),
            Some("3×3 tap stack in 16 chunks of ≤ 2 images")
        );
        let csi = Variant::parse("cat-store-inplace").unwrap();
        assert_eq!(
            schedule_notes(csi, &torchvision, TAP).0.as_deref(),
            Some("3×3 tap stack in 7 chunks of ≤ 5 images")
        );
        assert_eq!(schedule_notes(Variant::Autograd, &torchvision, TAP).0, None);
        let brc = Variant::parse("buffer-recompute-copy").unwrap();
        let bc100 = Config {
            depth: 48,
            ..Config::bc100_block()
        };
        // the split front (issue 38) has its own chunking of the tap stack: the layer input's
        // gradient no longer sets the leanest variants' peak
        assert_eq!(
            schedule_notes(brc, &bc100, TAP).0.as_deref(),
            Some("3×3 tap stack in 2 chunks of ≤ 32 images")
        );
        assert_eq!(
            schedule_notes(bri, &bc100, TAP).0.as_deref(),
            Some("3×3 tap stack in 8 chunks of ≤ 8 images")
        );
        // on a GPU's path in fewer pieces than the CPU's 16 (`Schedule::front_pieces`)
        let split = Some(
            "bc layer fronts split (ReLU1's output in 8 chunks of ≤ 8192 columns, its backward \
             in blocks of ≤ 64 channels)",
        );
        assert_eq!(schedule_notes(bri, &bc100, TAP).1.as_deref(), split);
        assert_eq!(schedule_notes(brc, &bc100, TAP).1.as_deref(), split);
        // the store variants keep their fronts whole; the mlp has none
        assert_eq!(schedule_notes(csi, &bc100, TAP).1, None);
        assert_eq!(
            schedule_notes(bri, &Config::tiny(impls::Family::Mlp), TAP).1,
            None
        );
        // cuDNN's convolution has no tap stack to chunk; the front's split is the model's
        // choice on that path too (its workspaces are small beside the saved state)
        let cudnn = Kernels::Cudnn(ConvWorkspaces {
            forward: 1 << 20,
            data: 1 << 20,
            filter: 1 << 20,
        });
        assert_eq!(schedule_notes(bri, &torchvision, cudnn).0, None);
        assert_eq!(schedule_notes(bri, &bc100, cudnn).0, None);
        assert_eq!(schedule_notes(bri, &bc100, cudnn).1.as_deref(), split);
        assert_eq!(schedule_notes(csi, &bc100, cudnn).1, None);
    }
}
