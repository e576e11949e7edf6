//! The layer maths, written once: forward and hand-written backward of every op a dense layer
//! uses, on channel-major 2-D feature maps `[C, M]` (M = N·H·W).
//!
//! Channel-major makes each channel's values one contiguous row: BatchNorm statistics are row
//! reductions, Conv1×1 and Linear are a plain `W[out, C] @ X[C, M]`, and a prefix of the
//! concatenated features is a contiguous view. Every strategy calls these functions, so variants
//! with the same op order produce bitwise-identical results.

use crate::config::{Config, BN_EPS, BN_MOMENTUM};
use crate::error::{CandleContext, Result};
use crate::kernels;
use crate::variant::Relu;
use candle_core::Tensor;

/// Batch statistics of one BatchNorm application, as saved for backward (per channel, `[C, 1]`).
#[derive(Debug, Clone)]
pub struct BnStats {
    pub mean: Tensor,
    /// 1/√(var_biased + eps).
    pub invstd: Tensor,
}

impl BnStats {
    pub fn tensors(&self) -> [&Tensor; 2] {
        [&self.mean, &self.invstd]
    }
}

/// Per-channel batch mean and biased variance of `x [C, M]` (two-pass, as PyTorch on CPU).
/// Returns the stats for normalisation and the biased variance for the running-stat update.
pub fn bn_stats(x: &Tensor) -> Result<(BnStats, Tensor)> {
    let m = x.dims()[1] as f64;
    let mean = (x.sum_keepdim(1).ctx("bn mean")? / m).ctx("bn mean")?;
    let var = {
        let xc = x.broadcast_sub(&mean).ctx("bn centre")?;
        (xc.sqr().ctx("bn var")?.sum_keepdim(1).ctx("bn var")? / m).ctx("bn var")?
    };
    let invstd = ((&var + BN_EPS)
        .ctx("bn eps")?
        .sqrt()
        .ctx("bn sqrt")?
        .recip())
    .ctx("bn invstd")?;
    Ok((BnStats { mean, invstd }, var))
}

/// PyTorch's running-stat update, done once per layer in forward only:
/// `r_mean ← (1−m)·r_mean + m·mean`, `r_var ← (1−m)·r_var + m·var·M/(M−1)` (unbiased).
pub fn bn_running_update(
    cfg: &Config,
    running_mean: &Tensor,
    running_var: &Tensor,
    stats: &BnStats,
    var_biased: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let m = cfg.m() as f64;
    let unbias = m / (m - 1.0);
    let mean = stats.mean.flatten_all().ctx("running mean")?;
    let var = var_biased.flatten_all().ctx("running var")?;
    let new_mean = ((running_mean * (1.0 - BN_MOMENTUM)).ctx("running mean")?
        + (mean * BN_MOMENTUM).ctx("running mean")?)
    .ctx("running mean")?;
    let new_var = ((running_var * (1.0 - BN_MOMENTUM)).ctx("running var")?
        + (var * (BN_MOMENTUM * unbias)).ctx("running var")?)
    .ctx("running var")?;
    Ok((new_mean, new_var))
}

/// `y = (x − mean)·invstd·γ + β`, computed as `x·scale + shift` with per-channel
/// `scale = γ·invstd`, `shift = β − mean·scale`: one full-size temporary instead of four.
pub fn bn_apply(x: &Tensor, stats: &BnStats, gamma: &Tensor, beta: &Tensor) -> Result<Tensor> {
    let c = x.dims()[0];
    let scale = gamma
        .reshape((c, 1))
        .ctx("bn scale")?
        .mul(&stats.invstd)
        .ctx("bn scale")?;
    let shift = beta
        .reshape((c, 1))
        .ctx("bn shift")?
        .sub(&stats.mean.mul(&scale).ctx("bn shift")?)
        .ctx("bn shift")?;
    x.broadcast_mul(&scale)
        .ctx("bn apply")?
        .broadcast_add(&shift)
        .ctx("bn apply")
}

/// Gradients of [`bn_apply`] with batch statistics, given its input `x` and the saved stats:
/// `dx = γ·invstd·(gy − mean(gy) − x̂·mean(gy·x̂))`, `dγ = Σ gy·x̂`, `dβ = Σ gy`.
/// Returns `(dx [C, M], dγ [C], dβ [C])`.
pub fn bn_bwd(
    gy: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (c, m) = (x.dims()[0], x.dims()[1] as f64);
    let xhat = x
        .broadcast_sub(&stats.mean)
        .ctx("bn bwd x̂")?
        .broadcast_mul(&stats.invstd)
        .ctx("bn bwd x̂")?;
    let dbeta = gy.sum_keepdim(1).ctx("bn bwd dβ")?;
    let dgamma = gy
        .mul(&xhat)
        .ctx("bn bwd dγ")?
        .sum_keepdim(1)
        .ctx("bn bwd dγ")?;
    let scale = gamma
        .reshape((c, 1))
        .ctx("bn bwd")?
        .mul(&stats.invstd)
        .ctx("bn bwd")?;
    let dx = {
        let t = xhat
            .broadcast_mul(&(&dgamma / m).ctx("bn bwd")?)
            .ctx("bn bwd dx")?;
        drop(xhat);
        let u = gy
            .broadcast_sub(&(&dbeta / m).ctx("bn bwd")?)
            .ctx("bn bwd dx")?
            .sub(&t)
            .ctx("bn bwd dx")?;
        drop(t);
        u.broadcast_mul(&scale).ctx("bn bwd dx")?
    };
    Ok((
        dx,
        dgamma.flatten_all().ctx("bn bwd dγ")?,
        dbeta.flatten_all().ctx("bn bwd dβ")?,
    ))
}

/// ReLU forward on a tensor the caller owns: `copy` writes a new tensor, `inplace` overwrites it.
pub fn relu_fwd(x: Tensor, mode: Relu) -> Result<Tensor> {
    match mode {
        Relu::Copy => x.relu().ctx("relu"),
        Relu::Inplace => kernels::relu_inplace(x),
    }
}

/// ReLU backward from the output mask. `inplace` **overwrites `g`**.
pub fn relu_bwd(g: Tensor, out: &Tensor, mode: Relu) -> Result<Tensor> {
    match mode {
        Relu::Copy => kernels::relu_bwd(&g, out),
        Relu::Inplace => kernels::relu_bwd_inplace(g, out),
    }
}

/// `W[out, in] @ x[in, M]` (+ bias `[out]`): Linear and Conv1×1 in channel-major form.
pub fn dense_fwd(w: &Tensor, bias: Option<&Tensor>, x: &Tensor) -> Result<Tensor> {
    let y = w.matmul(x).ctx("dense forward")?;
    match bias {
        Some(b) => {
            let b = b.reshape((b.dims()[0], 1)).ctx("dense bias")?;
            y.broadcast_add(&b).ctx("dense bias")
        }
        None => Ok(y),
    }
}

/// Weight gradient of [`dense_fwd`]: `gy[out, M] @ xᵀ[M, in]`.
pub fn dense_bwd_weight(gy: &Tensor, x: &Tensor) -> Result<Tensor> {
    gy.matmul(&x.t().ctx("dense dW")?).ctx("dense dW")
}

/// Bias gradient of [`dense_fwd`]: `Σ_M gy`.
pub fn dense_bwd_bias(gy: &Tensor) -> Result<Tensor> {
    gy.sum(1).ctx("dense db")
}

/// Input gradient of [`dense_fwd`]: `Wᵀ[in, out] @ gy[out, M]`.
pub fn dense_bwd_input(w: &Tensor, gy: &Tensor) -> Result<Tensor> {
    w.t().ctx("dense dx")?.matmul(gy).ctx("dense dx")
}

/// Conv3×3 (padding 1, no bias) on a channel-major bottleneck `s [B, N·H·W]` with a PyTorch
/// weight `[k, B, 3, 3]`; returns channel-major `[k, N·H·W]`.
pub fn conv3x3_fwd(cfg: &Config, s: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (n, h) = (cfg.batch, cfg.size);
    let b = s.dims()[0];
    let k = w.dims()[0];
    // [B, N, H, W] transposed is an NCHW view; candle's conv reads it through its strides.
    let x = s
        .reshape((b, n, h, h))
        .ctx("conv2 input")?
        .transpose(0, 1)
        .ctx("conv2 input")?;
    let y = x.conv2d(w, 1, 1, 1, 1).ctx("conv2 forward")?;
    y.transpose(0, 1)
        .ctx("conv2 output")?
        .contiguous()
        .ctx("conv2 output")?
        .reshape((k, n * h * h))
        .ctx("conv2 output")
}

/// Gradients of [`conv3x3_fwd`]: `(ds [B, M], dW [k, B, 3, 3])`.
///
/// `ds` is the transposed convolution of `gy` with `W` (what candle's autograd does for conv2d);
/// `dW` correlates the input with `gy` with batch and channels swapped — exactly the
/// channel-major layout both are already in, so no transposes are copied.
pub fn conv3x3_bwd(cfg: &Config, gy: &Tensor, s: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
    let (n, h) = (cfg.batch, cfg.size);
    let b = s.dims()[0];
    let k = w.dims()[0];
    let g4 = gy.reshape((k, n, h, h)).ctx("conv2 bwd")?;
    let ds = g4
        .transpose(0, 1)
        .ctx("conv2 bwd ds")?
        .conv_transpose2d(w, 1, 0, 1, 1)
        .ctx("conv2 bwd ds")?
        .transpose(0, 1)
        .ctx("conv2 bwd ds")?
        .contiguous()
        .ctx("conv2 bwd ds")?
        .reshape((b, n * h * h))
        .ctx("conv2 bwd ds")?;
    let s4 = s.reshape((b, n, h, h)).ctx("conv2 bwd dW")?;
    let dw = s4
        .conv2d(&g4, 1, 1, 1, 1)
        .ctx("conv2 bwd dW")?
        .transpose(0, 1)
        .ctx("conv2 bwd dW")?
        .contiguous()
        .ctx("conv2 bwd dW")?;
    Ok((ds, dw))
}

/// Canonical (PyTorch) `[N, C]` / `[N, C, H, W]` → channel-major `[C, M]`. Always a fresh
/// copy (even when the transpose happens to be contiguous, e.g. N = 1), so strategies may write
/// into the result in place without touching the caller's tensor.
pub fn to_channel_major(cfg: &Config, t: &Tensor) -> Result<Tensor> {
    let c = t.dims()[1];
    t.transpose(0, 1)
        .ctx("to channel-major")?
        .force_contiguous()
        .ctx("to channel-major")?
        .reshape((c, cfg.m()))
        .ctx("to channel-major")
}

/// Channel-major `[C, M]` → canonical layout, as a zero-copy strided view.
pub fn to_canonical(cfg: &Config, t: &Tensor) -> Result<Tensor> {
    let c = t.dims()[0];
    let mut shape = vec![c, cfg.batch];
    if cfg.family == crate::config::Family::Bc {
        shape.extend([cfg.size, cfg.size]);
    }
    t.reshape(shape)
        .ctx("to canonical")?
        .transpose(0, 1)
        .ctx("to canonical")
}
