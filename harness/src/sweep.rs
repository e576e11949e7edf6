//! `densebench bench-all`: a sweep file (TOML, format in harness/sweeps/README.md) expanded into
//! jobs, every job measured by [`run::measure_row`] in its own child process, every row appended
//! and flushed to the result CSV as soon as it exists.
//!
//! Guarantees: everything is validated before any work (sweep file, variant names, output
//! path); an existing output file is never overwritten silently (`--resume` continues it,
//! `--force` replaces it); the CSV is valid whenever the sweep is killed (header plus whole
//! rows; a torn last line is cut off on `--resume`); `--resume` runs only the keys missing.
//!
//! Beyond one machine: `--shard I/N` keeps only shard I of the sweep ([`crate::shard`]: whole
//! configurations, balanced by predicted cost, the same split on every node), after which
//! `--resume` works per shard file; `--devices cuda:0,cuda:1,…` runs one worker thread (one
//! child at a time) per device, whole configurations per device, rows appended under a lock.

use crate::child::resolve_threads;
use crate::device::DeviceSpec;
use crate::job::{self, Settings};
use crate::progress::Progress;
use crate::reference::{self, Cache};
use crate::row::{self, Row};
use crate::run;
use crate::shard::{self, ShardSpec};
use anyhow::{anyhow, bail, Context, Result};
use impls::{Config, Family, Variant};
use serde::Deserialize;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The built-in sweeps (copies of harness/sweeps/*.toml), so the binary runs from anywhere.
pub const DEFAULT_SWEEP: &str = include_str!("../sweeps/default.toml");
pub const QUICK_SWEEP: &str = include_str!("../sweeps/quick.toml");

/// `densebench bench-all` arguments.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    /// Sweep file (TOML; format in harness/sweeps/README.md). Default: the built-in
    /// harness/sweeps/default.toml.
    #[arg(long, conflicts_with = "quick")]
    pub sweep: Option<PathBuf>,
    /// Output CSV. Default: a new results/bench-YYYYmmdd-HHMMSS.csv (results/quick-… with
    /// --quick). An existing file is refused unless --resume or --force is given.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The built-in quick sweep (tiny configs, under a minute; for tests and CI).
    #[arg(long)]
    pub quick: bool,
    /// Continue an existing output file: configurations whose key it already holds are skipped.
    #[arg(long, conflicts_with = "force")]
    pub resume: bool,
    /// Replace an existing output file.
    #[arg(long)]
    pub force: bool,
    /// Memory limit of every child in bytes (suffixes K, M, G, KiB, MiB, GiB), overriding the
    /// sweep file; default 75% of RAM.
    #[arg(long, value_parser = job::parse_bytes)]
    pub mem_limit: Option<u64>,
    /// Reference cache directory (default: `densebench-cache` next to the executable, or
    /// $DENSEBENCH_CACHE_DIR).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Run only shard I of N (counting from 1, e.g. `2/3`): a deterministic part of the sweep,
    /// whole configurations balanced by predicted cost (`densebench plan` shows the split).
    /// Give each shard its own --out; --resume continues that shard's file.
    #[arg(long, value_name = "I/N")]
    pub shard: Option<ShardSpec>,
    /// Run on these devices concurrently, one child per device (e.g. `cuda:0,cuda:1`), instead
    /// of the sweep's `device`: a multi-GPU node without Slurm. Rows are keyed by the first
    /// device (the GPUs are taken as identical); `device_desc` names the one a row ran on.
    #[arg(long, value_delimiter = ',', value_name = "DEV,...")]
    pub devices: Vec<DeviceSpec>,
}

impl Args {
    /// What `densebench` with no subcommand runs: the default sweep into a new timestamped file.
    pub fn default_sweep() -> Self {
        Args::default()
    }
}

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

/// One measurement of a sweep.
#[derive(Debug, Clone)]
pub struct Job {
    pub key: String,
    pub variant: Variant,
    pub cfg: Config,
    pub settings: Settings,
    /// Predicted cost in FLOP-equivalents ([`shard::job_cost`]): shard balance and the ETA.
    pub cost: f64,
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

/// The result CSV being written: every row appended and flushed as one write.
pub struct Output {
    file: File,
    path: PathBuf,
}

/// Cuts a torn last line (a row cut short by a kill) off a result file; returns whether it did.
fn repair_torn_line(path: &Path) -> Result<bool> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(false);
    }
    let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {} to repair it", path.display()))?;
    f.set_len(keep as u64)
        .with_context(|| format!("truncating the torn last line of {}", path.display()))?;
    Ok(true)
}

/// One row as a CSV line (no header), exactly as `bench-all` appends it.
pub fn csv_line(row: &Row) -> Result<Vec<u8>> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    w.serialize(row).context("serialising a row")?;
    w.into_inner()
        .map_err(|e| anyhow!("serialising a row: {e}"))
}

impl Output {
    /// Opens `path` for a sweep. Returns the output and the keys it already holds (with
    /// `resume`). Errs, before any work, when the file exists without `resume`/`force`, is not
    /// a result CSV, or cannot be written.
    pub fn open(
        path: &Path,
        resume: bool,
        force: bool,
        progress: &dyn Fn(&str),
    ) -> Result<(Output, HashSet<String>)> {
        let existing = path.metadata().map(|m| m.len() > 0).unwrap_or(false);
        if path.is_dir() {
            bail!("output {} is a directory, not a CSV file", path.display());
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| {
                format!("cannot create the output directory {}", parent.display())
            })?;
        }
        let mut done = HashSet::new();
        let file = if existing && resume {
            if repair_torn_line(path)? {
                progress(&format!(
                    "{}: cut off a torn last line (a row interrupted by a kill)",
                    path.display()
                ));
            }
            for r in row::read_rows(path)? {
                done.insert(r.key);
            }
            OpenOptions::new()
                .append(true)
                .open(path)
                .with_context(|| format!("cannot append to the output file {}", path.display()))?
        } else {
            if existing && !force {
                bail!(
                    "output file {} already exists: pass --resume to continue it (skipping the \
                     configurations it holds) or --force to overwrite it",
                    path.display()
                );
            }
            let mut f = File::create(path)
                .with_context(|| format!("cannot write the output file {}", path.display()))?;
            let mut w = csv::Writer::from_writer(Vec::new());
            w.write_record(Row::columns())
                .context("writing the header")?;
            let header = w
                .into_inner()
                .map_err(|e| anyhow!("writing the header: {e}"))?;
            f.write_all(&header)
                .and_then(|()| f.flush())
                .with_context(|| format!("writing the header of {}", path.display()))?;
            f
        };
        Ok((
            Output {
                file,
                path: path.to_path_buf(),
            },
            done,
        ))
    }

    /// Appends one row as a single write, flushed and synced: a kill leaves whole rows.
    pub fn append(&mut self, row: &Row) -> Result<()> {
        let line = csv_line(row)?;
        self.file
            .write_all(&line)
            .and_then(|()| self.file.flush())
            .and_then(|()| self.file.sync_data())
            .with_context(|| format!("appending a row to {}", self.path.display()))
    }
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

/// Checks a `--devices` list: no device twice, and `cpu` only alone (two CPU children at once
/// would measure each other's contention, not the variants).
pub fn check_devices(devices: &[DeviceSpec]) -> Result<()> {
    let mut seen = HashSet::new();
    for d in devices {
        if !seen.insert(*d) {
            bail!("--devices lists {d} twice: one child per device");
        }
    }
    if devices.len() > 1 && devices.contains(&DeviceSpec::Cpu) {
        bail!(
            "--devices: `cpu` can only be used alone (concurrent CPU children would share the \
             cores and measure each other); list GPUs, e.g. cuda:0,cuda:1"
        );
    }
    Ok(())
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

fn default_out(quick: bool, shard: Option<ShardSpec>) -> PathBuf {
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    let stem = if quick { "quick" } else { "bench" };
    let part = shard
        .map(|s| format!("-shard{}of{}", s.index, s.count))
        .unwrap_or_default();
    PathBuf::from("results").join(format!("{stem}-{stamp}{part}.csv"))
}

/// What the workers share: the output file, the progress display and the tallies. Held under
/// one lock while a row is appended, so rows from concurrent devices never interleave.
struct Shared {
    out: Output,
    progress: Progress,
    started: usize,
    finished: usize,
    counts: std::collections::BTreeMap<String, usize>,
    out_of_tolerance: Vec<String>,
}

/// The work items of a sweep run: with one worker, every job in sweep order (one item); with
/// several, whole configurations (all variants of a config run on one device, and its
/// reference is computed once), most expensive first (longest-processing-time list scheduling).
fn work_items<'a>(todo: &[&'a Job], workers: usize) -> Vec<Vec<&'a Job>> {
    if workers <= 1 {
        return vec![todo.to_vec()];
    }
    let owned: Vec<Job> = todo.iter().map(|j| (*j).clone()).collect();
    let mut groups = shard::groups(&owned);
    groups.sort_by(|a, b| b.cost.total_cmp(&a.cost));
    groups
        .into_iter()
        .map(|g| g.jobs.into_iter().map(|i| todo[i]).collect())
        .collect()
}

/// One worker: takes items off the queue and measures their jobs on `device` (the job's own
/// device when `None`), appending each row under the lock. Stops early when another worker
/// failed (`stop`).
fn worker(
    device: Option<DeviceSpec>,
    queue: &std::sync::Mutex<std::collections::VecDeque<Vec<&Job>>>,
    shared: &std::sync::Mutex<Shared>,
    stop: &std::sync::atomic::AtomicBool,
    cache_dir: &Path,
) -> Result<()> {
    use std::sync::atomic::Ordering;
    let lock_err = || anyhow!("a sweep worker panicked while holding the output lock");
    let mut refs = Cache::new(cache_dir)?;
    loop {
        let item = match queue.lock() {
            Ok(mut q) => q.pop_front(),
            Err(_) => return Err(lock_err()),
        };
        let Some(item) = item else { return Ok(()) };
        for j in item {
            if stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let mut settings = j.settings.clone();
            if let Some(d) = device {
                settings.device = d;
            }
            {
                let mut sh = shared.lock().map_err(|_| lock_err())?;
                sh.started += 1;
                let n = sh.started;
                let on = device.map(|d| format!(" on {d}")).unwrap_or_default();
                sh.progress
                    .start(n, &format!("{} {}{on}", j.cfg.describe(), j.variant));
            }
            let measured = run::measure_row(j.variant, &j.cfg, &settings, &mut refs)
                .with_context(|| format!("measuring {}", j.key));
            let mut row = match measured {
                Ok(row) => row,
                Err(e) => {
                    stop.store(true, Ordering::SeqCst);
                    return Err(e);
                }
            };
            if settings.device != j.settings.device {
                // Keyed by the sweep's (logical) device; the physical one is in device_desc.
                row.key = j.key.clone();
                row.device = j.settings.device.to_string();
                row.device_desc = format!("ran on {}: {}", settings.device, row.device_desc);
            }
            let mut sh = shared.lock().map_err(|_| lock_err())?;
            sh.out.append(&row)?;
            sh.finished += 1;
            let n = sh.finished;
            sh.progress.finish(n, &row, j.cost);
            *sh.counts.entry(row.status.clone()).or_default() += 1;
            if row.grad_ok == Some(false) {
                sh.out_of_tolerance.push(row.key.clone());
            }
        }
    }
}

/// `densebench bench-all` (and `densebench` with no subcommand). Exit status 1 when any row's
/// gradients are out of tolerance; rows that ran out of memory or time are results, not failures.
pub fn run(a: Args) -> Result<ExitCode> {
    check_devices(&a.devices)?;
    let (text, source) = load_sweep(a.sweep.as_deref(), a.quick)?;
    let mut jobs = parse(&text, &source, a.mem_limit)?;
    if let Some(&first) = a.devices.first() {
        jobs = retarget(jobs, first);
    }
    let mut source = source;
    if let Some(s) = a.shard {
        let total = jobs.len();
        jobs = shard::select(jobs, s);
        source = format!("{source}, shard {s} ({} of {total} jobs)", jobs.len());
    }
    let out_path = a
        .out
        .clone()
        .unwrap_or_else(|| default_out(a.quick, a.shard));
    let note = |m: &str| eprintln!("{m}");
    let (out, done) = Output::open(&out_path, a.resume, a.force, &note)?;
    let cache_dir = reference::default_dir(a.cache_dir.as_deref())?;
    let mine: HashSet<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    let foreign = done.iter().filter(|k| !mine.contains(k.as_str())).count();
    if foreign > 0 {
        eprintln!(
            "densebench bench-all: note: {foreign} rows of {} are not jobs of this run ({source}); \
             they are kept as they are (another shard's file, or another sweep?)",
            out_path.display()
        );
    }
    let todo: Vec<&Job> = jobs.iter().filter(|j| !done.contains(&j.key)).collect();
    eprintln!(
        "densebench bench-all: {source}: {} jobs, {} already in {}, {} to run → {}{}",
        jobs.len(),
        jobs.len() - todo.len(),
        out_path.display(),
        todo.len(),
        out_path.display(),
        if a.devices.len() > 1 {
            format!(
                " on {} devices concurrently ({})",
                a.devices.len(),
                a.devices
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        } else {
            String::new()
        }
    );
    let start = Instant::now();
    let workers: Vec<Option<DeviceSpec>> = if a.devices.is_empty() {
        vec![None]
    } else {
        a.devices.iter().copied().map(Some).collect()
    };
    let queue = std::sync::Mutex::new(work_items(&todo, workers.len()).into());
    let shared = std::sync::Mutex::new(Shared {
        out,
        progress: Progress::new(todo.len(), todo.iter().map(|j| j.cost).sum()),
        started: 0,
        finished: 0,
        counts: Default::default(),
        out_of_tolerance: Vec::new(),
    });
    let stop = std::sync::atomic::AtomicBool::new(false);
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .iter()
            .map(|&d| {
                let (queue, shared, stop, cache_dir) = (&queue, &shared, &stop, &cache_dir);
                scope.spawn(move || worker(d, queue, shared, stop, cache_dir))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a sweep worker panicked")))
            })
            .collect()
    });
    let shared = shared
        .into_inner()
        .map_err(|_| anyhow!("a sweep worker panicked while holding the output lock"))?;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    shared.progress.done();
    let counts: Vec<String> = shared
        .counts
        .iter()
        .map(|(k, v)| format!("{k}: {v}"))
        .collect();
    eprintln!(
        "densebench bench-all: {} rows written to {} in {:.1} s ({})",
        shared.finished,
        out_path.display(),
        start.elapsed().as_secs_f64(),
        if counts.is_empty() {
            "nothing to do".to_string()
        } else {
            counts.join(", ")
        }
    );
    if !shared.out_of_tolerance.is_empty() {
        eprintln!(
            "densebench bench-all: gradients out of tolerance: {}",
            shared.out_of_tolerance.join(", ")
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
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
