//! Process isolation: the hidden `child` subcommand (one measurement, or one reference step, in
//! a fresh process) and the parent's side, which spawns it with its thread count, enforces the
//! time limit and classifies how it ended.
//!
//! Protocol: the child prints one JSON [`Measurement`] as the last line of its stdout and exits
//! 0. Anything else is a failure: killed at the time limit → `timeout`; aborted with Rust's
//! "memory allocation of N bytes failed" (the counting allocator refused to pass the memory
//! limit) or killed by SIGKILL it did not get from us (the kernel's OOM killer) → `oom`; any
//! other exit → `error` with the child's last stderr line.

use crate::measure::alloc;
use crate::measure::device::DeviceSpec;
use crate::measure::step::{self as measure, Measurement};
use crate::plan::job::{ConfigArgs, Settings};
use anyhow::{anyhow, Context, Result};
use impls::Variant;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

/// Arguments of the hidden `child` subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Variant to run.
    #[arg(long)]
    pub variant: String,
    /// Device (`cpu` or `cuda:N`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Allocator limit in bytes.
    #[arg(long)]
    pub mem_limit: Option<u64>,
    /// Reference result file to compare the last measured step with.
    #[arg(long, requires = "reference_variant")]
    pub reference: Option<PathBuf>,
    /// The variant the reference was computed with.
    #[arg(long)]
    pub reference_variant: Option<String>,
    /// Reference mode: run one unmeasured step and save its results here.
    #[arg(long, conflicts_with = "reference")]
    pub save_result: Option<PathBuf>,
}

/// The child's entry point.
pub fn child(a: Args) -> Result<ExitCode> {
    // First: the limit covers everything the child allocates from here on.
    alloc::set_limit(
        a.mem_limit
            .map(|b| usize::try_from(b).unwrap_or(usize::MAX)),
    );
    let cfg = a.config.to_config()?;
    let variant = Variant::parse(&a.variant).map_err(|e| anyhow!("--variant: {e}"))?;
    let spec: DeviceSpec = a.device.parse()?;
    if let Some(out) = &a.save_result {
        measure::save_reference(variant, &cfg, spec, out)?;
        return Ok(ExitCode::SUCCESS);
    }
    let reference = match (&a.reference, &a.reference_variant) {
        (Some(p), Some(v)) => Some((
            p.as_path(),
            Variant::parse(v).map_err(|e| anyhow!("--reference-variant: {e}"))?,
        )),
        _ => None,
    };
    let m = measure::measure(variant, &cfg, spec, a.steps, a.warmup, reference)?;
    let line = serde_json::to_string(&m).context("serialising the measurement")?;
    println!("{line}");
    Ok(ExitCode::SUCCESS)
}

/// How a child process ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Exit 0; its stdout.
    Ok(String),
    /// Out of memory, with what the child said.
    Oom(String),
    /// Killed at the time limit.
    Timeout(Duration),
    /// Any other failure, with the child's last stderr line.
    Error(String),
}

/// The row status of an outcome.
impl Outcome {
    pub fn status(&self) -> &'static str {
        match self {
            Outcome::Ok(_) => "ok",
            Outcome::Oom(_) => "oom",
            Outcome::Timeout(_) => "timeout",
            Outcome::Error(_) => "error",
        }
    }
}

/// The child flags for `variant` on `cfg` under `s` (without the mode flags).
pub fn flags(variant: Variant, cfg: &impls::Config, s: &Settings) -> Vec<String> {
    let mut f = vec!["child".to_string()];
    f.extend(ConfigArgs::from_config(cfg).to_flags());
    f.extend([
        "--variant".to_string(),
        variant.name(),
        "--device".to_string(),
        s.device.to_string(),
        "--steps".to_string(),
        s.steps.to_string(),
        "--warmup".to_string(),
        s.warmup.to_string(),
    ]);
    if let Some(limit) = s.mem_limit {
        f.extend(["--mem-limit".to_string(), limit.to_string()]);
    }
    f
}

/// How often the parent checks whether the child has exited.
const POLL: Duration = Duration::from_millis(10);

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // A read error leaves what was read; the exit status tells what happened.
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// The last stderr line worth showing (panics end with a `note: run with RUST_BACKTRACE` line).
fn last_line(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .map(str::trim)
        .rev()
        .find(|l| !l.is_empty() && !l.starts_with("note:"))
        .map(|l| {
            l.strip_prefix("densebench: error: ")
                .unwrap_or(l)
                .to_string()
        })
}

/// Runs this binary with `args` as a child process with `s.threads` compute threads, killing it
/// after `s.timeout`. Errs only when the child cannot be started at all.
pub fn spawn(args: &[String], s: &Settings) -> Result<Outcome> {
    let exe = std::env::current_exe().context("finding the densebench executable to re-run")?;
    let threads = s.threads.to_string();
    let mut child = Command::new(&exe)
        .args(args)
        // candle's CPU backend and gemm read RAYON_NUM_THREADS (candle_core::utils::
        // get_num_threads); CANDLE_NUM_THREADS sizes its barrier pool (defaults to the former).
        .env("RAYON_NUM_THREADS", &threads)
        .env("CANDLE_NUM_THREADS", &threads)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let out = child.stdout.take().map(read_all);
    let err = child.stderr.take().map(read_all);
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the child")? {
            break status;
        }
        if start.elapsed() >= s.timeout {
            timed_out = true;
            // Kill our own child by its handle; then reap it.
            let _ = child.kill();
            break child.wait().context("reaping the killed child")?;
        }
        std::thread::sleep(POLL);
    };
    let stdout = out.and_then(|h| h.join().ok()).unwrap_or_default();
    let stderr = err.and_then(|h| h.join().ok()).unwrap_or_default();
    Ok(classify(status, timed_out, s, stdout, &stderr))
}

fn classify(
    status: std::process::ExitStatus,
    timed_out: bool,
    s: &Settings,
    stdout: String,
    stderr: &str,
) -> Outcome {
    use std::os::unix::process::ExitStatusExt;
    if timed_out {
        return Outcome::Timeout(s.timeout);
    }
    if status.success() {
        return Outcome::Ok(stdout);
    }
    let limit = s
        .mem_limit
        .map(|l| format!(" (memory limit {l} bytes)"))
        .unwrap_or_default();
    if let Some(line) = stderr
        .lines()
        .find(|l| l.contains("memory allocation of") && l.contains("failed"))
    {
        return Outcome::Oom(format!("{}{limit}", line.trim()));
    }
    if status.signal() == Some(libc::SIGKILL) {
        return Outcome::Oom(format!(
            "killed by SIGKILL (likely the kernel's OOM killer){limit}"
        ));
    }
    let what = match (status.code(), status.signal()) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown exit".to_string(),
    };
    Outcome::Error(match last_line(stderr) {
        Some(l) => format!("{l} ({what})"),
        None => format!("child failed with {what} and no message"),
    })
}

/// Parses the child's measurement (the last non-empty stdout line).
pub fn parse_measurement(stdout: &str) -> Result<Measurement> {
    let line = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .context("the child printed no measurement")?;
    serde_json::from_str(line).with_context(|| format!("the child's measurement `{line}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_line_skips_notes_and_prefix() {
        let s = "thread 'main' panicked at x.rs:1:1:\nboom\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(last_line(s).as_deref(), Some("boom"));
        assert_eq!(
            last_line("densebench: error: bad thing\n").as_deref(),
            Some("bad thing")
        );
        assert_eq!(last_line("\n \n"), None);
    }

    #[test]
    fn flags_round_trip_through_config_args() {
        #[derive(clap::Parser)]
        struct T {
            #[command(flatten)]
            c: ConfigArgs,
        }
        use clap::Parser;
        for family in impls::Family::ALL {
            let cfg = crate::plan::job::normalize(impls::Config::tiny(family));
            let argv =
                std::iter::once("t".to_string()).chain(ConfigArgs::from_config(&cfg).to_flags());
            let parsed = T::try_parse_from(argv).map_err(|e| e.to_string());
            let back = parsed.and_then(|t| t.c.to_config().map_err(|e| e.to_string()));
            assert_eq!(back, Ok(cfg));
        }
    }
}
