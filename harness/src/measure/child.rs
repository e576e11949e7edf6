//! Process isolation: the hidden `child` subcommand (one measurement, or one reference step, in
//! a fresh process) and the parent's side, which spawns it with its thread count, enforces the
//! time limit and classifies how it ended.
//!
//! Protocol: the child prints one JSON [`Measurement`] as the last line of its stdout and exits
//! 0. Anything else is a failure, named by what ended the child:
//! - killed by us at the time limit → `timeout`;
//! - ended with the one line "memory allocation of N bytes failed" (the counting allocator
//!   refused to pass the memory limit, or the system had no more, and exited with status 1:
//!   no abort, no backtrace) → `oom`, the only case where the memory limit is the evident
//!   cause; after the child said its measured steps were done
//!   ([`measure::CHECK_MARKER`]), the gradient check's → `error` (the step fit);
//! - killed by a crash signal ([`CRASH_SIGNALS`]: SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, …)
//!   → `crashed`, error `crashed (SIGSEGV)` and the child's last stderr line if it said one;
//! - killed by any other signal we did not send (SIGKILL from a user, a scheduler or the
//!   kernel's OOM killer; a stop signal the parent did not also receive, see below; …) →
//!   `killed`, error `killed by SIGKILL`;
//! - any other exit → `error` with the child's last stderr line.
//!
//! `killed` and `crashed` rows are the ones `--retries N` reruns ([`RETRIED_STATUSES`]): nothing
//! says the next run ends the same way. A child killed because the parent was told to stop
//! ([`crate::measure::interrupt`]) is no row at all: [`spawn`] returns the `Interrupted` error.
//!
//! Children die with their parent: each child sets `PR_SET_PDEATHSIG` (SIGKILL) before it
//! starts, so a parent killed even with SIGKILL takes it along, and leads its own process group,
//! so a terminal's Ctrl-C reaches only the parent, which kills the group and stops in order.
//! Children ignore the stop signals (SIGTERM, SIGINT, SIGHUP): a scheduler cancelling a job
//! (Slurm's `scancel`) signals every process of it, and a child that died of that signal before
//! its parent saw its own would have been written as a `killed` row — a cancelled sweep's
//! artefact that `--resume` then kept. The parent kills its children with SIGKILL instead. A
//! child whose program reinstates a stop signal and dies of it (a peer's interpreter may) gets
//! [`STOP_GRACE`] for the parent's own signal to arrive before it counts as `killed`.

use crate::measure::alloc;
use crate::measure::device::{self, DeviceSpec};
use crate::measure::interrupt::{self, signal_name};
use crate::measure::step::{self as measure, Measurement};
use crate::plan::job::{ConfigArgs, Math, Settings};
use anyhow::{anyhow, Context, Result};
use impls::Variant;
use std::io::Read;
use std::os::unix::process::CommandExt;
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
    /// f32 math of matmuls and convolutions: `ieee` or `tf32` (GPU only).
    #[arg(long, value_enum, default_value_t = Math::Ieee)]
    pub math: Math,
    /// `graph`: time the step as CUDA-graph replays (after the eager steps that are checked).
    #[arg(long, value_enum, default_value_t = crate::plan::job::Execution::Eager)]
    pub execution: crate::plan::job::Execution,
    /// Reference result file to compare the last measured step with.
    #[arg(long, requires = "reference_variant")]
    pub reference: Option<PathBuf>,
    /// The variant the reference was computed with.
    #[arg(long)]
    pub reference_variant: Option<String>,
    /// The relative error `grad_ok` is judged against (default: the dtype's documented bound,
    /// [`measure::documented_tolerance`]).
    #[arg(long, requires = "reference")]
    pub tolerance: Option<f64>,
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
    // References are f64 in full precision whatever the rows' math.
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
    a.math.check(spec, cfg.dtype)?;
    a.execution.check_densebench(spec)?;
    device::set_math(a.math);
    let tolerance = a
        .tolerance
        .unwrap_or_else(|| measure::documented_tolerance(cfg.dtype));
    let m = measure::measure(
        variant,
        &cfg,
        spec,
        a.math,
        a.execution,
        a.steps,
        a.warmup,
        reference,
        tolerance,
    )?;
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
    /// Killed by a signal we did not send (`killed by SIGKILL`, …).
    Killed(String),
    /// Killed by a crash signal (`crashed (SIGSEGV)`, …, and its last stderr line).
    Crashed(String),
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
            Outcome::Killed(_) => "killed",
            Outcome::Crashed(_) => "crashed",
            Outcome::Error(_) => "error",
        }
    }
}

/// Row statuses that are results: measured, or beyond the memory or time limit the run set
/// (this configuration does not fit it).
pub const RESULT_STATUSES: [&str; 3] = ["ok", "oom", "timeout"];

/// Row statuses of failed rows: nothing was measured, or a measurement could not be checked
/// (`error`: "measured, but unchecked") — what `bench-all` exits 1 for and `--rerun-failed`
/// measures again. With [`RESULT_STATUSES`], every status an outcome has.
pub const FAILED_STATUSES: [&str; 3] = ["error", "killed", "crashed"];

/// Row statuses whose child may well end differently when run again (what `--retries` reruns).
pub const RETRIED_STATUSES: [&str; 2] = ["killed", "crashed"];

/// Signals that mean the child crashed (a bug, a stack overflow, an abort), not that something
/// outside killed it.
pub const CRASH_SIGNALS: [i32; 7] = [
    libc::SIGSEGV,
    libc::SIGBUS,
    libc::SIGILL,
    libc::SIGFPE,
    libc::SIGABRT,
    libc::SIGSYS,
    libc::SIGTRAP,
];

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
        "--math".to_string(),
        s.math.name().to_string(),
    ]);
    if s.execution != crate::plan::job::Execution::Eager {
        f.extend(["--execution".to_string(), s.execution.name().to_string()]);
    }
    if let Some(limit) = s.mem_limit {
        f.extend(["--mem-limit".to_string(), limit.to_string()]);
    }
    f
}

/// How often the parent checks whether the child has exited.
const POLL: Duration = Duration::from_millis(10);

/// How long a child that died of a stop signal waits for the parent's own (see the module's
/// documentation) before it is a `killed` row.
pub const STOP_GRACE: Duration = Duration::from_secs(2);

/// Whether the child was ended by SIGTERM, SIGINT or SIGHUP.
fn ended_by_stop_signal(status: std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status
        .signal()
        .is_some_and(|s| interrupt::STOP_SIGNALS.contains(&s))
}

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        // A read error leaves what was read; the exit status tells what happened.
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// The last stderr line worth showing, without the program's `…: error: ` prefix (panics end with a `note: run with RUST_BACKTRACE` line).
pub fn last_line(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .map(str::trim)
        .rev()
        .find(|l| !l.is_empty() && !l.starts_with("note:"))
        .map(|l| {
            ["densebench: error: ", "pytorch_peer: error: "]
                .iter()
                .find_map(|p| l.strip_prefix(p))
                .unwrap_or(l)
                .to_string()
        })
}

/// What the counting allocator said when it refused the child's first allocation past the
/// memory limit (`alloc::REFUSAL_PREFIX`): "L bytes live (limit X bytes)", or `None` when it
/// said nothing (a child without the limit, or one that is not densebench).
pub fn refusal(stderr: &str) -> Option<String> {
    let rest = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix(crate::measure::alloc::REFUSAL_PREFIX))?;
    let (_, live) = rest.split_once(" bytes requested with ")?;
    Some(live.trim().to_string())
}

/// Makes the child die with the thread that spawns it (`PR_SET_PDEATHSIG`, SIGKILL), lead its
/// own process group and ignore the stop signals ([`interrupt::STOP_SIGNALS`]; an ignored
/// disposition survives exec). The death signal follows the spawning *thread*: every caller
/// waits for its child on the thread that spawned it, so the two end together.
fn die_with_parent(cmd: &mut Command) {
    let parent = i32::try_from(std::process::id()).unwrap_or(0);
    // SAFETY: the closure runs in the forked child before exec, where only async-signal-safe
    // calls are allowed: prctl(2), getppid(2) and sigaction(2) (glibc's signal) are plain
    // system calls, and nothing allocates (an io::Error from a raw OS code does not).
    unsafe {
        cmd.pre_exec(move || {
            for sig in interrupt::STOP_SIGNALS {
                if libc::signal(sig, libc::SIG_IGN) == libc::SIG_ERR {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died between fork and prctl: then no signal will come.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    cmd.process_group(0);
}

/// glibc's malloc tunables for every child ([`run`]), densebench's and the peers' alike:
///
/// - `hugetlb=1` backs the heap with transparent huge pages: a step allocates and frees hundreds
///   of MB of tensors, and with 4 KiB pages the kernel's page-fault path took about a fifth of a
///   bc step's CPU time (perf, DenseNet-BC-100, 1 thread); with it the step was about 15% faster;
/// - `mmap_max=0` and a 16 GiB `trim_threshold` keep freed tensors in the heap for the next
///   allocation instead of unmapping them: otherwise every tensor over glibc's mmap threshold
///   comes back as fresh pages the kernel zeroes (`clear_page_erms`: 23% of a 2-thread mlp
///   `cat-store-copy` step's CPU time, perf; the step was 15–20% faster without it).
///
/// They change no byte the counting allocator sees; `peak_rss_bytes` may grow by the heap's
/// fragmentation (+8% on mlp `cat-store-copy`). Tunables the user set are kept, these appended
/// before them (a later duplicate wins, so theirs may override).
const HUGE_PAGE_TUNABLE: &str =
    "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184";

fn glibc_tunables() -> String {
    match std::env::var("GLIBC_TUNABLES") {
        Ok(t) if !t.is_empty() => format!("{HUGE_PAGE_TUNABLE}:{t}"),
        _ => HUGE_PAGE_TUNABLE.to_string(),
    }
}

/// This process's executable as it can be run and read again: `(image, path)`, the image
/// `/proc/self/exe` on Linux (the very binary that is running, even after a `cargo build`
/// replaced or deleted the file at its path mid-sweep: every child of a sweep then runs the
/// binary its first rows were measured with, and the `git_rev` they all record is true), else
/// the path itself; the path (for the child's `argv[0]` and messages) as
/// [`std::env::current_exe`] gives it.
pub fn running_executable() -> Result<(PathBuf, PathBuf)> {
    let path = std::env::current_exe().context("finding the densebench executable")?;
    let image = PathBuf::from("/proc/self/exe");
    if cfg!(target_os = "linux") && image.exists() {
        Ok((image, path))
    } else {
        Ok((path.clone(), path))
    }
}

/// Runs this binary with `args` as a child process with `s.threads` compute threads, killing it
/// after `s.timeout`. Errs when the child cannot be started at all, and with
/// [`interrupt::Interrupted`] when the parent was told to stop (the child is killed, and how it
/// ended is not a result).
pub fn spawn(args: &[String], s: &Settings) -> Result<Outcome> {
    let (image, exe) = running_executable()?;
    let threads = s.threads.to_string();
    let mut cmd = Command::new(&image);
    cmd.arg0(&exe)
        .args(args)
        // candle's CPU backend and gemm read RAYON_NUM_THREADS (candle_core::utils::
        // get_num_threads); CANDLE_NUM_THREADS sizes its barrier pool (defaults to the former).
        .env("RAYON_NUM_THREADS", &threads)
        .env("CANDLE_NUM_THREADS", &threads);
    let e = run(cmd, s)?;
    Ok(classify(e.status, e.timed_out, s, e.stdout, &e.stderr))
}

/// How a child process ended, before it is classified into an [`Outcome`].
#[derive(Debug)]
pub struct Ended {
    pub status: std::process::ExitStatus,
    /// Killed by us at the time limit.
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` (any program: this binary, or a peer's) as an isolated child: it dies with the
/// parent, leads its own process group, is killed after `s.timeout`, and its stdout and stderr
/// are collected. Errs as [`spawn`] does.
pub fn run(mut cmd: Command, s: &Settings) -> Result<Ended> {
    interrupt::check()?;
    let program = cmd.get_program().to_string_lossy().into_owned();
    // Every child, densebench's or a peer's, runs with the same malloc tunables, so the huge
    // pages help (or not) both sides of a versus-PyTorch ratio alike.
    cmd.env("GLIBC_TUNABLES", glibc_tunables())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    die_with_parent(&mut cmd);
    let mut child = cmd.spawn().with_context(|| format!("starting {program}"))?;
    let pid = i32::try_from(child.id()).unwrap_or(i32::MAX);
    let tracked = interrupt::track(child.id());
    let out = child.stdout.take().map(read_all);
    let err = child.stderr.take().map(read_all);
    let start = Instant::now();
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for the child")? {
            break status;
        }
        let stopping = interrupt::caught().is_some();
        if stopping || start.elapsed() >= s.timeout {
            timed_out = !stopping;
            // Kill our own child's group (the child leads it); then reap it.
            interrupt::kill_group(pid);
            break child.wait().context("reaping the killed child")?;
        }
        std::thread::sleep(POLL);
    };
    drop(tracked);
    if !timed_out && interrupt::caught().is_none() && ended_by_stop_signal(status) {
        // Most likely the same scheduler or terminal is signalling us too: let it arrive.
        interrupt::wait_for_stop(STOP_GRACE);
    }
    let stdout = out.and_then(|h| h.join().ok()).unwrap_or_default();
    let stderr = err.and_then(|h| h.join().ok()).unwrap_or_default();
    if let Some(stop) = interrupt::caught() {
        // A child that finished before the signal is a result; one that did not was ours to kill.
        if !status.success() {
            return Err(stop.into());
        }
    }
    Ok(Ended {
        status,
        timed_out,
        stdout,
        stderr,
    })
}

/// How a child ended, as a row status: see the module's documentation.
pub fn classify(
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
    // Past the GPU's memory: the driver's out-of-memory, as candle reports it, is the device's
    // limit as the allocator's abort is the host's.
    let out_of_memory = if let Some(line) = stderr
        .lines()
        .find(|l| l.contains("CUDA_ERROR_OUT_OF_MEMORY"))
    {
        Some(format!("out of GPU memory: {}", line.trim()))
    } else {
        stderr
            .lines()
            .find(|l| l.contains("memory allocation of") && l.contains("failed"))
            .map(|line| match refusal(stderr) {
                Some(r) => format!("{} with {r}", line.trim()),
                None => format!("{}{limit}", line.trim()),
            })
    };
    if let Some(what) = out_of_memory {
        // After the measured steps the memory is the gradient check's: the step fit.
        if stderr.lines().any(|l| l.trim() == measure::CHECK_MARKER) {
            return Outcome::Error(format!(
                "the measured steps fit, but checking their gradients against the reference \
                 ran out of memory: {what}; the check holds the reference beside the step's \
                 results (on the host, up to twice their bytes above --mem-limit)"
            ));
        }
        return Outcome::Oom(what);
    }
    match (status.code(), status.signal()) {
        (None, Some(sig)) if CRASH_SIGNALS.contains(&sig) => {
            Outcome::Crashed(match last_line(stderr) {
                Some(l) => format!("crashed ({}): {l}", signal_name(sig)),
                None => format!("crashed ({})", signal_name(sig)),
            })
        }
        (None, Some(sig)) if sig == libc::SIGKILL => Outcome::Killed(
            "killed by SIGKILL (not sent by densebench: a user, a job scheduler or the kernel's \
             OOM killer)"
                .to_string(),
        ),
        (None, Some(sig)) => Outcome::Killed(format!("killed by {}", signal_name(sig))),
        (Some(c), _) => Outcome::Error(match last_line(stderr) {
            Some(l) => format!("{l} (exit status {c})"),
            None => format!("child failed with exit status {c} and no message"),
        }),
        (None, None) => Outcome::Error(match last_line(stderr) {
            Some(l) => format!("{l} (unknown exit)"),
            None => "child failed with an unknown exit and no message".to_string(),
        }),
    }
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

    /// Every outcome's status is a result or a failure, never both or neither.
    #[test]
    fn every_status_is_a_result_or_a_failure() {
        let d = Duration::from_secs(1);
        let all = [
            Outcome::Ok(String::new()),
            Outcome::Oom(String::new()),
            Outcome::Timeout(d),
            Outcome::Killed(String::new()),
            Outcome::Crashed(String::new()),
            Outcome::Error(String::new()),
        ];
        for o in &all {
            let s = o.status();
            assert!(
                RESULT_STATUSES.contains(&s) != FAILED_STATUSES.contains(&s),
                "{s}"
            );
        }
        assert_eq!(RESULT_STATUSES.len() + FAILED_STATUSES.len(), all.len());
        for s in RETRIED_STATUSES {
            assert!(FAILED_STATUSES.contains(&s), "{s}");
        }
    }

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

    fn settings() -> Settings {
        Settings::cpu_test(Some(1 << 20))
    }

    /// A wait status: killed by `sig` (the low 7 bits), or exited with `code` (the next byte).
    fn killed_by(sig: i32) -> std::process::ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        std::process::ExitStatus::from_raw(sig)
    }

    fn exited(code: i32) -> std::process::ExitStatus {
        use std::os::unix::process::ExitStatusExt;
        std::process::ExitStatus::from_raw(code << 8)
    }

    #[test]
    fn what_ended_the_child_names_the_status() {
        let s = settings();
        let c = |status, stderr: &str| classify(status, false, &s, String::new(), stderr);
        // The allocator's abort is the one evident memory-limit case (it ends in SIGABRT).
        let oom = c(
            killed_by(libc::SIGABRT),
            "memory allocation of 64 bytes failed\n",
        );
        assert_eq!(oom.status(), "oom");
        // The GPU's own limit: candle's driver error is an oom too, not an error row.
        let gpu = c(
            exited(1),
            "densebench: error: step: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n",
        );
        assert_eq!(gpu.status(), "oom");
        assert!(
            matches!(&gpu, Outcome::Oom(m) if m.starts_with("out of GPU memory: ")),
            "{gpu:?}"
        );
        // With the allocator's line, the error says how many bytes were live and the limit.
        let said = c(
            killed_by(libc::SIGABRT),
            "densebench: memory limit: 64 bytes requested with 1000 bytes live (limit 1024 \
             bytes)\nmemory allocation of 64 bytes failed\n",
        );
        assert_eq!(
            said,
            Outcome::Oom(
                "memory allocation of 64 bytes failed with 1000 bytes live (limit 1024 bytes)"
                    .to_string()
            )
        );
        // Past the measured steps, the gradient check's out-of-memory is an error: the step fit.
        let check = format!(
            "{}\ndensebench: memory limit: 64 bytes requested with 1000 bytes live (limit 1024 \
             bytes)\nmemory allocation of 64 bytes failed\n",
            measure::CHECK_MARKER
        );
        let e = c(killed_by(libc::SIGABRT), &check);
        assert_eq!(e.status(), "error");
        assert!(
            matches!(&e, Outcome::Error(m) if m.starts_with("the measured steps fit, but \
                checking their gradients") && m.contains("1000 bytes live")),
            "{e:?}"
        );
        let gpu_check = format!(
            "{}\ndensebench: error: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n",
            measure::CHECK_MARKER
        );
        assert_eq!(c(exited(1), &gpu_check).status(), "error");
        // SIGKILL from outside: killed, not oom (nothing shows the limit was the cause).
        let k = c(killed_by(libc::SIGKILL), "");
        assert_eq!(k.status(), "killed");
        assert!(matches!(&k, Outcome::Killed(m) if m.starts_with("killed by SIGKILL")));
        assert_eq!(
            c(killed_by(libc::SIGTERM), ""),
            Outcome::Killed("killed by SIGTERM".to_string())
        );
        assert_eq!(
            c(killed_by(libc::SIGSEGV), ""),
            Outcome::Crashed("crashed (SIGSEGV)".to_string())
        );
        assert_eq!(
            c(
                killed_by(libc::SIGABRT),
                "thread 'main' has overflowed its stack\n"
            ),
            Outcome::Crashed(
                "crashed (SIGABRT): thread 'main' has overflowed its stack".to_string()
            )
        );
        assert_eq!(
            c(exited(1), "densebench: error: bad thing\n"),
            Outcome::Error("bad thing (exit status 1)".to_string())
        );
        // Our own kill at the time limit is a timeout whatever the signal.
        let t = classify(killed_by(libc::SIGKILL), true, &s, String::new(), "");
        assert_eq!(t, Outcome::Timeout(Duration::from_secs(5)));
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
