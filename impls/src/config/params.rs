//! Parameters and BN buffers under PyTorch `state_dict` names, with seeded deterministic init.
//!
//! Names and layouts follow PyTorch so a block saved there loads here:
//! - `mlp`: `layers.{i}.weight` `[k, C0+i·k]`, `layers.{i}.bias` `[k]` (nn.Linear).
//! - `bc`: torchvision's `_DenseLayer`, `denselayer{i+1}.norm1.weight|bias|running_mean|running_var`
//!   [C0+i·k], `.conv1.weight` [bn_size·k, C0+i·k, 1, 1], `.norm2.*` [bn_size·k],
//!   `.conv2.weight` [k, bn_size·k, 3, 3].

use crate::config::{Config, Family};
use crate::error::{CandleContext, Error, Result};
use candle_core::{DType, Device, Tensor};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use std::collections::BTreeMap;

/// Whether a named tensor is trained (gets a gradient) or a BN running statistic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Param,
    RunningStat,
}

/// How a tensor is initialised.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// U(-1/√fan_in, 1/√fan_in): PyTorch's default for Linear and Conv.
    FanIn(usize),
    /// U(lo, hi). BN affine parameters and running stats are drawn away from PyTorch's 1/0 so
    /// that every gradient path and the running-stat update are exercised by the tests.
    Uniform(f64, f64),
}

/// The specification of one named tensor.
#[derive(Debug, Clone)]
pub struct Spec {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: Kind,
    init: Init,
}

/// Every named tensor of a block, in a stable order: layer by layer ([`layer_specs`]).
pub fn specs(cfg: &Config) -> Vec<Spec> {
    (0..cfg.depth).flat_map(|i| layer_specs(cfg, i)).collect()
}

/// The named tensors of layer `i`, in a stable order.
pub fn layer_specs(cfg: &Config, i: usize) -> Vec<Spec> {
    let mut out = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, kind: Kind, init: Init| {
        out.push(Spec {
            name,
            shape,
            kind,
            init,
        })
    };
    let k = cfg.growth;
    let c = cfg.c_in(i);
    match cfg.family {
        Family::Mlp => {
            push(mlp_weight(i), vec![k, c], Kind::Param, Init::FanIn(c));
            push(mlp_bias(i), vec![k], Kind::Param, Init::FanIn(c));
        }
        Family::Bc => {
            let b = cfg.bottleneck();
            for (norm, ch) in [(1, c), (2, b)] {
                push(
                    bn_name(i, norm, "weight"),
                    vec![ch],
                    Kind::Param,
                    Init::Uniform(0.5, 1.5),
                );
                push(
                    bn_name(i, norm, "bias"),
                    vec![ch],
                    Kind::Param,
                    Init::Uniform(-0.5, 0.5),
                );
                push(
                    bn_name(i, norm, "running_mean"),
                    vec![ch],
                    Kind::RunningStat,
                    Init::Uniform(-0.1, 0.1),
                );
                push(
                    bn_name(i, norm, "running_var"),
                    vec![ch],
                    Kind::RunningStat,
                    Init::Uniform(0.5, 1.5),
                );
            }
            push(
                conv_name(i, 1),
                vec![b, c, 1, 1],
                Kind::Param,
                Init::FanIn(c),
            );
            push(
                conv_name(i, 2),
                vec![k, b, 3, 3],
                Kind::Param,
                Init::FanIn(9 * b),
            );
        }
    }
    out
}

pub fn mlp_weight(i: usize) -> String {
    format!("layers.{i}.weight")
}
pub fn mlp_bias(i: usize) -> String {
    format!("layers.{i}.bias")
}
/// `denselayer{i+1}.norm{norm}.{what}`.
pub fn bn_name(i: usize, norm: usize, what: &str) -> String {
    format!("denselayer{}.norm{norm}.{what}", i + 1)
}
/// `denselayer{i+1}.conv{conv}.weight`.
pub fn conv_name(i: usize, conv: usize) -> String {
    format!("denselayer{}.conv{conv}.weight", i + 1)
}

/// A deterministic stream of uniform numbers, one per (seed, name): a tensor's values do not
/// depend on which other tensors were drawn before it.
pub fn uniform(seed: u64, name: &str, count: usize, lo: f64, hi: f64) -> Vec<f64> {
    // FNV-1a over the name: stable across Rust versions, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ h);
    (0..count)
        .map(|_| {
            // 53 random mantissa bits → [0, 1).
            let unit = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            lo + (hi - lo) * unit
        })
        .collect()
}

/// A tensor of `shape` filled from [`uniform`], in `dtype`. bf16 values are those of the f32
/// tensor rounded to bf16 (f64 → f32 → bf16, each to nearest even), so a bf16 case holds the
/// f32 case's values rounded once more, never a value the f32 case would not round to.
pub fn uniform_tensor(
    cfg: &Config,
    name: &str,
    shape: &[usize],
    (lo, hi): (f64, f64),
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let count = shape.iter().product();
    let values = uniform(cfg.seed, name, count, lo, hi);
    let t = Tensor::from_vec(values, shape, device).ctx(name)?;
    let t = match dtype {
        DType::BF16 => t.to_dtype(DType::F32).ctx(name)?,
        _ => t,
    };
    t.to_dtype(dtype).ctx(name)
}

/// Named parameters and BN running stats of one block.
#[derive(Debug, Clone)]
pub struct Params {
    pub tensors: BTreeMap<String, Tensor>,
}

impl Params {
    /// Seeded deterministic init: the same config and seed give bitwise the same tensors, in
    /// the config's [`Config::param_dtype`] (a bf16 block's are its f32 block's).
    pub fn init(cfg: &Config, device: &Device) -> Result<Params> {
        cfg.validate()?;
        let mut tensors = BTreeMap::new();
        for spec in specs(cfg) {
            let (lo, hi) = match spec.init {
                Init::FanIn(fan_in) => {
                    let bound = 1.0 / (fan_in as f64).sqrt();
                    (-bound, bound)
                }
                Init::Uniform(lo, hi) => (lo, hi),
            };
            let t = uniform_tensor(
                cfg,
                &spec.name,
                &spec.shape,
                (lo, hi),
                cfg.param_dtype(),
                device,
            )?;
            tensors.insert(spec.name, t);
        }
        Ok(Params { tensors })
    }

    /// Builds from named tensors (e.g. a case file), checking every name, shape and dtype (the
    /// config's [`Config::param_dtype`]).
    pub fn from_tensors(cfg: &Config, mut named: BTreeMap<String, Tensor>) -> Result<Params> {
        let mut tensors = BTreeMap::new();
        for spec in specs(cfg) {
            let t = named
                .remove(&spec.name)
                .ok_or_else(|| Error::MissingTensor {
                    name: spec.name.clone(),
                    context: format!(" (expected shape {:?} for {})", spec.shape, cfg.describe()),
                })?;
            check_tensor(&spec.name, &t, &spec.shape, cfg.param_dtype())?;
            tensors.insert(spec.name, t);
        }
        Ok(Params { tensors })
    }

    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors.get(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            context: " from the parameters".to_string(),
        })
    }

    /// Total bytes of parameters and buffers.
    pub fn bytes(&self) -> usize {
        self.tensors
            .values()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }
}

/// Errs unless `t` has exactly `shape` and `dtype`, naming the tensor.
pub fn check_tensor(name: &str, t: &Tensor, shape: &[usize], dtype: DType) -> Result<()> {
    if t.dims() != shape {
        return Err(Error::ShapeMismatch {
            name: name.to_string(),
            expected: shape.to_vec(),
            found: t.dims().to_vec(),
        });
    }
    if t.dtype() != dtype {
        return Err(Error::DTypeMismatch {
            name: name.to_string(),
            expected: dtype.as_str().to_string(),
            found: t.dtype().as_str().to_string(),
        });
    }
    Ok(())
}
