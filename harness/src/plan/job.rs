//! One unit of work: a variant (densebench's or a peer's, [`Target`]) on a config with its
//! measurement settings, its stable key and
//! the command-line flags that describe it (shared by `run` and the hidden child); the
//! densebench version and git revision every row and reference carries.

use crate::plan::device::DeviceSpec;
pub use crate::plan::target::{Execution, Peer, PeerVariant, Target};
use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use impls::{Config, Family, Spatial};
use std::sync::OnceLock;
use std::time::Duration;

/// One measurement of a sweep.
#[derive(Debug, Clone)]
pub struct Job {
    pub key: String,
    /// What runs: a densebench variant or a peer's.
    pub variant: Target,
    pub cfg: Config,
    /// The peer framework the config is compared with, if any: its rows are jobs of the sweep,
    /// and the f32 tolerance of the config's densebench rows comes from its error on the case.
    pub peer: Option<Peer>,
    pub settings: Settings,
    /// Predicted cost in FLOP-equivalents ([`crate::plan::shard::job_cost`]): shard balance and
    /// the ETA.
    pub cost: f64,
}

/// `on` / `off` for boolean flags such as `--activation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    pub fn is_on(self) -> bool {
        self == OnOff::On
    }

    pub fn from_bool(b: bool) -> Self {
        if b {
            OnOff::On
        } else {
            OnOff::Off
        }
    }

    pub fn name(self) -> &'static str {
        if self.is_on() {
            "on"
        } else {
            "off"
        }
    }
}

/// The block configuration as command-line flags (used by `run` and the child).
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigArgs {
    /// Block family: `mlp` (Linear + ReLU layers) or `bc` (DenseNet-BC layers).
    #[arg(long)]
    pub family: String,
    /// Number of layers L.
    #[arg(long)]
    pub depth: usize,
    /// Batch size N.
    #[arg(long)]
    pub batch: usize,
    /// Growth rate k (channels each layer adds).
    #[arg(long)]
    pub growth: usize,
    /// Input channels C0.
    #[arg(long)]
    pub channels: usize,
    /// Bottleneck factor (bc only): Conv1×1 outputs bn_size·k channels [default: 4].
    #[arg(long)]
    pub bn_size: Option<usize>,
    /// Spatial size of the feature maps (bc only): `32` for 32×32, or `HxW`, height first
    /// (`360x480`) [default: 32].
    #[arg(long, value_parser = parse_size)]
    pub size: Option<Spatial>,
    /// ReLU after each Linear (mlp only; bc always has its ReLUs).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub activation: OnOff,
    /// Element type: f32, f64, or bf16 (mixed precision as PyTorch autocast: bf16 features, f32
    /// parameters, parameter gradients and BN statistics; on the CPU and on CUDA).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Seed of the parameters, input and upstream gradient.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// Bottleneck factor of a bc block when `--bn-size` is left out.
pub const DEFAULT_BN_SIZE: usize = 4;
/// Spatial size of a bc block when `--size` is left out: 32×32.
pub const DEFAULT_SIZE: Spatial = Spatial::square(32);

/// Refuses `--bn-size` and `--size` for an mlp block unless they give the values its key
/// records anyway (1, as `run`'s child is passed them): an mlp layer has no bottleneck and no
/// feature map, and a row keyed `size 1` for an explicit `--size 8` would measure what was not
/// asked for, silently. `None` is a flag left out.
pub fn check_bc_only(family: Family, bn_size: Option<usize>, size: Option<Spatial>) -> Result<()> {
    if family != Family::Mlp {
        return Ok(());
    }
    if let Some(b) = bn_size.filter(|&b| b != 1) {
        bail!(
            "--bn-size {b} applies to bc blocks only: an mlp layer (Linear → ReLU) has no \
             bottleneck; leave the flag out for mlp"
        );
    }
    if let Some(s) = size.filter(|&s| s != Spatial::square(1)) {
        bail!(
            "--size {s} applies to bc blocks only: an mlp layer's features are vectors, not \
             feature maps; leave the flag out for mlp"
        );
    }
    Ok(())
}

/// Refuses `--activation off` for a bc block. Not normalised away: a bc block always has its
/// ReLUs, and a row keyed `relu=on` for an explicit `--activation off` would measure what was
/// not asked for.
pub fn check_activation(family: Family, activation: OnOff) -> Result<()> {
    if family == Family::Bc && !activation.is_on() {
        bail!(
            "--activation off applies to mlp blocks only: a bc (DenseNet-BC) layer always has \
             its BN → ReLU; leave the flag out for bc"
        );
    }
    Ok(())
}

impl ConfigArgs {
    /// The validated config (fields that do not apply to the family normalised, see
    /// [`normalize`]).
    pub fn to_config(&self) -> Result<Config> {
        let family = Family::parse(&self.family).map_err(|e| anyhow!("--family: {e}"))?;
        check_activation(family, self.activation)?;
        check_bc_only(family, self.bn_size, self.size)?;
        let dtype = impls::config::parse_dtype(&self.dtype).map_err(|e| anyhow!("--dtype: {e}"))?;
        let cfg = normalize(Config {
            family,
            batch: self.batch,
            channels: self.channels,
            growth: self.growth,
            depth: self.depth,
            bn_size: self.bn_size.unwrap_or(DEFAULT_BN_SIZE),
            size: self.size.unwrap_or(DEFAULT_SIZE),
            activation: self.activation.is_on(),
            dtype,
            seed: self.seed,
        });
        cfg.validate().map_err(|e| anyhow!("{e}"))?;
        Ok(cfg)
    }

    pub fn from_config(cfg: &Config) -> Self {
        ConfigArgs {
            family: cfg.family.name().to_string(),
            depth: cfg.depth,
            batch: cfg.batch,
            growth: cfg.growth,
            channels: cfg.channels,
            bn_size: Some(cfg.bn_size),
            size: Some(cfg.size),
            activation: OnOff::from_bool(cfg.activation),
            dtype: cfg.dtype.as_str().to_string(),
            seed: cfg.seed,
        }
    }

    /// The flags that reproduce these arguments (a flag left out stays out).
    pub fn to_flags(&self) -> Vec<String> {
        [
            ("--family", Some(self.family.clone())),
            ("--depth", Some(self.depth.to_string())),
            ("--batch", Some(self.batch.to_string())),
            ("--growth", Some(self.growth.to_string())),
            ("--channels", Some(self.channels.to_string())),
            ("--bn-size", self.bn_size.map(|b| b.to_string())),
            ("--size", self.size.map(|s| s.to_string())),
            ("--activation", Some(self.activation.name().to_string())),
            ("--dtype", Some(self.dtype.clone())),
            ("--seed", Some(self.seed.to_string())),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| [k.to_string(), v]))
        .flatten()
        .collect()
    }
}

/// Fields that do not apply to a family get one canonical value, so that one block has one
/// key: mlp has `bn_size = 1`, `size = 1` (as a case file infers), bc always has its ReLUs.
pub fn normalize(mut cfg: Config) -> Config {
    match cfg.family {
        Family::Mlp => {
            cfg.bn_size = 1;
            cfg.size = Spatial::square(1);
        }
        Family::Bc => cfg.activation = true,
    }
    cfg
}

/// `--size`: `32` or `HxW` ([`Spatial`]); the error is the reason alone (clap names the flag
/// and the value).
pub fn parse_size(s: &str) -> Result<Spatial, String> {
    Spatial::parse(s).map_err(|e| match e {
        impls::Error::InvalidConfig { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// `key` without the variant: `family/N/C0/k/L/bn/size/act/dtype/seed/device`; `size` is `32`
/// for 32×32 and `HxW` otherwise (`360x480`), as in the CSV's `size` column.
pub fn config_key(cfg: &Config, device: DeviceSpec) -> String {
    format!(
        "{}/{}/{}/{}/{}/{}/{}/{}/{}/{}/{}",
        cfg.family.name(),
        cfg.batch,
        cfg.channels,
        cfg.growth,
        cfg.depth,
        cfg.bn_size,
        cfg.size,
        OnOff::from_bool(cfg.activation).name(),
        cfg.dtype.as_str(),
        cfg.seed,
        device
    )
}

/// The stable identity of a row: `variant/family/N/C0/k/L/bn/size/act/dtype/seed/device`, e.g.
/// `buffer-store-copy/mlp/4096/256/64/32/1/1/on/f32/0/cpu`, or a peer's
/// `pytorch-naive/bc/64/24/12/16/4/32/on/f32/0/cpu`. Shards, resumes and merges use it.
pub fn key(variant: impl Into<Target>, cfg: &Config, device: DeviceSpec) -> String {
    format!("{}/{}", variant.into().name(), config_key(cfg, device))
}

/// Floating-point math of f32 matmuls and convolutions (issue 11): `ieee`, full f32 (the
/// default, and the only mode of the CPU and of f64), or `tf32`, TF32 tensor cores on a GPU
/// (`candle_core::cuda::set_gemm_reduced_precision_f32`; 10-bit mantissa products, f32
/// accumulation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Math {
    #[default]
    Ieee,
    Tf32,
}

impl Math {
    pub fn name(self) -> &'static str {
        match self {
            Math::Ieee => "ieee",
            Math::Tf32 => "tf32",
        }
    }

    /// `ieee` or `tf32`; anything else is one line naming both.
    pub fn parse(s: &str) -> Result<Math> {
        match s {
            "ieee" => Ok(Math::Ieee),
            "tf32" => Ok(Math::Tf32),
            _ => bail!("math `{s}` is not `ieee` or `tf32`"),
        }
    }

    /// What a row's key carries after the device: nothing for `ieee` (so every key written
    /// before `--math` existed stays valid), `/tf32` for `tf32`.
    pub fn key_suffix(self) -> &'static str {
        match self {
            Math::Ieee => "",
            Math::Tf32 => "/tf32",
        }
    }

    /// Refuses `tf32` where it means nothing: on the CPU (which computes f32 in full
    /// precision) and in f64 and bf16.
    pub fn check(self, device: DeviceSpec, dtype: candle_core::DType) -> Result<()> {
        if self == Math::Tf32 {
            if device == DeviceSpec::Cpu {
                bail!(
                    "math `tf32` is a GPU mode (TF32 tensor cores); the CPU computes f32 in full \
                     precision: use `ieee` (the default) or a `cuda:N` device"
                );
            }
            if dtype != candle_core::DType::F32 {
                bail!(
                    "math `tf32` applies to f32 only, the dtype is {}",
                    dtype.as_str()
                );
            }
        }
        Ok(())
    }
}

/// The key of a row measured under `math`: [`key`], [`Math::key_suffix`] and the target's
/// [`Execution::key_suffix`] on `device` (`execution`: a densebench variant's; a peer variant
/// runs as it always does there).
pub fn job_key(
    variant: impl Into<Target>,
    cfg: &Config,
    device: DeviceSpec,
    math: Math,
    execution: Execution,
) -> String {
    let target = variant.into();
    format!(
        "{}{}{}",
        key(target, cfg, device),
        math.key_suffix(),
        target.execution(device, execution).key_suffix()
    )
}

/// How one measurement is run.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub device: DeviceSpec,
    /// f32 math of matmuls and convolutions ([`Math`]).
    pub math: Math,
    /// How densebench's timed steps run ([`Execution`]: eager, or a CUDA-graph replay); a peer
    /// variant runs as it always does on the device.
    pub execution: Execution,
    /// Compute threads of the child (resolved: never 0).
    pub threads: usize,
    /// Measured steps (median, min, max are over these).
    pub steps: usize,
    /// Unmeasured steps before them.
    pub warmup: usize,
    /// The child's allocator limit in bytes.
    pub mem_limit: Option<u64>,
    /// Wall-clock limit of each child process.
    pub timeout: Duration,
}

#[cfg(test)]
impl Settings {
    /// The unit tests' settings: one eager IEEE step on the CPU, one thread, no warm-up, 5 s,
    /// under `mem_limit`.
    pub(crate) fn cpu_test(mem_limit: Option<u64>) -> Settings {
        Settings {
            device: DeviceSpec::Cpu,
            math: Math::Ieee,
            execution: Execution::Eager,
            threads: 1,
            steps: 1,
            warmup: 0,
            mem_limit,
            timeout: Duration::from_secs(5),
        }
    }
}

/// Default memory limit of a child: this fraction of physical memory (the sweep runs one
/// child at a time, and the parent and the OS need the rest).
pub const DEFAULT_MEM_FRACTION: f64 = 0.75;
/// Default wall-clock limit of one child process, in seconds.
pub const DEFAULT_TIMEOUT_SECS: u64 = 600;

/// [`DEFAULT_MEM_FRACTION`] of physical memory, if it can be read.
pub fn default_mem_limit() -> Option<u64> {
    total_memory_bytes().map(|b| (b as f64 * DEFAULT_MEM_FRACTION) as u64)
}

/// Total physical memory in bytes (from /proc/meminfo), if readable.
pub fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Parses a byte count: an integer with an optional suffix `K`, `M`, `G`, `T` (powers of 1000)
/// or `KiB`, `MiB`, `GiB`, `TiB` (powers of 1024), e.g. `1500000`, `2GiB`, `512M`.
pub fn parse_bytes(s: &str) -> Result<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let n: u64 = digits.parse().map_err(|_| {
        let why = if digits.is_empty() {
            "a count starts with its digits"
        } else {
            "its number is beyond 2^64"
        };
        anyhow!("`{s}` is not a byte count ({why}; e.g. 1500000, 512M, 2GiB)")
    })?;
    let mult: u64 = match suffix.trim() {
        "" | "B" => 1,
        "K" | "KB" => 1_000,
        "M" | "MB" => 1_000_000,
        "G" | "GB" => 1_000_000_000,
        "T" | "TB" => 1_000_000_000_000,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        other => bail!("`{s}`: unknown byte suffix `{other}` (use K, M, G, T, KiB, MiB, GiB, TiB)"),
    };
    n.checked_mul(mult)
        .with_context(|| format!("`{s}` overflows a 64-bit byte count"))
}

/// This build's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The environment variable that names the revision for [`git_rev`] where the source tree is
/// not at hand: a binary packed for a GPU machine (`scripts/gpu-session.sh` sets it from
/// `.gpu/git-rev`, the revision `gpu-pack.sh` built).
pub const GIT_REV_ENV: &str = "DENSEBENCH_GIT_REV";

/// `git rev-parse --short HEAD` of the source tree this binary was built from, with `+dirty`
/// when tracked files differed from it, as the build script saw them at build time (`unknown`
/// for a build outside a git checkout); [`GIT_REV_ENV`] when it is set and not empty. Never
/// the checkout's state when the binary runs: a commit or edit after the build does not make a
/// row claim a source it was not measured with.
pub fn git_rev() -> &'static str {
    static REV: OnceLock<String> = OnceLock::new();
    REV.get_or_init(|| {
        std::env::var(GIT_REV_ENV)
            .ok()
            .map(|r| r.trim().to_string())
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| env!("DENSEBENCH_BUILD_GIT_REV").to_string())
    })
}

/// Resolves a requested thread count (0: the compute library's default, candle's, which
/// also reads `RAYON_NUM_THREADS`).
pub fn resolve_threads(requested: usize) -> usize {
    if requested == 0 {
        candle_core::utils::get_num_threads()
    } else {
        requested
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use impls::Variant;

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1500").ok(), Some(1500));
        assert_eq!(parse_bytes("2GiB").ok(), Some(2 << 30));
        assert_eq!(parse_bytes("512M").ok(), Some(512_000_000));
        assert!(parse_bytes("12XB").is_err());
        assert!(parse_bytes("lots").is_err());
    }

    #[test]
    fn key_normalises_fields_the_family_ignores() {
        let mut a = Config::tiny(Family::Mlp);
        a.size = Spatial::square(9);
        let mut b = a.clone();
        b.size = Spatial::new(3, 5);
        let (a, b) = (normalize(a), normalize(b));
        let v = Variant::NAIVE;
        assert_eq!(key(v, &a, DeviceSpec::Cpu), key(v, &b, DeviceSpec::Cpu));
        assert_eq!(
            key(v, &a, DeviceSpec::Cpu),
            "cat-store-copy/mlp/2/3/2/3/1/1/on/f64/7/cpu"
        );
    }

    #[test]
    fn key_and_flags_write_square_sizes_as_before_and_others_as_hxw() {
        let v = Variant::NAIVE;
        let square = Config::tiny(Family::Bc);
        assert_eq!(
            key(v, &square, DeviceSpec::Cpu),
            "cat-store-copy/bc/2/3/2/3/2/3/on/f64/7/cpu"
        );
        for (size, text) in [(Spatial::new(3, 5), "3x5"), (Spatial::new(5, 3), "5x3")] {
            let cfg = Config {
                size,
                ..square.clone()
            };
            assert_eq!(
                key(v, &cfg, DeviceSpec::Cpu),
                format!("cat-store-copy/bc/2/3/2/3/2/{text}/on/f64/7/cpu")
            );
            // The child's flags reproduce the config, H and W in order.
            let flags = ConfigArgs::from_config(&cfg).to_flags();
            let at = flags
                .iter()
                .position(|f| f == "--size")
                .map(|i| &flags[i + 1]);
            assert_eq!(at.map(String::as_str), Some(text));
            assert_eq!(parse_size(text), Ok(size));
        }
        for bad in ["0x", "x5", "axb", "3x5x7", "", "99999999999999999999999"] {
            let e = parse_size(bad).err().unwrap_or_default();
            assert!(
                e.contains("expected") || e.contains("usize::MAX"),
                "{bad}: {e}"
            );
        }
    }
}
