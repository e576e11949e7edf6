//! What one training step produces ([`StepResult`]): the type every step implementation returns
//! and the step dispatcher, comparisons and case files read. Its own module so that those
//! implementations (`block`, `autograd`) and the dispatcher (`step`) need not import each other.

use crate::error::Result;
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
    /// Bytes of every tensor it holds (their elements in their dtypes; a view counts as its
    /// elements, not its storage).
    pub fn bytes(&self) -> usize {
        let b = |t: &Tensor| t.elem_count() * t.dtype().size_in_bytes();
        b(&self.output)
            + b(&self.grad_input)
            + self
                .grads
                .values()
                .chain(self.running.values())
                .map(b)
                .sum::<usize>()
    }

    /// The same results with `features` applied to the output and the input gradient and
    /// `params` to every parameter gradient and running statistic (under mixed precision the
    /// two kinds have different dtypes): a cast, a copy.
    pub fn map(
        &self,
        features: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
        params: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<StepResult> {
        let conv = |m: &BTreeMap<String, Tensor>| -> Result<BTreeMap<String, Tensor>> {
            m.iter().map(|(k, v)| Ok((k.clone(), params(v)?))).collect()
        };
        Ok(StepResult {
            output: features(&self.output)?,
            grad_input: features(&self.grad_input)?,
            grads: conv(&self.grads)?,
            running: conv(&self.running)?,
        })
    }

    /// The same results in another dtype (e.g. f32 results widened to compare with an f64
    /// reference; widening is exact).
    pub fn to_dtype(&self, dtype: candle_core::DType) -> Result<StepResult> {
        self.map(|t| t.to_dtype(dtype), |t| t.to_dtype(dtype))
    }
}
