//! Hooks a training step calls at layer boundaries, so a harness can read clocks and allocator
//! counters without the library knowing how.

/// The name of the features buffer (the append buffer, or the concatenation a variant keeps) in
/// saved-state declarations and descriptions.
pub const FEATURES: &str = "features";

/// One tensor a variant keeps for backward, as declared from the config or described from the
/// live saved state. `view_of` names the storage it is a view into (then it owns no bytes).
/// `table`: a per-channel table (BN statistics), held in the parameters' dtype (f32 under
/// mixed precision), where everything else is a feature map in the config's dtype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub view_of: Option<String>,
    pub table: bool,
}

impl SavedTensor {
    pub fn owned(name: impl Into<String>, shape: Vec<usize>) -> Self {
        SavedTensor {
            name: name.into(),
            shape,
            view_of: None,
            table: false,
        }
    }

    /// An owned per-channel table (see [`SavedTensor::table`]).
    pub fn table(name: impl Into<String>, shape: Vec<usize>) -> Self {
        SavedTensor {
            table: true,
            ..SavedTensor::owned(name, shape)
        }
    }

    pub fn view(name: impl Into<String>, shape: Vec<usize>, of: &str) -> Self {
        SavedTensor {
            name: name.into(),
            shape,
            view_of: Some(of.to_string()),
            table: false,
        }
    }

    /// Bytes this tensor owns (0 for a view): `feature_size` bytes per element of a feature
    /// map, `table_size` of a table.
    pub fn owned_bytes(&self, feature_size: usize, table_size: usize) -> usize {
        let size = if self.table { table_size } else { feature_size };
        if self.view_of.is_some() {
            0
        } else {
            self.shape.iter().product::<usize>() * size
        }
    }
}

/// Total bytes owned by a list of saved tensors (see [`SavedTensor::owned_bytes`]).
pub fn saved_bytes(saved: &[SavedTensor], feature_size: usize, table_size: usize) -> usize {
    saved
        .iter()
        .map(|t| t.owned_bytes(feature_size, table_size))
        .sum()
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
