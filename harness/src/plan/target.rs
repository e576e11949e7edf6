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
    /// case is the f32 tolerance of the config's densebench rows; the compiled twins last).
    pub fn variants(self, cfg: &Config) -> Vec<PeerVariant> {
        let eager = match cfg.family {
            Family::Bc => [PeerVariant::Naive, PeerVariant::MemoryEfficient],
            Family::Mlp => [PeerVariant::Naive, PeerVariant::Checkpoint],
        };
        let mut vs = eager.to_vec();
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

/// A variant of the PyTorch peer (harness/peer/README.md has what each runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeerVariant {
    /// bc: `_DenseBlock(memory_efficient=False)`; mlp: the forum's block.
    Naive,
    /// bc only: `_DenseBlock(memory_efficient=True)` (norm1 → relu1 → conv1 checkpointed).
    MemoryEfficient,
    /// mlp only: each Linear + ReLU in `torch.utils.checkpoint`.
    Checkpoint,
    /// [`PeerVariant::Naive`] under `torch.compile`.
    CompiledNaive,
    /// [`PeerVariant::MemoryEfficient`] under `torch.compile` (bc only).
    CompiledMemoryEfficient,
    /// [`PeerVariant::Checkpoint`] under `torch.compile` (mlp only).
    CompiledCheckpoint,
}

impl PeerVariant {
    pub const ALL: [PeerVariant; 6] = [
        PeerVariant::Naive,
        PeerVariant::MemoryEfficient,
        PeerVariant::Checkpoint,
        PeerVariant::CompiledNaive,
        PeerVariant::CompiledMemoryEfficient,
        PeerVariant::CompiledCheckpoint,
    ];

    pub fn peer(self) -> Peer {
        if self.is_compiled() {
            Peer::PytorchCompiled
        } else {
            Peer::Pytorch
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PeerVariant::Naive => "pytorch-naive",
            PeerVariant::MemoryEfficient => "pytorch-memory-efficient",
            PeerVariant::Checkpoint => "pytorch-checkpoint",
            PeerVariant::CompiledNaive => "pytorch-compiled-naive",
            PeerVariant::CompiledMemoryEfficient => "pytorch-compiled-memory-efficient",
            PeerVariant::CompiledCheckpoint => "pytorch-compiled-checkpoint",
        }
    }

    /// The variant under `torch.compile` (a compiled one is its own).
    pub fn compiled(self) -> PeerVariant {
        match self {
            PeerVariant::Naive | PeerVariant::CompiledNaive => PeerVariant::CompiledNaive,
            PeerVariant::MemoryEfficient | PeerVariant::CompiledMemoryEfficient => {
                PeerVariant::CompiledMemoryEfficient
            }
            PeerVariant::Checkpoint | PeerVariant::CompiledCheckpoint => {
                PeerVariant::CompiledCheckpoint
            }
        }
    }

    /// The eager variant it compiles (an eager one is its own).
    pub fn eager(self) -> PeerVariant {
        match self {
            PeerVariant::Naive | PeerVariant::CompiledNaive => PeerVariant::Naive,
            PeerVariant::MemoryEfficient | PeerVariant::CompiledMemoryEfficient => {
                PeerVariant::MemoryEfficient
            }
            PeerVariant::Checkpoint | PeerVariant::CompiledCheckpoint => PeerVariant::Checkpoint,
        }
    }

    pub fn is_compiled(self) -> bool {
        self.compiled() == self
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
        self.eager() != PeerVariant::Naive
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
        for f in Family::ALL {
            let vs = Peer::Pytorch.variants(&Config::tiny(f));
            assert_eq!(vs.first(), Some(&PeerVariant::Naive));
            assert_eq!(vs.len(), 2);
            let all = Peer::PytorchCompiled.variants(&Config::tiny(f));
            assert_eq!(all.first(), Some(&PeerVariant::Naive));
            // The eager pair, then each one's compiled twin, in the same order.
            assert_eq!(all[..2], vs[..]);
            let twins: Vec<_> = vs.iter().map(|v| v.compiled()).collect();
            assert_eq!(all[2..], twins[..]);
        }
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
