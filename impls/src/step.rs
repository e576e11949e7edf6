//! The one interface every variant offers the harness: a training step from an input and an
//! upstream gradient to the output, every gradient and the updated BN running stats.

use crate::check::probe::Probe;
use crate::config::params::{check_tensor, Params};
use crate::config::variant::Variant;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::strategies::autograd;
use crate::strategies::block;
use candle_core::Tensor;

use crate::check::result::StepResult;

/// One training step of `variant`: forward, then backward of `sum(output · grad_output)`.
///
/// `input` and `grad_output` are in canonical layout, in the config's dtype, and are never
/// written to; the parameters are in its [`Config::param_dtype`] (f32 for a bf16 block). The
/// probe sees layer boundaries and the saved state at the end of forward.
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
    for spec in crate::config::params::specs(cfg) {
        let t = params
            .tensors
            .get(&spec.name)
            .ok_or_else(|| Error::MissingTensor {
                name: spec.name.clone(),
                context: " from the parameters".to_string(),
            })?;
        check_tensor(&spec.name, t, &spec.shape, cfg.param_dtype())?;
    }
    crate::layer::whole_front_override()?; // a mistyped DENSEBENCH_WHOLE_FRONT fails here
    match variant {
        Variant::Autograd => autograd::step_autograd(cfg, params, input, grad_output, probe),
        Variant::Manual(s) => {
            // what the memory model picked for the least peak on this device's kernels: the
            // chunks of the tap stack (a GPU's 3×3 convolution), whether r is remade for dW1,
            // whether the layer front is split, and on a GPU's path into how many pieces
            let path = crate::model::kernels_for(input.device(), cfg)?;
            let schedule = crate::model::schedule::schedule_for_step(variant, cfg, path)?;
            let mut scheduled = || {
                crate::layer::with_tap_chunk_columns(schedule.tap_chunk_columns, || {
                    let mut run = || {
                        let defer_r = schedule.defer_r;
                        block::step_manual(s, cfg, params, input, grad_output, defer_r, probe)
                    };
                    if schedule.split_front {
                        run()
                    } else {
                        crate::layer::with_whole_front(run)
                    }
                })
            };
            // a GPU's split front cut into the fewest pieces the model allows
            match schedule.front_pieces {
                Some(pieces) => crate::layer::with_front_pieces(pieces, scheduled),
                None => scheduled(),
            }
        }
    }
}
