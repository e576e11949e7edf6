//! Block configurations: the family, every size, dtype and seed; validation and derived shapes.

pub mod params;
pub mod size;
pub mod spatial;
pub mod switch;
pub mod variant;

use crate::config::size::Size;
use crate::config::spatial::Spatial;
use crate::error::{Error, Result};
use candle_core::DType;
use std::fmt;

/// The two dense-block families densebench measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// Layer i is Linear(C0 + i·k → k) with bias, optional ReLU after it (the forum's block).
    Mlp,
    /// DenseNet-BC: BN → ReLU → Conv1×1 (bn_size·k) → BN → ReLU → Conv3×3 (k, padding 1).
    Bc,
}

impl Family {
    pub const ALL: [Family; 2] = [Family::Mlp, Family::Bc];

    pub fn name(self) -> &'static str {
        match self {
            Family::Mlp => "mlp",
            Family::Bc => "bc",
        }
    }

    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "mlp" => Ok(Family::Mlp),
            "bc" => Ok(Family::Bc),
            other => Err(Error::InvalidConfig {
                field: "family",
                value: other.to_string(),
                reason: "expected `mlp` or `bc`".to_string(),
            }),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the `reason` of a refused dtype says.
const SUPPORTED_DTYPES: &str = "supported dtypes are f32, f64 and bf16 (mixed precision: bf16 \
                                features, f32 parameters)";

/// Parses a dtype name; only the float types the block is verified in are accepted: f32, f64,
/// and bf16, PyTorch autocast's mixed precision (see [`Config::param_dtype`]).
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "f64" => Ok(DType::F64),
        "bf16" => Ok(DType::BF16),
        other => Err(Error::InvalidConfig {
            field: "dtype",
            value: other.to_string(),
            reason: SUPPORTED_DTYPES.to_string(),
        }),
    }
}

/// The dtype a config of `dtype` keeps its parameters, their gradients and its BatchNorm
/// statistics in: f32 for bf16 (PyTorch autocast: parameters and BN buffers stay f32, only the
/// features are bf16), else `dtype` itself.
pub fn param_dtype(dtype: DType) -> DType {
    match dtype {
        DType::BF16 => DType::F32,
        other => other,
    }
}

pub fn dtype_name(dtype: DType) -> &'static str {
    dtype.as_str()
}

/// BatchNorm constants: PyTorch's defaults.
pub const BN_EPS: f64 = 1e-5;
pub const BN_MOMENTUM: f64 = 0.1;

/// Largest element count of any one tensor (and of the parameters together) we agree to build:
/// 2^40 elements are 4 TiB in f32, beyond any machine densebench runs on, so a bigger shape is
/// almost surely a typo.
pub const MAX_ELEMENTS: u128 = 1 << 40;

/// Largest element count of the activations one step keeps for backward (summed over layers).
/// 2^50 elements (4 PiB in f32) is beyond any machine; bounding the sum keeps every byte count
/// of the memory model within `u64`.
pub const MAX_STEP_ELEMENTS: u128 = 1 << 50;

/// Checks `size` against `limit`, returning its value; over the limit (or overflowing), the
/// error blames the field contributing most and shows the formula, the values and the limit.
fn check_size(what: &str, unit: &str, size: &Size, limit: u128, limit_name: &str) -> Result<u128> {
    match size.eval() {
        Some(v) if v <= limit => Ok(v),
        _ => {
            let (field, value) = size.blame().unwrap_or(("size", 0));
            Err(Error::InvalidConfig {
                field,
                value: value.to_string(),
                reason: format!(
                    "{what} would hold {} = {} = {} {unit}, more than {limit_name} = {limit}",
                    size.formula(),
                    size.values(),
                    size.value_text()
                ),
            })
        }
    }
}

/// One dense block. `bn_size` and `size` only matter for `bc`, `activation` only for `mlp`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub family: Family,
    /// Batch size N.
    pub batch: usize,
    /// Input channels C0.
    pub channels: usize,
    /// Growth rate k: channels each layer appends.
    pub growth: usize,
    /// Number of layers L.
    pub depth: usize,
    /// Bottleneck width factor (bc): Conv1×1 outputs bn_size·k channels.
    pub bn_size: usize,
    /// Spatial size H × W of the feature maps (bc): `32` is 32×32, `360x480` is H = 360, W = 480.
    pub size: Spatial,
    /// ReLU after each Linear (mlp).
    pub activation: bool,
    pub dtype: DType,
    pub seed: u64,
}

impl Config {
    /// DenseNet-BC-100's dense block on CIFAR at batch 64 (k=12, C0=24, bn_size 4, 32×32, L=16).
    pub fn bc100_block() -> Self {
        Config {
            family: Family::Bc,
            batch: 64,
            channels: 24,
            growth: 12,
            depth: 16,
            bn_size: 4,
            size: Spatial::square(32),
            activation: true,
            dtype: DType::F32,
            seed: 0,
        }
    }

    /// A small config for tests.
    pub fn tiny(family: Family) -> Self {
        Config {
            family,
            batch: 2,
            channels: 3,
            growth: 2,
            depth: 3,
            bn_size: 2,
            size: Spatial::square(3),
            activation: true,
            dtype: DType::F64,
            seed: 7,
        }
    }

    /// Checks every field and every size the block derives from them, before any work; the
    /// error names the field at fault, its value and what was expected.
    ///
    /// Zero sizes are refused. Every product is computed with checked arithmetic (nothing
    /// wraps, whatever the fields) and bounded (M = N·H·W, C_i = C0 + i·k, B = bn_size·k):
    /// - each tensor of a step — the block output `N·(C0+L·k)·H·W` (also the feature buffer
    ///   and every concatenation), the widest weight (`k·C_{L−1}`, bc: `B·C_{L−1}`), and for bc
    ///   the bottleneck activation `B·M`, the 3×3 tap products `9·k·M` and tap-stacked weight
    ///   `9·k·B` — and the parameter count, by [`MAX_ELEMENTS`];
    /// - the activations the naive variant keeps for backward (mlp `Σ_i (C_i + k)·M`, bc
    ///   `Σ_i (2·C_i + 2·B)·M`) by [`MAX_STEP_ELEMENTS`];
    /// - the FLOP count of one step ([`crate::model::flops`]) by `u64::MAX`;
    /// - the byte counts of the largest tensor, the parameters and the kept activations at the
    ///   dtype's size by `usize::MAX`.
    ///
    /// A product over its limit is blamed on the field contributing most (see
    /// `size.rs`): `size = 4294967297` names `size`, not `depth`.
    pub fn validate(&self) -> Result<()> {
        self.check_positive()?;
        if !matches!(self.dtype, DType::F32 | DType::F64 | DType::BF16) {
            return Err(Error::InvalidConfig {
                field: "dtype",
                value: self.dtype.as_str().to_string(),
                reason: SUPPORTED_DTYPES.to_string(),
            });
        }
        // Each field alone first: a field beyond the per-tensor limit is surely the typo.
        for (field, v) in self.fields() {
            if v as u128 > MAX_ELEMENTS {
                return Err(Error::InvalidConfig {
                    field,
                    value: v.to_string(),
                    reason: format!(
                        "more than MAX_ELEMENTS = {MAX_ELEMENTS} (2^40), the most elements \
                         densebench puts in one tensor, and a tensor of the block has at \
                         least `{field}` elements"
                    ),
                });
            }
        }
        // the widest element anything is stored in: a bf16 block's parameters are f32
        let dtype_size = self.dtype_size().max(self.param_size()) as u128;
        let mut largest = 0u128;
        for (what, size) in self.tensor_sizes() {
            largest = largest.max(check_size(
                &what,
                "elements",
                &size,
                MAX_ELEMENTS,
                "MAX_ELEMENTS",
            )?);
        }
        let params = check_size(
            "the parameter count",
            "elements",
            &self.param_count(),
            MAX_ELEMENTS,
            "MAX_ELEMENTS",
        )?;
        let kept = check_size(
            "the activations the naive variant keeps for backward",
            "elements",
            &self.kept_activations(),
            MAX_STEP_ELEMENTS,
            "MAX_STEP_ELEMENTS",
        )?;
        check_size(
            "the FLOP count of one step",
            "FLOPs",
            &self.flop_count(),
            u64::MAX as u128,
            "u64::MAX",
        )?;
        for (what, elements) in [
            ("the largest tensor", largest),
            ("the parameters", params),
            ("the kept activations", kept),
        ] {
            // Cannot overflow u128: elements ≤ 2^50 here and a dtype is at most 8 bytes.
            let bytes = elements * dtype_size;
            if bytes > usize::MAX as u128 {
                return Err(Error::InvalidConfig {
                    field: "dtype",
                    value: self.dtype.as_str().to_string(),
                    reason: format!(
                        "{what} would take {elements} × {dtype_size} = {bytes} bytes, more \
                         than usize::MAX = {} on this host",
                        usize::MAX
                    ),
                });
            }
        }
        if self.family == Family::Bc && self.m_size().eval().is_some_and(|m| m < 2) {
            return Err(Error::InvalidConfig {
                field: "batch",
                value: self.batch.to_string(),
                reason: format!(
                    "training-mode BatchNorm needs more than one value per channel, \
                     but {} = {} = 1",
                    self.m_size().formula(),
                    self.m_size().values()
                ),
            });
        }
        Ok(())
    }

    /// Refuses zero sizes, each with what it would mean.
    fn check_positive(&self) -> Result<()> {
        let mut checks = vec![
            ("batch", self.batch, "a step needs at least one sample"),
            (
                "channels",
                self.channels,
                "the block input needs at least one channel",
            ),
            (
                "growth",
                self.growth,
                "each layer must append at least one channel",
            ),
            ("depth", self.depth, "a dense block has at least one layer"),
        ];
        if self.family == Family::Bc {
            checks.push((
                "bn_size",
                self.bn_size,
                "the 1×1 convolution must output at least one channel (bn_size·growth)",
            ));
            for (field, v) in self.spatial_fields() {
                checks.push((field, v, "feature maps are at least 1×1"));
            }
        }
        for (field, v, why) in checks {
            if v == 0 {
                // A side of `size = "HxW"`: say which size it is a side of.
                let of = match field {
                    "height" | "width" => format!(" (size = {})", self.size),
                    _ => String::new(),
                };
                return Err(Error::InvalidConfig {
                    field,
                    value: "0".to_string(),
                    reason: format!("must be at least 1: {why}{of}"),
                });
            }
        }
        Ok(())
    }

    /// The size fields that matter for the family, by name.
    fn fields(&self) -> Vec<(&'static str, usize)> {
        let mut f = vec![
            ("batch", self.batch),
            ("channels", self.channels),
            ("growth", self.growth),
            ("depth", self.depth),
        ];
        if self.family == Family::Bc {
            f.push(("bn_size", self.bn_size));
            f.extend(self.spatial_fields());
        }
        f
    }

    /// The spatial size by the names the user wrote it with: `size` when square (`size = 32`),
    /// `height` and `width` otherwise (`size = "360x480"`), so that an error blames the side.
    fn spatial_fields(&self) -> Vec<(&'static str, usize)> {
        if self.size.is_square() {
            vec![("size", self.size.height)]
        } else {
            vec![("height", self.size.height), ("width", self.size.width)]
        }
    }

    fn n(&self) -> Size {
        Size::field("batch", self.batch)
    }
    fn c0(&self) -> Size {
        Size::field("channels", self.channels)
    }
    fn k(&self) -> Size {
        Size::field("growth", self.growth)
    }
    fn l(&self) -> Size {
        Size::field("depth", self.depth)
    }
    fn bn(&self) -> Size {
        Size::field("bn_size", self.bn_size)
    }
    /// H·W: `size·size` when square, `height·width` otherwise.
    fn hw(&self) -> Size {
        if self.size.is_square() {
            Size::field("size", self.size.height) * Size::field("size", self.size.width)
        } else {
            Size::field("height", self.size.height) * Size::field("width", self.size.width)
        }
    }

    /// M = N·H·W as an expression.
    fn m_size(&self) -> Size {
        match self.family {
            Family::Mlp => self.n(),
            Family::Bc => self.n() * self.hw(),
        }
    }

    /// C0 + L·k.
    fn c_total_size(&self) -> Size {
        self.c0() + self.l() * self.k()
    }

    /// C_{L−1} = C0 + (L−1)·k: input channels of the last layer.
    fn c_last_size(&self) -> Size {
        self.c0() + Size::Less1(Box::new(self.l())) * self.k()
    }

    /// Σ_{i<L} C_i = L·C0 + k·L(L−1)/2.
    fn c_sum_size(&self) -> Size {
        self.l() * self.c0() + self.k() * Size::Tri(Box::new(self.l()))
    }

    /// B = bn_size·k.
    fn b_size(&self) -> Size {
        self.bn() * self.k()
    }

    /// Every tensor shape a step builds that can be the largest, described.
    fn tensor_sizes(&self) -> Vec<(String, Size)> {
        let mut out = vec![match self.family {
            Family::Mlp => (
                "the block output (and feature buffer) [N, C0+L·k]".to_string(),
                self.n() * self.c_total_size(),
            ),
            Family::Bc => (
                "the block output (and feature buffer) [N, C0+L·k, H, W]".to_string(),
                self.n() * self.c_total_size() * self.hw(),
            ),
        }];
        match self.family {
            Family::Mlp => out.push((
                "the last layer's weight [k, C0+(L−1)·k]".to_string(),
                self.k() * self.c_last_size(),
            )),
            Family::Bc => {
                out.push((
                    "the last layer's conv1 weight [bn_size·k, C0+(L−1)·k]".to_string(),
                    self.b_size() * self.c_last_size(),
                ));
                out.push((
                    "the bottleneck activation [bn_size·k, N·H·W]".to_string(),
                    self.b_size() * self.m_size(),
                ));
                out.push((
                    "the 3×3 convolution's tap products [9·k, N·H·W]".to_string(),
                    Size::Const(9) * self.k() * self.m_size(),
                ));
                out.push((
                    "the tap-stacked conv2 weight [9·k, bn_size·k]".to_string(),
                    Size::Const(9) * self.k() * self.b_size(),
                ));
            }
        }
        out
    }

    /// Elements of every parameter and BN buffer (see [`crate::config::params::specs`]).
    fn param_count(&self) -> Size {
        match self.family {
            // Σ_i (k·C_i + k): weight and bias.
            Family::Mlp => self.k() * self.c_sum_size() + self.l() * self.k(),
            // Σ_i (4·C_i + 4·B + B·C_i + 9·k·B): norm1, norm2, conv1, conv2.
            Family::Bc => {
                (Size::Const(4) + self.b_size()) * self.c_sum_size()
                    + self.l()
                        * (Size::Const(4) * self.b_size()
                            + Size::Const(9) * self.k() * self.b_size())
            }
        }
    }

    /// What the naive variant keeps for backward: mlp Σ_i (C_i + k)·M (inputs and outputs),
    /// bc Σ_i (2·C_i + 2·B)·M (x, r, z, s).
    fn kept_activations(&self) -> Size {
        match self.family {
            Family::Mlp => (self.c_sum_size() + self.l() * self.k()) * self.m_size(),
            Family::Bc => {
                Size::Const(2) * (self.c_sum_size() + self.l() * self.b_size()) * self.m_size()
            }
        }
    }

    /// [`crate::model::flops`] in closed form: mlp 6·k·M·Σ_i C_i, bc 6·M·(B·Σ_i C_i + 9·B·k·L).
    fn flop_count(&self) -> Size {
        match self.family {
            Family::Mlp => Size::Const(6) * self.k() * self.m_size() * self.c_sum_size(),
            Family::Bc => {
                Size::Const(6)
                    * self.m_size()
                    * (self.b_size() * self.c_sum_size()
                        + Size::Const(9) * self.b_size() * self.k() * self.l())
            }
        }
    }

    /// H·W for bc, 1 for mlp.
    pub fn spatial(&self) -> usize {
        match self.family {
            Family::Mlp => 1,
            Family::Bc => self.size.height * self.size.width,
        }
    }

    /// Columns of a channel-major feature map: M = N·H·W.
    pub fn m(&self) -> usize {
        self.batch * self.spatial()
    }

    /// Input channels of layer i: C0 + i·k.
    pub fn c_in(&self, layer: usize) -> usize {
        self.channels + layer * self.growth
    }

    /// Channels of the block output: C0 + L·k.
    pub fn c_total(&self) -> usize {
        self.c_in(self.depth)
    }

    /// Bottleneck width bn_size·k (bc); 0 for mlp, which has no bottleneck (its `bn_size` is
    /// not validated, so it is never multiplied).
    pub fn bottleneck(&self) -> usize {
        match self.family {
            Family::Mlp => 0,
            Family::Bc => self.bn_size * self.growth,
        }
    }

    /// Bytes of one feature element (the block's input, stored features, output and their
    /// gradients): the size of [`Config::dtype`].
    pub fn dtype_size(&self) -> usize {
        self.dtype.size_in_bytes()
    }

    /// The dtype of the parameters, their gradients, the BN statistics and running stats: f32
    /// for a bf16 block (PyTorch autocast's mixed precision), else the features' dtype. See
    /// [`param_dtype`].
    pub fn param_dtype(&self) -> DType {
        param_dtype(self.dtype)
    }

    /// Bytes of one element of [`Config::param_dtype`] (4 for bf16 blocks). Also the element
    /// the CPU kernels compute in (`ops::cpu::shared::Elem::Acc`): the 3×3 convolution's scratch
    /// tiles and stacked weights are this size.
    pub fn param_size(&self) -> usize {
        self.param_dtype().size_in_bytes()
    }

    /// Canonical (PyTorch) shape of the block input: [N, C0] or [N, C0, H, W].
    pub fn input_shape(&self) -> Vec<usize> {
        self.canonical_shape(self.channels)
    }

    /// Canonical shape of the block output: [N, C_total] or [N, C_total, H, W].
    pub fn output_shape(&self) -> Vec<usize> {
        self.canonical_shape(self.c_total())
    }

    pub fn canonical_shape(&self, channels: usize) -> Vec<usize> {
        match self.family {
            Family::Mlp => vec![self.batch, channels],
            Family::Bc => vec![self.batch, channels, self.size.height, self.size.width],
        }
    }

    /// [`Config::describe`] without the seed: the block of a case file, whose values are the
    /// file's own, drawn from no seed of densebench's.
    pub fn describe_block(&self) -> String {
        match self.family {
            Family::Mlp => format!(
                "mlp N={} C0={} k={} L={} relu={} {}",
                self.batch,
                self.channels,
                self.growth,
                self.depth,
                if self.activation { "on" } else { "off" },
                self.dtype.as_str()
            ),
            Family::Bc => format!(
                "bc N={} C0={} k={} L={} bn={} {} {}",
                self.batch,
                self.channels,
                self.growth,
                self.depth,
                self.bn_size,
                self.size.label(),
                self.dtype.as_str()
            ),
        }
    }

    /// A one-line description, e.g. `bc N=64 C0=24 k=12 L=16 bn=4 32x32 f32 seed=0`.
    pub fn describe(&self) -> String {
        format!("{} seed={}", self.describe_block(), self.seed)
    }
}
