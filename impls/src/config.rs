//! Block configurations: the family, every size, dtype and seed; validation and derived shapes.

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

/// Parses a dtype name; only the float types the block is verified in are accepted.
pub fn parse_dtype(s: &str) -> Result<DType> {
    match s {
        "f32" => Ok(DType::F32),
        "f64" => Ok(DType::F64),
        other => Err(Error::InvalidConfig {
            field: "dtype",
            value: other.to_string(),
            reason: "supported dtypes are f32 and f64".to_string(),
        }),
    }
}

pub fn dtype_name(dtype: DType) -> &'static str {
    dtype.as_str()
}

/// BatchNorm constants: PyTorch's defaults.
pub const BN_EPS: f64 = 1e-5;
pub const BN_MOMENTUM: f64 = 0.1;

/// Largest element count of any one tensor we agree to build. Bigger shapes are almost surely a
/// typo, and products beyond this would overflow byte counts on 32-bit hosts.
pub const MAX_ELEMENTS: u128 = 1 << 40;

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
    /// Spatial size H = W (bc).
    pub size: usize,
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
            size: 32,
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
            size: 3,
            activation: true,
            dtype: DType::F64,
            seed: 7,
        }
    }

    /// Checks every field; the error names the field and value.
    pub fn validate(&self) -> Result<()> {
        let positive = |field: &'static str, v: usize| -> Result<()> {
            if v == 0 {
                Err(Error::InvalidConfig {
                    field,
                    value: v.to_string(),
                    reason: "must be at least 1".to_string(),
                })
            } else {
                Ok(())
            }
        };
        positive("batch", self.batch)?;
        positive("channels", self.channels)?;
        positive("growth", self.growth)?;
        positive("depth", self.depth)?;
        if self.family == Family::Bc {
            positive("bn_size", self.bn_size)?;
            positive("size", self.size)?;
            if self.batch * self.size * self.size < 2 {
                return Err(Error::InvalidConfig {
                    field: "batch",
                    value: self.batch.to_string(),
                    reason: format!(
                        "training-mode BatchNorm needs more than one value per channel, \
                         but batch·size² = {}·{}² = 1",
                        self.batch, self.size
                    ),
                });
            }
        }
        if !matches!(self.dtype, DType::F32 | DType::F64) {
            return Err(Error::InvalidConfig {
                field: "dtype",
                value: self.dtype.as_str().to_string(),
                reason: "supported dtypes are f32 and f64".to_string(),
            });
        }
        // Overflow: the widest tensor is the concatenation [C_total, N·H·W] (or the im2col of
        // the bottleneck, 9·bn_size·k·N·H·W); check with u128 arithmetic so nothing wraps.
        let c_total = self.channels as u128 + self.depth as u128 * self.growth as u128;
        let m = self.batch as u128 * self.spatial() as u128;
        let widest = c_total.max(9 * self.bn_size as u128 * self.growth as u128) * m;
        if widest > MAX_ELEMENTS {
            return Err(Error::InvalidConfig {
                field: "depth",
                value: self.depth.to_string(),
                reason: format!(
                    "the block's widest tensor would hold {widest} elements, more than the \
                     {MAX_ELEMENTS} densebench accepts (check depth, batch, channels, size)"
                ),
            });
        }
        Ok(())
    }

    /// H·W for bc, 1 for mlp.
    pub fn spatial(&self) -> usize {
        match self.family {
            Family::Mlp => 1,
            Family::Bc => self.size * self.size,
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

    /// Bottleneck width bn_size·k (bc).
    pub fn bottleneck(&self) -> usize {
        self.bn_size * self.growth
    }

    pub fn dtype_size(&self) -> usize {
        self.dtype.size_in_bytes()
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
            Family::Bc => vec![self.batch, channels, self.size, self.size],
        }
    }

    /// A one-line description, e.g. `bc N=64 C0=24 k=12 L=16 bn=4 32x32 f32 seed=0`.
    pub fn describe(&self) -> String {
        match self.family {
            Family::Mlp => format!(
                "mlp N={} C0={} k={} L={} relu={} {} seed={}",
                self.batch,
                self.channels,
                self.growth,
                self.depth,
                if self.activation { "on" } else { "off" },
                self.dtype.as_str(),
                self.seed
            ),
            Family::Bc => format!(
                "bc N={} C0={} k={} L={} bn={} {}x{} {} seed={}",
                self.batch,
                self.channels,
                self.growth,
                self.depth,
                self.bn_size,
                self.size,
                self.size,
                self.dtype.as_str(),
                self.seed
            ),
        }
    }
}
