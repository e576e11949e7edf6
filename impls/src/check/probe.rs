//! Hooks a training step calls at layer boundaries, so a harness can read clocks and allocator
//! counters without the library knowing how.

/// The name of the features buffer (the append buffer, or the concatenation a variant keeps) in
/// saved-state declarations and descriptions.
pub const FEATURES: &str = "features";

/// One tensor a variant keeps for backward, as declared from the config or described from the
/// live saved state. `view_of` names the storage it is a view into (then it owns no bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub view_of: Option<String>,
}

impl SavedTensor {
    pub fn owned(name: impl Into<String>, shape: Vec<usize>) -> Self {
        SavedTensor {
            name: name.into(),
            shape,
            view_of: None,
        }
    }

    pub fn view(name: impl Into<String>, shape: Vec<usize>, of: &str) -> Self {
        SavedTensor {
            name: name.into(),
            shape,
            view_of: Some(of.to_string()),
        }
    }

    /// Bytes this tensor owns (0 for a view).
    pub fn owned_bytes(&self, dtype_size: usize) -> usize {
        if self.view_of.is_some() {
            0
        } else {
            self.shape.iter().product::<usize>() * dtype_size
        }
    }
}

/// Total bytes owned by a list of saved tensors.
pub fn saved_bytes(saved: &[SavedTensor], dtype_size: usize) -> usize {
    saved.iter().map(|t| t.owned_bytes(dtype_size)).sum()
}

/// Where a step is.
#[derive(Debug)]
pub enum Event<'a> {
    /// Layer `i`'s forward is done (its output appended).
    ForwardLayer(usize),
    /// The forward pass is done; `saved` is what the variant keeps for backward.
    ForwardEnd { saved: &'a [SavedTensor] },
    /// Layer `i`'s backward is done (its input gradient accumulated).
    BackwardLayer(usize),
    /// The backward pass is done.
    BackwardEnd,
}

/// Receives [`Event`]s during a step. The default does nothing.
pub trait Probe {
    fn event(&mut self, _event: Event<'_>) {}
}

/// A probe that ignores everything.
pub struct NoProbe;
impl Probe for NoProbe {}
