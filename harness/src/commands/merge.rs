//! `densebench merge OUT.csv IN.csv…`: combines result CSVs (the shard files of a sweep, earlier
//! merges) into one, by row key (`variant/family/N/C0/k/L/bn/size/act/dtype/seed/device`).
//!
//! - Rows with the same key and identical cells (a row copied into two files) are kept once.
//! - Rows with the same key and different cells (two measurements of one configuration) are a
//!   conflict: nothing is written and the keys, files and differing columns are named, unless
//!   `--prefer newest` keeps the row with the latest `timestamp` (on a tie, the one whose CSV
//!   line sorts last, so the choice never depends on the order of the inputs).
//! - With `--sweep FILE` (or `--quick`, `--default-sweep`), keys of the sweep that no input holds are listed (per
//!   shard with `--shards N`: the array indices to resubmit) and the exit status is
//!   [`EXIT_INCOMPLETE`]; rows are written in the sweep's order, rows outside the sweep after
//!   them. Without a sweep, rows keep the order in which their keys first appear.
//! - Rows that failed (`error`, `killed`, `crashed`) are counted by status, with the shards
//!   holding them (`--shards N`) to rerun with `--resume --rerun-failed`. Their keys have rows,
//!   so they change no exit status (each shard's `bench-all` already exited 1 for them).
//! - OUT's writer lock is taken before any input is read, and OUT is written whole under a
//!   temporary name and renamed only if OUT is still what it was then (results/README.md). An
//!   existing OUT is refused unless
//!   it is one of the inputs (its rows take part, so `merge all.csv all.csv shard-*.csv` adds
//!   new shards to it) or `--force` is given. Merging the output again with the same inputs
//!   gives the same bytes (idempotent).

use crate::measure::child;
use crate::plan::device::DeviceSpec;
use crate::plan::sweep::sweep_keys;
use crate::results::conv_path;
use crate::results::merge::{merge_rows, Input, Prefer};
use crate::results::row;
use crate::results::store::{csv_bytes, refuse_input_as_output, same_file, Reserved};
use anyhow::{bail, Result};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::ExitCode;

/// Exit status when OUT was written but keys of the sweep are missing.
pub const EXIT_INCOMPLETE: u8 = 2;

/// `densebench merge` arguments.
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Exit status: 0 merged (and complete, when a sweep is given); 2 merged, \
                        but keys of the sweep are missing (listed); 1 nothing written: an input \
                        is unreadable, rows conflict, or OUT exists. Rows that failed (error, \
                        killed, crashed) are counted by status, with the shards to rerun with \
                        --resume --rerun-failed; their keys have rows, so they change no status."
)]
pub struct Args {
    /// The merged result CSV. Refused if it exists, unless it is also one of the inputs or
    /// --force is given.
    pub out: PathBuf,
    /// Result CSVs to merge (shard files, earlier merges).
    #[arg(required = true)]
    pub inputs: Vec<PathBuf>,
    /// The sweep file the inputs were run from: list its keys that no input holds, and write the
    /// rows in its order.
    #[arg(long, conflicts_with = "quick")]
    pub sweep: Option<PathBuf>,
    /// The built-in quick sweep (as `bench-all --quick`) is the sweep.
    #[arg(long, conflicts_with = "default_sweep")]
    pub quick: bool,
    /// The built-in default sweep (as plain `bench-all`) is the sweep.
    #[arg(long, conflicts_with = "sweep")]
    pub default_sweep: bool,
    /// With a sweep: the shard count it ran with, so missing keys are listed per shard (the
    /// Slurm array indices to resubmit).
    #[arg(long, value_name = "N")]
    pub shards: Option<usize>,
    /// With a sweep: the `--devices` list it ran with (rows are keyed by the first device).
    #[arg(long, value_delimiter = ',', value_name = "DEV,...")]
    pub devices: Vec<DeviceSpec>,
    /// Rows of one key with different values: keep the newest (by `timestamp`) instead of
    /// refusing.
    #[arg(long, value_enum)]
    pub prefer: Option<Prefer>,
    /// Overwrite OUT when it exists and is not one of the inputs.
    #[arg(long)]
    pub force: bool,
}

/// Says how many merged rows failed (`error`, `killed`, `crashed`), by status, and which shards
/// to rerun with `--resume --rerun-failed` (with a sweep and `--shards`); and how many have
/// gradients out of tolerance. Returns the number of failed rows. They change no exit status:
/// their keys have rows (what merge checks), and each shard's `bench-all` already exited 1.
fn report_failed_rows(
    rows: &[row::Row],
    keys: Option<&[(String, Option<usize>)]>,
    shards: Option<usize>,
) -> usize {
    let shard_of: HashMap<&str, usize> = keys
        .into_iter()
        .flatten()
        .filter_map(|(k, s)| Some((k.as_str(), (*s)?)))
        .collect();
    let mut by_status: BTreeMap<&str, usize> = BTreeMap::new();
    let mut in_shards: BTreeSet<usize> = BTreeSet::new();
    let mut unsharded = false;
    for r in rows
        .iter()
        .filter(|r| !child::RESULT_STATUSES.contains(&r.status.as_str()))
    {
        *by_status.entry(r.status.as_str()).or_default() += 1;
        match shard_of.get(r.key.as_str()) {
            Some(&s) => {
                in_shards.insert(s);
            }
            None => unsharded = true,
        }
    }
    let failed: usize = by_status.values().sum();
    if failed > 0 {
        let rerun = match shards {
            Some(n) if !in_shards.is_empty() && !unsharded => {
                let idx: Vec<String> = in_shards.iter().map(ToString::to_string).collect();
                format!(
                    "rerun shard(s) {} of {n} with --resume --rerun-failed (Slurm: export \
                     DENSEBENCH_BENCH_ARGS=--rerun-failed and resubmit array index {})",
                    idx.join(","),
                    idx.join(",")
                )
            }
            _ => "rerun their shards (or sweep) with --resume --rerun-failed".to_string(),
        };
        crate::say!(
            "densebench merge: {failed} rows failed ({}): their `status` and `error` columns say \
             why; {rerun}, then merge again",
            row::join_counts(&by_status)
        );
    }
    let out_of_tolerance = rows.iter().filter(|r| r.grad_ok == Some(false)).count();
    if out_of_tolerance > 0 {
        crate::say!(
            "densebench merge: note: {out_of_tolerance} rows have gradients out of tolerance \
             (`grad_ok` false; `densebench report` lists them)"
        );
    }
    failed
}

/// `densebench merge`.
pub fn run(a: Args) -> Result<ExitCode> {
    if a.shards == Some(0) {
        bail!("--shards must be at least 1");
    }
    let has_sweep = a.sweep.is_some() || a.quick || a.default_sweep;
    if (a.shards.is_some() || !a.devices.is_empty()) && !has_sweep {
        bail!(
            "--shards and --devices describe a sweep: give it with --sweep FILE, --quick or \
             --default-sweep"
        );
    }
    // The sweep is an input too: `--force` would replace it with the merged rows.
    if let Some(sweep) = &a.sweep {
        refuse_input_as_output(&a.out, "OUT", &[sweep])?;
    }
    // OUT's lock before any input is read: a second merge (or report) on OUT fails at once, and
    // OUT is replaced only if it is still what it is now.
    let out = Reserved::new(&a.out)?;
    let out_is_input = a.inputs.iter().any(|i| same_file(i, &a.out));
    if a.out.exists() && !out_is_input && !a.force {
        bail!(
            "output file {} already exists and is not one of the inputs: pass --force to \
             overwrite it, or list it as an input to merge into it",
            a.out.display()
        );
    }
    let expected = if has_sweep {
        Some(sweep_keys(
            a.sweep.as_deref(),
            a.quick,
            &a.devices,
            a.shards,
        )?)
    } else {
        None
    };
    let mut inputs = Vec::new();
    for p in &a.inputs {
        let rows = row::read_rows(p).map_err(|e| {
            // the hint only where it helps: a row cut short, as a killed shard leaves it
            let hint = if crate::plan::bounds::carries::<row::TornRow>(&e) {
                " (a shard killed in the middle of a write is repaired by running it again with \
                 --resume)"
            } else {
                ""
            };
            e.context(format!("merging {}{hint}", p.display()))
        })?;
        inputs.push(Input {
            name: p.display().to_string(),
            rows,
        });
    }
    let read: usize = inputs.iter().map(|i| i.rows.len()).sum();
    let mut merged = merge_rows(&inputs, a.prefer)?;
    let mix = conv_path::mixed(&merged.rows);
    if !mix.is_empty() {
        bail!(
            "the merged rows would hold GPU rows of {} 3×3 convolutions ({}): a row's key does \
             not name its convolution (DENSEBENCH_CONV), so compare, report and plots could not \
             tell them apart. Merge each convolution's rows into a file of its own; nothing was \
             written",
            mix.len(),
            mix.iter()
                .map(|(which, n, key)| format!("{which}: {n} rows, the first {key}"))
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    let mut missing: Vec<(String, Option<usize>)> = Vec::new();
    let mut outside = 0;
    if let Some((_, keys)) = &expected {
        let rank: HashMap<&str, usize> = keys
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.as_str(), i))
            .collect();
        // Sweep order; rows outside the sweep after it, in first-appearance order (stable sort).
        merged
            .rows
            .sort_by_key(|r| rank.get(r.key.as_str()).copied().unwrap_or(usize::MAX));
        let have: std::collections::HashSet<&str> =
            merged.rows.iter().map(|r| r.key.as_str()).collect();
        outside = merged
            .rows
            .iter()
            .filter(|r| !rank.contains_key(r.key.as_str()))
            .count();
        missing = keys
            .iter()
            .filter(|(k, _)| !have.contains(k.as_str()))
            .cloned()
            .collect();
    }
    out.write_bytes(&csv_bytes(&merged.rows)?)?;
    crate::say!(
        "densebench merge: {} inputs, {read} rows → {} rows in {} ({} identical duplicates \
         dropped{})",
        inputs.len(),
        merged.rows.len(),
        a.out.display(),
        merged.identical_duplicates,
        if merged.resolved.is_empty() {
            String::new()
        } else {
            format!(
                ", {} keys with differing rows resolved to the newest",
                merged.resolved.len()
            )
        }
    );
    if !merged.tied.is_empty() {
        crate::say!(
            "densebench merge: warning: {} of them had two differing rows with the same newest \
             timestamp; kept the row whose CSV line sorts last (a rule, not the newer \
             measurement): {}",
            merged.tied.len(),
            merged.tied.join(", ")
        );
    }
    let failed = report_failed_rows(
        &merged.rows,
        expected.as_ref().map(|(_, k)| k.as_slice()),
        a.shards,
    );
    let Some((source, keys)) = expected else {
        return Ok(ExitCode::SUCCESS);
    };
    if outside > 0 {
        crate::say!("densebench merge: note: {outside} rows are not keys of {source}");
    }
    if missing.is_empty() {
        crate::say!(
            "densebench merge: complete: all {} keys of {source}{}",
            keys.len(),
            if failed > 0 {
                format!(" have a row ({failed} of them failed rows, above)")
            } else {
                String::new()
            }
        );
        return Ok(ExitCode::SUCCESS);
    }
    crate::say!(
        "densebench merge: INCOMPLETE: {} of the {} keys of {source} are missing:",
        missing.len(),
        keys.len()
    );
    let mut per_shard: BTreeMap<Option<usize>, Vec<String>> = BTreeMap::new();
    for (k, s) in missing {
        per_shard.entry(s).or_default().push(k);
    }
    for (s, ks) in &per_shard {
        if let (Some(s), Some(n)) = (s, a.shards) {
            crate::say!("  shard {s}/{n} ({} missing):", ks.len());
        }
        for k in ks {
            crate::say!("    {k}");
        }
    }
    if let Some(n) = a.shards {
        let idx: Vec<String> = per_shard.keys().flatten().map(|s| s.to_string()).collect();
        crate::say!(
            "densebench merge: rerun shard(s) {} of {n} with --resume (Slurm: resubmit array \
             index {}), then merge again",
            idx.join(","),
            idx.join(",")
        );
    }
    Ok(ExitCode::from(EXIT_INCOMPLETE))
}
