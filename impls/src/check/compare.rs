//! Gradient equality: how far one step's results are from a reference's, tensor by tensor.

use crate::check::result::StepResult;
use crate::error::{CandleContext, Error, Result};
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

/// Calls `f` with `t`'s elements in row-major order, each widened to f64 as it is read: from a
/// contiguous CPU tensor's own storage, else from one host copy in the tensor's dtype (f32,
/// f64; other dtypes widened whole). Never a whole f64 copy of an f32 tensor: a gradient check
/// holds the reference beside the step's results, and three f64 copies of the largest tensor
/// made it need more memory than the measured step itself.
fn with_values<R>(
    t: &Tensor,
    name: &str,
    f: impl FnOnce(&mut dyn Iterator<Item = f64>) -> R,
) -> Result<R> {
    use candle_core::{CpuStorage, Storage};
    if t.device().is_cpu() {
        let (storage, layout) = t.storage_and_layout();
        match (&*storage, layout.contiguous_offsets()) {
            (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => {
                return Ok(f(&mut v[a..b].iter().map(|&x| f64::from(x))))
            }
            (Storage::Cpu(CpuStorage::F64(v)), Some((a, b))) => {
                return Ok(f(&mut v[a..b].iter().copied()))
            }
            (Storage::Cpu(CpuStorage::F32(v)), None) => {
                return Ok(f(&mut offsets(layout).map(|i| f64::from(v[i]))))
            }
            (Storage::Cpu(CpuStorage::F64(v)), None) => {
                return Ok(f(&mut offsets(layout).map(|i| v[i])))
            }
            _ => {}
        }
    }
    let flat = t.flatten_all().ctx(name)?;
    Ok(match t.dtype() {
        DType::F32 => f(&mut flat.to_vec1::<f32>().ctx(name)?.into_iter().map(f64::from)),
        DType::F64 => f(&mut flat.to_vec1::<f64>().ctx(name)?.into_iter()),
        _ => f(&mut values(t, name)?.into_iter()),
    })
}

/// The storage offsets of `l`'s elements in row-major order (candle's own iterator is private
/// to it): a strided view read in place.
fn offsets(l: &candle_core::Layout) -> impl Iterator<Item = usize> + '_ {
    let (dims, strides) = (l.dims(), l.stride());
    let mut index = vec![0usize; dims.len()];
    let mut at = l.start_offset();
    (0..l.shape().elem_count()).map(move |k| {
        if k > 0 {
            for d in (0..dims.len()).rev() {
                index[d] += 1;
                at += strides[d];
                if index[d] < dims[d] {
                    break;
                }
                at -= strides[d] * dims[d];
                index[d] = 0;
            }
        }
        at
    })
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
    let mut max_abs = 0f64;
    let mut ref_max = 0f64;
    let mut bitwise = a.dtype() == reference.dtype();
    with_values(a, name, |va| {
        with_values(reference, name, |vb| {
            for (x, y) in va.zip(vb) {
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
        })
    })??;
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

/// [`compare`] for judging a step: its running statistics are compared by how far the step
/// moved them from `before` (the values the step started from, by the same names: the case's),
/// not by their new values. A BN step moves a running statistic a tenth of the way to the
/// batch's (momentum 0.1), so a statistic left un-updated is only about a tenth of its batch
/// change away from the reference's new value — 0.106 norm-wise on BC-100's block, under an f32
/// bc row's tolerance — while its update is wholly wrong (relative error 1). The same `before`
/// is subtracted on both sides (in f64), so the absolute error is the new value's; the relative
/// error is against the reference update's largest magnitude. Whether a statistic is bitwise
/// equal is still said of its new value.
pub fn compare_updates(
    result: &StepResult,
    reference: &StepResult,
    before: &BTreeMap<String, Tensor>,
) -> Result<Comparison> {
    let mut c = compare(result, reference)?;
    let moved = |running: &BTreeMap<String, Tensor>| -> Result<BTreeMap<String, Tensor>> {
        running
            .iter()
            .map(|(name, t)| {
                let b = before.get(name).ok_or_else(|| Error::MissingTensor {
                    name: name.clone(),
                    context: " among the running statistics before the step".to_string(),
                })?;
                let b = b.to_device(t.device()).and_then(|b| b.to_dtype(DType::F64));
                let d = t.to_dtype(DType::F64).and_then(|t| t - b?).ctx(name)?;
                Ok((name.clone(), d))
            })
            .collect()
    };
    let mut updates = BTreeMap::new();
    group(
        &mut updates,
        "",
        &moved(&result.running)?,
        &moved(&reference.running)?,
    )?;
    let mut running = TensorError::ZERO;
    for (name, u) in updates {
        let e = TensorError {
            bitwise: c.per_tensor.get(&name).is_some_and(|v| v.bitwise),
            ..u
        };
        running = running.worst(e);
        c.per_tensor.insert(name, e);
    }
    c.running = running;
    c.overall = c
        .output
        .worst(c.grad_input)
        .worst(c.grad_params)
        .worst(running);
    Ok(c)
}

/// The bits of one tensor as a SHA-256 over its dtype, shape and elements in row-major order
/// (f32 and f64 by their own bits; other dtypes widened to f64, which is exact for the floats
/// candle has).
fn tensor_digest(name: &str, t: &Tensor) -> Result<[u8; 32]> {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(format!("{:?} {:?}", t.dtype(), t.dims()).as_bytes());
    let flat = t.flatten_all().ctx(name)?;
    match t.dtype() {
        DType::F32 => flat
            .to_vec1::<f32>()
            .ctx(name)?
            .iter()
            .for_each(|v| h.update(v.to_bits().to_le_bytes())),
        DType::F64 => flat
            .to_vec1::<f64>()
            .ctx(name)?
            .iter()
            .for_each(|v| h.update(v.to_bits().to_le_bytes())),
        _ => values(t, name)?
            .iter()
            .for_each(|v| h.update(v.to_bits().to_le_bytes())),
    }
    Ok(h.finalize().into())
}

/// Every tensor of a step's results as a SHA-256 of its bits, by the names of
/// [`Comparison::per_tensor`]. Two results with the same digests are equal bit for bit (up to
/// a hash collision), element by element, which a [`Comparison`] with a reference (worst
/// figures only) cannot say. Costs one copy of each tensor to the host.
pub fn digests(result: &StepResult) -> Result<BTreeMap<String, [u8; 32]>> {
    let mut out = BTreeMap::new();
    out.insert("output".into(), tensor_digest("output", &result.output)?);
    out.insert(
        "grad.input".into(),
        tensor_digest("grad.input", &result.grad_input)?,
    );
    for (name, t) in &result.grads {
        let full = format!("grad.{name}");
        out.insert(full.clone(), tensor_digest(&full, t)?);
    }
    for (name, t) in &result.running {
        out.insert(name.clone(), tensor_digest(name, t)?);
    }
    Ok(out)
}

/// The names of the tensors whose bits differ between two [`digests`] (a tensor on one side
/// only counts as differing), in name order; empty when the results are bitwise equal.
pub fn differing(a: &BTreeMap<String, [u8; 32]>, b: &BTreeMap<String, [u8; 32]>) -> Vec<String> {
    let names: std::collections::BTreeSet<&String> = a
        .keys()
        .chain(b.keys())
        .filter(|n| a.get(*n) != b.get(*n))
        .collect();
    names.into_iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn result(out: &[f32], g: &[f32], w: &[f32]) -> StepResult {
        let t = |v: &[f32]| Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap();
        StepResult {
            output: t(out),
            grad_input: t(g),
            grads: [("w".to_string(), t(w))].into_iter().collect(),
            running: BTreeMap::new(),
        }
    }

    /// Every tensor counts in `overall`: a step wrong in only one of them — the output, the
    /// input gradient, the first, a middle or the last parameter gradient, the first or the
    /// last running statistic — has that error as its overall error, in its group too. (A
    /// `compare` that left the output out of `overall` passed every other test.)
    #[test]
    fn a_step_wrong_in_any_one_tensor_is_wrong_overall() {
        let t = |v: &[f32]| Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap();
        let map = |names: &[&str]| -> BTreeMap<String, Tensor> {
            names
                .iter()
                .map(|n| (n.to_string(), t(&[1.0, 2.0])))
                .collect()
        };
        let params = ["a.weight", "m.weight", "z.weight"];
        let stats = ["a.running_mean", "z.running_var"];
        let good = StepResult {
            output: t(&[1.0, 2.0]),
            grad_input: t(&[1.0, 2.0]),
            grads: map(&params),
            running: map(&stats),
        };
        let clean = compare(&good, &good).unwrap();
        assert_eq!(clean.overall.max_rel, 0.0);
        let bad = || t(&[1.0, 3.0]); // max |a − b| / max |ref| = 1 / 2
        let mut cases: Vec<(String, StepResult)> = Vec::new();
        let mut r = good.clone();
        r.output = bad();
        cases.push(("output".into(), r));
        let mut r = good.clone();
        r.grad_input = bad();
        cases.push(("grad.input".into(), r));
        for p in params {
            let mut r = good.clone();
            r.grads.insert(p.to_string(), bad());
            cases.push((format!("grad.{p}"), r));
        }
        for st in stats {
            let mut r = good.clone();
            r.running.insert(st.to_string(), bad());
            cases.push((st.to_string(), r));
        }
        for (which, r) in cases {
            let c = compare(&r, &good).unwrap();
            assert_eq!(c.overall.max_rel, 0.5, "{which}: {c:?}");
            assert_eq!(c.per_tensor[&which].max_rel, 0.5, "{which}");
            let group = match which.as_str() {
                "output" => c.output,
                "grad.input" => c.grad_input,
                w if w.starts_with("grad.") => c.grad_params,
                _ => c.running,
            };
            assert_eq!(group.max_rel, 0.5, "{which}: {c:?}");
        }
    }

    /// A strided view (a permutation, a narrowed start, a step over a dimension) compares in
    /// logical order, read in place: the same errors as its contiguous copy, f32 against f64
    /// and bit for bit against itself; a NaN anywhere makes the error infinite.
    #[test]
    fn strided_views_compare_in_logical_order() {
        let v: Vec<f32> = (0..60).map(|i| (i as f32 * 0.37).sin()).collect();
        let base = Tensor::from_vec(v, (3, 4, 5), &Device::Cpu).unwrap();
        let views = [
            base.permute((2, 0, 1)).unwrap(),
            base.narrow(1, 1, 2).unwrap().t().unwrap(),
            base.narrow(2, 1, 3).unwrap(),
        ];
        for view in views {
            assert!(!view.is_contiguous());
            let copy = view.contiguous().unwrap();
            let reference = copy
                .to_dtype(DType::F64)
                .unwrap()
                .affine(1.001, 0.0)
                .unwrap();
            assert_eq!(
                tensor_error("v", &view, &reference).unwrap(),
                tensor_error("v", &copy, &reference).unwrap()
            );
            let same = tensor_error("v", &view, &copy).unwrap();
            assert!(same.bitwise && same.max_abs == 0.0, "{same:?}");
            // One element changed in the copy: seen at its logical place, never missed.
            let mut vals = copy.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let last = vals.len() - 1;
            vals[last] += 0.5;
            let changed = Tensor::from_vec(vals, copy.dims(), &Device::Cpu).unwrap();
            let e = tensor_error("v", &view, &changed).unwrap();
            assert!(!e.bitwise && (e.max_abs - 0.5).abs() < 1e-6, "{e:?}");
        }
        let mut nan = base.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        nan[7] = f32::NAN;
        let nan = Tensor::from_vec(nan, (3, 4, 5), &Device::Cpu).unwrap();
        let e = tensor_error(
            "v",
            &nan.permute((1, 2, 0)).unwrap(),
            &base.permute((1, 2, 0)).unwrap(),
        )
        .unwrap();
        assert_eq!(e.max_abs, f64::INFINITY);
    }

    /// Digests see every element's bits: one element one ulp off, −0 for +0, another NaN, a
    /// strided view of the same values, another shape or dtype.
    #[test]
    fn digests_differ_exactly_where_bits_differ() {
        let base = result(&[1.0, 2.0, 0.0], &[3.0], &[f32::NAN, 5.0]);
        let d = digests(&base).unwrap();
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            ["grad.input", "grad.w", "output"]
        );
        assert!(differing(&d, &digests(&base.clone()).unwrap()).is_empty());
        let ulp = f32::from_bits(2.0f32.to_bits() + 1);
        let cases = [
            (result(&[1.0, ulp, 0.0], &[3.0], &[f32::NAN, 5.0]), "output"),
            (
                result(&[1.0, 2.0, -0.0], &[3.0], &[f32::NAN, 5.0]),
                "output",
            ),
            (
                result(
                    &[1.0, 2.0, 0.0],
                    &[3.0],
                    &[f32::from_bits(0x7fc0_0001), 5.0],
                ),
                "grad.w",
            ),
            (
                result(&[1.0, 2.0, 0.0], &[3.5], &[f32::NAN, 5.0]),
                "grad.input",
            ),
        ];
        for (r, name) in cases {
            assert_eq!(differing(&d, &digests(&r).unwrap()), vec![name.to_string()]);
        }
        // Same values in another shape or dtype are different results.
        let mut reshaped = base.clone();
        reshaped.output = reshaped.output.reshape((1, 3)).unwrap();
        assert_eq!(differing(&d, &digests(&reshaped).unwrap()), vec!["output"]);
        let wide = base.to_dtype(DType::F64).unwrap();
        assert_eq!(differing(&d, &digests(&wide).unwrap()).len(), 3);
        // A strided view is read in logical order: the same bits as a contiguous copy.
        let m = Tensor::from_slice(&[1f32, 2., 3., 4.], (2, 2), &Device::Cpu).unwrap();
        let mut tr = base.clone();
        tr.output = m.t().unwrap();
        let mut copy = base.clone();
        copy.output = m.t().unwrap().contiguous().unwrap();
        assert!(differing(&digests(&tr).unwrap(), &digests(&copy).unwrap()).is_empty());
        // A tensor on one side only.
        let mut more = base.clone();
        more.running.insert(
            "bn.running_mean".into(),
            Tensor::new(&[0f32], &Device::Cpu).unwrap(),
        );
        assert_eq!(
            differing(&d, &digests(&more).unwrap()),
            vec!["bn.running_mean"]
        );
    }

    /// A running statistic the step left as it was (mutant "running var never updated") is a
    /// tenth of its change away by value, and wholly wrong by update: `compare_updates` says
    /// relative error 1 where `compare` says 0.05. A correct update is within rounding both ways,
    /// and the absolute error is the value's.
    #[test]
    fn an_un_updated_running_statistic_is_wrong_by_its_update() {
        let t = |v: &[f64]| Tensor::from_slice(v, v.len(), &Device::Cpu).unwrap();
        let before: BTreeMap<String, Tensor> =
            [("bn.running_var".to_string(), t(&[1.0, 1.0]))].into();
        let with = |running: &[f64]| StepResult {
            output: t(&[1.0]),
            grad_input: t(&[1.0]),
            grads: BTreeMap::new(),
            running: [("bn.running_var".to_string(), t(running))].into(),
        };
        // batch variances 0.5 and 1.2: the update moves 1.0 to 0.95 and 1.02
        let reference = with(&[0.95, 1.02]);
        let stale = with(&[1.0, 1.0]);
        let by_value = compare(&stale, &reference).unwrap();
        assert!(
            (by_value.overall.max_rel - 0.05 / 1.02).abs() < 1e-12,
            "{by_value:?}"
        );
        let by_update = compare_updates(&stale, &reference, &before).unwrap();
        assert!(
            (by_update.overall.max_rel - 1.0).abs() < 1e-12,
            "{by_update:?}"
        );
        assert_eq!(by_update.running.max_abs, by_value.running.max_abs);
        assert!(!by_update.overall.bitwise);
        let close = with(&[0.95 + 1e-9, 1.02]);
        let c = compare_updates(&close, &reference, &before).unwrap();
        assert!(c.overall.max_rel < 1e-7, "{c:?}");
        assert!(
            compare_updates(&reference, &reference, &before)
                .unwrap()
                .overall
                .bitwise
        );
        // a statistic with no value before the step is an error, never a silent pass
        assert!(compare_updates(&stale, &reference, &BTreeMap::new()).is_err());
    }
}
