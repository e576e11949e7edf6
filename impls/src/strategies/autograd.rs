//! The `autograd` variant: the forum's block as written (`x = cat([x, layer(x)])`, canonical
//! NCHW / `[N, C]` layout) through candle's own autograd. It shares no backward code with the
//! hand-written variants, which makes it the independent gradient reference.
//!
//! Memory caveat: candle's autograd keeps every op's inputs alive until the graph is dropped,
//! more than PyTorch's autograd saves; this variant's memory is candle's, not PyTorch's.

use crate::check::probe::{Event, Probe, SavedTensor};
use crate::check::result::StepResult;
use crate::config::params::{bn_name, conv_name, mlp_bias, mlp_weight, Kind, Params};
use crate::config::{Config, Family, BN_EPS, BN_MOMENTUM};
use crate::error::{CandleContext, Error, Result};
use candle_core::{Tensor, Var};
use std::collections::BTreeMap;

/// Training-mode BatchNorm over (N, H, W) of an NCHW tensor, from candle ops so autograd
/// differentiates it. Returns the output, the batch mean and the biased variance (detached).
///
/// Written on the `[N, C, H·W]` view of `x` (a reshape of a contiguous tensor: no copy), with
/// every reduction one dimension at a time, innermost first, and every per-channel vector
/// broadcast one dimension at a time, so that candle's autograd reduces one dimension at a time
/// in backward too (a broadcast's gradient is a sum over the broadcast dimensions). candle's
/// CPU sum over the non-adjacent dimensions (0, 2, 3) in one call takes the generic strided
/// path: 115 ms for BC-100's `[64, 120, 32, 32]` in f32 against 4 ms for `H·W` then `N`, and
/// this variant made a dozen of them per layer (the forward's four, the backward's eight), about
/// half of its step. The same full-size tensors saved (and the `[N, C, 1]` partial sums, +0.02 %
/// of the peak on BC-100's block), the same values up to summation order.
fn batch_norm(x: &Tensor, gamma: &Tensor, beta: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
    let (n, c, h, w) = x.dims4().ctx("bn input")?;
    let count = (n * h * w) as f64;
    let xf = x.reshape((n, c, h * w)).ctx("bn input")?;
    // Σ over H·W (contiguous), then over N: [1, C, 1]
    let per_channel_sum = |t: &Tensor| -> Result<Tensor> {
        t.sum_keepdim(2).ctx("bn sum")?.sum_keepdim(0).ctx("bn sum")
    };
    // [1, C, 1] to [N, C, H·W], N first: backward sums over H·W first, then over N
    let spread = |v: &Tensor| -> Result<Tensor> {
        v.broadcast_as((n, c, 1))
            .ctx("bn broadcast")?
            .broadcast_as((n, c, h * w))
            .ctx("bn broadcast")
    };
    let mean = (per_channel_sum(&xf)? / count).ctx("bn mean")?;
    let xc = xf.sub(&spread(&mean)?).ctx("bn centre")?;
    let var = (per_channel_sum(&xc.sqr().ctx("bn var")?)? / count).ctx("bn var")?;
    let denom = (&var + BN_EPS).ctx("bn")?.sqrt().ctx("bn")?;
    let y = xc
        .div(&spread(&denom)?)
        .ctx("bn normalise")?
        .mul(&spread(&gamma.reshape((1, c, 1)).ctx("bn γ")?)?)
        .ctx("bn γ")?
        .add(&spread(&beta.reshape((1, c, 1)).ctx("bn β")?)?)
        .ctx("bn β")?
        .reshape((n, c, h, w))
        .ctx("bn output")?;
    Ok((
        y,
        mean.detach().flatten_all().ctx("bn")?,
        var.detach().flatten_all().ctx("bn")?,
    ))
}

pub fn step_autograd(
    cfg: &Config,
    params: &Params,
    input: &Tensor,
    grad_output: &Tensor,
    probe: &mut dyn Probe,
) -> Result<StepResult> {
    // Trainable leaves. `Var::from_tensor` copies, so these are the autograd's own tensors.
    let mut vars: BTreeMap<String, Var> = BTreeMap::new();
    for spec in crate::config::params::specs(cfg) {
        if spec.kind == Kind::Param {
            vars.insert(
                spec.name.clone(),
                Var::from_tensor(params.get(&spec.name)?).ctx(&spec.name)?,
            );
        }
    }
    let p = |name: String| -> Result<Tensor> {
        vars.get(&name)
            .map(|v| v.as_tensor().clone())
            .ok_or(Error::MissingTensor {
                name,
                context: " from the autograd variables".to_string(),
            })
    };
    let x_var = Var::from_tensor(input).ctx("input")?;
    let mut x = x_var.as_tensor().clone();
    let mut running = BTreeMap::new();
    let count = cfg.m() as f64;
    for i in 0..cfg.depth {
        let y = match cfg.family {
            Family::Mlp => {
                let y = x
                    .matmul(&p(mlp_weight(i))?.t().ctx("linear")?)
                    .ctx("linear")?
                    .broadcast_add(&p(mlp_bias(i))?)
                    .ctx("linear bias")?;
                if cfg.activation {
                    y.relu().ctx("relu")?
                } else {
                    y
                }
            }
            Family::Bc => {
                let mut h = x.clone();
                for norm in [1, 2] {
                    if norm == 2 {
                        h = h.conv2d(&p(conv_name(i, 1))?, 0, 1, 1, 1).ctx("conv1")?;
                    }
                    let (y, mean, var) = batch_norm(
                        &h,
                        &p(bn_name(i, norm, "weight"))?,
                        &p(bn_name(i, norm, "bias"))?,
                    )?;
                    h = y.relu().ctx("relu")?;
                    let rm = bn_name(i, norm, "running_mean");
                    let rv = bn_name(i, norm, "running_var");
                    let new_m = ((params.get(&rm)? * (1.0 - BN_MOMENTUM)).ctx("running")?
                        + (mean * BN_MOMENTUM).ctx("running")?)
                    .ctx("running")?;
                    let new_v = ((params.get(&rv)? * (1.0 - BN_MOMENTUM)).ctx("running")?
                        + (var * (BN_MOMENTUM * count / (count - 1.0))).ctx("running")?)
                    .ctx("running")?;
                    running.insert(rm, new_m);
                    running.insert(rv, new_v);
                }
                h.conv2d(&p(conv_name(i, 2))?, 1, 1, 1, 1).ctx("conv2")?
            }
        };
        x = Tensor::cat(&[&x, &y], 1).ctx("concatenate")?;
        probe.event(Event::ForwardLayer(i));
    }
    probe.event(Event::ForwardEnd {
        saved: &[SavedTensor::owned(
            "autograd graph (not enumerable)",
            vec![],
        )],
    });
    let loss = x.mul(grad_output).ctx("loss")?.sum_all().ctx("loss")?;
    let mut store = loss.backward().ctx("candle backward")?;
    let mut grads = BTreeMap::new();
    for (name, v) in &vars {
        let g = store
            .remove(v.as_tensor())
            .ok_or_else(|| Error::MissingTensor {
                name: format!("grad.{name}"),
                context: " from candle's gradient store".to_string(),
            })?;
        grads.insert(name.clone(), g);
    }
    let grad_input = store
        .remove(x_var.as_tensor())
        .ok_or_else(|| Error::MissingTensor {
            name: "grad.input".to_string(),
            context: " from candle's gradient store".to_string(),
        })?;
    drop(store);
    probe.event(Event::BackwardEnd);
    Ok(StepResult {
        output: x.detach(),
        grad_input,
        grads,
        running,
    })
}
