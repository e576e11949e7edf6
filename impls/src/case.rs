//! Cross-framework case files: a block's parameters, input and upstream gradient in one
//! safetensors file, and one step's results written back the same way.
//!
//! Input file tensors: `input`, `grad_output`, and every parameter and BN buffer under its
//! PyTorch `state_dict` name. The config is read from the tensors: the family from which names
//! exist (`layers.0.weight` → mlp, `denselayer1.conv1.weight` → bc), N and C0 from `input`,
//! L from the number of layers, k from the last weight's output channels, bn_size from
//! `conv1.weight`, H = W from `input`, the dtype from `input`. Only the mlp activation cannot be
//! seen in the tensors and is given by the caller (default on). Extra tensors such as PyTorch's
//! `num_batches_tracked` are ignored.
//!
//! Result file tensors: `output`, `grad.input`, `grad.<param name>`, and the updated
//! `<bn name>.running_mean|running_var`.

use crate::config::{Config, Family};
use crate::error::{CandleContext, Error, Result};
use crate::params::{self, Params};
use crate::step::StepResult;
use candle_core::{Device, Tensor};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Lower and upper bound of the uniform input and upstream gradient of a random case.
const CASE_RANGE: (f64, f64) = (-1.0, 1.0);

/// A block's parameters with one input and upstream gradient: everything a step needs.
#[derive(Debug, Clone)]
pub struct Case {
    pub cfg: Config,
    pub params: Params,
    pub input: Tensor,
    pub grad_output: Tensor,
}

fn load_map(path: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    if !path.exists() {
        return Err(Error::Io {
            path: path.display().to_string(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    candle_core::safetensors::load(path, device)
        .ctx(&format!("reading safetensors {}", path.display()))
}

fn save_map(map: &HashMap<String, Tensor>, path: &Path) -> Result<()> {
    let mut contiguous = HashMap::new();
    for (k, t) in map {
        contiguous.insert(k.clone(), t.contiguous().ctx(k)?);
    }
    candle_core::safetensors::save(&contiguous, path).ctx(&format!("writing {}", path.display()))
}

fn dim(name: &str, t: &Tensor, axis: usize, rank: usize) -> Result<usize> {
    if t.rank() != rank {
        return Err(Error::InvalidConfig {
            field: "case file",
            value: format!("{name} with shape {:?}", t.dims()),
            reason: format!("expected a rank-{rank} tensor"),
        });
    }
    Ok(t.dims()[axis])
}

impl Case {
    /// Seeded random parameters (see [`Params::init`]), input and upstream gradient.
    pub fn random(cfg: &Config, device: &Device) -> Result<Case> {
        let params = Params::init(cfg, device)?;
        let (lo, hi) = CASE_RANGE;
        let input = params::uniform_tensor(cfg, "input", &cfg.input_shape(), lo, hi, device)?;
        let grad_output =
            params::uniform_tensor(cfg, "grad_output", &cfg.output_shape(), lo, hi, device)?;
        Ok(Case {
            cfg: cfg.clone(),
            params,
            input,
            grad_output,
        })
    }

    /// The same case in another dtype. Widening f32 → f64 is exact, so an f64 step on the
    /// widened case is the exact-arithmetic reference for the f32 case.
    pub fn to_dtype(&self, dtype: candle_core::DType) -> Result<Case> {
        let cfg = Config {
            dtype,
            ..self.cfg.clone()
        };
        let tensors = self
            .params
            .tensors
            .iter()
            .map(|(k, v)| Ok((k.clone(), v.to_dtype(dtype).ctx(k)?)))
            .collect::<Result<_>>()?;
        Ok(Case {
            params: Params { tensors },
            input: self.input.to_dtype(dtype).ctx("input")?,
            grad_output: self.grad_output.to_dtype(dtype).ctx("grad_output")?,
            cfg,
        })
    }

    /// Runs one step of `variant` on this case.
    pub fn step(&self, variant: crate::Variant) -> Result<StepResult> {
        crate::step(
            variant,
            &self.cfg,
            &self.params,
            &self.input,
            &self.grad_output,
            &mut crate::NoProbe,
        )
    }

    /// The reference results: `autograd` (independent of every hand-written backward) run in
    /// f64 on this case widened to f64 — exact-arithmetic truth up to f64 rounding, whatever
    /// the case's own dtype.
    pub fn reference(&self) -> Result<StepResult> {
        self.to_dtype(candle_core::DType::F64)?
            .step(crate::Variant::Autograd)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let mut map: HashMap<String, Tensor> = self
            .params
            .tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        map.insert("input".to_string(), self.input.clone());
        map.insert("grad_output".to_string(), self.grad_output.clone());
        save_map(&map, path)
    }

    /// Loads a case, inferring the config from the tensors (see the module docs). `activation`
    /// sets the mlp ReLU, which the tensors cannot show.
    pub fn load(path: &Path, activation: bool, device: &Device) -> Result<Case> {
        let map = load_map(path, device)?;
        let get = |name: &str| -> Result<&Tensor> {
            map.get(name).ok_or_else(|| Error::MissingTensor {
                name: name.to_string(),
                context: format!(" from case file {}", path.display()),
            })
        };
        let input = get("input")?;
        let family = if map.contains_key(&params::mlp_weight(0)) {
            Family::Mlp
        } else if map.contains_key(&params::conv_name(0, 1)) {
            Family::Bc
        } else {
            return Err(Error::MissingTensor {
                name: format!("{} or {}", params::mlp_weight(0), params::conv_name(0, 1)),
                context: format!(
                    " from case file {} (needed to tell the family: mlp or bc)",
                    path.display()
                ),
            });
        };
        let depth = (0..)
            .take_while(|&i| match family {
                Family::Mlp => map.contains_key(&params::mlp_weight(i)),
                Family::Bc => map.contains_key(&params::conv_name(i, 1)),
            })
            .count();
        let rank = if family == Family::Mlp { 2 } else { 4 };
        let batch = dim("input", input, 0, rank)?;
        let channels = dim("input", input, 1, rank)?;
        let (growth, bn_size, size) = match family {
            Family::Mlp => (
                dim(&params::mlp_weight(0), get(&params::mlp_weight(0))?, 0, 2)?,
                1,
                1,
            ),
            Family::Bc => {
                let w2 = get(&params::conv_name(0, 2))?;
                let k = dim(&params::conv_name(0, 2), w2, 0, 4)?;
                let b = dim(
                    &params::conv_name(0, 1),
                    get(&params::conv_name(0, 1))?,
                    0,
                    4,
                )?;
                if k == 0 || b % k != 0 {
                    return Err(Error::InvalidConfig {
                        field: "bn_size",
                        value: format!("{b}/{k}"),
                        reason: "conv1 output channels must be a multiple of the growth rate"
                            .to_string(),
                    });
                }
                let (h, w) = (input.dims()[2], input.dims()[3]);
                if h != w {
                    return Err(Error::InvalidConfig {
                        field: "size",
                        value: format!("{h}x{w}"),
                        reason: "densebench blocks are square (H = W)".to_string(),
                    });
                }
                (k, b / k, h)
            }
        };
        let cfg = Config {
            family,
            batch,
            channels,
            growth,
            depth,
            bn_size,
            size,
            activation,
            dtype: input.dtype(),
            seed: 0,
        };
        cfg.validate()?;
        params::check_tensor("input", input, &cfg.input_shape(), cfg.dtype)?;
        let grad_output = get("grad_output")?;
        params::check_tensor("grad_output", grad_output, &cfg.output_shape(), cfg.dtype)?;
        let named: BTreeMap<String, Tensor> =
            map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let params = Params::from_tensors(&cfg, named)?;
        Ok(Case {
            input: input.clone(),
            grad_output: grad_output.clone(),
            cfg,
            params,
        })
    }
}

/// Writes a step's results: `output`, `grad.input`, `grad.<param>`, `<bn>.running_*`.
pub fn save_result(result: &StepResult, path: &Path) -> Result<()> {
    let mut map = HashMap::new();
    map.insert("output".to_string(), result.output.clone());
    map.insert("grad.input".to_string(), result.grad_input.clone());
    for (k, v) in &result.grads {
        map.insert(format!("grad.{k}"), v.clone());
    }
    for (k, v) in &result.running {
        map.insert(k.clone(), v.clone());
    }
    save_map(&map, path)
}

/// Reads a result file written by [`save_result`] for `cfg`, checking every tensor.
pub fn load_result(cfg: &Config, path: &Path, device: &Device) -> Result<StepResult> {
    let mut map = load_map(path, device)?;
    let mut take = |name: &str, shape: &[usize]| -> Result<Tensor> {
        let t = map.remove(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            context: format!(" from result file {}", path.display()),
        })?;
        params::check_tensor(name, &t, shape, cfg.dtype)?;
        Ok(t)
    };
    let output = take("output", &cfg.output_shape())?;
    let grad_input = take("grad.input", &cfg.input_shape())?;
    let mut grads = BTreeMap::new();
    let mut running = BTreeMap::new();
    for spec in params::specs(cfg) {
        match spec.kind {
            params::Kind::Param => {
                grads.insert(
                    spec.name.clone(),
                    take(&format!("grad.{}", spec.name), &spec.shape)?,
                );
            }
            params::Kind::RunningStat => {
                running.insert(spec.name.clone(), take(&spec.name, &spec.shape)?);
            }
        }
    }
    Ok(StepResult {
        output,
        grad_input,
        grads,
        running,
    })
}
