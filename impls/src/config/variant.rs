//! Strategies as axes and variants as points on them, each with one stable kebab-case name.
//!
//! A hand-written variant is `<concat>-<intermediates>-<relu>`:
//! - concat `cat`: a fresh concatenated tensor per layer (memory quadratic in depth);
//!   `buffer`: one [`AppendBuffer`](crate::strategies::buffer::AppendBuffer) the layers append into.
//! - intermediates `store`: keep what each layer's backward needs; `recompute`: keep only the
//!   concatenated features and BN statistics, recompute the rest in backward (checkpointing).
//! - relu `copy`: ReLU writes a new tensor; `inplace`: it overwrites its input and its backward
//!   uses the output mask.
//!
//! `autograd` is the forum's code through candle's own autograd: the user's baseline and an
//! independent gradient reference. `cat-store-copy` is the explicit naive variant.
//!
//! Points that mean nothing are left out rather than aliased:
//! - `mlp` + `buffer-recompute-*`: an mlp layer's only intermediate is its input, which lives in
//!   the buffer already; there is nothing to recompute. (`cat-recompute-*` does mean something for
//!   mlp: it keeps the layer outputs and re-concatenates in backward.)
//! - `mlp` with the activation off + `*-inplace`: there is no ReLU to run in place.
//! - `autograd` in bf16: candle's CPU autograd cannot run a bf16 step ([`AUTOGRAD_BF16`]).

use crate::config::{Config, Family};
use crate::error::{Error, Result};
use std::fmt;

/// Why `autograd` does not run in bf16. Its graph would run candle's own CPU ops in bf16, and
/// candle-core 0.11's CPU matmul (which its `conv2d` runs on) takes f16, f32 and f64 only
/// (`UnsupportedDTypeForOp(BF16, "matmul")`); its BN statistics and parameter gradients would
/// be bf16 too, not autocast's f32. The bf16 rows are checked against `autograd` in f64 on the
/// bf16 case widened exactly, which needs no bf16 autograd.
pub const AUTOGRAD_BF16: &str = "candle's autograd runs candle's own CPU ops, and candle-core \
    0.11's CPU matmul (under its conv2d too) has no bf16 (UnsupportedDTypeForOp); a bf16 \
    autograd step would also keep BN statistics and parameter gradients in bf16, not PyTorch \
    autocast's f32. bf16 rows are checked against autograd in f64 on the case widened exactly";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Concat {
    Cat,
    Buffer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Intermediates {
    Store,
    Recompute,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Relu {
    Copy,
    Inplace,
}

/// A point on the three hand-written axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Strategy {
    pub concat: Concat,
    pub intermediates: Intermediates,
    pub relu: Relu,
}

/// Every way densebench runs a dense block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Variant {
    /// The forum's code through candle's autograd; no hand-written backward.
    Autograd,
    /// A hand-written forward and backward following a strategy.
    Manual(Strategy),
}

impl Strategy {
    pub const NAIVE: Strategy = Strategy {
        concat: Concat::Cat,
        intermediates: Intermediates::Store,
        relu: Relu::Copy,
    };
}

impl Variant {
    /// The explicit naive variant, `cat-store-copy`: what every ratio is taken against.
    pub const NAIVE: Variant = Variant::Manual(Strategy::NAIVE);

    /// Every variant in a stable order (the order of legends and tables).
    pub fn all() -> Vec<Variant> {
        let mut out = vec![Variant::Autograd];
        for concat in [Concat::Cat, Concat::Buffer] {
            for intermediates in [Intermediates::Store, Intermediates::Recompute] {
                for relu in [Relu::Copy, Relu::Inplace] {
                    out.push(Variant::Manual(Strategy {
                        concat,
                        intermediates,
                        relu,
                    }));
                }
            }
        }
        out
    }

    /// The variants that mean something for a config (see the module docs for what is left out).
    pub fn for_config(cfg: &Config) -> Vec<Variant> {
        Self::all()
            .into_iter()
            .filter(|v| v.check(cfg).is_ok())
            .collect()
    }

    /// Errs when this variant means nothing for `cfg`, or cannot run in its dtype, saying why.
    pub fn check(&self, cfg: &Config) -> Result<()> {
        let Variant::Manual(s) = self else {
            if cfg.dtype == candle_core::DType::BF16 {
                return Err(Error::DTypeNotSupported {
                    variant: self.name(),
                    dtype: cfg.dtype.as_str().to_string(),
                    reason: AUTOGRAD_BF16.to_string(),
                });
            }
            return Ok(());
        };
        let reason = match cfg.family {
            Family::Mlp if s.concat == Concat::Buffer && s.intermediates == Intermediates::Recompute => {
                Some("an mlp layer's only intermediate is its input, already in the buffer: nothing to recompute")
            }
            Family::Mlp if !cfg.activation && s.relu == Relu::Inplace => {
                Some("the activation is off, so there is no ReLU to run in place")
            }
            _ => None,
        };
        match reason {
            Some(reason) => Err(Error::VariantNotApplicable {
                variant: self.name(),
                family: cfg.family.name().to_string(),
                reason: reason.to_string(),
            }),
            None => Ok(()),
        }
    }

    pub fn name(&self) -> String {
        match self {
            Variant::Autograd => "autograd".to_string(),
            Variant::Manual(s) => format!(
                "{}-{}-{}",
                match s.concat {
                    Concat::Cat => "cat",
                    Concat::Buffer => "buffer",
                },
                match s.intermediates {
                    Intermediates::Store => "store",
                    Intermediates::Recompute => "recompute",
                },
                match s.relu {
                    Relu::Copy => "copy",
                    Relu::Inplace => "inplace",
                }
            ),
        }
    }

    pub fn parse(name: &str) -> Result<Variant> {
        Self::all()
            .into_iter()
            .find(|v| v.name() == name)
            .ok_or_else(|| Error::UnknownVariant {
                name: name.to_string(),
                known: Self::all()
                    .iter()
                    .map(Variant::name)
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// True for the variants whose memory grows linearly in depth: everything they keep per
    /// layer is O(k) channels. `recompute` keeps only the features and BN statistics; a
    /// `buffer-store` mlp layer keeps views of the buffer; but a `buffer-store` bc layer still
    /// keeps its ReLU1 output `[C_i, M]`, which grows with i — quadratic overall.
    pub fn is_linear_memory(&self, family: Family) -> bool {
        match self {
            Variant::Autograd => false,
            Variant::Manual(s) => {
                s.intermediates == Intermediates::Recompute
                    || (family == Family::Mlp && s.concat == Concat::Buffer)
            }
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}
