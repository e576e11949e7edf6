//! Gradient equality: how far one step's results are from a reference's, tensor by tensor.

use crate::error::{CandleContext, Error, Result};
use crate::result::StepResult;
use candle_core::{DType, Tensor};
use std::collections::BTreeMap;

/// Differences between one tensor and its reference.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TensorError {
    /// max |a − b| over elements.
    pub max_abs: f64,
    /// Norm-wise relative error: max |a − b| / max |b| (element-wise relative error is
    /// meaningless where the reference is near zero, as many gradients are).
    pub max_rel: f64,
    /// Every element has the same bits.
    pub bitwise: bool,
}

impl TensorError {
    const ZERO: TensorError = TensorError {
        max_abs: 0.0,
        max_rel: 0.0,
        bitwise: true,
    };

    fn worst(self, o: TensorError) -> TensorError {
        TensorError {
            max_abs: self.max_abs.max(o.max_abs),
            max_rel: self.max_rel.max(o.max_rel),
            bitwise: self.bitwise && o.bitwise,
        }
    }
}

/// How one step compares with a reference, by group and overall.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub output: TensorError,
    pub grad_input: TensorError,
    /// Worst over every parameter gradient.
    pub grad_params: TensorError,
    /// Worst over every updated running statistic.
    pub running: TensorError,
    /// Worst over everything.
    pub overall: TensorError,
    /// Every tensor by name (`output`, `grad.input`, `grad.<param>`, `<bn>.running_*`).
    pub per_tensor: BTreeMap<String, TensorError>,
}

fn values(t: &Tensor, name: &str) -> Result<Vec<f64>> {
    t.to_dtype(DType::F64)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f64>())
        .ctx(name)
}

/// Compares one tensor with its reference; shapes must match.
pub fn tensor_error(name: &str, a: &Tensor, reference: &Tensor) -> Result<TensorError> {
    if a.dims() != reference.dims() {
        return Err(Error::ShapeMismatch {
            name: name.to_string(),
            expected: reference.dims().to_vec(),
            found: a.dims().to_vec(),
        });
    }
    let (va, vb) = (values(a, name)?, values(reference, name)?);
    let mut max_abs = 0f64;
    let mut ref_max = 0f64;
    let mut bitwise = a.dtype() == reference.dtype();
    for (x, y) in va.iter().zip(&vb) {
        let d = (x - y).abs();
        // NaN anywhere must not hide: it makes the error infinite.
        max_abs = if d.is_nan() {
            f64::INFINITY
        } else {
            max_abs.max(d)
        };
        ref_max = ref_max.max(y.abs());
        bitwise &= x.to_bits() == y.to_bits();
    }
    let max_rel = if max_abs == 0.0 {
        0.0
    } else if ref_max == 0.0 {
        f64::INFINITY
    } else {
        max_abs / ref_max
    };
    Ok(TensorError {
        max_abs,
        max_rel,
        bitwise,
    })
}

fn group(
    out: &mut BTreeMap<String, TensorError>,
    prefix: &str,
    a: &BTreeMap<String, Tensor>,
    b: &BTreeMap<String, Tensor>,
) -> Result<TensorError> {
    let mut worst = TensorError::ZERO;
    for name in a.keys().chain(b.keys()) {
        let full = format!("{prefix}{name}");
        let (Some(x), Some(y)) = (a.get(name), b.get(name)) else {
            return Err(Error::MissingTensor {
                name: full,
                context: " on one side of the comparison".to_string(),
            });
        };
        if out.contains_key(&full) {
            continue;
        }
        let e = tensor_error(&full, x, y)?;
        out.insert(full, e);
        worst = worst.worst(e);
    }
    Ok(worst)
}

/// Compares a step's results with a reference step's.
pub fn compare(result: &StepResult, reference: &StepResult) -> Result<Comparison> {
    let mut per_tensor = BTreeMap::new();
    let output = tensor_error("output", &result.output, &reference.output)?;
    per_tensor.insert("output".to_string(), output);
    let grad_input = tensor_error("grad.input", &result.grad_input, &reference.grad_input)?;
    per_tensor.insert("grad.input".to_string(), grad_input);
    let grad_params = group(&mut per_tensor, "grad.", &result.grads, &reference.grads)?;
    let running = group(&mut per_tensor, "", &result.running, &reference.running)?;
    let overall = output.worst(grad_input).worst(grad_params).worst(running);
    Ok(Comparison {
        output,
        grad_input,
        grad_params,
        running,
        overall,
        per_tensor,
    })
}
