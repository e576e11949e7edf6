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
//! - OUT is written whole under a temporary name and renamed. An existing OUT is refused unless
//!   it is one of the inputs (its rows take part, so `merge all.csv all.csv shard-*.csv` adds
//!   new shards to it) or `--force` is given. Merging the output again with the same inputs
//!   gives the same bytes (idempotent).

use crate::device::DeviceSpec;
use crate::row::{self, Row};
use crate::shard;
use crate::sweep::{self, csv_line};
use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status when OUT was written but keys of the sweep are missing.
pub const EXIT_INCOMPLETE: u8 = 2;

/// How many conflicting keys an error message lists in full.
const CONFLICTS_SHOWN: usize = 10;

/// Which row wins when two rows of one key differ.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    /// The row with the latest `timestamp`.
    Newest,
}

/// `densebench merge` arguments.
#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Exit status: 0 merged (and complete, when a sweep is given); 2 merged, \
                        but keys of the sweep are missing (listed); 1 nothing written: an input \
                        is unreadable, rows conflict, or OUT exists."
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

/// The rows of one input file.
pub struct Input {
    /// The file, for messages.
    pub name: String,
    pub rows: Vec<Row>,
}

/// The result of [`merge_rows`].
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// One row per key, in order of first appearance.
    pub rows: Vec<Row>,
    /// Rows dropped because an identical row of the same key was kept.
    pub identical_duplicates: usize,
    /// Keys whose rows differed and were resolved by `--prefer newest`.
    pub resolved: Vec<String>,
}

/// A candidate row of one key and where it came from.
struct Candidate {
    row: Row,
    line: Vec<u8>,
    source: String,
}

/// The columns in which two rows differ.
fn differing_columns(a: &Row, b: &Row) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return vec!["?".to_string()];
    };
    row::Row::columns()
        .into_iter()
        .filter(|c| a.get(c) != b.get(c))
        .collect()
}

fn timestamp(c: &Candidate) -> Result<chrono::DateTime<chrono::FixedOffset>> {
    chrono::DateTime::parse_from_rfc3339(&c.row.timestamp).with_context(|| {
        format!(
            "{}: row {}: timestamp `{}` is not RFC 3339",
            c.source, c.row.key, c.row.timestamp
        )
    })
}

/// Merges the inputs' rows by key (see the module docs). Errs on conflicting rows without
/// `prefer`, naming the keys, files and differing columns.
pub fn merge_rows(inputs: &[Input], prefer: Option<Prefer>) -> Result<Merged> {
    let mut order: Vec<String> = Vec::new();
    let mut by_key: HashMap<String, Vec<Candidate>> = HashMap::new();
    let mut identical_duplicates = 0;
    for input in inputs {
        for row in &input.rows {
            let line = csv_line(row).with_context(|| format!("{}: {}", input.name, row.key))?;
            let cands = by_key.entry(row.key.clone()).or_insert_with(|| {
                order.push(row.key.clone());
                Vec::new()
            });
            if cands.iter().any(|c| c.line == line) {
                identical_duplicates += 1;
                continue;
            }
            cands.push(Candidate {
                row: row.clone(),
                line,
                source: input.name.clone(),
            });
        }
    }
    let conflicts: Vec<&String> = order.iter().filter(|k| by_key[*k].len() > 1).collect();
    if !conflicts.is_empty() && prefer.is_none() {
        let mut msg = format!(
            "{} keys have rows with different values (two measurements of one configuration); \
             nothing written. Pass --prefer newest to keep the newest row of each, or remove \
             the stale file.",
            conflicts.len()
        );
        for k in conflicts.iter().take(CONFLICTS_SHOWN) {
            let cands = &by_key[*k];
            let files: Vec<String> = cands
                .iter()
                .map(|c| format!("{} ({})", c.source, c.row.timestamp))
                .collect();
            msg.push_str(&format!(
                "\n  {k}: in {}; columns differing: {}",
                files.join(", "),
                differing_columns(&cands[0].row, &cands[1].row).join(", ")
            ));
        }
        if conflicts.len() > CONFLICTS_SHOWN {
            msg.push_str(&format!(
                "\n  … and {} more",
                conflicts.len() - CONFLICTS_SHOWN
            ));
        }
        bail!(msg);
    }
    let mut rows = Vec::with_capacity(order.len());
    let mut resolved = Vec::new();
    for k in &order {
        let cands = by_key
            .remove(k)
            .ok_or_else(|| anyhow!("internal: key {k} lost while merging"))?;
        if cands.len() > 1 {
            resolved.push(k.clone());
        }
        let mut best: Option<(chrono::DateTime<chrono::FixedOffset>, Candidate)> = None;
        for c in cands {
            let t = timestamp(&c)?;
            let better = match &best {
                None => true,
                Some((bt, b)) => (t, &c.line) > (*bt, &b.line),
            };
            if better {
                best = Some((t, c));
            }
        }
        if let Some((_, c)) = best {
            rows.push(c.row);
        }
    }
    Ok(Merged {
        rows,
        identical_duplicates,
        resolved,
    })
}

/// Writes `rows` as a result CSV to `path`, under a temporary name renamed into place.
pub fn write_rows(path: &Path, rows: &[Row]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(Row::columns())
        .context("writing the header")?;
    let mut bytes = w
        .into_inner()
        .map_err(|e| anyhow!("writing the header: {e}"))?;
    for r in rows {
        bytes.extend(csv_line(r)?);
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating the output directory {}", parent.display()))?;
    }
    let name = path
        .file_name()
        .with_context(|| format!("output {} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .with_context(|| format!("writing {}", tmp.display()));
    if let Err(e) = written.and_then(|()| {
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    }) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Whether two paths name the same file (both must exist to compare canonical paths).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// A sweep's name and its keys in order, each with its shard (1-based) when a count was given.
pub type SweepKeys = (String, Vec<(String, Option<usize>)>);

/// The keys of a sweep in its order, and, with `shards`, each key's shard (1-based).
pub fn sweep_keys(
    sweep_file: Option<&Path>,
    quick: bool,
    devices: &[DeviceSpec],
    shards: Option<usize>,
) -> Result<SweepKeys> {
    let (text, source) = sweep::load_sweep(sweep_file, quick)?;
    let mut jobs = sweep::parse(&text, &source, None)?;
    if let Some(&first) = devices.first() {
        jobs = sweep::retarget(jobs, first);
    }
    let mut shard_of: HashMap<usize, usize> = HashMap::new();
    if let Some(n) = shards {
        for (i, part) in shard::partition(&jobs, n).iter().enumerate() {
            for &j in &part.jobs {
                shard_of.insert(j, i + 1);
            }
        }
    }
    let keys = jobs
        .into_iter()
        .enumerate()
        .map(|(i, j)| (j.key, shard_of.get(&i).copied()))
        .collect();
    Ok((source, keys))
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
        let rows = row::read_rows(p).with_context(|| {
            format!(
                "merging {} (a shard killed in the middle of a write is repaired by running it \
                 again with --resume)",
                p.display()
            )
        })?;
        inputs.push(Input {
            name: p.display().to_string(),
            rows,
        });
    }
    let read: usize = inputs.iter().map(|i| i.rows.len()).sum();
    let mut merged = merge_rows(&inputs, a.prefer)?;
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
    write_rows(&a.out, &merged.rows)?;
    eprintln!(
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
    let Some((source, keys)) = expected else {
        return Ok(ExitCode::SUCCESS);
    };
    if outside > 0 {
        eprintln!("densebench merge: note: {outside} rows are not keys of {source}");
    }
    if missing.is_empty() {
        eprintln!(
            "densebench merge: complete: all {} keys of {source}",
            keys.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!(
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
            eprintln!("  shard {s}/{n} ({} missing):", ks.len());
        }
        for k in ks {
            eprintln!("    {k}");
        }
    }
    if let Some(n) = a.shards {
        let idx: Vec<String> = per_shard.keys().flatten().map(|s| s.to_string()).collect();
        eprintln!(
            "densebench merge: rerun shard(s) {} of {n} with --resume (Slurm: resubmit array \
             index {}), then merge again",
            idx.join(","),
            idx.join(",")
        );
    }
    Ok(ExitCode::from(EXIT_INCOMPLETE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, ts: &str, median: u64) -> Row {
        Row {
            key: key.to_string(),
            timestamp: ts.to_string(),
            status: "ok".to_string(),
            median_ns: Some(median),
            ..Row::default()
        }
    }

    fn input(name: &str, rows: Vec<Row>) -> Input {
        Input {
            name: name.to_string(),
            rows,
        }
    }

    #[test]
    fn newest_wins_whatever_the_input_order() {
        let old = row("a", "2024-01-01T00:00:00Z", 1);
        let new = row("a", "2024-01-02T00:00:00Z", 2);
        for inputs in [
            vec![input("x", vec![old.clone()]), input("y", vec![new.clone()])],
            vec![input("y", vec![new.clone()]), input("x", vec![old.clone()])],
        ] {
            let m = merge_rows(&inputs, Some(Prefer::Newest)).map_err(|e| e.to_string());
            assert_eq!(m.map(|m| m.rows), Ok(vec![new.clone()]));
        }
    }

    #[test]
    fn conflicts_name_key_files_and_columns() {
        let inputs = [
            input("s1.csv", vec![row("a", "2024-01-01T00:00:00Z", 1)]),
            input("s2.csv", vec![row("a", "2024-01-01T00:00:00Z", 2)]),
        ];
        let e = merge_rows(&inputs, None).err().map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(
            e.contains("s1.csv") && e.contains("s2.csv") && e.contains("median_ns"),
            "{e}"
        );
    }
}
