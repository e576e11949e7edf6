//! The PyTorch peer's side of a measurement (`harness/peer/pytorch_peer.py`, its contract in
//! harness/peer/README.md): finding the program, probing once that PyTorch is importable,
//! running one peer variant on a case file in an isolated child process (same warm-up, steps,
//! threads, memory and time limits as densebench's children), classifying how it ended
//! (exit 4 → `oom`), parsing its one JSON line, and comparing its RESULT file with densebench's
//! f64 reference exactly as a densebench row's result is compared.

use crate::measure::child::{self, Outcome};
use crate::plan::job::{PeerVariant, Settings};
use anyhow::{anyhow, bail, Context, Result};
use candle_core::Device;
use impls::check::compare::Comparison;
use impls::Config;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Environment variable naming the peer program to run instead of the repository's
/// `harness/peer/pytorch_peer.py` (a copy elsewhere, or a fake one in tests).
pub const SCRIPT_ENV: &str = "DENSEBENCH_PEER";
/// Environment variable naming the Python interpreter that starts the peer (default `python3`;
/// the peer re-executes itself with its venv's Python when this one has no PyTorch).
pub const PYTHON_ENV: &str = "DENSEBENCH_PYTHON";
/// The peer program's path inside the repository.
pub const SCRIPT_IN_REPO: &str = "harness/peer/pytorch_peer.py";
/// Environment variable whose value, when set, is the peer's `LD_LIBRARY_PATH` (empty: none):
/// on a GPU machine densebench's binaries may need CUDA libraries first on the path that are
/// not the ones PyTorch ships with; PyTorch should load its own, as it does outside densebench,
/// so that its rows time the PyTorch a user runs (`scripts/gpu-session.sh` sets it to the path
/// it found).
pub const LD_PATH_ENV: &str = "DENSEBENCH_PEER_LD_LIBRARY_PATH";
/// The peer's exit status for "out of memory" (its `--mem-limit`, or the device's).
pub const EXIT_OOM: i32 = 4;
/// The peer's exit status for "PyTorch is not importable".
pub const EXIT_NO_TORCH: i32 = 3;
/// What to do when PyTorch is missing, for messages.
pub const SETUP_HINT: &str = "run `just peer-setup` (harness/peer/setup.sh: a venv with the \
     pinned torch + torchvision in harness/peer/.venv-peer, or an importable PyTorch)";
/// Time limit of the `--check` probe: importing torch took 12.7 s on 2 busy cores.
pub const CHECK_TIMEOUT_SECS: u64 = 120;

/// The command that starts the peer's Python, with its `LD_LIBRARY_PATH` from [`LD_PATH_ENV`]
/// where that is set.
fn python_command() -> Command {
    let mut cmd = Command::new(python());
    match std::env::var_os(LD_PATH_ENV) {
        Some(p) if p.is_empty() => {
            cmd.env_remove("LD_LIBRARY_PATH");
        }
        Some(p) => {
            cmd.env("LD_LIBRARY_PATH", p);
        }
        None => {}
    }
    cmd
}

/// The peer program: `$DENSEBENCH_PEER`; else `harness/peer/pytorch_peer.py` of the source tree
/// this binary was built from (`CARGO_MANIFEST_DIR/peer/`), if it is still there; else of the
/// first ancestor of the executable that holds one (a copied checkout); else of the current
/// directory. Errs naming every place looked at.
pub fn script() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(SCRIPT_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            bail!("{SCRIPT_ENV}={} is not a file", p.display());
        }
        return Ok(p);
    }
    let mut tried = Vec::new();
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("peer/pytorch_peer.py");
    tried.push(built);
    if let Ok(exe) = std::env::current_exe() {
        tried.extend(exe.ancestors().skip(1).map(|d| d.join(SCRIPT_IN_REPO)));
    }
    if let Ok(cwd) = std::env::current_dir() {
        tried.push(cwd.join(SCRIPT_IN_REPO));
    }
    if let Some(p) = tried.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    bail!(
        "the PyTorch peer {SCRIPT_IN_REPO} was not found (looked in the source tree this binary \
         was built from, above the executable and in the current directory): run from a \
         densebench checkout or set {SCRIPT_ENV}=/path/to/pytorch_peer.py"
    )
}

fn python() -> std::ffi::OsString {
    std::env::var_os(PYTHON_ENV)
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "python3".into())
}

/// The interpreter that starts the peer and where it comes from, for messages:
/// `DENSEBENCH_PYTHON=/bin/false`, or `python3 (the default; DENSEBENCH_PYTHON chooses another)`.
pub fn interpreter() -> String {
    match std::env::var_os(PYTHON_ENV).filter(|p| !p.is_empty()) {
        Some(p) => format!("{PYTHON_ENV}={}", p.to_string_lossy()),
        None => format!("python3 (the default; {PYTHON_ENV} chooses another)"),
    }
}

/// The peer's command as run, `python3 /path/pytorch_peer.py`, for messages (the script as
/// [`script`] finds it, or its path in the repository when it is not found).
pub fn command_line() -> String {
    let script = script().unwrap_or_else(|_| PathBuf::from(SCRIPT_IN_REPO));
    format!("{} {}", python().to_string_lossy(), script.display())
}

/// The framework version the `--check` probe reported, once it ran in this process.
static PROBED: OnceLock<String> = OnceLock::new();

/// What `--check` said: PyTorch's and torchvision's versions.
pub fn probed_version() -> Option<&'static str> {
    PROBED.get().map(String::as_str)
}

#[derive(Deserialize)]
struct CheckLine {
    framework_version: String,
}

/// Runs `pytorch_peer.py --check` once: Ok with the framework version, or Err with one line
/// saying why no peer row can be measured and how to get PyTorch.
pub fn check() -> std::result::Result<String, String> {
    let script = script().map_err(|e| format!("{e:#}"))?;
    let s = Settings {
        device: crate::plan::device::DeviceSpec::Cpu,
        math: crate::plan::job::Math::Ieee,
        execution: crate::plan::job::Execution::Eager,
        threads: 1,
        steps: 1,
        warmup: 0,
        mem_limit: None,
        timeout: std::time::Duration::from_secs(CHECK_TIMEOUT_SECS),
    };
    let mut cmd = python_command();
    cmd.arg(&script).arg("--check");
    let py = python().to_string_lossy().into_owned();
    let probe = format!("`{py} {} --check`", script.display());
    let interpreter = interpreter();
    let ended = child::run(cmd, &s).map_err(|e| {
        format!(
            "--peer pytorch: cannot start the interpreter {py} ({interpreter}) to run \
             {probe}: {e:#}; set {PYTHON_ENV} to a Python 3, then {SETUP_HINT}"
        )
    })?;
    if ended.timed_out {
        return Err(format!(
            "--peer pytorch: {probe} did not answer within {CHECK_TIMEOUT_SECS} s \
             (interpreter {interpreter})"
        ));
    }
    let why = child::last_line(&ended.stderr);
    let ended_how = match ended.status.code() {
        Some(c) => format!("exit status {c}"),
        None => "killed by a signal".to_string(),
    };
    match (ended.status.code(), why) {
        (Some(0), _) => {}
        (Some(EXIT_NO_TORCH), Some(why)) => {
            return Err(format!(
                "--peer pytorch: {why} (interpreter {interpreter}, {probe})"
            ))
        }
        (_, why) => {
            return Err(format!(
                "--peer pytorch: {probe} failed ({}, {ended_how}): is the interpreter \
                 {interpreter} a Python 3? If it is, {SETUP_HINT}",
                why.as_deref().unwrap_or("no message")
            ))
        }
    }
    let line = ended
        .stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let parsed: CheckLine = serde_json::from_str(line).map_err(|e| {
        let printed = if line.is_empty() {
            "printed nothing".to_string()
        } else {
            format!("printed `{}`", clip(line))
        };
        format!(
            "--peer pytorch: {probe} exited 0 but {printed}, not the peer's JSON line ({e}): \
             is the interpreter {interpreter} the Python that runs the peer, and {} the \
             peer ({SCRIPT_ENV})?",
            script.display()
        )
    })?;
    let _ = PROBED.set(parsed.framework_version.clone());
    Ok(parsed.framework_version)
}

/// The peer's command line for `variant` on the case file `case` (the config's), writing its
/// RESULT to `out`: the same warm-up, steps, threads, device and memory limit as densebench's.
pub fn args(
    variant: PeerVariant,
    cfg: &Config,
    s: &Settings,
    case: &Path,
    out: &Path,
) -> Vec<String> {
    let mut a = vec![
        "--case".to_string(),
        case.display().to_string(),
        "--family".to_string(),
        cfg.family.name().to_string(),
        "--variant".to_string(),
        variant.name().to_string(),
        "--device".to_string(),
        s.device.to_string(),
        "--dtype".to_string(),
        cfg.dtype.as_str().to_string(),
        "--warmup".to_string(),
        s.warmup.to_string(),
        "--steps".to_string(),
        s.steps.to_string(),
        "--threads".to_string(),
        s.threads.to_string(),
        "--math".to_string(),
        s.math.name().to_string(),
        "--out".to_string(),
        out.display().to_string(),
    ];
    if cfg.family == impls::Family::Mlp {
        a.extend([
            "--activation".to_string(),
            if cfg.activation { "on" } else { "off" }.to_string(),
        ]);
    }
    if let Some(limit) = s.mem_limit {
        a.extend(["--mem-limit".to_string(), limit.to_string()]);
    }
    a
}

/// At most this many characters of what a peer printed go into a message or a row's `error`.
pub const SHOWN_CHARS: usize = 200;

/// `text`, cut to [`SHOWN_CHARS`] characters (`…` where cut).
pub fn clip(text: &str) -> String {
    match text.char_indices().nth(SHOWN_CHARS) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}

/// Runs the peer's `variant` on `case` in its own child process, writing its RESULT to `out`.
/// Exit 0 → `Ok` with its stdout; exit 4 → `oom`; killed at the time limit → `timeout`; any
/// other end → as densebench's children (`error` with the peer's one line, `crashed`, …), the
/// `error` and `crashed` messages naming the peer's command ([`command_line`]). An interpreter
/// that cannot be started at all is an `error` outcome too (the sweep goes on); only a stop
/// (`interrupt::Interrupted`) or a missing peer program is an `Err`.
pub fn run(
    variant: PeerVariant,
    cfg: &Config,
    s: &Settings,
    case: &Path,
    out: &Path,
) -> Result<Outcome> {
    let script = script()?;
    let mut cmd = python_command();
    cmd.arg(&script).args(args(variant, cfg, s, case, out));
    let named = |m: &str| format!("the peer `{}` ({}): {m}", command_line(), interpreter());
    let e = match child::run(cmd, s) {
        Ok(e) => e,
        Err(e) if crate::measure::interrupt::interrupted(&e).is_some() => return Err(e),
        Err(e) => return Ok(Outcome::Error(named(&format!("{e:#}")))),
    };
    if !e.timed_out && e.status.code() == Some(EXIT_OOM) {
        let why = child::last_line(&e.stderr).unwrap_or_else(|| "out of memory".to_string());
        return Ok(Outcome::Oom(why));
    }
    Ok(
        match child::classify(e.status, e.timed_out, s, e.stdout, &e.stderr) {
            Outcome::Error(m) => Outcome::Error(named(&clip(&m))),
            Outcome::Crashed(m) => Outcome::Crashed(named(&clip(&m))),
            other => other,
        },
    )
}

/// The peer's JSON line: the keys a row needs (harness/peer/README.md lists them all).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PeerMeasurement {
    pub framework: String,
    pub framework_version: String,
    pub device_desc: String,
    pub threads: usize,
    pub math: String,
    pub peak_bytes: u64,
    pub baseline_bytes: u64,
    /// Live bytes at the end of forward (the probe step); `None` for a CUDA-graph replay, whose
    /// memory is its graph pool's and invisible to the allocator.
    pub saved_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
    /// `eager`, `graph` or `compiled` (peers before schema 3 did not say: `eager`).
    #[serde(default)]
    pub execution: Option<String>,
    /// Warm-up steps run (a compiled variant raises `--warmup` to its minimum).
    #[serde(default)]
    pub warmup: Option<usize>,
    /// A compiled variant's warm-up beyond running steps (compiling, recording graphs), ns.
    #[serde(default)]
    pub compile_ns: Option<u64>,
    pub median_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub fwd_median_ns: u64,
    pub fwd_min_ns: u64,
    pub fwd_max_ns: u64,
    pub bwd_median_ns: u64,
    pub bwd_min_ns: u64,
    pub bwd_max_ns: u64,
    #[serde(default)]
    pub timeline: String,
    /// Training-mode updates of each BatchNorm's running stats in one step (bc; empty for mlp).
    #[serde(default)]
    pub bn_updates: BTreeMap<String, u32>,
    /// What the RESULT's running stats are: `after_forward` (the snapshot the harness compares)
    /// or `after_step`.
    #[serde(default)]
    pub running_snapshot: String,
    /// Where the peer's process spent its time outside the timed steps, `(phase, ns)` in order
    /// (`import`, `setup`, `warm-up`, `probe`, `steps`, `result`); empty from older peers.
    #[serde(default)]
    pub phases_ns: Vec<(String, u64)>,
}

impl PeerMeasurement {
    /// The BatchNorm modules whose running stats PyTorch updated more than once in a step.
    pub fn updated_twice(&self) -> Vec<&str> {
        self.bn_updates
            .iter()
            .filter(|(_, &n)| n > 1)
            .map(|(k, _)| k.as_str())
            .collect()
    }
}

/// Parses the peer's JSON line (the last non-empty line of its stdout).
pub fn parse(stdout: &str) -> Result<PeerMeasurement> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .context("the peer exited 0 but printed no JSON line")?;
    serde_json::from_str(line).with_context(|| {
        format!(
            "the peer's JSON line `{}` is not its measurement",
            clip(line)
        )
    })
}

/// The peer's RESULT file against a reference result file of the same config, both loaded on
/// the CPU in the config's dtype (as densebench's child compares its own step), its running
/// statistics judged by their update from the CASE file's ([`impls::check::compare::compare_updates`]).
pub fn compare(cfg: &Config, case: &Path, result: &Path, reference: &Path) -> Result<Comparison> {
    let before = impls::case::Case::load(case, Some(cfg.activation), &Device::Cpu)
        .map_err(|e| anyhow!("loading the case {}: {e}", case.display()))?
        .params
        .tensors;
    let ours = impls::case::load_result(cfg, result, &Device::Cpu)
        .map_err(|e| anyhow!("loading the peer's result {}: {e}", result.display()))?;
    let reference = impls::case::load_result(cfg, reference, &Device::Cpu)
        .map_err(|e| anyhow!("loading the reference {}: {e}", reference.display()))?;
    impls::check::compare::compare_updates(&ours, &reference, &before)
        .map_err(|e| anyhow!("comparing the peer's result with the reference: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_line_with_double_update() {
        let line = r#"{"framework":"pytorch","framework_version":"torch 2.15.0","device_desc":"cpu (1 threads)","threads":1,"math":"ieee","peak_bytes":10,"baseline_bytes":5,"saved_bytes":3,"peak_rss_bytes":null,"median_ns":9,"min_ns":8,"max_ns":10,"fwd_median_ns":4,"fwd_min_ns":4,"fwd_max_ns":4,"bwd_median_ns":5,"bwd_min_ns":5,"bwd_max_ns":5,"timeline":"f0=1","bn_updates":{"denselayer1.norm1":2,"denselayer1.norm2":1},"running_snapshot":"after_forward","extra":"ignored"}"#;
        let m = parse(&format!("noise\n{line}\n\n")).map_err(|e| format!("{e:#}"));
        let m = m.as_ref().map(|m| (m.updated_twice(), m.peak_bytes));
        assert_eq!(m, Ok((vec!["denselayer1.norm1"], 10)));
        assert!(parse("not json").is_err());
    }

    #[test]
    fn args_carry_the_settings() {
        let cfg = impls::Config::tiny(impls::Family::Mlp);
        let s = Settings {
            device: crate::plan::device::DeviceSpec::Cpu,
            math: crate::plan::job::Math::Ieee,
            execution: crate::plan::job::Execution::Eager,
            threads: 3,
            steps: 5,
            warmup: 2,
            mem_limit: Some(1 << 30),
            timeout: std::time::Duration::from_secs(1),
        };
        let a = args(
            PeerVariant::CHECKPOINT,
            &cfg,
            &s,
            Path::new("c.st"),
            Path::new("r.st"),
        )
        .join(" ");
        for want in [
            "--variant pytorch-checkpoint",
            "--threads 3",
            "--steps 5",
            "--warmup 2",
            "--mem-limit 1073741824",
            "--activation on",
            "--family mlp",
        ] {
            assert!(a.contains(want), "{a} lacks {want}");
        }
    }
}
