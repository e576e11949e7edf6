//! Sweep files (TOML, format in harness/sweeps/README.md) and their expansion into jobs: every
//! list an axis of a cartesian product, every variant checked against its config, every job
//! keyed ([`crate::plan::job::key`]) and costed ([`crate::plan::shard::job_cost`]) before any
//! work. Also the built-in sweeps and `--devices` retargeting.

use crate::plan::device::DeviceSpec;
use crate::plan::job::{self, resolve_threads, Settings};
use crate::plan::shard;
use anyhow::{anyhow, bail, Context, Result};
use impls::{Config, Family, Variant};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

pub use crate::plan::job::Job;

/// The built-in sweeps (copies of harness/sweeps/*.toml), so the binary runs from anywhere.
pub const DEFAULT_SWEEP: &str = include_str!("../../sweeps/default.toml");
pub const QUICK_SWEEP: &str = include_str!("../../sweeps/quick.toml");

/// A scalar or a list of them (every list is one axis of the sweep's cartesian product).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    fn values(&self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A byte count: an integer or a string with a suffix (`"12GiB"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Bytes {
    Int(u64),
    Text(String),
}

impl Bytes {
    fn get(&self) -> Result<u64> {
        match self {
            Bytes::Int(b) => Ok(*b),
            Bytes::Text(s) => job::parse_bytes(s),
        }
    }
}

/// One table of a sweep file: `[defaults]` or a `[[group]]`. Every field is optional in the
/// file; a group's missing fields come from `[defaults]`, then from the built-in defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: Option<String>,
    pub family: Option<String>,
    pub batch: Option<OneOrMany<usize>>,
    pub channels: Option<OneOrMany<usize>>,
    pub growth: Option<OneOrMany<usize>>,
    pub depth: Option<OneOrMany<usize>>,
    pub bn_size: Option<OneOrMany<usize>>,
    pub size: Option<OneOrMany<usize>>,
    pub activation: Option<OneOrMany<bool>>,
    pub dtype: Option<OneOrMany<String>>,
    pub seed: Option<OneOrMany<u64>>,
    /// `"all"` (every variant that applies) or a list of variant names.
    pub variants: Option<OneOrMany<String>>,
    pub steps: Option<usize>,
    pub warmup: Option<usize>,
    pub threads: Option<usize>,
    pub device: Option<String>,
    pub timeout_secs: Option<u64>,
    pub mem_limit: Option<Bytes>,
}

/// A sweep file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SweepFile {
    pub name: Option<String>,
    pub description: Option<String>,
    #[serde(default)]
    pub defaults: Entry,
    #[serde(default, rename = "group")]
    pub groups: Vec<Entry>,
}

/// Built-in defaults for fields neither a group nor `[defaults]` sets.
const DEFAULT_BN_SIZE: usize = 4;
const DEFAULT_SIZE: usize = 32;
const DEFAULT_STEPS: usize = 3;
const DEFAULT_WARMUP: usize = 1;

macro_rules! merged {
    ($g:expr, $d:expr, $field:ident) => {
        $g.$field.clone().or_else(|| $d.$field.clone())
    };
}

/// Parses a sweep file's text and expands it into jobs, validating everything. `source` names
/// the file in error messages; `mem_override` replaces every memory limit.
pub fn parse(text: &str, source: &str, mem_override: Option<u64>) -> Result<Vec<Job>> {
    let file: SweepFile = toml::from_str(text).map_err(|e| toml_error(text, source, &e))?;
    if file.groups.is_empty() {
        bail!("sweep file {source} has no [[group]]: nothing to run");
    }
    let d = &file.defaults;
    let mut jobs = Vec::new();
    let mut seen = HashSet::new();
    for (gi, g) in file.groups.iter().enumerate() {
        let label = match &g.name {
            Some(n) => format!("sweep file {source}, group {} (`{n}`)", gi + 1),
            None => format!("sweep file {source}, group {}", gi + 1),
        };
        let group_jobs = expand(g, d, mem_override).with_context(|| label.clone())?;
        for j in group_jobs {
            // A key listed twice is measured once.
            if seen.insert(j.key.clone()) {
                jobs.push(j);
            }
        }
    }
    Ok(jobs)
}

/// A TOML error on one line: position and message (toml's own rendering spans several lines).
fn toml_error(text: &str, source: &str, e: &toml::de::Error) -> anyhow::Error {
    let at = e
        .span()
        .and_then(|span| text.get(..span.start))
        .map(|before| {
            let line = before.matches('\n').count() + 1;
            let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            format!(" at line {line}, column {column}")
        })
        .unwrap_or_default();
    let msg = e.message().trim().replace('\n', " ");
    anyhow!("sweep file {source} is malformed{at}: {msg}")
}

fn required<T: Clone>(v: Option<OneOrMany<T>>, field: &str) -> Result<Vec<T>> {
    let v = v
        .with_context(|| format!("`{field}` is missing (set it in the group or in [defaults])"))?
        .values();
    if v.is_empty() {
        bail!("`{field}` is an empty list");
    }
    Ok(v)
}

fn optional<T: Clone>(v: Option<OneOrMany<T>>, default: T, field: &str) -> Result<Vec<T>> {
    match v {
        None => Ok(vec![default]),
        Some(v) => required(Some(v), field),
    }
}

fn expand(g: &Entry, d: &Entry, mem_override: Option<u64>) -> Result<Vec<Job>> {
    let family_name = merged!(g, d, family).context("`family` is missing (`mlp` or `bc`)")?;
    let family = Family::parse(&family_name).map_err(|e| anyhow!("{e}"))?;
    let batches = required(merged!(g, d, batch), "batch")?;
    let channels = required(merged!(g, d, channels), "channels")?;
    let growths = required(merged!(g, d, growth), "growth")?;
    let depths = required(merged!(g, d, depth), "depth")?;
    let bn_sizes = optional(merged!(g, d, bn_size), DEFAULT_BN_SIZE, "bn_size")?;
    let sizes = optional(merged!(g, d, size), DEFAULT_SIZE, "size")?;
    let activations = optional(merged!(g, d, activation), true, "activation")?;
    let dtypes = optional(merged!(g, d, dtype), "f32".to_string(), "dtype")?;
    let seeds = optional(merged!(g, d, seed), 0, "seed")?;
    let variants = optional(merged!(g, d, variants), "all".to_string(), "variants")?;
    let device: DeviceSpec = merged!(g, d, device)
        .unwrap_or_else(|| "cpu".to_string())
        .parse()
        .context("`device`")?;
    let mem_limit = match mem_override {
        Some(b) => Some(b),
        None => match merged!(g, d, mem_limit) {
            Some(b) => Some(b.get().context("`mem_limit`")?),
            None => job::default_mem_limit(),
        },
    };
    let settings = Settings {
        device,
        threads: resolve_threads(merged!(g, d, threads).unwrap_or(0)),
        steps: merged!(g, d, steps).unwrap_or(DEFAULT_STEPS),
        warmup: merged!(g, d, warmup).unwrap_or(DEFAULT_WARMUP),
        mem_limit,
        timeout: Duration::from_secs(
            merged!(g, d, timeout_secs).unwrap_or(job::DEFAULT_TIMEOUT_SECS),
        ),
    };
    if settings.steps == 0 {
        bail!("`steps` must be at least 1");
    }
    let explicit: Option<Vec<Variant>> = if variants == ["all"] {
        None
    } else {
        Some(
            variants
                .iter()
                .map(|v| Variant::parse(v).map_err(|e| anyhow!("`variants`: {e}")))
                .collect::<Result<_>>()?,
        )
    };
    let mut jobs = Vec::new();
    // Depth innermost (after variants): each configuration runs shallow to deep.
    for &batch in &batches {
        for &c0 in &channels {
            for &k in &growths {
                for &bn in &bn_sizes {
                    for &size in &sizes {
                        for &act in &activations {
                            for dt in &dtypes {
                                for &seed in &seeds {
                                    for &depth in &depths {
                                        let dtype = impls::config::parse_dtype(dt)
                                            .map_err(|e| anyhow!("`dtype`: {e}"))?;
                                        let cfg = job::normalize(Config {
                                            family,
                                            batch,
                                            channels: c0,
                                            growth: k,
                                            depth,
                                            bn_size: bn,
                                            size,
                                            activation: act,
                                            dtype,
                                            seed,
                                        });
                                        cfg.validate().map_err(|e| anyhow!("{e}"))?;
                                        let vs = match &explicit {
                                            None => Variant::for_config(&cfg),
                                            Some(list) => {
                                                for v in list {
                                                    v.check(&cfg)
                                                        .map_err(|e| anyhow!("`variants`: {e}"))?;
                                                }
                                                list.clone()
                                            }
                                        };
                                        for variant in vs {
                                            jobs.push(Job {
                                                key: job::key(variant, &cfg, device),
                                                cost: shard::job_cost(variant, &cfg, &settings),
                                                variant,
                                                cfg: cfg.clone(),
                                                settings: settings.clone(),
                                            });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(jobs)
}

/// The sweep's text and its name for messages: `sweep` if given, else the built-in quick
/// (`quick`) or default sweep.
pub fn load_sweep(sweep: Option<&Path>, quick: bool) -> Result<(String, String)> {
    match (sweep, quick) {
        (Some(p), _) => Ok((
            std::fs::read_to_string(p)
                .with_context(|| format!("reading sweep file {}", p.display()))?,
            p.display().to_string(),
        )),
        (None, true) => Ok((
            QUICK_SWEEP.to_string(),
            "harness/sweeps/quick.toml (built in)".to_string(),
        )),
        (None, false) => Ok((
            DEFAULT_SWEEP.to_string(),
            "harness/sweeps/default.toml (built in)".to_string(),
        )),
    }
}

/// Moves every job to `device` (what `--devices` does with its first device): keys are
/// recomputed, and jobs that now share a key (the same config on two devices in the sweep file)
/// are measured once.
pub fn retarget(jobs: Vec<Job>, device: DeviceSpec) -> Vec<Job> {
    let mut seen = HashSet::new();
    jobs.into_iter()
        .filter_map(|mut j| {
            j.settings.device = device;
            j.key = job::key(j.variant, &j.cfg, device);
            seen.insert(j.key.clone()).then_some(j)
        })
        .collect()
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
    let (text, source) = load_sweep(sweep_file, quick)?;
    let mut jobs = parse(&text, &source, None)?;
    if let Some(&first) = devices.first() {
        jobs = retarget(jobs, first);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse(text, "t.toml", Some(1 << 30)) {
            Ok(_) => "parsed".to_string(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn built_in_sweeps_parse() {
        for (text, name) in [(DEFAULT_SWEEP, "default"), (QUICK_SWEEP, "quick")] {
            let jobs = parse(text, name, Some(1 << 30));
            assert!(
                jobs.is_ok_and(|j| !j.is_empty()),
                "{name} sweep does not parse"
            );
        }
    }

    #[test]
    fn expands_lists_and_all_variants() {
        let text = r#"
            [defaults]
            steps = 2
            [[group]]
            family = "mlp"
            batch = 4
            channels = 3
            growth = 2
            depth = [1, 2]
            activation = [true, false]
        "#;
        let jobs = parse(text, "t.toml", Some(1 << 30)).map_err(|e| e.to_string());
        // mlp with the activation on: autograd + 6 manual variants (no buffer-recompute-*);
        // off: autograd + cat-store-copy, cat-recompute-copy, buffer-store-copy. Two depths.
        assert_eq!(jobs.map(|j| j.len()), Ok(2 * (7 + 4)));
    }

    #[test]
    fn malformed_files_name_the_problem() {
        assert!(err("[[group]]\nfamily = 'mlp'\nbatch = ").contains("malformed"));
        assert!(err(
            "[[group]]\nfamily = 'mlp'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 1\ncolour = 3"
        )
        .contains("colour"));
        assert!(
            err("[[group]]\nfamily = 'mlp'\nchannels = 1\ngrowth = 1\ndepth = 1")
                .contains("`batch` is missing")
        );
        assert!(
            err("[[group]]\nfamily = 'cnn'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 1")
                .contains("cnn")
        );
        let e = err("[[group]]\nname = 'x'\nfamily = 'mlp'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 1\nvariants = ['cat-store-kopy']");
        assert!(
            e.contains("cat-store-kopy") && e.contains("group 1 (`x`)"),
            "{e}"
        );
        assert!(err("name = 'empty'").contains("no [[group]]"));
        assert!(
            err("[[group]]\nfamily = 'mlp'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 0")
                .contains("depth")
        );
    }
}
