//! `densebench plan`: what a sweep will run and how `--shard I/N` splits it, before anything is
//! submitted: every configuration's jobs with their keys and predicted cost, grouped per shard,
//! with each shard's total (its references included) against the mean.
//!
//! Costs are FLOP-equivalents from [`crate::plan::shard::job_cost`] (the FLOP model × steps × a
//! variant factor), printed in GFLOP-eq: relative numbers for balancing, not seconds.

use crate::measure::device::{check_devices, DeviceSpec};
use crate::plan::bounds::{self, ResultExt};
use crate::plan::shard;
use crate::plan::sweep;
use anyhow::Result;
use clap::ValueEnum;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// FLOP-equivalents per printed unit (GFLOP-eq).
const UNIT: f64 = 1e9;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Per shard: a summary line, then each configuration and its jobs (cost, key).
    Text,
    /// One line per job, tab-separated: `shard`, `key`, `cost_gflop_eq` (with a header).
    Tsv,
}

/// `densebench plan` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Sweep file (default: the built-in harness/sweeps/default.toml).
    #[arg(long, conflicts_with = "quick")]
    pub sweep: Option<PathBuf>,
    /// The built-in quick sweep.
    #[arg(long)]
    pub quick: bool,
    /// Number of shards (as `bench-all --shard I/N`): 1 to 10000, and at most the sweep's jobs.
    #[arg(
        long,
        default_value_t = 1,
        value_name = "N",
        value_parser = bounds::flags::shards,
        // `--shards -1` reaches the parser, which says what a shard count is (not "unexpected
        // argument '-1'")
        allow_negative_numbers = true
    )]
    pub shards: usize,
    /// The `--devices` list of `bench-all` (rows are keyed by the first device).
    #[arg(long, value_delimiter = ',', value_name = "DEV,...")]
    pub devices: Vec<DeviceSpec>,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// The `--peer` of `bench-all`: the peer's jobs are listed with the others.
    #[arg(long, value_enum, value_name = "PEER")]
    pub peer: Option<crate::plan::job::Peer>,
    /// The `--math` of `bench-all` (`tf32` keys end in `/tf32`).
    #[arg(long, value_enum, value_name = "MATH")]
    pub math: Option<crate::plan::job::Math>,
}

/// The plan as text (see [`Format`]). Every error is the user's input (exit status 2).
pub fn render(a: &Args) -> Result<String> {
    bounds::check_shards("--shards", a.shards).bad_input()?;
    check_devices(&a.devices).bad_input()?;
    let (text, source) = sweep::load_sweep(a.sweep.as_deref(), a.quick).bad_input()?;
    let over = sweep::Overrides {
        mem_limit: None,
        peer: a.peer,
        math: a.math,
        device: a.devices.first().copied(),
    };
    let mut jobs = sweep::parse_with(&text, &source, over).bad_input()?;
    if let Some(&first) = a.devices.first() {
        jobs = sweep::retarget(jobs, first);
    }
    bounds::check_shards_for("--shards", a.shards, jobs.len(), &source).bad_input()?;
    let parts = shard::partition(&jobs, a.shards);
    let groups = shard::groups(&jobs);
    let total: f64 = parts.iter().map(|p| p.cost).sum();
    let mean = total / a.shards as f64;
    let mut s = String::new();
    match a.format {
        Format::Tsv => {
            s.push_str("shard\tkey\tcost_gflop_eq\n");
            for (i, p) in parts.iter().enumerate() {
                for &j in &p.jobs {
                    s.push_str(&format!(
                        "{}\t{}\t{:.6}\n",
                        i + 1,
                        jobs[j].key,
                        jobs[j].cost / UNIT
                    ));
                }
            }
        }
        Format::Text => {
            let unsplit: f64 = groups.iter().map(|g| g.cost).sum();
            s.push_str(&format!(
                "{source}: {} jobs in {} configurations, predicted cost {:.3} GFLOP-eq\n\
                 {} shard(s): {:.3} GFLOP-eq in all (a configuration split over shards pays \
                 its reference in each), mean {:.3}\n",
                jobs.len(),
                groups.len(),
                unsplit / UNIT,
                a.shards,
                total / UNIT,
                mean / UNIT
            ));
            for (i, p) in parts.iter().enumerate() {
                s.push_str(&format!(
                    "\nshard {}/{}: {} jobs, {} configurations, {:.3} GFLOP-eq ({:.0}% of the \
                     mean)\n",
                    i + 1,
                    a.shards,
                    p.jobs.len(),
                    p.configs.len(),
                    p.cost / UNIT,
                    if mean > 0.0 {
                        100.0 * p.cost / mean
                    } else {
                        0.0
                    }
                ));
                for &gi in &p.configs {
                    let g = &groups[gi];
                    let mine: Vec<usize> = g
                        .jobs
                        .iter()
                        .copied()
                        .filter(|j| p.jobs.contains(j))
                        .collect();
                    s.push_str(&format!(
                        "  {}  ({:.3} GFLOP-eq with its reference {:.3}{})\n",
                        g.config_key,
                        g.cost / UNIT,
                        g.reference / UNIT,
                        if mine.len() < g.jobs.len() {
                            format!("; split: {} of its {} jobs here", mine.len(), g.jobs.len())
                        } else {
                            String::new()
                        }
                    ));
                    for &j in &mine {
                        s.push_str(&format!(
                            "    {:>12.3}  {}\n",
                            jobs[j].cost / UNIT,
                            jobs[j].key
                        ));
                    }
                }
            }
        }
    }
    Ok(s)
}

/// `densebench plan`.
pub fn run(a: Args) -> Result<ExitCode> {
    let text = render(&a)?;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`plan | head`) is not an error worth a message.
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    Ok(ExitCode::SUCCESS)
}
