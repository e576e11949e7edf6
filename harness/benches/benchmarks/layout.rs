//! Channel-major `[C, N·H·W]` against NCHW `[N, C, H, W]`: the two layer pieces whose cost
//! depends on the layout, timed on the same values.
//!
//! - `bn-relu-conv1x1`: training-mode BatchNorm (batch statistics), ReLU, then the bottleneck
//!   Conv1×1 (C → bn_size·k), forward only. Three implementations of the same algebra
//!   (`scale = γ·invstd`, `shift = β − mean·scale`, `y = relu(x·scale + shift)`, `W @ y`):
//!   - `channel-major`: `impls::layer` as the variants run it (fused CPU kernels for the
//!     statistics and the affine pass, then one matmul);
//!   - `channel-major-candle`: the same on `[C, M]` from candle ops only
//!     (`impls::ops::bn::generic_*`, `relu`, `matmul`): layout alone, no fused kernels;
//!   - `nchw-candle`: candle ops on `[N, C, H, W]` (`sum_keepdim((0, 2, 3))`, broadcast ops,
//!     `conv2d` with a 1×1 kernel), as the `autograd` variant and PyTorch-style code write it.
//!
//!   `channel-major-candle / nchw-candle` is the layout's effect, `channel-major /
//!   channel-major-candle` the fused kernels'.
//! - `cat`: appending one layer's k channels to the features so far, as the `cat-*` variants
//!   do: along dim 0 of channel-major (two contiguous copies) against dim 1 of NCHW (N strided
//!   block copies per input).
//!
//! One group per shape, `layout-N{N}-C{C}-o{out}-{H}x{W}`, ids `<op>/<layout>`. Setup checks that
//! the layouts agree before anything is timed.

use super::{device, time_iters};
use candle_core::{DType, Device, Tensor};
use criterion::{BenchmarkId, Criterion, SamplingMode};
use impls::layer::{bn_stats, dense_fwd, relu_fwd};
use impls::Relu;
use std::time::Duration;

/// A layer input shape: batch, input channels, spatial size, growth and bottleneck width.
struct Shape {
    batch: usize,
    channels: usize,
    size: usize,
    growth: usize,
    bottleneck: usize,
}

/// DenseNet-BC-100's block, layer 9 of 16 (C = 24 + 8·12 = 120 input channels, bottleneck
/// 4·12 = 48) at batch 64, 32×32: 31 MB of f32 features, the middle of the block.
const BC100_MID: Shape = Shape {
    batch: 64,
    channels: 120,
    size: 32,
    growth: 12,
    bottleneck: 48,
};
/// The same layer on the small bc config (16 images of 8×8): 64× fewer columns.
const BC_SMALL_MID: Shape = Shape {
    batch: 16,
    channels: 120,
    size: 8,
    growth: 12,
    bottleneck: 48,
};
const SHAPES: [Shape; 2] = [BC100_MID, BC_SMALL_MID];

const BN_EPS: f64 = impls::config::BN_EPS;
/// Largest |channel-major − NCHW| / max|y| accepted in the setup check: the two sum in
/// different orders in f32 (relative rounding ~1e-7 per add over M ≤ 65536 terms), so 1e-4 is
/// far above rounding and far below any indexing mistake (which is O(1)).
const AGREEMENT_TOLERANCE: f64 = 1e-4;
const SAMPLES: usize = 10;
const WARM_UP: Duration = Duration::from_millis(500);
const MEASUREMENT: Duration = Duration::from_secs(2);

/// Values of one shape, in both layouts.
struct Inputs {
    /// `[C, M]`
    cm: Tensor,
    /// `[N, C, H, W]`, the same values.
    nchw: Tensor,
    /// One layer's new features, `[k, M]` and `[N, k, H, W]`.
    new_cm: Tensor,
    new_nchw: Tensor,
    gamma: Tensor,
    beta: Tensor,
    /// Conv1×1 weight `[out, C]` and `[out, C, 1, 1]`.
    w: Tensor,
    w4: Tensor,
}

/// `[N, C, H, W]` → `[C, N·H·W]` (contiguous).
fn nchw_to_cm(t: &Tensor) -> candle_core::Result<Tensor> {
    let (n, c, h, w) = t.dims4()?;
    t.transpose(0, 1)?.contiguous()?.reshape((c, n * h * w))
}

fn inputs(s: &Shape, dev: &Device) -> candle_core::Result<Inputs> {
    let (n, c, hw) = (s.batch, s.channels, s.size);
    let nchw = Tensor::randn(0f32, 1.0, (n, c, hw, hw), dev)?;
    let new_nchw = Tensor::randn(0f32, 1.0, (n, s.growth, hw, hw), dev)?;
    let w4 = (Tensor::randn(0f32, 1.0, (s.bottleneck, c, 1, 1), dev)? / (c as f64).sqrt())?;
    Ok(Inputs {
        cm: nchw_to_cm(&nchw)?,
        new_cm: nchw_to_cm(&new_nchw)?,
        nchw,
        new_nchw,
        gamma: Tensor::rand(0.5f32, 1.5, c, dev)?,
        beta: Tensor::rand(-0.5f32, 0.5, c, dev)?,
        w: w4.reshape((s.bottleneck, c))?,
        w4,
    })
}

/// What the variants run (`impls::layer`, `impls::ops::bn`): BN's statistics, its per-channel
/// step (running stats from zero mean and unit variance), apply, ReLU, Conv1×1.
fn channel_major(i: &Inputs) -> impls::Result<Tensor> {
    let (c, m) = i.cm.dims2().map_err(impls::Error::from)?;
    let dev = i.cm.device();
    let (rm, rv) = (
        Tensor::zeros(c, DType::F32, dev)?,
        Tensor::ones(c, DType::F32, dev)?,
    );
    let (table, _running) =
        impls::ops::bn::bn_prepare(&bn_stats(&i.cm)?, &i.gamma, &i.beta, &rm, &rv, m)?;
    let scale_shift = table.narrow(0, 2, 2)?;
    let y = relu_fwd(
        impls::ops::bn::affine_rows(&i.cm, &scale_shift)?,
        Relu::Copy,
    )?;
    dense_fwd(&i.w, None, &y)
}

/// Per-channel `(scale, shift)` from `mean` and biased `var` of any broadcastable shape.
fn scale_shift(
    mean: &Tensor,
    var: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
) -> candle_core::Result<(Tensor, Tensor)> {
    let scale = (var + BN_EPS)?.sqrt()?.recip()?.mul(gamma)?;
    let shift = beta.sub(&mean.mul(&scale)?)?;
    Ok((scale, shift))
}

/// The same algebra on `[C, M]` from candle ops only.
fn channel_major_candle(i: &Inputs) -> candle_core::Result<Tensor> {
    let c = i.cm.dims()[0];
    let mv = impls::ops::bn::generic_bn_stats(&i.cm).map_err(candle_core::Error::wrap)?;
    let column = |q| impls::ops::bn::column(&mv, q).map_err(candle_core::Error::wrap);
    let (mean, var) = (column(0)?, column(1)?);
    let (scale, shift) = scale_shift(
        &mean,
        &var,
        &i.gamma.reshape((c, 1))?,
        &i.beta.reshape((c, 1))?,
    )?;
    let y = i.cm.broadcast_mul(&scale)?.broadcast_add(&shift)?.relu()?;
    i.w.matmul(&y)
}

/// The same algebra on `[N, C, H, W]` from candle ops, Conv1×1 as `conv2d`.
fn nchw_candle(i: &Inputs) -> candle_core::Result<Tensor> {
    let x = &i.nchw;
    let (n, c, h, w) = x.dims4()?;
    let count = (n * h * w) as f64;
    let mean = (x.sum_keepdim((0, 2, 3))? / count)?;
    let var = (x.broadcast_sub(&mean)?.sqr()?.sum_keepdim((0, 2, 3))? / count)?;
    let (scale, shift) = scale_shift(
        &mean,
        &var,
        &i.gamma.reshape((1, c, 1, 1))?,
        &i.beta.reshape((1, c, 1, 1))?,
    )?;
    let y = x.broadcast_mul(&scale)?.broadcast_add(&shift)?.relu()?;
    y.conv2d(&i.w4, 0, 1, 1, 1)
}

/// Panics unless the three implementations give the same output (see [`AGREEMENT_TOLERANCE`]).
fn check_agreement(i: &Inputs) -> candle_core::Result<()> {
    let reference = channel_major(i).map_err(candle_core::Error::wrap)?;
    let scale = reference
        .abs()?
        .max_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    for (name, y) in [
        ("channel-major-candle", channel_major_candle(i)?),
        ("nchw-candle", nchw_to_cm(&nchw_candle(i)?)?),
    ] {
        let diff = (y - &reference)?
            .abs()?
            .max_all()?
            .to_dtype(DType::F64)?
            .to_scalar::<f64>()?;
        assert!(
            diff <= AGREEMENT_TOLERANCE * scale,
            "{name} differs from channel-major by {diff} (max |y| = {scale})"
        );
    }
    Ok(())
}

/// The value of a timed op; a failure is a bug in the bench, reported by panicking.
fn ok<T, E: std::fmt::Display>(op: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| panic!("{op}: {e}"))
}

pub fn bench_layout(c: &mut Criterion) {
    let dev = device();
    for s in &SHAPES {
        let i = inputs(s, &dev).unwrap_or_else(|e| panic!("building the layout inputs: {e}"));
        check_agreement(&i).unwrap_or_else(|e| panic!("checking the layouts agree: {e}"));
        let mut group = c.benchmark_group(format!(
            "layout-N{}-C{}-o{}-{}x{}",
            s.batch, s.channels, s.bottleneck, s.size, s.size
        ));
        group
            .sample_size(SAMPLES)
            .sampling_mode(SamplingMode::Flat)
            .warm_up_time(WARM_UP)
            .measurement_time(MEASUREMENT);
        let op = "bn-relu-conv1x1";
        group.bench_function(BenchmarkId::new(op, "channel-major"), |b| {
            b.iter_custom(|n| time_iters(&dev, n, || ok(op, channel_major(&i))))
        });
        group.bench_function(BenchmarkId::new(op, "channel-major-candle"), |b| {
            b.iter_custom(|n| time_iters(&dev, n, || ok(op, channel_major_candle(&i))))
        });
        group.bench_function(BenchmarkId::new(op, "nchw-candle"), |b| {
            b.iter_custom(|n| time_iters(&dev, n, || ok(op, nchw_candle(&i))))
        });
        let cat = |a: &Tensor, b: &Tensor, dim: usize| ok("cat", Tensor::cat(&[a, b], dim));
        group.bench_function(BenchmarkId::new("cat", "channel-major"), |b| {
            b.iter_custom(|n| time_iters(&dev, n, || cat(&i.cm, &i.new_cm, 0)))
        });
        group.bench_function(BenchmarkId::new("cat", "nchw"), |b| {
            b.iter_custom(|n| time_iters(&dev, n, || cat(&i.nchw, &i.new_nchw, 1)))
        });
        group.finish();
    }
}

criterion::criterion_group!(benches, bench_layout);
