//! `densebench max-depth`: the question users actually ask — how deep a block fits in a memory
//! budget — answered per variant from the analytic model, then confirmed by measured runs at
//! the answer (must fit) and one layer deeper (must not).
//!
//! "Fits" means the block's memory stays within the budget: its static tensors (parameters and
//! BN buffers, input, upstream gradient) plus the measured peak of one training step above
//! them. The process's own runtime overhead (a few MiB of thread pools and buffers, the same for
//! every variant) is not counted. Each measured run is an isolated child whose allocator limit is
//! the budget plus [`overhead_margin`], so a run far beyond the budget fails fast as `oom`.
//! `autograd` has no model: it is searched by measured runs alone (doubling, then bisection).

use crate::measure::child::{self, Outcome};
use crate::measure::device::DeviceSpec;
use crate::measure::estimates::{overhead_margin, static_bytes};
use crate::plan::job::{self, normalize, OnOff, Settings};
use anyhow::{anyhow, bail, Context, Result};
use impls::{Config, Family, Variant};
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// `densebench max-depth` arguments. Sizes default to the family's canonical block:
/// DenseNet-BC-100's (N=64, C0=24, k=12, bn_size 4, 32×32) for bc, the forum's
/// (N=4096, C0=256, k=64) for mlp.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Block family: `mlp` or `bc`.
    #[arg(long)]
    pub family: String,
    /// Variants to answer for (comma-separated); default every variant that applies.
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// Memory budget in bytes (suffixes K, M, G or KiB, MiB, GiB), e.g. `1GiB`.
    #[arg(long, value_parser = job::parse_bytes)]
    pub budget: u64,
    /// Batch size N.
    #[arg(long)]
    pub batch: Option<usize>,
    /// Input channels C0.
    #[arg(long)]
    pub channels: Option<usize>,
    /// Growth rate k.
    #[arg(long)]
    pub growth: Option<usize>,
    /// Bottleneck factor (bc).
    #[arg(long)]
    pub bn_size: Option<usize>,
    /// Spatial size H = W (bc).
    #[arg(long)]
    pub size: Option<usize>,
    /// ReLU after each Linear (mlp).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub activation: OnOff,
    /// f32 or f64.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Deepest block considered.
    #[arg(long, default_value_t = 1024)]
    pub max_depth: usize,
    /// Answer from the model only, without measured confirmation runs.
    #[arg(long)]
    pub no_confirm: bool,
    /// Also write the table as CSV to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Compute threads of each measured run (0: all physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Time limit of each measured run in seconds.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
}

/// One variant's answer.
#[derive(Debug, Clone, Serialize)]
pub struct Answer {
    pub variant: String,
    pub family: String,
    pub budget_bytes: u64,
    /// Deepest block that fits (0: not even one layer).
    pub max_depth: usize,
    /// Model's footprint (baseline + predicted peak) at `max_depth`; empty for autograd.
    pub predicted_total_bytes: Option<u64>,
    /// Measured footprint at `max_depth`.
    pub measured_total_bytes: Option<u64>,
    /// Measured footprint one layer deeper (empty when it ran out of memory at the budget).
    pub measured_next_total_bytes: Option<u64>,
    /// `max_depth` over naive's (`cat-store-copy`).
    pub depth_ratio_to_naive: Option<f64>,
    /// `model`, `model+measured`, or `measured` (autograd).
    pub method: String,
    /// Where the model and the measurement disagreed, what was done.
    pub note: String,
}

/// Model footprint at `depth`, or `None` for variants without a model.
fn model_total(v: Variant, cfg: &Config, depth: usize) -> Option<u64> {
    let c = Config {
        depth,
        ..cfg.clone()
    };
    impls::memory::predict_peak_bytes(v, &c).map(|p| p + static_bytes(&c))
}

/// A measured run's verdict.
enum Probe {
    Fits(u64),
    TooBig(Option<u64>),
}

struct Searcher<'a> {
    settings: &'a Settings,
    budget: u64,
    runs: usize,
}

impl Searcher<'_> {
    fn measure(&mut self, v: Variant, cfg: &Config, depth: usize) -> Result<Probe> {
        let c = Config {
            depth,
            ..cfg.clone()
        };
        c.validate().map_err(|e| anyhow!("{e}"))?;
        self.runs += 1;
        eprintln!("densebench max-depth: measuring {v} at L={depth}");
        match child::spawn(&child::flags(v, &c, self.settings), self.settings)? {
            Outcome::Ok(stdout) => {
                let m = child::parse_measurement(&stdout)?;
                let total = static_bytes(&c) + m.peak_bytes;
                Ok(if total <= self.budget {
                    Probe::Fits(total)
                } else {
                    Probe::TooBig(Some(total))
                })
            }
            Outcome::Oom(_) => Ok(Probe::TooBig(None)),
            Outcome::Timeout(t) => bail!(
                "{v} at L={depth} did not finish in {} s (raise --timeout)",
                t.as_secs()
            ),
            Outcome::Error(e) => bail!("{v} at L={depth}: {e}"),
        }
    }

    /// Largest depth in [1, max] for which `fits` holds, assuming it is monotone; 0 if none.
    fn bisect(max: usize, mut fits: impl FnMut(usize) -> Result<bool>) -> Result<usize> {
        if !fits(1)? {
            return Ok(0);
        }
        // Doubling, then bisection between the last fit and the first miss.
        let (mut lo, mut hi) = (1, 2);
        while hi <= max && fits(hi)? {
            lo = hi;
            hi *= 2;
        }
        let mut hi = hi.min(max + 1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if fits(mid)? {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    fn answer(&mut self, v: Variant, cfg: &Config, max: usize, confirm: bool) -> Result<Answer> {
        let budget = self.budget;
        let mut ans = Answer {
            variant: v.name(),
            family: cfg.family.name().to_string(),
            budget_bytes: budget,
            max_depth: 0,
            predicted_total_bytes: None,
            measured_total_bytes: None,
            measured_next_total_bytes: None,
            depth_ratio_to_naive: None,
            method: String::new(),
            note: String::new(),
        };
        if model_total(v, cfg, 1).is_some() {
            let mut depth = Self::bisect(max, |l| {
                Ok(model_total(v, cfg, l).is_some_and(|t| t <= budget))
            })?;
            ans.method = "model".to_string();
            if confirm {
                ans.method = "model+measured".to_string();
                // Walk down while the answer does not fit, up while the next one does.
                let mut notes = Vec::new();
                loop {
                    if depth == 0 {
                        break;
                    }
                    match self.measure(v, cfg, depth)? {
                        Probe::Fits(t) => {
                            ans.measured_total_bytes = Some(t);
                            break;
                        }
                        Probe::TooBig(_) => {
                            notes.push(format!("model said L={depth} fits, measured it does not"));
                            depth -= 1;
                        }
                    }
                }
                while depth < max {
                    match self.measure(v, cfg, depth + 1)? {
                        Probe::TooBig(t) => {
                            ans.measured_next_total_bytes = t;
                            break;
                        }
                        Probe::Fits(t) => {
                            notes.push(format!(
                                "model said L={} does not fit, measured it does",
                                depth + 1
                            ));
                            depth += 1;
                            ans.measured_total_bytes = Some(t);
                        }
                    }
                }
                ans.note = notes.join("; ");
            }
            ans.max_depth = depth;
            ans.predicted_total_bytes = model_total(v, cfg, depth.max(1)).filter(|_| depth > 0);
        } else {
            ans.method = "measured".to_string();
            let mut seen: Vec<(usize, Probe)> = Vec::new();
            let depth = Self::bisect(max, |l| {
                let p = self.measure(v, cfg, l)?;
                let fits = matches!(p, Probe::Fits(_));
                seen.push((l, p));
                Ok(fits)
            })?;
            ans.max_depth = depth;
            for (l, p) in seen {
                match p {
                    Probe::Fits(t) if l == depth => ans.measured_total_bytes = Some(t),
                    Probe::TooBig(t) if l == depth + 1 => ans.measured_next_total_bytes = t,
                    _ => {}
                }
            }
            if confirm && depth > 0 && depth < max && ans.measured_total_bytes.is_none() {
                if let Probe::Fits(t) = self.measure(v, cfg, depth)? {
                    ans.measured_total_bytes = Some(t);
                }
            }
        }
        Ok(ans)
    }
}

fn block(a: &Args) -> Result<Config> {
    let family = Family::parse(&a.family).map_err(|e| anyhow!("--family: {e}"))?;
    let dtype = impls::config::parse_dtype(&a.dtype).map_err(|e| anyhow!("--dtype: {e}"))?;
    let base = match family {
        Family::Bc => Config::bc100_block(),
        Family::Mlp => Config {
            family: Family::Mlp,
            batch: 4096,
            channels: 256,
            growth: 64,
            depth: 1,
            bn_size: 1,
            size: 1,
            activation: true,
            dtype,
            seed: 0,
        },
    };
    let cfg = normalize(Config {
        batch: a.batch.unwrap_or(base.batch),
        channels: a.channels.unwrap_or(base.channels),
        growth: a.growth.unwrap_or(base.growth),
        bn_size: a.bn_size.unwrap_or(base.bn_size),
        size: a.size.unwrap_or(base.size),
        activation: a.activation.is_on(),
        dtype,
        depth: 1,
        ..base
    });
    cfg.validate().map_err(|e| anyhow!("{e}"))?;
    Ok(cfg)
}

fn mib(b: Option<u64>) -> String {
    b.map_or_else(
        || "-".to_string(),
        |b| format!("{:.1}", b as f64 / (1 << 20) as f64),
    )
}

/// `densebench max-depth`.
pub fn run(a: Args) -> Result<ExitCode> {
    let cfg = block(&a)?;
    anyhow::ensure!(a.max_depth >= 1, "--max-depth must be at least 1");
    anyhow::ensure!(a.budget > 0, "--budget must be positive");
    let variants: Vec<Variant> = if a.variants.is_empty() {
        Variant::for_config(&cfg)
    } else {
        a.variants
            .iter()
            .map(|n| {
                let v = Variant::parse(n).map_err(|e| anyhow!("--variants: {e}"))?;
                v.check(&cfg).map_err(|e| anyhow!("--variants: {e}"))?;
                Ok(v)
            })
            .collect::<Result<_>>()?
    };
    if let Some(out) = &a.out {
        if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
    }
    let settings = Settings {
        device: DeviceSpec::Cpu,
        threads: job::resolve_threads(a.threads),
        steps: 1,
        warmup: 1,
        mem_limit: Some(a.budget.saturating_add(overhead_margin(a.budget))),
        timeout: Duration::from_secs(a.timeout),
    };
    let mut s = Searcher {
        settings: &settings,
        budget: a.budget,
        runs: 0,
    };
    let mut answers = Vec::new();
    for v in &variants {
        answers.push(s.answer(*v, &cfg, a.max_depth, !a.no_confirm)?);
    }
    let naive = answers
        .iter()
        .find(|x| x.variant == Variant::NAIVE.name())
        .map(|x| x.max_depth);
    for x in &mut answers {
        x.depth_ratio_to_naive = naive
            .filter(|&n| n > 0)
            .map(|n| x.max_depth as f64 / n as f64);
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "max depth of {} within {:.1} MiB ({} measured runs)",
        crate::results::row::Row {
            family: cfg.family.name().to_string(),
            batch: cfg.batch,
            channels: cfg.channels,
            growth: cfg.growth,
            bn_size: cfg.bn_size,
            size: cfg.size,
            activation: cfg.activation,
            dtype: cfg.dtype.as_str().to_string(),
            ..Default::default()
        }
        .config_label(),
        a.budget as f64 / (1 << 20) as f64,
        s.runs
    )?;
    writeln!(
        out,
        "{:<26} {:>9} {:>8} {:>14} {:>14} {:>14}  method",
        "variant", "max depth", "×naive", "predicted MiB", "measured MiB", "L+1 MiB"
    )?;
    for x in &answers {
        writeln!(
            out,
            "{:<26} {:>9} {:>8} {:>14} {:>14} {:>14}  {}{}",
            x.variant,
            x.max_depth,
            x.depth_ratio_to_naive
                .map_or("-".to_string(), |r| format!("{r:.2}")),
            mib(x.predicted_total_bytes),
            mib(x.measured_total_bytes),
            if x.measured_next_total_bytes.is_none() && x.method != "model" {
                "oom".to_string()
            } else {
                mib(x.measured_next_total_bytes)
            },
            x.method,
            if x.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", x.note)
            }
        )?;
    }
    if let Some(path) = &a.out {
        let mut w =
            csv::Writer::from_path(path).with_context(|| format!("creating {}", path.display()))?;
        for x in &answers {
            w.serialize(x)
                .with_context(|| format!("writing {}", path.display()))?;
        }
        w.flush()
            .with_context(|| format!("writing {}", path.display()))?;
        writeln!(out, "wrote {}", path.display())?;
    }
    Ok(ExitCode::SUCCESS)
}
