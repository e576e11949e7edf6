//! Reference results: one training step of the reference variant on a config and seed, computed
//! in its own child process (so it never inflates a measured peak) and cached as a safetensors
//! result file.
//!
//! The reference is `autograd` (candle's autograd: shares no backward code with the hand-written
//! variants). When it cannot be computed (it keeps every op input alive and is the first to run
//! out of memory or time at large depth), the explicit naive variant `cat-store-copy` is the
//! fallback, then the most frugal hand-written variant (`buffer-recompute-copy` for bc,
//! `buffer-store-copy` for mlp: a different storage and gradient path from naive's, and linear
//! memory, so deep blocks still get a checked reference); the row's `reference` column says
//! which was used. A candidate that cannot fit the memory limit is skipped without running it:
//! hand-written variants by the memory model, `autograd` by [`AUTOGRAD_OVER_NAIVE`] times
//! naive's model. A failure is remembered for the rest of the process so the next variant of the
//! same config does not retry it.
//!
//! Cache: `<dir>/<build id>/<config key with / as _>.<variant>.safetensors`, where the default
//! `<dir>` is `densebench-cache` next to the executable (so `target/release/densebench-cache`),
//! overridable with `--cache-dir` or `DENSEBENCH_CACHE_DIR`, and `<build id>` is a hash of the
//! executable, so a rebuilt binary never uses a reference computed by different code. Files are
//! written under a temporary name (`….tmp<parent pid>`) and renamed, so a killed run never
//! leaves a partial file; the temporary files are removed whenever the reference is not
//! completed (the child failed, or the parent was told to stop), and a cache opened later
//! removes those of a parent that no longer runs (one killed with SIGKILL could not).
//!
//! The cache also holds what a peer framework needs and gives per config: the case file the
//! densebench rows measure (`<config key>.case.safetensors`, written by the code `densebench
//! case` runs), which the peer loads, and the naive peer's relative error on it against the
//! reference (`<config key>.pytorch-naive.error.json`), the f32 tolerance of the config's
//! densebench rows ([`Cache::tolerance`]).

use crate::measure::child::{self, Outcome};
use crate::measure::interrupt;
use crate::measure::step as measure;
use crate::plan::device::DeviceSpec;
use crate::plan::input::{self, MAX_JSON_BYTES};
use crate::plan::job::{config_key, Execution, Math, Peer, PeerVariant, Settings};
use anyhow::{anyhow, Context, Result};
use impls::{Config, Variant};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Environment variable overriding the default cache directory.
pub const CACHE_ENV: &str = "DENSEBENCH_CACHE_DIR";

/// The reference variants for `cfg`, in order of preference.
pub fn candidates(cfg: &Config) -> [Variant; 3] {
    let frugal = match cfg.family {
        impls::Family::Bc => "buffer-recompute-copy",
        impls::Family::Mlp => "buffer-store-copy",
    };
    [
        Variant::Autograd,
        Variant::NAIVE,
        Variant::parse(frugal).unwrap_or(Variant::NAIVE),
    ]
}

/// Upper bound on `autograd`'s peak over naive's, used only to skip a reference run that
/// cannot fit: measured 3.8× on bc (BC-100 block, L=16: candle keeps every BN op's inputs) and
/// 1.3–2.1× on mlp (L=64…8).
pub const AUTOGRAD_OVER_NAIVE: [(impls::Family, f64); 2] =
    [(impls::Family::Bc, 4.0), (impls::Family::Mlp, 2.5)];

/// The reference step's predicted footprint (in f64, the reference dtype): static tensors plus
/// the modelled peak; `None` when unknown.
fn predicted_reference_bytes(variant: Variant, cfg: &Config) -> Option<u64> {
    let wide = Config {
        dtype: measure::REFERENCE_DTYPE,
        ..cfg.clone()
    };
    let static_bytes = crate::measure::estimates::static_bytes(&wide);
    match variant {
        Variant::Autograd => {
            let factor = AUTOGRAD_OVER_NAIVE
                .iter()
                .find(|(f, _)| *f == cfg.family)
                .map(|(_, x)| *x)?;
            let naive = impls::model::predict_peak_bytes(Variant::NAIVE, &wide)?;
            Some(static_bytes + (naive as f64 * factor) as u64)
        }
        v => impls::model::predict_peak_bytes(v, &wide).map(|p| p + static_bytes),
    }
}

/// What an f64 reference of `s`'s rows must fit in, and how to name it: the child's memory
/// limit on the CPU; on a GPU the device's memory, where the reference's tensors live (the
/// host limit is far larger there, and a reference past the device's memory would be tried and
/// fail on the GPU before the next candidate is).
fn reference_budget(s: &Settings) -> Option<(u64, String)> {
    match s.device {
        DeviceSpec::Cpu => s
            .mem_limit
            .map(|l| (l, format!("the {} MiB limit", l >> 20))),
        DeviceSpec::Cuda(n) => crate::measure::gpu::check_available(n).ok().map(|i| {
            (
                i.total_memory_bytes,
                format!("cuda:{n}'s {} MiB", i.total_memory_bytes >> 20),
            )
        }),
    }
}

/// A reference result on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub path: PathBuf,
    pub variant: Variant,
}

/// What [`Cache::get`] does with one candidate ([`Cache::candidate`]).
enum Candidate {
    /// Its result file is cached: used.
    Cached(PathBuf),
    /// The memory model says it cannot fit: skipped, for this reason.
    TooBig(String),
    /// Computed into this file.
    Compute(PathBuf),
}

/// Computes and caches references.
pub struct Cache {
    dir: PathBuf,
    /// Config key → why no reference could be computed.
    failures: HashMap<String, String>,
    /// (config, peer, reference) → why the peer's own error could not be measured: asked once
    /// per configuration, not once per row (each attempt starts PyTorch, seconds on a GPU).
    peer_failures: std::sync::Mutex<HashMap<String, String>>,
}

/// FNV-1a 64 over `bytes`, as 16 hex digits: cheap, stable, and enough to tell two builds or
/// two result files apart (not a cryptographic hash).
pub fn content_hash(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// [`content_hash`] of the executable, computed once per process (every [`Cache::new`] asks:
/// `bench-all` checks its cache before the run, and each sweep worker opens one).
fn build_id() -> Result<String> {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    if let Some(id) = ID.get() {
        return Ok(id.clone());
    }
    let (image, exe) = crate::measure::child::running_executable()?;
    let bytes =
        std::fs::read(&image).with_context(|| format!("reading {} to hash it", exe.display()))?;
    Ok(ID.get_or_init(|| content_hash(&bytes)).clone())
}

/// The cache directory: `explicit`, else `$DENSEBENCH_CACHE_DIR`, else next to the executable.
pub fn default_dir(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(d) = explicit {
        return Ok(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os(CACHE_ENV) {
        return Ok(PathBuf::from(d));
    }
    let exe = std::env::current_exe().context("finding the densebench executable")?;
    let dir = exe
        .parent()
        .with_context(|| format!("{} has no parent directory", exe.display()))?;
    Ok(dir.join("densebench-cache"))
}

impl Cache {
    /// A cache under `root` (see [`default_dir`]); creates the directory.
    pub fn new(root: &Path) -> Result<Cache> {
        let dir = root.join(build_id()?);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating the reference cache {}", dir.display()))?;
        // Writable, checked now: else every configuration would compute its reference and fail
        // to keep it, and each of its rows would be an `error`.
        // One probe file per call: the workers of a sweep over several devices open their
        // caches at once in one process, and a name shared between them let one worker remove
        // the other's probe before it did (a flaky "not writable: No such file").
        static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let probe = dir.join(format!("write-probe.{n}.tmp{}", std::process::id()));
        std::fs::write(&probe, b"")
            .and_then(|()| std::fs::remove_file(&probe))
            .with_context(|| {
                format!(
                    "the reference cache {} is not writable: pass --cache-dir DIR or set \
                     {CACHE_ENV}",
                    dir.display()
                )
            })?;
        remove_stale_temporaries(&dir);
        Ok(Cache {
            dir,
            failures: HashMap::new(),
            peer_failures: std::sync::Mutex::default(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, cfg: &Config, s: &Settings, variant: Variant) -> PathBuf {
        let key = config_key(cfg, s.device).replace('/', "_");
        self.dir
            .join(format!("{key}.{}.safetensors", variant.name()))
    }

    /// The reference for `cfg`: cached, or computed now in a child process under the same
    /// settings (threads, memory and time limits). The inner `Err` says why none could be
    /// computed; the outer one that the run was stopped ([`interrupt::Interrupted`]).
    pub fn get(
        &mut self,
        cfg: &Config,
        s: &Settings,
    ) -> Result<std::result::Result<Reference, String>> {
        let key = config_key(cfg, s.device);
        if let Some(why) = self.failures.get(&key) {
            return Ok(Err(why.clone()));
        }
        let mut why = Vec::new();
        // once per configuration (on a GPU a query of the device), not per candidate
        let mut budget = None;
        for variant in candidates(cfg) {
            match self.candidate(cfg, s, variant, &mut budget) {
                Candidate::Cached(path) => return Ok(Ok(Reference { path, variant })),
                Candidate::TooBig(skipped) => why.push(skipped),
                Candidate::Compute(path) => match self.compute(cfg, s, variant, &path) {
                    Ok(()) => return Ok(Ok(Reference { path, variant })),
                    Err(e) if interrupt::interrupted(&e).is_some() => return Err(e),
                    Err(e) => why.push(format!("{variant}: {e}")),
                },
            }
        }
        let why = format!("no reference could be computed ({})", why.join("; "));
        self.failures.insert(key, why.clone());
        Ok(Err(why))
    }

    /// What [`get`](Self::get) does with `variant`, the next candidate for `cfg`: use its cached
    /// file, skip it (the model says it cannot fit `budget`, asked of [`reference_budget`] the
    /// first time it is needed), or compute it.
    fn candidate(
        &self,
        cfg: &Config,
        s: &Settings,
        variant: Variant,
        budget: &mut Option<Option<(u64, String)>>,
    ) -> Candidate {
        let path = self.path(cfg, s, variant);
        if cached(&path) {
            return Candidate::Cached(path);
        }
        let budget = budget.get_or_insert_with(|| reference_budget(s));
        if let (Some(need), Some((limit, what))) = (predicted_reference_bytes(variant, cfg), budget)
        {
            if need > *limit {
                return Candidate::TooBig(format!(
                    "{variant}: skipped, needs about {} MiB in f64, over {what}",
                    need >> 20
                ));
            }
        }
        Candidate::Compute(path)
    }

    /// The reference [`get`](Self::get) would compute for `cfg` now, by the same steps: `None`
    /// when it would use a cached one, or knows none can be computed; else the first candidate
    /// it would compute. What the sweep's progress counts a configuration's first row for and
    /// says it waits for ([`crate::results::runner`]); should that candidate fail, `get` goes
    /// on to the next.
    pub fn to_compute(&self, cfg: &Config, s: &Settings) -> Option<Variant> {
        if self.failures.contains_key(&config_key(cfg, s.device)) {
            return None;
        }
        let mut budget = None;
        for variant in candidates(cfg) {
            match self.candidate(cfg, s, variant, &mut budget) {
                Candidate::Cached(_) => return None,
                Candidate::TooBig(_) => {}
                Candidate::Compute(_) => return Some(variant),
            }
        }
        None
    }

    /// The case file of `cfg` (written now if it is not cached, or its cached file does not
    /// read): exactly the parameters, BN
    /// state, input and upstream gradient densebench's child builds from the seed.
    pub fn case(&self, cfg: &Config, s: &Settings) -> Result<PathBuf> {
        let key = config_key(cfg, s.device).replace('/', "_");
        let path = self.dir.join(format!("{key}.case.safetensors"));
        if cached(&path) {
            return Ok(path);
        }
        let case = impls::Case::random(cfg, &candle_core::Device::Cpu)
            .map_err(|e| anyhow!("building the case of {}: {e}", cfg.describe()))?;
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let written = case
            .save(&tmp)
            .map_err(|e| anyhow!("writing the case file {}: {e}", tmp.display()))
            .and_then(|()| {
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("moving {} to {}", tmp.display(), path.display()))
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written.map(|()| path)
    }

    fn peer_error_path(&self, cfg: &Config, s: &Settings, v: PeerVariant) -> PathBuf {
        self.error_path(cfg, s, v.name())
    }

    /// `<config key>.<who>.error.json`: the cached f32 error of `who` (a peer variant, or
    /// densebench's naive variant) on the config's case.
    fn error_path(&self, cfg: &Config, s: &Settings, who: &str) -> PathBuf {
        let key = format!("{}{}", config_key(cfg, s.device), s.math.key_suffix()).replace('/', "_");
        self.dir.join(format!("{key}.{who}.error.json"))
    }

    /// Remembers the relative error of a peer variant's result against this config's
    /// reference (`reference`: the reference column, so a cached error is used only with the
    /// same reference).
    pub fn record_peer_error(
        &self,
        cfg: &Config,
        s: &Settings,
        v: PeerVariant,
        reference: &str,
        max_rel_err: f64,
    ) -> Result<()> {
        write_error(
            &self.peer_error_path(cfg, s, v),
            &PeerError {
                variant: v.name().to_string(),
                reference: reference.to_string(),
                max_rel_err,
            },
        )
    }

    /// An error figure a tolerance is derived from: `known` (cached on disk), else the failure
    /// already met this run under `memo` (measured once, not again per row), else `measure`d now,
    /// a failure remembered under `memo` (an interruption is not a failure).
    fn known_or_measured(
        &self,
        known: Option<f64>,
        memo: String,
        measure: impl FnOnce() -> Result<f64>,
    ) -> Result<f64> {
        if let Some(e) = known {
            return Ok(e);
        }
        let failed_before = self
            .peer_failures
            .lock()
            .ok()
            .and_then(|m| m.get(&memo).cloned());
        if let Some(why) = failed_before {
            return Err(anyhow!("{why}"));
        }
        let measured = measure();
        if let Err(e) = &measured {
            if interrupt::interrupted(e).is_none() {
                if let Ok(mut m) = self.peer_failures.lock() {
                    m.insert(memo, format!("{e:#}"));
                }
            }
        }
        measured
    }

    /// A recorded peer error on this config, if any.
    fn peer_error(&self, cfg: &Config, s: &Settings, v: PeerVariant) -> Option<PeerError> {
        read_error(&self.peer_error_path(cfg, s, v))
    }

    /// The f32 tolerance of a peer row of `cfg` and a note when it is not what the reader
    /// expects ([`measure::peer_row_tolerance`]): derived from densebench's naive variant's
    /// error on the same case against the same reference — cached beside it
    /// (`<config key>.cat-store-copy.error.json`), else measured now (one step of the child, no
    /// warm-up, `ieee` math) and cached. When it cannot be measured (out of memory, …), or for a
    /// `tf32` peer row (its own step is in TF32, whose error alone is a bug's size:
    /// [`measure::TF32_REL_BOUND`]), the documented bound, and the note says why. Never from a
    /// peer row's own error.
    pub fn peer_row_tolerance(
        &self,
        cfg: &Config,
        s: &Settings,
        reference: &Reference,
    ) -> Result<(f64, String)> {
        let documented = measure::documented_tolerance(cfg.dtype);
        if cfg.dtype == measure::REFERENCE_DTYPE {
            return Ok((documented, String::new()));
        }
        if s.math != Math::Ieee {
            return Ok((
                documented,
                format!(
                    "tolerance is the documented f32 bound: the peer's step ran in {} math",
                    s.math.name()
                ),
            ));
        }
        let label = measure::reference_label(reference.variant);
        let naive = Variant::NAIVE;
        let path = self.error_path(cfg, s, naive.name().as_str());
        let known = read_error(&path)
            .filter(|e| e.reference == label)
            .map(|e| e.max_rel_err);
        let memo = format!("{}|densebench|{label}", config_key(cfg, s.device));
        let err = self.known_or_measured(known, memo, || {
            self.measure_dense_error(cfg, s, reference, &label, &path)
        });
        match err {
            Ok(e) if e.is_finite() => Ok((measure::peer_row_tolerance(cfg, e), String::new())),
            Ok(e) => Ok((
                documented,
                format!(
                    "tolerance is the documented f32 bound: densebench's {naive} error on this \
                     case is {e}"
                ),
            )),
            Err(e) if interrupt::interrupted(&e).is_some() => Err(e),
            Err(e) => Ok((
                documented,
                format!(
                    "tolerance is the documented f32 bound: densebench's {naive} error on this \
                     case is unknown ({})",
                    format!("{e:#}").replace(['\n', '\r'], " | ")
                ),
            )),
        }
    }

    /// One unmeasured step of densebench's naive variant on the case in `ieee` math, checked
    /// against `reference` by its own child; its relative error is cached at `path`.
    fn measure_dense_error(
        &self,
        cfg: &Config,
        s: &Settings,
        reference: &Reference,
        label: &str,
        path: &Path,
    ) -> Result<f64> {
        let naive = Variant::NAIVE;
        let one = Settings {
            steps: 1,
            warmup: 0,
            math: Math::Ieee,
            execution: Execution::Eager,
            ..s.clone()
        };
        let mut args = child::flags(naive, cfg, &one);
        args.extend([
            "--reference".to_string(),
            reference.path.display().to_string(),
            "--reference-variant".to_string(),
            reference.variant.name(),
        ]);
        let err = match child::spawn(&args, &one)? {
            Outcome::Ok(stdout) => child::parse_measurement(&stdout)?
                .errors
                .map(|e| e.max_rel)
                .with_context(|| format!("{naive}'s child reported no errors"))?,
            o => return Err(anyhow!("{naive}: {}", outcome_message(&o))),
        };
        write_error(
            path,
            &PeerError {
                variant: naive.name(),
                reference: label.to_string(),
                max_rel_err: err,
            },
        )?;
        Ok(err)
    }

    /// The relative error `grad_ok` of a densebench row of `cfg` is judged against, and a note
    /// when it is not what the reader expects. Without a peer: the dtype's documented bound
    /// ([`measure::documented_tolerance`]). With one: derived from the naive peer's error on
    /// the same case ([`measure::peer_derived_tolerance`]) — recorded when its row ran, else
    /// measured now (one step, no warm-up) and recorded; when the peer cannot give it, the
    /// documented bound, and the note says why. Never from a densebench row.
    pub fn tolerance(
        &mut self,
        cfg: &Config,
        s: &Settings,
        peer: Option<Peer>,
        reference: &Reference,
    ) -> Result<(f64, String)> {
        let documented = measure::documented_tolerance(cfg.dtype);
        let Some(peer) = peer else {
            return Ok((documented, String::new()));
        };
        if cfg.dtype == measure::REFERENCE_DTYPE {
            return Ok((documented, String::new()));
        }
        let label = measure::reference_label(reference.variant);
        let naive = PeerVariant::NAIVE;
        let known = self
            .peer_error(cfg, s, naive)
            .filter(|e| e.reference == label)
            .map(|e| e.max_rel_err);
        let memo = format!("{}|{peer}|{label}", config_key(cfg, s.device));
        let err = self.known_or_measured(known, memo, || {
            self.measure_peer_error(cfg, s, naive, reference, &label)
        });
        match err {
            Ok(e) if e.is_finite() => Ok((measure::peer_derived_tolerance(cfg, e), String::new())),
            Ok(e) => Ok((
                documented,
                format!(
                    "tolerance is the documented f32 bound: {peer}'s own error on this case is {e}"
                ),
            )),
            Err(e) if interrupt::interrupted(&e).is_some() => Err(e),
            Err(e) => Ok((
                documented,
                format!(
                    "tolerance is the documented f32 bound: {peer}'s own error on this case is \
                     unknown ({})",
                    format!("{e:#}").replace(['\n', '\r'], " | ")
                ),
            )),
        }
    }

    /// One unmeasured step of the peer's variant `v` on the case, compared with `reference`;
    /// its error is recorded.
    fn measure_peer_error(
        &self,
        cfg: &Config,
        s: &Settings,
        v: PeerVariant,
        reference: &Reference,
        label: &str,
    ) -> Result<f64> {
        let case = self.case(cfg, s)?;
        let out = self.dir.join(format!(
            "{}.{}.result.tmp{}",
            config_key(cfg, s.device).replace('/', "_"),
            v.name(),
            std::process::id()
        ));
        let one = Settings {
            steps: 1,
            warmup: 0,
            ..s.clone()
        };
        let outcome = crate::measure::peer::run(v, cfg, &one, &case, &out);
        let err = match outcome {
            Ok(Outcome::Ok(_)) => crate::measure::peer::compare(cfg, &case, &out, &reference.path)
                .map(|c| c.overall.max_rel),
            Ok(o) => Err(anyhow!("{v}: {}", outcome_message(&o))),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&out);
        let err = err?;
        self.record_peer_error(cfg, s, v, label, err)?;
        Ok(err)
    }

    fn compute(&self, cfg: &Config, s: &Settings, variant: Variant, path: &Path) -> Result<()> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut args = child::flags(variant, cfg, s);
        args.extend(["--save-result".to_string(), tmp.display().to_string()]);
        // One step, no warm-up: the reference is not timed.
        let outcome = child::spawn(&args, s);
        let result = match outcome {
            // Stopped, or no child could be started: nothing to keep.
            Err(e) => Err(e),
            Ok(outcome) => match outcome {
                Outcome::Ok(_) => std::fs::rename(&tmp, path)
                    .with_context(|| format!("moving {} to {}", tmp.display(), path.display())),
                Outcome::Oom(m) => Err(anyhow::anyhow!("oom: {m}")),
                Outcome::Timeout(t) => Err(anyhow::anyhow!("timeout after {} s", t.as_secs())),
                Outcome::Killed(m) | Outcome::Crashed(m) => Err(anyhow::anyhow!("{m}")),
                Outcome::Error(m) => Err(anyhow::anyhow!("error: {m}")),
            },
        };
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

/// A variant's relative error on a config's case against its reference (a peer's, or
/// densebench's naive one), cached as JSON; a NaN or infinite error is written as text
/// ([`measure::nonfinite`]), so it reads back as what it was.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct PeerError {
    variant: String,
    reference: String,
    #[serde(with = "measure::nonfinite")]
    max_rel_err: f64,
}

/// The cached error at `path`, if there is a readable one.
fn read_error(path: &Path) -> Option<PeerError> {
    let bytes =
        input::read_bounded(path, "cached peer error", MAX_JSON_BYTES, "MAX_JSON_BYTES").ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Caches `e` at `path` (written under a temporary name and renamed).
fn write_error(path: &Path, e: &PeerError) -> Result<()> {
    let text = serde_json::to_string(e).context("serialising a cached error")?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing {}", path.display()));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// A failed child's outcome in a few words.
fn outcome_message(o: &Outcome) -> String {
    match o {
        Outcome::Ok(_) => "ok".to_string(),
        Outcome::Timeout(t) => format!("timeout after {} s", t.as_secs()),
        Outcome::Oom(m) => format!("oom: {m}"),
        Outcome::Killed(m) | Outcome::Crashed(m) | Outcome::Error(m) => m.clone(),
    }
}

/// The parent process id in a temporary file's name (`x.safetensors` → `x.tmp1234`, its noise
/// file `x.tmp1234.noise.json`), if `name` is one.
fn temporary_owner(name: &str) -> Option<i32> {
    let stem = name.strip_suffix(".noise.json").unwrap_or(name);
    let (_, pid) = stem.rsplit_once(".tmp")?;
    if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Removes the temporary files in `dir` whose parent no longer runs (a parent killed with
/// SIGKILL cannot remove its own). Best effort: a file that cannot be removed stays.
fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name.to_str().and_then(temporary_owner) else {
            continue;
        };
        if !crate::measure::interrupt::process_exists(pid) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Whether `path` is a cached file to use: it exists and its safetensors header reads, within
/// the file (every tensor's data inside it). A file that does not — cut short by a full disk
/// or a copy, or not safetensors — is said once and computed again over (each cache file is
/// written by a rename, so densebench itself never leaves one half-written); a row would
/// otherwise be an `error` on every run until someone deleted it by hand.
fn cached(path: &Path) -> bool {
    if !path.is_file() {
        return false;
    }
    let reads = std::fs::File::open(path)
        .map_err(|e| e.to_string())
        .and_then(|mut f| {
            let len = f.metadata().map_err(|e| e.to_string())?.len();
            impls::case::header::read_header(&mut f, len, None)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
    match reads {
        Ok(()) => true,
        Err(why) => {
            crate::say!(
                "densebench: the cached file {} does not read ({why}): computing it again",
                path.display()
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The workers of a sweep over several devices open their caches at once in one process:
    /// each one's writability probe must be its own (a shared probe name let one remove the
    /// other's first, a flaky "not writable" for a writable cache).
    #[test]
    fn caches_opened_at_once_in_one_process_all_succeed() {
        let root = tempfile::tempdir().expect("temp dir");
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..200 {
                        if let Err(e) = Cache::new(root.path()) {
                            panic!("{e:#}");
                        }
                    }
                });
            }
        });
    }

    /// A CPU reference must fit the child's limit; a GPU one the device's memory (none known
    /// where no GPU is usable: no pre-check then, the child's own error decides).
    #[test]
    fn a_reference_fits_the_host_limit_on_the_cpu_and_the_device_on_a_gpu() {
        let mut s = Settings::cpu_test(Some(2 << 30));
        assert_eq!(
            reference_budget(&s),
            Some((2 << 30, "the 2048 MiB limit".to_string()))
        );
        s.mem_limit = None;
        assert_eq!(reference_budget(&s), None);
        s.device = DeviceSpec::Cuda(0);
        s.mem_limit = Some(2 << 30);
        match crate::measure::gpu::check_available(0) {
            Ok(info) => assert_eq!(
                reference_budget(&s),
                Some((
                    info.total_memory_bytes,
                    format!("cuda:0's {} MiB", info.total_memory_bytes >> 20)
                ))
            ),
            // not the host's limit, which is not where a GPU reference lives
            Err(_) => assert_eq!(reference_budget(&s), None),
        }
    }

    /// What a sweep's progress counts for a configuration's reference: what `get` would compute,
    /// the first candidate the model lets fit, nothing once `get` would find one cached.
    #[test]
    fn the_reference_to_compute_is_the_first_that_fits_and_none_once_cached() {
        let root = tempfile::tempdir().expect("temp dir");
        let cache = Cache::new(root.path()).expect("cache");
        let cfg = Config::tiny(impls::Family::Bc);
        let mut s = Settings::cpu_test(None);
        assert_eq!(cache.to_compute(&cfg, &s), Some(Variant::Autograd));
        // a limit between naive's f64 footprint and autograd's: naive is what will run
        let naive = predicted_reference_bytes(Variant::NAIVE, &cfg).expect("naive model");
        let autograd = predicted_reference_bytes(Variant::Autograd, &cfg).expect("autograd");
        assert!(naive < autograd, "{naive} {autograd}");
        s.mem_limit = Some(naive);
        assert_eq!(cache.to_compute(&cfg, &s), Some(Variant::NAIVE));
        // a later candidate cached does not stop `get` computing an earlier one that fits…
        // (a cached file is one whose safetensors header reads: an empty one here)
        let empty: &[u8] = b"\x08\0\0\0\0\0\0\0{}      ";
        let [.., frugal] = candidates(&cfg);
        std::fs::write(cache.path(&cfg, &s, frugal), empty).expect("write");
        assert_eq!(cache.to_compute(&cfg, &s), Some(Variant::NAIVE));
        // …one that does not read is no cached file…
        std::fs::write(cache.path(&cfg, &s, Variant::NAIVE), b"x").expect("write");
        assert_eq!(cache.to_compute(&cfg, &s), Some(Variant::NAIVE));
        // …the first one that fits, cached: nothing to compute
        std::fs::write(cache.path(&cfg, &s, Variant::NAIVE), empty).expect("write");
        assert_eq!(cache.to_compute(&cfg, &s), None);
    }

    #[test]
    fn temporary_names_give_their_owner() {
        assert_eq!(temporary_owner("mlp_2.autograd.tmp1234"), Some(1234));
        assert_eq!(
            temporary_owner("mlp_2.autograd.tmp1234.noise.json"),
            Some(1234)
        );
        assert_eq!(temporary_owner("mlp_2.autograd.safetensors"), None);
        assert_eq!(temporary_owner("mlp_2.autograd.tmpx"), None);
    }

    #[test]
    fn stale_temporaries_are_removed_live_ones_kept() {
        let dir = tempfile::tempdir().expect("temp dir");
        // Pids are at most 2^22 on Linux (pid_max), so this one runs nowhere.
        let stale = dir.path().join("a.autograd.tmp99999999");
        let mine = dir
            .path()
            .join(format!("b.autograd.tmp{}.noise.json", std::process::id()));
        let done = dir.path().join("c.autograd.safetensors");
        for p in [&stale, &mine, &done] {
            std::fs::write(p, b"x").expect("write");
        }
        remove_stale_temporaries(dir.path());
        assert!(!stale.exists());
        assert!(mine.exists() && done.exists());
    }
}
