//! The hand-written training step: one driver over the three strategy axes, calling the layer
//! maths in [`crate::layer`]. What each layer keeps for backward is the [`LayerSaved`] struct.

use crate::check::probe::{Event, Probe, SavedTensor, FEATURES};
use crate::check::result::StepResult;
use crate::config::params::{bn_name, conv_name, mlp_bias, mlp_weight, Params};
use crate::config::variant::{Concat, Intermediates, Relu, Strategy};
use crate::config::{Config, Family};
use crate::error::{CandleContext, Result};
use crate::layer::{self, BnStats};
use crate::ops::cpu::shared::unfilled;
use crate::ops::elementwise;
use crate::strategies::buffer::{AppendBuffer, GradBuffer};
use candle_core::Tensor;
use std::collections::BTreeMap;

/// What one layer keeps for backward.
#[derive(Debug)]
pub struct LayerSaved {
    /// The layer's input, the concatenation of earlier features `[C_i, M]`: its own tensor for
    /// `cat-store`, a view of the buffer for `buffer-*`, absent for `cat-recompute` (it is
    /// re-concatenated from the pieces in backward).
    pub x: Option<Tensor>,
    pub inner: Inner,
}

/// The family-specific part of [`LayerSaved`].
#[derive(Debug)]
pub enum Inner {
    /// mlp: the layer output after the optional ReLU `[k, M]` (the ReLU mask). For `cat` it is
    /// the piece appended (shared with the pieces list), for `buffer` a view of the buffer.
    Mlp { out: Tensor },
    /// bc, `store`: every intermediate backward reads.
    BcStore {
        stats1: BnStats,
        /// ReLU1 output `[C_i, M]`: Conv1×1's input and ReLU1's mask.
        r: Tensor,
        /// Conv1×1 output `[B, M]`: BN2's input.
        z: Tensor,
        stats2: BnStats,
        /// ReLU2 output `[B, M]`: Conv3×3's input and ReLU2's mask.
        s: Tensor,
    },
    /// bc, `recompute`: only the batch statistics; BN → ReLU → Conv1×1 → BN → ReLU are rerun in
    /// backward with these exact statistics (so the running stats are not touched again and the
    /// recomputed values are bitwise those of forward).
    BcRecompute { stats1: BnStats, stats2: BnStats },
}

impl LayerSaved {
    /// Describes the live saved tensors (names, shapes, and which are views of the buffer).
    /// `pieces` is true when a pieces list holds the layer outputs (`cat-recompute`).
    pub fn describe(&self, i: usize, concat: Concat, pieces: bool, out: &mut Vec<SavedTensor>) {
        let tensor = |name: String, t: &Tensor, view: bool| {
            if view {
                SavedTensor::view(name, t.dims().to_vec(), FEATURES)
            } else {
                SavedTensor::owned(name, t.dims().to_vec())
            }
        };
        let in_buffer = concat == Concat::Buffer;
        if let Some(x) = &self.x {
            out.push(tensor(format!("layer{i}.x"), x, in_buffer));
        }
        let stats = |out: &mut Vec<SavedTensor>, which: &str, s: &BnStats| {
            out.push(SavedTensor::table(
                format!("layer{i}.{which}.stats"),
                s.table.dims().to_vec(),
            ));
        };
        match &self.inner {
            Inner::Mlp { out: o } => {
                let name = format!("layer{i}.out");
                out.push(if pieces {
                    SavedTensor::view(name, o.dims().to_vec(), &format!("pieces.{}", i + 1))
                } else {
                    tensor(name, o, in_buffer)
                });
            }
            Inner::BcStore {
                stats1,
                r,
                z,
                stats2,
                s,
            } => {
                stats(out, "bn1", stats1);
                out.push(tensor(format!("layer{i}.r"), r, false));
                out.push(tensor(format!("layer{i}.z"), z, false));
                stats(out, "bn2", stats2);
                out.push(tensor(format!("layer{i}.s"), s, false));
            }
            Inner::BcRecompute { stats1, stats2 } => {
                stats(out, "bn1", stats1);
                stats(out, "bn2", stats2);
            }
        }
    }
}

/// The intermediates of one bc layer's forward.
struct BcForward {
    stats1: BnStats,
    /// ReLU1's output, kept only when asked ([`bc_front`]'s `keep_r`).
    r: Option<Tensor>,
    z: Tensor,
    stats2: BnStats,
    s: Tensor,
    /// The running-stat updates of BN1 and BN2 (`(mean, var)` each; forward only).
    running: Option<[(Tensor, Tensor); 2]>,
}

/// Where a bc layer's front takes its batch statistics from.
#[derive(Clone, Copy)]
enum FrontStats<'a> {
    /// Forward: BN1's from the per-channel statistics of the features, BN2's measured on z.
    Forward(&'a ChannelStats),
    /// Recompute in backward: both as saved in forward.
    Saved(&'a BnStats, &'a BnStats),
}

/// Per-channel batch mean and biased variance of the features so far, planar `[2, C]`. A
/// channel's values never change once it is in the concatenation, so BN1 of layer i measures
/// only the k channels layer i − 1 appended instead of all C_i: the statistics are per-row
/// reductions, so they are bitwise those of measuring the whole layer input.
struct ChannelStats {
    mv: Tensor,
}

impl ChannelStats {
    fn of(x: &Tensor) -> Result<Self> {
        Ok(Self {
            mv: layer::bn_stats(x)?,
        })
    }

    /// Adds the statistics of the appended channels `y [k, M]`.
    fn append(&mut self, y: &Tensor) -> Result<()> {
        let mv = layer::bn_stats(y)?;
        self.mv = Tensor::cat(&[&self.mv, &mv], 1).ctx("feature statistics")?;
        Ok(())
    }
}

/// BN `norm` (1 or 2) of layer `i` in forward, from batch statistics `mv [2, C]`: the saved
/// stats and the running-stat update.
fn bn_forward(
    cfg: &Config,
    params: &Params,
    i: usize,
    norm: usize,
    mv: &Tensor,
) -> Result<(BnStats, (Tensor, Tensor))> {
    let [gamma, beta, rmean, rvar] = bn_params(params, i, norm)?;
    let (stats, mean, var) = layer::bn_forward_stats(cfg, mv, gamma, beta, rmean, rvar)?;
    Ok((stats, (mean, var)))
}

/// Layer `i`'s BN `norm` (1 or 2): γ, β, running mean, running variance.
fn bn_params(params: &Params, i: usize, norm: usize) -> Result<[&Tensor; 4]> {
    let p = |what| params.get(&bn_name(i, norm, what));
    Ok([
        p("weight")?,
        p("bias")?,
        p("running_mean")?,
        p("running_var")?,
    ])
}

/// BN1 → ReLU → Conv1×1 → BN2 → ReLU up to the Conv3×3 input, with the batch statistics of
/// `stats`. ReLU1's output r `[C_i, M]` is freed as soon as Conv1×1 has read it unless
/// `keep_r` (`store` keeps it for backward; `recompute` needs it in forward only for Conv1×1,
/// and in backward, on a GPU's path, keeps it for dW1 unless the schedule defers it, see
/// [`bc_backward`]). Where r is not kept, the CPU makes it a column chunk at a time
/// ([`layer::bn_relu_conv1_chunked`], [`layer::split_front`]).
fn bc_front(
    cfg: &Config,
    params: &Params,
    i: usize,
    x: &Tensor,
    relu: crate::config::variant::Relu,
    stats: FrontStats,
    keep_r: bool,
) -> Result<BcForward> {
    let (stats1, run1) = match stats {
        FrontStats::Saved(s1, _) => (s1.clone(), None),
        FrontStats::Forward(f) => {
            let (s, r) = bn_forward(cfg, params, i, 1, &f.mv)?;
            (s, Some(r))
        }
    };
    // the features' dtype (bf16: a copy of the f32 weight, freed once Conv1×1 has run)
    let w1 = layer::autocast(&conv1_matrix(cfg, params, i)?, x.dtype())?;
    let (r, z) = if !keep_r && layer::split_front(x.device()) {
        // r is needed for Conv1×1 only: made and multiplied a column chunk at a time
        (None, layer::bn_relu_conv1_chunked(&w1, x, &stats1, relu)?)
    } else {
        let r = layer::bn_apply_relu(x, &stats1, relu)?;
        let z = layer::dense_fwd(&w1, None, &r)?;
        (keep_r.then_some(r), z)
    };
    drop(w1);
    let (stats2, run2) = match stats {
        FrontStats::Saved(_, s2) => (s2.clone(), None),
        FrontStats::Forward(_) => {
            // z's statistics and BN2's per-channel step in one op
            let [gamma, beta, rmean, rvar] = bn_params(params, i, 2)?;
            let (s, mean, var) = layer::bn_forward_stats_of(&z, gamma, beta, rmean, rvar)?;
            (s, Some((mean, var)))
        }
    };
    let s = layer::bn_apply_relu(&z, &stats2, relu)?;
    Ok(BcForward {
        stats1,
        r,
        z,
        stats2,
        s,
        running: run1.zip(run2).map(|(a, b)| [a, b]),
    })
}

/// Conv1×1 weight `[B, C_i, 1, 1]` as the matrix `[B, C_i]` (a zero-copy reshape).
fn conv1_matrix(cfg: &Config, params: &Params, i: usize) -> Result<Tensor> {
    params
        .get(&conv_name(i, 1))?
        .reshape((cfg.bottleneck(), cfg.c_in(i)))
        .ctx("conv1 weight")
}

/// Forward features: one tensor per concatenation, or one append buffer.
enum Features {
    Cat {
        current: Tensor,
        /// `[x0, y0, y1, …]`, kept only for `cat-recompute`.
        pieces: Option<Vec<Tensor>>,
    },
    Buffer(AppendBuffer),
}

impl Features {
    fn current(&self, cfg: &Config, i: usize) -> Result<Tensor> {
        match self {
            Features::Cat { current, .. } => Ok(current.clone()),
            Features::Buffer(b) => b.prefix(cfg.c_in(i)),
        }
    }

    /// Appends layer output `y [k, M]`; returns the tensor now holding it (for the mlp mask).
    fn push(&mut self, cfg: &Config, i: usize, y: Tensor) -> Result<Tensor> {
        match self {
            Features::Cat { current, pieces } => {
                *current = elementwise::cat_rows(&[&*current, &y])?;
                if let Some(p) = pieces {
                    p.push(y.clone());
                }
                Ok(y)
            }
            Features::Buffer(b) => {
                b.append(&y)?;
                drop(y);
                b.rows(cfg.c_in(i), cfg.growth)
            }
        }
    }
}

/// Backward gradients of the features: a fresh tensor per layer, or one gradient buffer.
enum Grads {
    Cat(Tensor),
    Buffer(GradBuffer),
}

/// One training step of a hand-written strategy. `defer_r`: a recomputing bc layer remakes
/// ReLU1's output for dW1 after BN2's backward instead of keeping the recomputed front's
/// (`crate::model::schedule::Schedule::defer_r`, what the memory model picks).
pub fn step_manual(
    strategy: Strategy,
    cfg: &Config,
    params: &Params,
    input: &Tensor,
    grad_output: &Tensor,
    defer_r: bool,
    probe: &mut dyn Probe,
) -> Result<StepResult> {
    let (c_total, m, k) = (cfg.c_total(), cfg.m(), cfg.growth);
    let mut running = BTreeMap::new();
    let x0 = layer::to_channel_major(cfg, input)?;
    let mut feats = match strategy.concat {
        Concat::Cat => Features::Cat {
            pieces: (strategy.intermediates == Intermediates::Recompute).then(|| vec![x0.clone()]),
            current: x0,
        },
        Concat::Buffer => {
            let mut b = AppendBuffer::new(FEATURES, c_total, m, cfg.dtype, input.device())?;
            b.append(&x0)?;
            drop(x0);
            Features::Buffer(b)
        }
    };

    // ---- forward ----
    let mut saved: Vec<LayerSaved> = Vec::with_capacity(cfg.depth);
    let mut channel_stats = match cfg.family {
        Family::Bc => Some(ChannelStats::of(&feats.current(cfg, 0)?)?),
        Family::Mlp => None,
    };
    for i in 0..cfg.depth {
        let x = feats.current(cfg, i)?;
        let keep_x = match (strategy.concat, strategy.intermediates) {
            (Concat::Cat, Intermediates::Recompute) => None,
            _ => Some(x.clone()),
        };
        let layer = match cfg.family {
            Family::Mlp => {
                let w = layer::autocast(params.get(&mlp_weight(i))?, x.dtype())?;
                let b = params.get(&mlp_bias(i))?;
                let y = layer::dense_fwd(&w, Some(b), &x)?;
                drop(w);
                let y = if cfg.activation {
                    layer::relu_fwd(y, strategy.relu)?
                } else {
                    y
                };
                drop(x);
                let out = feats.push(cfg, i, y)?;
                LayerSaved {
                    x: keep_x,
                    inner: Inner::Mlp { out },
                }
            }
            Family::Bc => {
                let ch =
                    channel_stats
                        .as_mut()
                        .ok_or_else(|| crate::error::Error::BufferMisuse {
                            buffer: "bn statistics",
                            reason: "bc forward without feature statistics".to_string(),
                        })?;
                let store = strategy.intermediates == Intermediates::Store;
                let mut f = bc_front(
                    cfg,
                    params,
                    i,
                    &x,
                    strategy.relu,
                    FrontStats::Forward(ch),
                    store,
                )?;
                drop(x);
                let updates =
                    f.running
                        .take()
                        .ok_or_else(|| crate::error::Error::BufferMisuse {
                            buffer: "bn statistics",
                            reason: "forward ran without updating the running stats".to_string(),
                        })?;
                for (norm, (new_m, new_v)) in [1, 2].into_iter().zip(updates) {
                    running.insert(bn_name(i, norm, "running_mean"), new_m);
                    running.insert(bn_name(i, norm, "running_var"), new_v);
                }
                let w2 = layer::autocast(params.get(&conv_name(i, 2))?, f.s.dtype())?;
                let y = layer::conv3x3_fwd(cfg, &f.s, &w2)?;
                drop(w2);
                if i + 1 < cfg.depth {
                    ch.append(&y)?; // the last layer's output is normalised by no BN
                }
                feats.push(cfg, i, y)?;
                let inner = match strategy.intermediates {
                    Intermediates::Store => Inner::BcStore {
                        stats1: f.stats1,
                        r: f.r.ok_or_else(|| crate::error::Error::BufferMisuse {
                            buffer: "saved state",
                            reason: format!("layer {i}: the stored front lost r"),
                        })?,
                        z: f.z,
                        stats2: f.stats2,
                        s: f.s,
                    },
                    Intermediates::Recompute => Inner::BcRecompute {
                        stats1: f.stats1,
                        stats2: f.stats2,
                    },
                };
                LayerSaved { x: keep_x, inner }
            }
        };
        saved.push(layer);
        probe.event(Event::ForwardLayer(i));
    }
    drop(channel_stats); // backward re-reads only the saved tables
    let (output, pieces) = match feats {
        Features::Cat { current, pieces } => (current, pieces),
        Features::Buffer(b) => (b.into_full()?, None),
    };
    {
        let mut described = Vec::new();
        if strategy.concat == Concat::Buffer {
            described.push(SavedTensor::owned(FEATURES, output.dims().to_vec()));
        }
        if let Some(p) = &pieces {
            for (j, t) in p.iter().enumerate() {
                described.push(SavedTensor::owned(format!("pieces.{j}"), t.dims().to_vec()));
            }
        }
        for (i, s) in saved.iter().enumerate() {
            s.describe(i, strategy.concat, pieces.is_some(), &mut described);
        }
        probe.event(Event::ForwardEnd { saved: &described });
    }

    // ---- backward ----
    let upstream = layer::to_channel_major(cfg, grad_output)?;
    let mut grads = match strategy.concat {
        Concat::Cat => Grads::Cat(upstream),
        Concat::Buffer => Grads::Buffer(GradBuffer::from_upstream("feature gradients", upstream)?),
    };
    let mut param_grads = BTreeMap::new();
    for i in (0..cfg.depth).rev() {
        let c_in = cfg.c_in(i);
        let layer = saved
            .pop()
            .ok_or_else(|| crate::error::Error::BufferMisuse {
                buffer: "saved state",
                reason: format!("no saved state for layer {i}"),
            })?;
        let gy = match &mut grads {
            Grads::Cat(g) => g.narrow(0, c_in, k).ctx("grad of layer output")?,
            Grads::Buffer(b) => b.seal_top(k)?,
        };
        let x = match layer.x {
            Some(x) => x,
            None => {
                let p = pieces
                    .as_ref()
                    .ok_or_else(|| crate::error::Error::BufferMisuse {
                        buffer: "pieces",
                        reason: "cat-recompute lost its pieces".to_string(),
                    })?;
                elementwise::cat_rows(&p[..=i].iter().collect::<Vec<_>>())?
            }
        };
        // bc: BN1's backward adds its input gradient straight into the buffer's prefix, or (cat)
        // into a new copy of the previous gradient's prefix — no [C_i, M] temporary and no
        // second pass either way; mlp adds its own below.
        let into = match (&mut grads, cfg.family) {
            (_, Family::Mlp) => None,
            (Grads::Buffer(b), Family::Bc) => {
                Some(InputGrad::Into(b.prefix_for_accumulation(c_in)?))
            }
            (Grads::Cat(g), Family::Bc) => Some(InputGrad::New(
                g.narrow(0, 0, c_in).ctx("grad of layer input")?,
            )),
        };
        let bc_into = || {
            into.ok_or_else(|| crate::error::Error::BufferMisuse {
                buffer: "feature gradients",
                reason: format!("bc layer {i} without its input gradient's destination"),
            })
        };
        let dx: Option<Tensor> = match layer.inner {
            Inner::Mlp { out } => {
                let gy = if cfg.activation {
                    layer::relu_bwd(gy, &out, strategy.relu)?
                } else {
                    gy
                };
                drop(out);
                param_grads.insert(mlp_weight(i), layer::dense_bwd_weight(&gy, &x)?);
                param_grads.insert(mlp_bias(i), layer::dense_bwd_bias(&gy)?);
                drop(x);
                // the features' dtype (bf16: a copy of the f32 weight, freed with this layer)
                let w = &layer::autocast(params.get(&mlp_weight(i))?, gy.dtype())?;
                // The input gradient is added straight into the gradient of the layer input:
                // the buffer's prefix, or (cat) a new tensor holding the prefix's values.
                match &mut grads {
                    // gy is the buffer's own sealed rows unless the ReLU backward copied it
                    Grads::Buffer(b) if cfg.activation && strategy.relu == Relu::Copy => {
                        let prefix = b.prefix_for_accumulation(c_in)?;
                        layer::dense_bwd_input_accumulate(w, &gy, &prefix)?;
                    }
                    Grads::Buffer(b) => {
                        drop(gy);
                        let rows = b.open_and_sealed(k)?;
                        layer::dense_bwd_input_accumulate_tail(w, &rows, c_in)?;
                    }
                    Grads::Cat(g) => {
                        let next = elementwise::copy_rows(
                            &g.narrow(0, 0, c_in).ctx("grad of layer input")?,
                        )?;
                        layer::dense_bwd_input_accumulate(w, &gy, &next)?;
                        drop(gy);
                        *g = next;
                    }
                }
                None
            }
            Inner::BcStore {
                stats1,
                r,
                z,
                stats2,
                s,
            } => bc_backward(
                cfg,
                params,
                i,
                strategy,
                gy,
                x,
                stats1,
                Some(r),
                z,
                stats2,
                s,
                bc_into()?,
                &mut param_grads,
            )?,
            Inner::BcRecompute { stats1, stats2 } => {
                let f = bc_front(
                    cfg,
                    params,
                    i,
                    &x,
                    strategy.relu,
                    FrontStats::Saved(&stats1, &stats2),
                    // the CPU's split backward remakes r a column group at a time
                    !defer_r && !layer::split_front(x.device()),
                )?;
                bc_backward(
                    cfg,
                    params,
                    i,
                    strategy,
                    gy,
                    x,
                    stats1,
                    f.r,
                    f.z,
                    stats2,
                    f.s,
                    bc_into()?,
                    &mut param_grads,
                )?
            }
        };
        grads = match (grads, dx) {
            // bc: the new gradient of the layer input, the previous one's prefix plus dx
            (Grads::Cat(g), Some(next)) => {
                drop(g);
                Grads::Cat(next)
            }
            // mlp layers have already replaced it
            (Grads::Cat(g), None) => Grads::Cat(g),
            (Grads::Buffer(b), None) => Grads::Buffer(b),
            (Grads::Buffer(_), Some(_)) => {
                return Err(crate::error::Error::BufferMisuse {
                    buffer: "feature gradients",
                    reason: format!("layer {i} returned an input gradient instead of adding it"),
                })
            }
        };
        probe.event(Event::BackwardLayer(i));
    }
    let grad_input_cm = match grads {
        Grads::Cat(g) => g,
        Grads::Buffer(b) => b.into_open()?,
    };
    probe.event(Event::BackwardEnd);
    drop(pieces);
    Ok(StepResult {
        output: layer::to_canonical(cfg, &output)?,
        grad_input: layer::to_canonical(cfg, &grad_input_cm)?,
        grads: param_grads,
        running,
    })
}

/// Where a bc layer's input gradient goes.
enum InputGrad {
    /// Added **in place** into this view (the gradient buffer's prefix).
    Into(Tensor),
    /// Added into a new copy of this view (the previous gradient's prefix, `cat`), made at the
    /// moment BN1's backward needs it and returned.
    New(Tensor),
}

/// bc layer backward from its (saved or recomputed) intermediates; consumes and frees each as
/// soon as it has been read. Adds the gradient of the layer input `[C_i, M]` as `into` says:
/// returns the new gradient for [`InputGrad::New`], `None` for [`InputGrad::Into`].
///
/// `r` is `None` when a recomputing layer does not keep it: ReLU1's output is then remade from
/// `x` and BN1's saved table just before Conv1×1's weight gradient reads it, so it is not live
/// through the 3×3 convolution's backward and BN2's (bitwise the same values, the same kernel
/// on the same inputs): on the CPU a column group at a time ([`Front::backward_blocked`]),
/// on a GPU's path whole where the schedule defers it (`defer_r`: one BN1 apply more per
/// layer, `C_i` rows fewer where that sets the peak).
#[allow(clippy::too_many_arguments)]
fn bc_backward(
    cfg: &Config,
    params: &Params,
    i: usize,
    strategy: Strategy,
    gy: Tensor,
    x: Tensor,
    stats1: BnStats,
    r: Option<Tensor>,
    z: Tensor,
    stats2: BnStats,
    s: Tensor,
    into: InputGrad,
    param_grads: &mut BTreeMap<String, Tensor>,
) -> Result<Option<Tensor>> {
    let w2 = layer::autocast(params.get(&conv_name(i, 2))?, gy.dtype())?;
    let (ds, dw2) = layer::conv3x3_bwd(cfg, &gy, &s, &w2)?;
    drop((gy, w2));
    param_grads.insert(conv_name(i, 2), dw2);
    let gamma2 = params.get(&bn_name(i, 2, "weight"))?;
    let (dz, dg2, dbeta2) = match strategy.relu {
        // ReLU2's backward, then BN2's, each with its output
        Relu::Copy => {
            let db = layer::relu_bwd(ds, &s, Relu::Copy)?;
            drop(s);
            layer::bn_bwd(&db, &z, &stats2, gamma2)?
        }
        // ReLU2's backward fused into BN2's (masked from z, as `s` was made from it)
        Relu::Inplace => {
            drop(s);
            let grads = layer::bn_relu_bwd(&ds, &z, &stats2, gamma2)?;
            drop(ds);
            grads
        }
    };
    drop(z);
    param_grads.insert(bn_name(i, 2, "weight"), dg2);
    param_grads.insert(bn_name(i, 2, "bias"), dbeta2);
    let w1 = layer::autocast(&conv1_matrix(cfg, params, i)?, dz.dtype())?;
    let gamma1 = params.get(&bn_name(i, 1, "weight"))?;
    let front = Front {
        x: &x,
        stats1: &stats1,
        w1: &w1,
        gamma1,
        relu: strategy.relu,
    };
    let (dw1, dg1, dbeta1, dx) = if layer::split_front(x.device()) {
        front.backward_blocked(r, dz, into)?
    } else {
        front.backward_whole(r, dz, into)?
    };
    drop(w1);
    param_grads.insert(
        conv_name(i, 1),
        dw1.reshape((cfg.bottleneck(), cfg.c_in(i), 1, 1))
            .ctx("conv1 dW")?,
    );
    param_grads.insert(bn_name(i, 1, "weight"), dg1);
    param_grads.insert(bn_name(i, 1, "bias"), dbeta1);
    Ok(dx)
}

/// The gradients of a bc layer's front, BN1 → ReLU → Conv1×1: `(dW1 [B, C_i], dγ1, dβ1, dx)`,
/// with `dx` as [`bc_backward`] returns it.
type FrontGrads = (Tensor, Tensor, Tensor, Option<Tensor>);

/// A bc layer's BN1 → ReLU → Conv1×1 for its backward: the layer input, BN1's saved table,
/// the Conv1×1 matrix `[B, C_i]` and γ1.
struct Front<'a> {
    x: &'a Tensor,
    stats1: &'a BnStats,
    w1: &'a Tensor,
    gamma1: &'a Tensor,
    relu: Relu,
}

impl Front<'_> {
    /// The front's backward from Conv1×1's output gradient `dz`, over all C_i channels at once
    /// (a GPU's path): dW1 from ReLU1's output `r` (remade from `x` and BN1's table where the
    /// schedule deferred it; [`layer::conv1_bwd_weight`], on the CPU a chunked sum as the split
    /// front's), then `dr`, ReLU1's mask (from `x` and the table, so `r` is freed
    /// first: one `C_i·M` tensor fewer at BN1's backward) and BN1's backward, which adds `dx`
    /// into `into`.
    fn backward_whole(&self, r: Option<Tensor>, dz: Tensor, into: InputGrad) -> Result<FrontGrads> {
        let r = match r {
            Some(r) => r,
            None => layer::bn_apply_relu(self.x, self.stats1, self.relu)?,
        };
        let c = self.x.dims()[0];
        let dw1 = layer::conv1_bwd_weight(&dz, c, |g0, n| r.narrow(1, g0, n).ctx("conv1 dW"))?;
        drop(r);
        let dr = layer::dense_bwd_input(self.w1, &dz)?;
        drop(dz);
        let (da, relu) = relu1_bwd(dr, self.x, self.stats1, self.relu)?;
        let bn1 = |dst: &Tensor| {
            let (x, stats, gamma) = (self.x, self.stats1, self.gamma1);
            if relu {
                layer::bn_relu_bwd_accumulate(&da, x, stats, gamma, dst)
            } else {
                layer::bn_bwd_accumulate(&da, x, stats, gamma, dst)
            }
        };
        let (dx, dg1, dbeta1) = match into {
            InputGrad::Into(dst) => {
                let (dg, db) = bn1(&dst)?;
                (None, dg, db)
            }
            InputGrad::New(prefix) => {
                let next = elementwise::copy_rows(&prefix)?;
                drop(prefix);
                let (dg, db) = bn1(&next)?;
                (Some(next), dg, db)
            }
        };
        Ok((dw1, dg1, dbeta1, dx))
    }

    /// [`Front::backward_whole`] in pieces (the split front, on any device), in two passes. First dW1
    /// ([`layer::conv1_bwd_weight`]), from ReLU1's output a column group of
    /// [`layer::dw_groups`] at a time (columns of the saved `r`, else remade from the group's
    /// columns of `x`). Then, a block of [`layer::grad_blocks`] at a time, the block's `dr`,
    /// ReLU1's mask and BN1's backward on its channels, which adds the block's rows of `dx`
    /// into `into`. Every op is per channel or element, or sums as the unsplit one does, so the
    /// results are bitwise [`Front::backward_whole`]'s on the CPU's kernels (on a GPU's path up
    /// to cuBLAS's summation order), with group- and block-sized transients where that has
    /// `[C_i, M]` ones.
    fn backward_blocked(
        &self,
        r: Option<Tensor>,
        dz: Tensor,
        into: InputGrad,
    ) -> Result<FrontGrads> {
        let c = self.x.dims()[0];
        let dw1 = layer::conv1_bwd_weight(&dz, c, |g0, n| match &r {
            Some(r) => r.narrow(1, g0, n).ctx("column group"),
            None => {
                let x = self.x.narrow(1, g0, n).ctx("column group")?;
                layer::bn_apply_relu(&x, self.stats1, self.relu)
            }
        })?;
        // a saved r's last reader
        drop(r);
        // where dx goes: the buffer's prefix, or (cat) a new tensor holding the previous
        // gradient's prefix plus dx, allocated when BN1's backward first needs it and written
        // block by block in the same pass as dx (no copy of the prefix first)
        let (mut dst, prefix, new) = match into {
            InputGrad::Into(dst) => (Some(dst), None, false),
            InputGrad::New(prefix) => (None, Some(prefix), true),
        };
        // the CPU writes the new gradient block by block as prefix + dx in one pass
        // (`bn_bwd_accumulate_from`, a CPU kernel); elsewhere the prefix is copied first
        let fused_copy = layer::cpu_kernels(self.x.device());
        let mut sums = Vec::new();
        for (c0, n) in layer::grad_blocks(c) {
            let rows = |t: &Tensor| t.narrow(0, c0, n).ctx("channel block");
            let (x, stats) = (rows(self.x)?, self.stats1.channels(c0, n)?);
            let w1 = self.w1.narrow(1, c0, n).ctx("channel block")?;
            let dr = layer::dense_bwd_input(&w1, &dz)?;
            let (da, relu) = relu1_bwd(dr, &x, &stats, self.relu)?;
            if let (Some(p), None) = (&prefix, &dst) {
                dst = Some(if fused_copy {
                    // SAFETY: the blocks of grad_blocks tile the channels, and each block's
                    // rows are written whole by bn_bwd_accumulate_from below before anything
                    // reads them.
                    unsafe { unfilled(p.dims(), p.dtype(), p.device(), "grad of layer input")? }
                } else {
                    // a GPU's path: the prefix copied whole, each block's dx added into it
                    elementwise::copy_rows(p)?
                });
            }
            let d = dst
                .as_ref()
                .ok_or_else(|| crate::error::Error::BufferMisuse {
                    buffer: "feature gradients",
                    reason: "a channel block without its input gradient".to_string(),
                })?;
            let gamma = self.gamma1.narrow(0, c0, n).ctx("channel block")?;
            sums.push(match (&prefix, relu) {
                (Some(p), false) if fused_copy => {
                    layer::bn_bwd_accumulate_from(&da, &x, &stats, &gamma, &rows(p)?, &rows(d)?)?
                }
                (Some(p), true) if fused_copy => layer::bn_relu_bwd_accumulate_from(
                    &da,
                    &x,
                    &stats,
                    &gamma,
                    &rows(p)?,
                    &rows(d)?,
                )?,
                (_, false) => layer::bn_bwd_accumulate(&da, &x, &stats, &gamma, &rows(d)?)?,
                (_, true) => layer::bn_relu_bwd_accumulate(&da, &x, &stats, &gamma, &rows(d)?)?,
            });
        }
        drop(prefix);
        drop(dz);
        let (dg1, dbeta1) = if sums.len() == 1 {
            sums.remove(0)
        } else {
            let (dgs, dbs): (Vec<Tensor>, Vec<Tensor>) = sums.drain(..).unzip();
            (
                Tensor::cat(&dgs, 0).ctx("bn1 dγ")?,
                Tensor::cat(&dbs, 0).ctx("bn1 dβ")?,
            )
        };
        let next = if new { dst } else { None };
        Ok((dw1, dg1, dbeta1, next))
    }
}

/// ReLU1's backward on `dr`, the gradient of its output over the channels of `x` and `stats`
/// (all of them, or a channel block's): `copy` masks into a new tensor here (`(da, false)`),
/// before the caller allocates anything else, as the memory model orders it; `inplace` leaves
/// it to BN1's backward, which fuses it in (`(dr, true)`: `layer::bn_relu_bwd_accumulate`).
fn relu1_bwd(dr: Tensor, x: &Tensor, stats: &BnStats, relu: Relu) -> Result<(Tensor, bool)> {
    Ok(match relu {
        Relu::Copy => (layer::relu_bwd_bn(dr, x, stats, Relu::Copy)?, false),
        Relu::Inplace => (dr, true),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu::shared::{bits, randn};
    use candle_core::DType;

    /// The CPU's front backward in pieces is bitwise the whole one, for both ReLU modes, with
    /// ReLU1's output given (store) or remade a column group at a time (recompute), its input
    /// gradient added into a buffer view or into a new copy of the previous gradient's prefix
    /// (cat). 4796 columns make two column groups for dW1 (4096 + 700, the last chunk 188
    /// columns), 200 channels four blocks for BN1's backward, with BC-100's bottleneck of 48.
    #[test]
    fn the_blocked_front_backward_is_bitwise_the_whole_one() -> Result<()> {
        let (c, b, m) = (200, 48, 4796);
        assert_eq!(layer::dw_groups(m), [(0, 4096), (4096, 700)]);
        assert!(layer::grad_blocks(c).len() > 3);
        for dtype in [DType::F32, DType::F64] {
            let x = randn((c, m), dtype);
            let stats1 = BnStats {
                table: randn((4, c), dtype),
            };
            let (w1, gamma1) = (randn((b, c), dtype), randn(c, dtype));
            let (dz, grad) = (randn((b, m), dtype), randn((c, m), dtype));
            for relu in [Relu::Copy, Relu::Inplace] {
                let front = Front {
                    x: &x,
                    stats1: &stats1,
                    w1: &w1,
                    gamma1: &gamma1,
                    relu,
                };
                for keep_r in [false, true] {
                    let r = || -> Result<Option<Tensor>> {
                        Ok(if keep_r {
                            Some(layer::bn_apply_relu(&x, &stats1, relu)?)
                        } else {
                            None
                        })
                    };
                    for new in [false, true] {
                        let what = format!("{dtype:?} {relu:?} keep_r {keep_r} new {new}");
                        let run = |blocked: bool| -> Result<(FrontGrads, Tensor)> {
                            let dst = elementwise::copy_rows(&grad)?;
                            let into = if new {
                                InputGrad::New(dst.clone())
                            } else {
                                InputGrad::Into(dst.clone())
                            };
                            let dz = elementwise::copy_rows(&dz)?;
                            let out = if blocked {
                                front.backward_blocked(r()?, dz, into)?
                            } else {
                                front.backward_whole(r()?, dz, into)?
                            };
                            Ok((out, dst))
                        };
                        let ((w_a, g_a, b_a, dx_a), dst_a) = run(false)?;
                        let ((w_b, g_b, b_b, dx_b), dst_b) = run(true)?;
                        assert_eq!(w_a.dims(), &[b, c], "{what}");
                        assert!(bits(&w_a) == bits(&w_b), "{what}: dW1");
                        assert!(bits(&g_a) == bits(&g_b), "{what}: dγ1");
                        assert!(bits(&b_a) == bits(&b_b), "{what}: dβ1");
                        assert!(bits(&dst_a) == bits(&dst_b), "{what}: the destination");
                        match (dx_a, dx_b) {
                            (Some(a), Some(b)) if new => {
                                assert!(bits(&a) == bits(&b), "{what}: dx");
                                // the prefix itself is untouched; dx is a new tensor
                                assert!(bits(&dst_a) == bits(&grad), "{what}");
                                assert!(bits(&a) != bits(&grad), "{what}");
                            }
                            (None, None) if !new => {
                                assert!(bits(&dst_a) != bits(&grad), "{what}: nothing added");
                            }
                            _ => panic!("{what}: dx returned as it should not be"),
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
