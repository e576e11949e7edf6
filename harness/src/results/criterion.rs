//! Criterion's estimates as rows: reads the estimates criterion left under `target/criterion`
//! (`<group>/<function>/<param>/new/estimates.json`, per-iteration nanoseconds) and writes them
//! as one flat companion CSV, one row per benchmark, so the report can cite `cargo bench`.
//!
//! Also the naming convention the benches use for their groups ([`group_name`]): a family and
//! every config field but depth (`bc-N16-C24-k12-bn4-8x8`), depth being the benchmark parameter.
//! The import splits a group name back into `family` and `config` at its first `-`.
//!
//! The JSON structs are tolerant: unknown fields are ignored and only `median.point_estimate`
//! is required, so a criterion upgrade that adds fields still imports. The CSV schema is in
//! results/README.md ("criterion.csv").

use crate::plan::input::{self, MAX_JSON_BYTES};
use crate::results::store::write_bytes_atomic;
use anyhow::{bail, Context, Result};
use impls::{Config, Family, Variant};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Criterion's folder for the latest run of a benchmark (`base/` and `change/` are comparisons).
const LATEST_RUN_DIR: &str = "new";
const ESTIMATES_FILE: &str = "estimates.json";
const SAMPLE_FILE: &str = "sample.json";
const BENCHMARK_FILE: &str = "benchmark.json";

/// The criterion group of a config's benchmarks: family and every size field but depth, e.g.
/// `mlp-N4096-C256-k64` or `bc-N64-C24-k12-bn4-32x32` (H×W, `-360x480` when not square);
/// `-norelu` for an mlp without activation, `-f64` for f64, `-seedS` for a seed other than 0.
pub fn group_name(cfg: &Config) -> String {
    let mut s = format!(
        "{}-N{}-C{}-k{}",
        cfg.family, cfg.batch, cfg.channels, cfg.growth
    );
    match cfg.family {
        Family::Mlp if !cfg.activation => s.push_str("-norelu"),
        Family::Mlp => {}
        Family::Bc => s.push_str(&format!("-bn{}-{}", cfg.bn_size, cfg.size.label())),
    }
    if cfg.dtype != candle_core::DType::F32 {
        s.push('-');
        s.push_str(cfg.dtype.as_str());
    }
    if cfg.seed != 0 {
        s.push_str(&format!("-seed{}", cfg.seed));
    }
    s
}

/// One criterion statistic: point estimate and (optional) confidence interval, in ns.
#[derive(Debug, Clone, Deserialize)]
pub struct Estimate {
    pub point_estimate: f64,
    #[serde(default)]
    pub confidence_interval: Option<ConfidenceInterval>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ConfidenceInterval {
    #[serde(default)]
    pub lower_bound: Option<f64>,
    #[serde(default)]
    pub upper_bound: Option<f64>,
}

/// `estimates.json`, the fields densebench uses (criterion also writes `median_abs_dev` and
/// `slope`, ignored here).
#[derive(Debug, Clone, Deserialize)]
pub struct Estimates {
    pub median: Estimate,
    #[serde(default)]
    pub mean: Option<Estimate>,
    #[serde(default)]
    pub std_dev: Option<Estimate>,
}

/// `sample.json`: iterations and total time of each sample.
#[derive(Debug, Clone, Deserialize)]
struct Sample {
    #[serde(default)]
    iters: Vec<f64>,
    #[serde(default)]
    times: Vec<f64>,
}

/// `benchmark.json`: the ids as given to criterion, before it made them safe as folder names.
#[derive(Debug, Clone, Deserialize)]
struct BenchmarkJson {
    #[serde(default)]
    group_id: Option<String>,
    #[serde(default)]
    function_id: Option<String>,
    #[serde(default)]
    value_str: Option<String>,
}

/// One row of `criterion.csv` (columns documented in results/README.md).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CriterionRow {
    pub group: String,
    pub family: String,
    pub config: String,
    pub variant: String,
    pub depth: Option<usize>,
    pub param: String,
    pub median_ns: f64,
    pub median_lo_ns: Option<f64>,
    pub median_hi_ns: Option<f64>,
    pub mean_ns: Option<f64>,
    pub mean_lo_ns: Option<f64>,
    pub mean_hi_ns: Option<f64>,
    pub std_dev_ns: Option<f64>,
    pub samples: Option<usize>,
    pub iterations: Option<u64>,
    /// When criterion wrote `estimates.json` (its modification time), RFC 3339 UTC: tells
    /// benchmarks of an older `cargo bench` (still in the folder) from the latest ones.
    pub measured_at: String,
    pub estimates_file: String,
}

/// Whether a file is a companion CSV [`write_csv`] wrote, from its first bytes: its header
/// starts with `group` and has `estimates_file` (`results::replace::Kind`'s signature; the
/// length is unused).
pub fn is_criterion_csv(start: &[u8], _len: u64) -> bool {
    crate::results::replace::csv_header(start).is_some_and(|h| {
        h.first().is_some_and(|c| c == "group") && h.iter().any(|c| c == "estimates_file")
    })
}

/// Where criterion writes by default: `$CARGO_TARGET_DIR/criterion`, else `target/criterion`.
pub fn default_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("criterion")
}

/// Every benchmark under `dir` (each `…/new/estimates.json`), sorted by group, variant (in the
/// stable variant order when the function id is a variant name) and depth.
pub fn import(dir: &Path) -> Result<Vec<CriterionRow>> {
    if !dir.is_dir() {
        bail!(
            "criterion folder {} does not exist or is not a folder: run `cargo bench -p \
             densebench` first, or pass --dir",
            dir.display()
        );
    }
    let mut found = Vec::new();
    find_estimates(dir, &mut found)?;
    if found.is_empty() {
        bail!(
            "no benchmark results under {}: expected <group>/<function>/<param>/{LATEST_RUN_DIR}/\
             {ESTIMATES_FILE} (run `cargo bench -p densebench` first)",
            dir.display()
        );
    }
    let mut rows = found
        .iter()
        .map(|run_dir| read_benchmark(dir, run_dir))
        .collect::<Result<Vec<_>>>()?;
    let order = |r: &CriterionRow| {
        Variant::parse(&r.variant)
            .ok()
            .and_then(|v| Variant::all().iter().position(|x| *x == v))
            .unwrap_or(usize::MAX)
    };
    rows.sort_by(|a, b| {
        (&a.group, order(a), &a.variant, a.depth, &a.param).cmp(&(
            &b.group,
            order(b),
            &b.variant,
            b.depth,
            &b.param,
        ))
    });
    Ok(rows)
}

/// Collects every `new` folder holding an `estimates.json`, depth first, in name order.
fn find_estimates(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let mut entries = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    entries.sort();
    for path in entries.into_iter().filter(|p| p.is_dir()) {
        if path.file_name().is_some_and(|n| n == LATEST_RUN_DIR) {
            if path.join(ESTIMATES_FILE).is_file() {
                out.push(path);
            }
        } else {
            find_estimates(&path, out)?;
        }
    }
    Ok(())
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = input::read_bounded(path, "criterion file", MAX_JSON_BYTES, "MAX_JSON_BYTES")?;
    serde_json::from_slice(&bytes).with_context(|| {
        format!(
            "{} is not a criterion result file of the expected form",
            path.display()
        )
    })
}

/// One benchmark from its `new` folder. Ids come from `benchmark.json` when it is there, else
/// from the folder names between `root` and `new`: `<group>/<function>/<param>`.
fn read_benchmark(root: &Path, run_dir: &Path) -> Result<CriterionRow> {
    let estimates_path = run_dir.join(ESTIMATES_FILE);
    let est: Estimates = read_json(&estimates_path)?;
    check_estimates(&est, &estimates_path)?;
    let parts: Vec<String> = run_dir
        .parent()
        .and_then(|p| p.strip_prefix(root).ok())
        .map(|rel| {
            rel.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    let (mut group, mut function, mut param) = match parts.as_slice() {
        [g] => (g.clone(), String::new(), String::new()),
        [g, f] => (g.clone(), f.clone(), String::new()),
        [g, f, p] => (g.clone(), f.clone(), p.clone()),
        _ => bail!(
            "{}: expected <group>/<function>/<param>/{LATEST_RUN_DIR}/{ESTIMATES_FILE} under {}",
            estimates_path.display(),
            root.display()
        ),
    };
    let benchmark_path = run_dir.join(BENCHMARK_FILE);
    if benchmark_path.is_file() {
        let b: BenchmarkJson = read_json(&benchmark_path)?;
        group = b.group_id.unwrap_or(group);
        function = b.function_id.unwrap_or(function);
        param = b.value_str.unwrap_or(param);
    }
    let sample_path = run_dir.join(SAMPLE_FILE);
    let (samples, iterations) = if sample_path.is_file() {
        let s: Sample = read_json(&sample_path)?;
        if s.iters.len() != s.times.len() {
            bail!(
                "{}: {} iteration counts but {} times; expected one of each per sample",
                sample_path.display(),
                s.iters.len(),
                s.times.len()
            );
        }
        // Criterion stores iteration counts as floats; they are whole numbers, at least 1.
        if let Some((i, n)) = s
            .iters
            .iter()
            .enumerate()
            .find(|(_, n)| !(n.is_finite() && **n >= 1.0 && n.fract() == 0.0))
        {
            bail!(
                "{}: iteration count {n} of sample {}: expected a whole number of at least 1 (a \
                 damaged file? rerun `cargo bench`)",
                sample_path.display(),
                i + 1
            );
        }
        if let Some((i, t)) = s
            .times
            .iter()
            .enumerate()
            .find(|(_, t)| !(t.is_finite() && **t >= 0.0))
        {
            bail!(
                "{}: time {t} of sample {}: expected a duration of at least 0 ns (a damaged \
                 file? rerun `cargo bench`)",
                sample_path.display(),
                i + 1
            );
        }
        (
            Some(s.times.len()),
            Some(s.iters.iter().sum::<f64>().round() as u64),
        )
    } else {
        (None, None)
    };
    let (family, config) = match group.split_once('-') {
        Some((f, c)) => (f.to_string(), c.to_string()),
        None => (group.clone(), String::new()),
    };
    // Depth is the parameter of the step benches; other groups (layouts) have other parameters.
    let depth = if Family::parse(&family).is_ok() {
        param.parse::<usize>().ok()
    } else {
        None
    };
    let lo = |e: &Estimate| e.confidence_interval.as_ref().and_then(|c| c.lower_bound);
    let hi = |e: &Estimate| e.confidence_interval.as_ref().and_then(|c| c.upper_bound);
    Ok(CriterionRow {
        family,
        config,
        variant: function,
        depth,
        param,
        median_ns: est.median.point_estimate,
        median_lo_ns: lo(&est.median),
        median_hi_ns: hi(&est.median),
        mean_ns: est.mean.as_ref().map(|e| e.point_estimate),
        mean_lo_ns: est.mean.as_ref().and_then(lo),
        mean_hi_ns: est.mean.as_ref().and_then(hi),
        std_dev_ns: est.std_dev.as_ref().map(|e| e.point_estimate),
        samples,
        iterations,
        measured_at: modified_utc(&estimates_path)?,
        estimates_file: estimates_path.display().to_string(),
        group,
    })
}

/// Refuses estimates no benchmark can have: a time that is negative (or not finite), a
/// confidence interval whose lower bound is above its upper one.
fn check_estimates(est: &Estimates, path: &Path) -> Result<()> {
    let stats = [
        ("median", Some(&est.median)),
        ("mean", est.mean.as_ref()),
        ("std_dev", est.std_dev.as_ref()),
    ];
    for (name, e) in stats {
        let Some(e) = e else { continue };
        let ci = e.confidence_interval.as_ref();
        let values = [
            ("point_estimate", Some(e.point_estimate)),
            (
                "confidence_interval.lower_bound",
                ci.and_then(|c| c.lower_bound),
            ),
            (
                "confidence_interval.upper_bound",
                ci.and_then(|c| c.upper_bound),
            ),
        ];
        for (field, v) in values {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                bail!(
                    "{}: `{name}.{field}` is {v} ns: a time is at least 0 (a damaged file? rerun \
                     `cargo bench`)",
                    path.display()
                );
            }
        }
        if let Some((lo, hi)) = ci.and_then(|c| c.lower_bound.zip(c.upper_bound)) {
            if lo > hi {
                bail!(
                    "{}: `{name}`'s confidence interval runs from {lo} down to {hi} ns: its lower \
                     bound must not exceed its upper one (a damaged file? rerun `cargo bench`)",
                    path.display()
                );
            }
        }
    }
    Ok(())
}

fn modified_utc(path: &Path) -> Result<String> {
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .with_context(|| format!("reading the modification time of {}", path.display()))?;
    Ok(chrono::DateTime::<chrono::Utc>::from(modified)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// Writes the rows (header first) to `path`, creating its folder; replaces an existing file.
pub fn write_csv(rows: &[CriterionRow], path: &Path) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    for r in rows {
        w.serialize(r)
            .with_context(|| format!("serialising a row for {}", path.display()))?;
    }
    let bytes = w
        .into_inner()
        .map_err(|e| anyhow::anyhow!("serialising {}: {e}", path.display()))?;
    write_bytes_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_follow_the_convention() {
        // The names the issue and the benches use.
        assert_eq!(
            group_name(&Config::bc100_block()),
            "bc-N64-C24-k12-bn4-32x32"
        );
        let camvid = Config {
            size: impls::Spatial::new(360, 480),
            ..Config::bc100_block()
        };
        assert_eq!(group_name(&camvid), "bc-N64-C24-k12-bn4-360x480");
        let mut mlp = Config::tiny(Family::Mlp);
        (mlp.batch, mlp.channels, mlp.growth) = (4096, 256, 64);
        mlp.dtype = candle_core::DType::F32;
        mlp.seed = 0;
        assert_eq!(group_name(&mlp), "mlp-N4096-C256-k64");
        mlp.activation = false;
        mlp.dtype = candle_core::DType::F64;
        assert_eq!(group_name(&mlp), "mlp-N4096-C256-k64-norelu-f64");
    }
}
