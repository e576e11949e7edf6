//! The one interface every variant offers the harness: a training step from an input and an
//! upstream gradient to the output, every gradient and the updated BN running stats.

use crate::autograd;
use crate::block;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::params::{check_tensor, Params};
use crate::probe::Probe;
use crate::variant::Variant;
use candle_core::Tensor;
use std::collections::BTreeMap;

/// Everything one training step produces, in canonical (PyTorch) layouts.
#[derive(Debug, Clone)]
pub struct StepResult {
    /// Block output `[N, C_total(, H, W)]` (may be a strided view of the variant's storage).
    pub output: Tensor,
    /// Gradient of the block input `[N, C0(, H, W)]`.
    pub grad_input: Tensor,
    /// Gradient of every trained parameter, by its `state_dict` name.
    pub grads: BTreeMap<String, Tensor>,
    /// Updated BN running stats by name (empty for mlp).
    pub running: BTreeMap<String, Tensor>,
}

impl StepResult {
    /// The same results in another dtype (e.g. f32 results widened to compare with an f64
    /// reference; widening is exact).
    pub fn to_dtype(&self, dtype: candle_core::DType) -> Result<StepResult> {
        let conv = |m: &BTreeMap<String, Tensor>| -> Result<BTreeMap<String, Tensor>> {
            m.iter()
                .map(|(k, v)| Ok((k.clone(), v.to_dtype(dtype)?)))
                .collect()
        };
        Ok(StepResult {
            output: self.output.to_dtype(dtype)?,
            grad_input: self.grad_input.to_dtype(dtype)?,
            grads: conv(&self.grads)?,
            running: conv(&self.running)?,
        })
    }
}

/// One training step of `variant`: forward, then backward of `sum(output · grad_output)`.
///
/// `input` and `grad_output` are in canonical layout and are never written to. The probe sees
/// layer boundaries and the saved state at the end of forward.
pub fn step(
    variant: Variant,
    cfg: &Config,
    params: &Params,
    input: &Tensor,
    grad_output: &Tensor,
    probe: &mut dyn Probe,
) -> Result<StepResult> {
    cfg.validate()?;
    variant.check(cfg)?;
    check_tensor("input", input, &cfg.input_shape(), cfg.dtype)?;
    check_tensor("grad_output", grad_output, &cfg.output_shape(), cfg.dtype)?;
    for spec in crate::params::specs(cfg) {
        let t = params
            .tensors
            .get(&spec.name)
            .ok_or_else(|| Error::MissingTensor {
                name: spec.name.clone(),
                context: " from the parameters".to_string(),
            })?;
        check_tensor(&spec.name, t, &spec.shape, cfg.dtype)?;
    }
    match variant {
        Variant::Autograd => autograd::step_autograd(cfg, params, input, grad_output, probe),
        Variant::Manual(s) => block::step_manual(s, cfg, params, input, grad_output, probe),
    }
}
