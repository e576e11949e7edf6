//! What a job runs: one of densebench's own variants, or a peer framework's variant (the
//! PyTorch peer, `harness/peer/pytorch_peer.py`) on the same case. Names are stable (the CSV's
//! `variant` column, the first part of a key) and a peer variant's name starts with its
//! framework's (`pytorch-naive`), so no peer name can be taken for a densebench variant.

use anyhow::{bail, Result};
use impls::{Config, Family, Variant};
use std::fmt;
use std::str::FromStr;

/// A peer framework a sweep can compare with (`--peer`, the sweep file's `peer` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Peer {
    /// PyTorch: torchvision's `_DenseBlock` (bc) and the forum's Linear block (mlp).
    Pytorch,
}

impl Peer {
    /// The `framework` column of its rows.
    pub fn name(self) -> &'static str {
        match self {
            Peer::Pytorch => "pytorch",
        }
    }

    /// The peer's variants for a config, in the order they run (naive first: its error on the
    /// case is the f32 tolerance of the config's densebench rows).
    pub fn variants(self, cfg: &Config) -> Vec<PeerVariant> {
        match (self, cfg.family) {
            (Peer::Pytorch, Family::Bc) => vec![PeerVariant::Naive, PeerVariant::MemoryEfficient],
            (Peer::Pytorch, Family::Mlp) => vec![PeerVariant::Naive, PeerVariant::Checkpoint],
        }
    }
}

impl FromStr for Peer {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pytorch" => Ok(Peer::Pytorch),
            other => bail!("unknown peer `{other}` (the one peer is `pytorch`)"),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A variant of the PyTorch peer (harness/peer/README.md has what each runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerVariant {
    /// bc: `_DenseBlock(memory_efficient=False)`; mlp: the forum's block.
    Naive,
    /// bc only: `_DenseBlock(memory_efficient=True)` (norm1 → relu1 → conv1 checkpointed).
    MemoryEfficient,
    /// mlp only: each Linear + ReLU in `torch.utils.checkpoint`.
    Checkpoint,
}

impl PeerVariant {
    pub const ALL: [PeerVariant; 3] = [
        PeerVariant::Naive,
        PeerVariant::MemoryEfficient,
        PeerVariant::Checkpoint,
    ];

    pub fn peer(self) -> Peer {
        Peer::Pytorch
    }

    pub fn name(self) -> &'static str {
        match self {
            PeerVariant::Naive => "pytorch-naive",
            PeerVariant::MemoryEfficient => "pytorch-memory-efficient",
            PeerVariant::Checkpoint => "pytorch-checkpoint",
        }
    }

    /// Whether it recomputes part of forward in backward (for the cost model).
    pub fn recomputes(self) -> bool {
        self != PeerVariant::Naive
    }
}

impl fmt::Display for PeerVariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one job runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// A densebench variant, measured by densebench's own child.
    Densebench(Variant),
    /// A peer framework's variant, measured by the peer's program in its own child process.
    Peer(PeerVariant),
}

impl Target {
    /// The stable name: the CSV's `variant` column and the first part of the key.
    pub fn name(self) -> String {
        match self {
            Target::Densebench(v) => v.name(),
            Target::Peer(p) => p.name().to_string(),
        }
    }

    /// The densebench variant, if it is one.
    pub fn variant(self) -> Option<Variant> {
        match self {
            Target::Densebench(v) => Some(v),
            Target::Peer(_) => None,
        }
    }

    pub fn is_peer(self) -> bool {
        matches!(self, Target::Peer(_))
    }
}

impl From<Variant> for Target {
    fn from(v: Variant) -> Self {
        Target::Densebench(v)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_names_never_parse_as_densebench_variants() {
        for p in PeerVariant::ALL {
            assert!(Variant::parse(p.name()).is_err(), "{}", p.name());
        }
    }

    #[test]
    fn naive_runs_first_for_both_families() {
        // The naive peer's error is the config's f32 tolerance: it must be known first.
        for f in Family::ALL {
            let vs = Peer::Pytorch.variants(&Config::tiny(f));
            assert_eq!(vs.first(), Some(&PeerVariant::Naive));
            assert_eq!(vs.len(), 2);
        }
    }
}
