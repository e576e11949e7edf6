//! Capacity: how deep a block fits in a memory budget, per variant — the analytic model's
//! answer confirmed by measured runs at the answer (must fit) and one layer deeper (must not);
//! `autograd`, which has no model, by measured runs alone (doubling, then bisection). The
//! library side of `densebench max-depth`.
//!
//! "Fits" means the block's memory stays within the budget: its static tensors (parameters and
//! BN buffers, input, upstream gradient) plus the measured peak of one training step above
//! them. Each measured run is an isolated child whose allocator limit is the budget plus
//! [`crate::measure::estimates::overhead_margin`], so a run far beyond the budget fails fast.

use crate::measure::child::{self, Outcome};
use crate::measure::estimates::static_bytes;
use crate::plan::device::DeviceSpec;
use crate::plan::job::Settings;
use anyhow::{anyhow, bail, Result};
use impls::{Config, Variant};
use serde::{Deserialize, Serialize};

/// The start of an answer's `note` when its depth is the search's bound (a lower bound):
/// `max-depth` writes it, `report` reads it.
pub const BOUND_NOTE: &str = "search bound reached";

/// The columns [`Answer`] gained after its first CSVs, in order, each appended last (so a reader
/// of the columns before them by position reads them as before): `dtype` with bf16, `block`
/// with the report's pairing of answers by block (`results::replace::is_max_depth_header`).
pub const ADDED_COLUMNS: [&str; 2] = ["dtype", "block"];

/// One variant's answer: a row of `max-depth --out`'s CSV (and what `report --max-depth` reads).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
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
    /// Where the model and the measurement disagreed, what was done; that the search reached
    /// its bound (`max-depth` adds it).
    pub note: String,
    /// `f32`, `f64` or `bf16` (mixed precision): the block's dtype. The last column, added with
    /// bf16, so that a reader of the columns before it by position reads them as before (empty
    /// in a CSV written before it existed).
    #[serde(default)]
    pub dtype: String,
    /// The block apart from its dtype and depth, and where it was answered ([`block_label`]):
    /// `bc N=64 C0=24 k=12 bn=4 32x32 on cpu (2 threads)`. After `dtype`, for the same reason
    /// (empty in a CSV written before it): `report --max-depth` sets an f32 answer beside a bf16
    /// one only when they are of one block.
    #[serde(default)]
    pub block: String,
    /// `max_depth` is the search's bound (`--max-depth`): the block fits at least that deep, how
    /// much deeper is unknown. Not a column: `max-depth` says it in `note`.
    #[serde(skip)]
    pub bound_reached: bool,
}

/// The [`Answer::block`] of `cfg` answered with `s`: its configuration without dtype and depth,
/// the device, and on the CPU the thread count (the model's per-thread scratch depends on it).
pub fn block_label(cfg: &Config, s: &Settings) -> String {
    let shape = match cfg.family {
        impls::Family::Bc => format!(
            "bc N={} C0={} k={} bn={} {}",
            cfg.batch,
            cfg.channels,
            cfg.growth,
            cfg.bn_size,
            cfg.size.label()
        ),
        impls::Family::Mlp => format!(
            "mlp N={} C0={} k={} relu={}",
            cfg.batch,
            cfg.channels,
            cfg.growth,
            if cfg.activation { "on" } else { "off" }
        ),
    };
    match s.device {
        DeviceSpec::Cpu => format!("{shape} on cpu ({} threads)", s.threads),
        d => format!("{shape} on {d}"),
    }
}

/// Model footprint at `depth` on the device and thread count of `s` (a GPU's tap-stack path has
/// other transients than the CPU's kernels, see `estimates::predicted_peak_bytes`), or `None`
/// for variants without a model.
fn model_total(v: Variant, cfg: &Config, depth: usize, s: &Settings) -> Option<u64> {
    let c = Config {
        depth,
        ..cfg.clone()
    };
    crate::measure::estimates::predicted_peak_bytes(v, &c, s.device == DeviceSpec::Cpu, s.threads)
        .map(|p| p + static_bytes(&c))
}

/// Whether `v` has a memory model (every variant but `autograd`), i.e. whether it can be
/// answered without measured runs.
pub fn has_model(v: Variant, cfg: &Config, s: &Settings) -> bool {
    model_total(v, cfg, 1, s).is_some()
}

/// A measured run's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Within the budget: the measured total (static tensors + peak).
    Fits(u64),
    /// Beyond it: the measured total, or none when the run ran out of memory at the limit.
    TooBig(Option<u64>),
}

/// The model's answer checked by measured runs ([`confirm_model_depth`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confirmed {
    /// Deepest depth measured to fit (0: not even one layer).
    pub depth: usize,
    /// Measured total at `depth`.
    pub measured_total_bytes: Option<u64>,
    /// Measured total one layer deeper (none when it ran out of memory, or was not run).
    pub measured_next_total_bytes: Option<u64>,
    /// Where the measurements moved the model's answer, one note per depth measured.
    pub notes: Vec<String>,
}

/// Checks the model's answer `depth` by measured runs: walks down while a run does not fit, then
/// up while the next one does (up to `max`). Each depth is measured once: a run near the budget
/// can land on either side of it from one process to the next, and a depth found too big on the
/// way down is the answer's "one deeper", not measured again (which could contradict it).
pub fn confirm_model_depth(
    mut depth: usize,
    max: usize,
    mut measure: impl FnMut(usize) -> Result<Probe>,
) -> Result<Confirmed> {
    let mut c = Confirmed::default();
    let mut next_known = false;
    while depth > 0 {
        match measure(depth)? {
            Probe::Fits(t) => {
                c.measured_total_bytes = Some(t);
                break;
            }
            Probe::TooBig(t) => {
                c.notes
                    .push(format!("model said L={depth} fits, measured it does not"));
                c.measured_next_total_bytes = t;
                next_known = true;
                depth -= 1;
            }
        }
    }
    while !next_known && depth < max {
        match measure(depth + 1)? {
            Probe::TooBig(t) => {
                c.measured_next_total_bytes = t;
                break;
            }
            Probe::Fits(t) => {
                c.notes.push(format!(
                    "model said L={} does not fit, measured it does",
                    depth + 1
                ));
                depth += 1;
                c.measured_total_bytes = Some(t);
            }
        }
    }
    c.depth = depth;
    Ok(c)
}

/// Searches the deepest block that fits a budget, counting the measured runs it made.
pub struct Searcher<'a> {
    settings: &'a Settings,
    budget: u64,
    pub runs: usize,
}

impl<'a> Searcher<'a> {
    /// A searcher whose runs use `settings` (its memory limit the budget plus a margin).
    pub fn new(settings: &'a Settings, budget: u64) -> Self {
        Searcher {
            settings,
            budget,
            runs: 0,
        }
    }

    fn measure(&mut self, v: Variant, cfg: &Config, depth: usize) -> Result<Probe> {
        let c = Config {
            depth,
            ..cfg.clone()
        };
        c.validate().map_err(|e| anyhow!("{e}"))?;
        self.runs += 1;
        crate::say!("densebench max-depth: measuring {v} at L={depth}");
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
            Outcome::Killed(e) | Outcome::Crashed(e) | Outcome::Error(e) => {
                bail!("{v} at L={depth}: {e}")
            }
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

    pub fn answer(
        &mut self,
        v: Variant,
        cfg: &Config,
        max: usize,
        confirm: bool,
    ) -> Result<Answer> {
        let (budget, s) = (self.budget, self.settings);
        let mut ans = Answer {
            variant: v.name(),
            family: cfg.family.name().to_string(),
            dtype: cfg.dtype.as_str().to_string(),
            block: block_label(cfg, s),
            budget_bytes: budget,
            max_depth: 0,
            predicted_total_bytes: None,
            measured_total_bytes: None,
            measured_next_total_bytes: None,
            depth_ratio_to_naive: None,
            method: String::new(),
            note: String::new(),
            bound_reached: false,
        };
        if model_total(v, cfg, 1, s).is_some() {
            let mut depth = Self::bisect(max, |l| {
                Ok(model_total(v, cfg, l, s).is_some_and(|t| t <= budget))
            })?;
            ans.method = "model".to_string();
            if confirm {
                ans.method = "model+measured".to_string();
                let c = confirm_model_depth(depth, max, |l| self.measure(v, cfg, l))?;
                depth = c.depth;
                ans.measured_total_bytes = c.measured_total_bytes;
                ans.measured_next_total_bytes = c.measured_next_total_bytes;
                ans.note = c.notes.join("; ");
            }
            ans.max_depth = depth;
            ans.predicted_total_bytes = model_total(v, cfg, depth.max(1), s).filter(|_| depth > 0);
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
        // The search looks no deeper than `max`: an answer there is a lower bound.
        ans.bound_reached = ans.max_depth == max;
        Ok(ans)
    }
}
