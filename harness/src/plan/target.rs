//! What a job runs: one of densebench's own variants, or a peer framework's variant (the
//! PyTorch peer, `harness/peer/pytorch_peer.py`) on the same case. Names are stable (the CSV's
//! `variant` column, the first part of a key) and a peer variant's name starts with its
//! framework's (`pytorch-naive`), so no peer name can be taken for a densebench variant.

use crate::plan::device::DeviceSpec;
use anyhow::{anyhow, bail, Result};
use impls::{Config, Family, Variant};
use std::fmt;
use std::str::FromStr;

/// How a timed step is executed (the `execution` column, schema 3): like is compared only with
/// like (results/README.md, "What a timed step contains").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Execution {
    /// Every op launched by the host as the step runs: densebench's steps, PyTorch eager.
    #[default]
    Eager,
    /// The whole step replayed as CUDA graphs: densebench's graph rows, PyTorch's
    /// `torch.compile(mode="reduce-overhead")` (inductor's kernels in cudagraph trees).
    Graph,
    /// Compiled kernels launched by the host, no graphs: `torch.compile` in its default mode
    /// (what the CPU gets).
    Compiled,
}

impl Execution {
    pub const ALL: [Execution; 3] = [Execution::Eager, Execution::Graph, Execution::Compiled];

    /// The `execution` column's value.
    pub fn name(self) -> &'static str {
        match self {
            Execution::Eager => "eager",
            Execution::Graph => "graph",
            Execution::Compiled => "compiled",
        }
    }

    /// `eager`, `graph` or `compiled`; anything else is one line naming them.
    pub fn parse(s: &str) -> Result<Execution> {
        Execution::ALL
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| anyhow!("execution `{s}` is not `eager`, `graph` or `compiled`"))
    }

    /// Refuses what densebench cannot run: `compiled` (a peer's mode) and `graph` off CUDA
    /// (a CUDA-graph replay of the step).
    pub fn check_densebench(self, device: DeviceSpec) -> Result<()> {
        match (self, device) {
            (Execution::Compiled, _) => bail!(
                "execution `compiled` is torch.compile's (the `pytorch-compiled-*` peer \
                 variants); densebench's steps run `eager` or, on CUDA, `graph`"
            ),
            (Execution::Graph, DeviceSpec::Cpu) => bail!(
                "execution `graph` replays the step as a CUDA graph: a cuda:N device only (the \
                 CPU runs `eager`)"
            ),
            _ => Ok(()),
        }
    }

    /// What a row's key carries after the math: nothing for `eager` (every key written before
    /// schema 3 stays valid), `/graph` or `/compiled` otherwise.
    pub fn key_suffix(self) -> &'static str {
        match self {
            Execution::Eager => "",
            Execution::Graph => "/graph",
            Execution::Compiled => "/compiled",
        }
    }
}

/// A peer framework a sweep can compare with (`--peer`, the sweep file's `peer` key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Peer {
    /// PyTorch eager: torchvision's `_DenseBlock` (bc) and the forum's Linear block (mlp).
    Pytorch,
    /// PyTorch eager and the same blocks under `torch.compile` (`reduce-overhead` on CUDA, the
    /// default mode on the CPU): the strongest PyTorch a user reaches for, beside the plain one.
    PytorchCompiled,
}

impl Peer {
    /// The `framework` column of its rows.
    pub fn name(self) -> &'static str {
        "pytorch"
    }

    /// The `--peer` value: `pytorch` or `pytorch-compiled`.
    pub fn arg(self) -> &'static str {
        match self {
            Peer::Pytorch => "pytorch",
            Peer::PytorchCompiled => "pytorch-compiled",
        }
    }

    /// The peer's variants for a config, in the order they run (naive first: its error on the
    /// case is the f32 tolerance of the config's densebench rows): the eager blocks, for `bc`
    /// the same blocks in `channels_last` memory format, then (`pytorch-compiled`) each one's
    /// compiled twin in the same order.
    pub fn variants(self, cfg: &Config) -> Vec<PeerVariant> {
        let eager = match cfg.family {
            Family::Bc => vec![
                PeerVariant::NAIVE,
                PeerVariant::MEMORY_EFFICIENT,
                PeerVariant::CHANNELS_LAST_NAIVE,
                PeerVariant::CHANNELS_LAST_MEMORY_EFFICIENT,
            ],
            Family::Mlp => vec![PeerVariant::NAIVE, PeerVariant::CHECKPOINT],
        };
        let mut vs = eager.clone();
        if self == Peer::PytorchCompiled {
            vs.extend(eager.iter().map(|v| v.compiled()));
        }
        vs
    }
}

impl FromStr for Peer {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "pytorch" => Ok(Peer::Pytorch),
            "pytorch-compiled" => Ok(Peer::PytorchCompiled),
            other => bail!(
                "unknown peer `{other}` (the peer is `pytorch`, or `pytorch-compiled` for \
                 PyTorch eager and under torch.compile)"
            ),
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The block a PyTorch peer variant runs (harness/peer/README.md has what each runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerBlock {
    /// bc: `_DenseBlock(memory_efficient=False)`; mlp: the forum's block.
    Naive,
    /// bc only: `_DenseBlock(memory_efficient=True)` (norm1 → relu1 → conv1 checkpointed).
    MemoryEfficient,
    /// mlp only: each Linear + ReLU in `torch.utils.checkpoint`.
    Checkpoint,
}

/// A variant of the PyTorch peer: a block on three axes — which block, eager or under
/// `torch.compile`, and (bc only: a Linear block has no memory format) in PyTorch's default
/// contiguous (NCHW) layout or `channels_last` (NHWC: the module and its input converted with
/// `.to(memory_format=torch.channels_last)`, PyTorch's performance guide's advice for
/// convolutional networks). Built only through the constants and [`PeerVariant::compiled`],
/// [`PeerVariant::eager`], so no checkpointed mlp block is ever `channels_last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerVariant {
    block: PeerBlock,
    compiled: bool,
    channels_last: bool,
}

impl PeerVariant {
    const fn of(block: PeerBlock, compiled: bool, channels_last: bool) -> Self {
        PeerVariant {
            block,
            compiled,
            channels_last,
        }
    }

    /// bc: `_DenseBlock(memory_efficient=False)`; mlp: the forum's block.
    pub const NAIVE: PeerVariant = Self::of(PeerBlock::Naive, false, false);
    /// bc only: `_DenseBlock(memory_efficient=True)`.
    pub const MEMORY_EFFICIENT: PeerVariant = Self::of(PeerBlock::MemoryEfficient, false, false);
    /// mlp only: each Linear + ReLU in `torch.utils.checkpoint`.
    pub const CHECKPOINT: PeerVariant = Self::of(PeerBlock::Checkpoint, false, false);
    /// bc only: [`PeerVariant::NAIVE`] in `channels_last` memory format.
    pub const CHANNELS_LAST_NAIVE: PeerVariant = Self::of(PeerBlock::Naive, false, true);
    /// bc only: [`PeerVariant::MEMORY_EFFICIENT`] in `channels_last` memory format.
    pub const CHANNELS_LAST_MEMORY_EFFICIENT: PeerVariant =
        Self::of(PeerBlock::MemoryEfficient, false, true);

    /// Every peer variant, eager ones first.
    pub const ALL: [PeerVariant; 10] = [
        Self::NAIVE,
        Self::MEMORY_EFFICIENT,
        Self::CHECKPOINT,
        Self::CHANNELS_LAST_NAIVE,
        Self::CHANNELS_LAST_MEMORY_EFFICIENT,
        Self::NAIVE.compiled(),
        Self::MEMORY_EFFICIENT.compiled(),
        Self::CHECKPOINT.compiled(),
        Self::CHANNELS_LAST_NAIVE.compiled(),
        Self::CHANNELS_LAST_MEMORY_EFFICIENT.compiled(),
    ];

    pub fn peer(self) -> Peer {
        if self.is_compiled() {
            Peer::PytorchCompiled
        } else {
            Peer::Pytorch
        }
    }

    /// The block it runs.
    pub fn block(self) -> PeerBlock {
        self.block
    }

    /// The stable name: `pytorch-`, then `compiled-` under `torch.compile`, then
    /// `channels-last-` in that memory format, then the block.
    pub fn name(self) -> &'static str {
        use PeerBlock::*;
        match (self.compiled, self.channels_last, self.block) {
            (false, false, Naive) => "pytorch-naive",
            (false, false, MemoryEfficient) => "pytorch-memory-efficient",
            (false, true, Naive) => "pytorch-channels-last-naive",
            (false, true, MemoryEfficient) => "pytorch-channels-last-memory-efficient",
            (true, false, Naive) => "pytorch-compiled-naive",
            (true, false, MemoryEfficient) => "pytorch-compiled-memory-efficient",
            (true, true, Naive) => "pytorch-compiled-channels-last-naive",
            (true, true, MemoryEfficient) => "pytorch-compiled-channels-last-memory-efficient",
            // never channels_last (see the type's doc)
            (false, _, Checkpoint) => "pytorch-checkpoint",
            (true, _, Checkpoint) => "pytorch-compiled-checkpoint",
        }
    }

    /// The variant under `torch.compile` (a compiled one is its own).
    pub const fn compiled(self) -> PeerVariant {
        Self::of(self.block, true, self.channels_last)
    }

    /// The eager variant it compiles (an eager one is its own).
    pub const fn eager(self) -> PeerVariant {
        Self::of(self.block, false, self.channels_last)
    }

    pub fn is_compiled(self) -> bool {
        self.compiled
    }

    /// Whether the module and its input are in `channels_last` memory format.
    pub fn is_channels_last(self) -> bool {
        self.channels_last
    }

    /// How its timed step runs on `device`: `reduce-overhead` (CUDA graphs) on a GPU, the
    /// default mode (compiled kernels, no graphs) on the CPU; eager for the eager variants.
    pub fn execution(self, device: DeviceSpec) -> Execution {
        match (self.is_compiled(), device) {
            (false, _) => Execution::Eager,
            (true, DeviceSpec::Cpu) => Execution::Compiled,
            (true, _) => Execution::Graph,
        }
    }

    /// Whether it recomputes part of forward in backward (for the cost model).
    pub fn recomputes(self) -> bool {
        self.block != PeerBlock::Naive
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

    /// How its timed step runs on `device`: a densebench variant as the job asks (`ours`: eager,
    /// or graph on CUDA), a peer variant as it always runs there.
    pub fn execution(self, device: DeviceSpec, ours: Execution) -> Execution {
        match self {
            Target::Densebench(_) => ours,
            Target::Peer(p) => p.execution(device),
        }
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
        for (f, eager) in [(Family::Bc, 4), (Family::Mlp, 2)] {
            let vs = Peer::Pytorch.variants(&Config::tiny(f));
            assert_eq!(vs.first(), Some(&PeerVariant::NAIVE));
            assert_eq!(vs.len(), eager, "{f:?}");
            assert!(vs.iter().all(|v| !v.is_compiled()));
            // channels_last only where there are convolutions
            assert_eq!(
                vs.iter().any(|v| v.is_channels_last()),
                f == Family::Bc,
                "{f:?}"
            );
            let all = Peer::PytorchCompiled.variants(&Config::tiny(f));
            assert_eq!(all.first(), Some(&PeerVariant::NAIVE));
            // The eager ones, then each one's compiled twin, in the same order.
            assert_eq!(all[..eager], vs[..]);
            let twins: Vec<_> = vs.iter().map(|v| v.compiled()).collect();
            assert_eq!(all[eager..], twins[..]);
        }
    }

    #[test]
    fn peer_variant_names_are_distinct_and_say_their_axes() {
        let names: std::collections::BTreeSet<_> =
            PeerVariant::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names.len(), PeerVariant::ALL.len(), "{names:?}");
        for p in PeerVariant::ALL {
            assert!(p.name().starts_with("pytorch-"), "{}", p.name());
            assert_eq!(
                p.is_channels_last(),
                p.name().contains("-channels-last-"),
                "{}",
                p.name()
            );
            assert_eq!(
                p.recomputes(),
                !p.name().ends_with("-naive"),
                "{}",
                p.name()
            );
            assert!(!(p.is_channels_last() && p.block() == PeerBlock::Checkpoint));
        }
        assert_eq!(
            PeerVariant::CHANNELS_LAST_MEMORY_EFFICIENT
                .compiled()
                .name(),
            "pytorch-compiled-channels-last-memory-efficient"
        );
    }

    #[test]
    fn compiled_twins_and_execution() {
        for p in PeerVariant::ALL {
            assert_eq!(p.compiled().eager(), p.eager());
            assert_eq!(p.eager().compiled(), p.compiled());
            assert_eq!(p.is_compiled(), p.name().starts_with("pytorch-compiled-"));
            assert_eq!(p.is_compiled(), p.peer() == Peer::PytorchCompiled);
            let (cpu, gpu) = (
                p.execution(DeviceSpec::Cpu),
                p.execution(DeviceSpec::Cuda(0)),
            );
            if p.is_compiled() {
                assert_eq!((cpu, gpu), (Execution::Compiled, Execution::Graph));
            } else {
                assert_eq!((cpu, gpu), (Execution::Eager, Execution::Eager));
            }
        }
        for e in Execution::ALL {
            assert_eq!(Execution::parse(e.name()).ok(), Some(e));
        }
        assert!(Execution::parse("jit").is_err());
        assert_eq!(
            "pytorch-compiled".parse::<Peer>().ok(),
            Some(Peer::PytorchCompiled)
        );
    }
}
