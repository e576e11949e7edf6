//! `densebench bench-all` (and `densebench` with no subcommand): a sweep file expanded into
//! jobs ([`crate::plan::sweep`]), every job measured in its own child process and appended to the
//! result CSV as soon as it exists ([`crate::results::runner`]).
//!
//! Guarantees: everything is validated before any work (sweep file, variant names, output
//! path); an existing output file is never overwritten silently (`--resume` continues it,
//! `--force` replaces it); the CSV is valid whenever the sweep is killed (header plus whole
//! rows; a torn last line is cut off on `--resume`); `--resume` runs only the keys missing,
//! and with `--rerun-failed` also those of rows that failed (`error`, `killed`, `crashed`).
//! SIGTERM, SIGINT or SIGHUP to this process kills the children and stops with exit status
//! 128 + the signal and one line saying `--resume` continues; `--retries N` reruns rows whose
//! child was killed or crashed. Bad input (the sweep, a flag, a reference cache that cannot be
//! written) exits with status 2, before any work. A finished run exits 1 when a row of its jobs
//! in the output file (written now, or kept by `--resume`) has gradients out of tolerance or
//! failed (`error`, `killed`, `crashed`), 0 otherwise: a resumed run judges the whole file's
//! rows of its jobs as a fresh run would, never only the rows it added.
//!
//! Versus PyTorch: `--peer pytorch` (or `peer = "pytorch"` in the sweep file) runs each config's
//! PyTorch peer variants too, before its densebench variants; PyTorch is probed once before any
//! work (`pytorch_peer.py --check`), and a missing PyTorch is one line saying how to get it,
//! exit status 2, nothing written.
//!
//! Beyond one machine: `--shard I/N` keeps only shard I of the sweep ([`crate::plan::shard`]:
//! whole configurations, balanced by predicted cost, the same split on every node), after which
//! `--resume` works per shard file; `--devices cuda:0,cuda:1,…` runs one worker thread (one
//! child at a time) per device, whole configurations per device, rows appended under a lock.

use crate::measure::device::check_devices;
use crate::measure::{child, interrupt, peer, reference};
use crate::plan::bounds::{self, bad_input, ResultExt};
use crate::plan::device::DeviceSpec;
use crate::plan::job::{Math, Peer};
use crate::plan::shard::{self, ShardSpec};
use crate::plan::sweep::{load_sweep, parse_with, retarget, Job, Overrides};
use crate::results::row::{join_counts, Row};
use crate::results::store::{refuse_input_as_output, Output, RowFilter};
use crate::results::{conv_path, runner};
use anyhow::{anyhow, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

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
    /// Needs --out: without it each run writes a new file, so there would be nothing to resume.
    #[arg(long, conflicts_with = "force", requires = "out")]
    pub resume: bool,
    /// With --resume: measure again the rows that failed (status `error`, `killed` or
    /// `crashed`): they are removed from the file first (rewritten atomically, every other row
    /// kept byte for byte). Only rows of this run's jobs; `oom`, `timeout` and rows out of
    /// tolerance are results and stay.
    #[arg(long, requires = "resume")]
    pub rerun_failed: bool,
    /// Replace an existing output file.
    #[arg(long)]
    pub force: bool,
    /// Memory limit of every child in bytes (suffixes K, M, G, KiB, MiB, GiB), overriding the
    /// sweep file; default 75% of RAM. At least 1 MiB.
    #[arg(long, value_parser = bounds::flags::mem_limit)]
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
    /// Rerun a row whose child was killed by a signal densebench did not send, or crashed
    /// (status `killed` or `crashed`), up to N times (at most 100).
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = bounds::flags::retries)]
    pub retries: usize,
    /// Also run every config in this peer framework (`pytorch`: torchvision's `_DenseBlock` for
    /// bc, the forum's Linear block for mlp), on the same case file, checked against the same
    /// f64 reference; its rows have `framework = pytorch`. Needs PyTorch (`just peer-setup`).
    #[arg(long, value_enum, value_name = "PEER")]
    pub peer: Option<Peer>,
    /// f32 math of every group (overrides the sweep file's `math`): `ieee` (full f32, the
    /// default) or `tf32` (TF32 tensor cores; GPU devices and f32 only). `tf32` rows' keys end
    /// in `/tf32`.
    #[arg(long, value_enum, value_name = "MATH")]
    pub math: Option<Math>,
}

impl Args {
    /// What `densebench` with no subcommand runs: the default sweep into a new timestamped file.
    pub fn default_sweep() -> Self {
        Args::default()
    }
}

fn default_out(quick: bool, shard: Option<ShardSpec>) -> PathBuf {
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    let stem = if quick { "quick" } else { "bench" };
    let part = shard
        .map(|s| format!("-shard{}of{}", s.index, s.count))
        .unwrap_or_default();
    PathBuf::from("results").join(format!("{stem}-{stamp}{part}.csv"))
}

/// The jobs of this run (the sweep, retargeted to `--devices`, cut to `--shard`) and the
/// sweep's name for messages. Every error is the user's input.
fn jobs(a: &Args) -> Result<(Vec<Job>, String)> {
    check_devices(&a.devices)?;
    let (text, source) = load_sweep(a.sweep.as_deref(), a.quick)?;
    let over = Overrides {
        mem_limit: a.mem_limit,
        peer: a.peer,
        math: a.math,
        device: a.devices.first().copied(),
    };
    let mut jobs = parse_with(&text, &source, over)?;
    if let Some(&first) = a.devices.first() {
        jobs = retarget(jobs, first);
        for j in &jobs {
            j.settings
                .math
                .check(first, j.cfg.dtype)
                .map_err(|e| anyhow::anyhow!("--devices {first}: {e}"))?;
        }
    }
    let mut source = source;
    if let Some(s) = a.shard {
        let total = jobs.len();
        bounds::check_shards_for(&format!("--shard {s}"), s.count, total, &source)?;
        jobs = shard::select(jobs, s);
        source = format!("{source}, shard {s} ({} of {total} jobs)", jobs.len());
    }
    Ok((jobs, source))
}

/// The command that continues an interrupted run: this one's arguments with `bench-all` where
/// there was no subcommand (the main job), `--out` naming the file it wrote (a default name is
/// new on every run) and `--resume`; each word shell-quoted where it needs it.
fn resume_command(argv: Vec<String>, out: &Path) -> String {
    let mut words: Vec<String> = argv.into_iter().skip(1).collect();
    if !words.iter().any(|w| w == "bench-all") {
        words.insert(0, "bench-all".to_string());
    }
    let has = |words: &[String], flag: &str| {
        words
            .iter()
            .any(|w| w == flag || w.starts_with(&format!("{flag}=")))
    };
    if !has(&words, "--out") {
        words.push("--out".to_string());
        words.push(out.display().to_string());
    }
    if !has(&words, "--resume") {
        words.push("--resume".to_string());
    }
    let quote = |w: &String| {
        let plain = !w.is_empty()
            && w.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
        if plain {
            w.clone()
        } else {
            format!("'{}'", w.replace('\'', "'\\''"))
        }
    };
    std::iter::once("densebench".to_string())
        .chain(words.iter().map(quote))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Refuses to resume `out` when rows of this run's jobs in it (`held`) were measured with
/// another 3×3 convolution than `DENSEBENCH_CONV` now picks: a row's key does not carry the
/// path, so the file would mix two convolutions under one key (`results::conv_path`). The file
/// is left as it is.
fn refuse_other_convolution<'a>(out: &Path, held: impl IntoIterator<Item = &'a Row>) -> Result<()> {
    let gpu_rows: Vec<&Row> = held
        .into_iter()
        .filter(|r| conv_path::measured_with(r).is_some())
        .collect();
    if gpu_rows.is_empty() {
        return Ok(());
    }
    let conv = impls::layer::gpu_conv().bad_input()?;
    let bad = conv_path::mismatched(gpu_rows, conv);
    if let Some((key, measured)) = bad.first() {
        return Err(bad_input(anyhow!(
            "{}: {} of the rows this run would resume were measured with {measured} (the \
             first: {key}), and this run would measure with DENSEBENCH_CONV={}: a row's key \
             does not name the 3×3 convolution, so the file would mix two under one key. Set \
             DENSEBENCH_CONV to the path the file was measured with, remove those rows, or \
             write to another --out; the file was not changed",
            out.display(),
            bad.len(),
            conv_path::setting(conv)
        )));
    }
    Ok(())
}

/// The warning for CPU rows that `--resume` keeps (`kept`, this run's jobs) measured on another
/// CPU model than `here` ([`crate::measure::device::cpu_model`]): a key does not name the
/// machine, so those rows count as done and the file ends with rows of two machines, whose
/// times are no comparison. `None` when every kept CPU row is of this CPU.
fn other_cpu_warning(kept: &[&Row], here: &str) -> Option<String> {
    let mut others: Vec<&str> = Vec::new();
    let mut n = 0;
    for r in kept.iter().filter(|r| r.device == "cpu") {
        // the model: without any warning the child added (` [warning: …]`) and the thread count
        let desc = r.device_desc.split(" [warning:").next().unwrap_or_default();
        let cpu = crate::outputs::plots::data::bare_desc(desc);
        if cpu != here {
            n += 1;
            if !others.contains(&cpu) {
                others.push(cpu);
            }
        }
    }
    (n > 0).then(|| {
        format!(
            "{n} of the rows --resume keeps were measured on another CPU ({}; this one is {here}): \
             they count as done and are not measured again, so the file will hold rows of two \
             machines, whose times are no comparison (report and plots keep machines apart). \
             To measure every row here, write to another --out",
            others.join("; ")
        )
    })
}

/// `densebench bench-all` (and `densebench` with no subcommand). Exit status 1 when any row of
/// this run's jobs in the output (written now, or kept by `--resume`) has gradients out of
/// tolerance or failed (`error`, `killed`, `crashed`); rows that ran out of memory or time are
/// results, not failures.
pub fn run(a: Args) -> Result<ExitCode> {
    interrupt::install()?;
    let (jobs, source) = jobs(&a).bad_input()?;
    // A CPU job that cannot fit its child's memory limit becomes an `oom` row without a child
    // (`record::measure_row`, `estimates::check_fits`): the sweep's other jobs still run.
    if jobs.iter().any(|j| j.variant.is_peer()) {
        // Once, before anything is written: without PyTorch no peer row could be measured.
        let version = peer::check().map_err(anyhow::Error::msg).bad_input()?;
        crate::say!("densebench bench-all: peer rows by {version}");
    }
    let out_path = a
        .out
        .clone()
        .unwrap_or_else(|| default_out(a.quick, a.shard));
    // `--force` (which the refusal of an existing --out suggests) would replace the sweep file
    // with the rows measured from it.
    if let Some(sweep) = &a.sweep {
        refuse_input_as_output(&out_path, "--out", &[sweep])?;
    }
    let note = |m: &str| crate::say!("{m}");
    let cache_dir = reference::default_dir(a.cache_dir.as_deref())?;
    // Before the output is touched: a cache that cannot be written is refused at once.
    reference::Cache::new(&cache_dir).bad_input()?;
    let mine: HashSet<&str> = jobs.iter().map(|j| j.key.as_str()).collect();
    // Only this run's failed rows: another shard's or sweep's would be dropped and not rerun.
    let failed_here =
        |key: &str, status: &str| mine.contains(key) && child::FAILED_STATUSES.contains(&status);
    let rerun: Option<&RowFilter> = a.rerun_failed.then_some(&failed_here);
    // Before `--rerun-failed` removes a row: a refusal leaves the file as it was.
    let check = |held: &[Row]| {
        refuse_other_convolution(
            &out_path,
            held.iter().filter(|r| mine.contains(r.key.as_str())),
        )
    };
    let (out, held) = Output::open(&out_path, a.resume, a.force, rerun, &check, &note)?;
    let done: HashSet<String> = held.iter().map(|r| r.key.clone()).collect();
    // The rows of this run's jobs that `--resume` keeps: part of this run's result, so the
    // verdict (exit status, summary) counts them as it counts the rows written now.
    // A key the file holds more than once (an edited or concatenated file) counts once: its
    // last row, as report, plots and compare read it, said here.
    let mut last: HashMap<&str, usize> = HashMap::new();
    for (i, r) in held.iter().enumerate() {
        if mine.contains(r.key.as_str()) {
            last.insert(r.key.as_str(), i);
        }
    }
    let kept: Vec<&Row> = held
        .iter()
        .enumerate()
        .filter(|(i, r)| last.get(r.key.as_str()) == Some(i))
        .map(|(_, r)| r)
        .collect();
    // the earlier rows of repeated keys, and those keys, each named once
    let earlier: Vec<&str> = held
        .iter()
        .enumerate()
        .filter(|(i, r)| last.get(r.key.as_str()).is_some_and(|l| l != i))
        .map(|(_, r)| r.key.as_str())
        .collect();
    let repeated = earlier.len();
    if repeated > 0 {
        let mut seen = HashSet::new();
        let keys: Vec<&str> = earlier.into_iter().filter(|k| seen.insert(*k)).collect();
        crate::say!(
            "densebench bench-all: warning: {} holds {repeated} earlier row(s) of keys it also \
             holds later ({}{}): each key counts once, its last row (as report, plots and \
             compare read it)",
            out_path.display(),
            keys.iter().take(3).copied().collect::<Vec<_>>().join(", "),
            if keys.len() > 3 { ", …" } else { "" }
        );
    }
    let foreign = done.iter().filter(|k| !mine.contains(k.as_str())).count();
    if foreign > 0 {
        crate::say!(
            "densebench bench-all: note: {foreign} rows of {} are not jobs of this run ({source}); \
             they are kept as they are (another shard's file, or another sweep?)",
            out_path.display()
        );
    }
    if let Some(w) = other_cpu_warning(&kept, &crate::measure::device::cpu_model()) {
        crate::say!("densebench bench-all: warning: {}: {w}", out_path.display());
    }
    let todo: Vec<&Job> = jobs.iter().filter(|j| !done.contains(&j.key)).collect();
    crate::say!(
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
    let shared = runner::run(&todo, &a.devices, out, &cache_dir, a.retries)?;
    if let Some(stop) = shared.interrupted {
        crate::say!(
            "densebench bench-all: {stop} after {} of {} rows: the running children were killed \
             and their temporary files removed, {} holds whole rows only; to continue, run: {}",
            shared.finished,
            todo.len(),
            out_path.display(),
            resume_command(std::env::args().collect(), &out_path)
        );
        return Ok(ExitCode::from(stop.exit_status()));
    }
    crate::say!(
        "densebench bench-all: {} rows written to {} in {:.1} s ({})",
        shared.finished,
        out_path.display(),
        start.elapsed().as_secs_f64(),
        if shared.counts.is_empty() {
            "nothing to do".to_string()
        } else {
            join_counts(&shared.counts)
        }
    );
    // The verdict covers every row of this run's jobs the file holds: those written now and
    // those `--resume` kept (a shard retried after a preemption still holds its failed rows).
    let mut kept_counts: BTreeMap<String, usize> = BTreeMap::new();
    for r in &kept {
        *kept_counts.entry(r.status.clone()).or_default() += 1;
    }
    // Every row of this run's jobs in the file, by status: written now plus kept.
    let mut all = shared.counts.clone();
    for (status, n) in &kept_counts {
        *all.entry(status.clone()).or_default() += n;
    }
    if !kept.is_empty() {
        crate::say!(
            "densebench bench-all: {} also holds {} rows of this run's jobs from before ({}); \
             the verdict (the last line, and the exit status) counts them",
            out_path.display(),
            kept.len(),
            join_counts(&kept_counts)
        );
    }
    let mut failed = false;
    let kept_out: Vec<&str> = kept
        .iter()
        .filter(|r| r.grad_ok == Some(false))
        .map(|r| r.key.as_str())
        .collect();
    if !shared.out_of_tolerance.is_empty() || !kept_out.is_empty() {
        let mut keys = shared.out_of_tolerance.join(", ");
        if !kept_out.is_empty() {
            if !keys.is_empty() {
                keys.push_str("; ");
            }
            keys.push_str(&format!("kept from before: {}", kept_out.join(", ")));
        }
        crate::say!("densebench bench-all: gradients out of tolerance: {keys}");
        failed = true;
    }
    // A row that failed (`error`, `killed`, `crashed`) is written and the sweep goes on, but the
    // run did not get what it was asked for (nothing measured, or a measurement whose gradients
    // could not be checked): exit 1, as for a row out of tolerance, so that a script does not
    // plot a partial result as a whole one. `oom` and `timeout` are results of the limits the
    // sweep set (this configuration does not fit them), not failures.
    let failures = |counts: &BTreeMap<String, usize>| -> BTreeMap<String, usize> {
        counts
            .iter()
            .filter(|(status, _)| !child::RESULT_STATUSES.contains(&status.as_str()))
            .map(|(status, &n)| (status.clone(), n))
            .collect()
    };
    let kept_failed = failures(&kept_counts);
    let all_failed = failures(&all);
    if !all_failed.is_empty() {
        let from_before = if kept_failed.is_empty() {
            String::new()
        } else {
            format!(
                "; {} of them kept from before ({})",
                kept_failed.values().sum::<usize>(),
                join_counts(&kept_failed)
            )
        };
        crate::say!(
            "densebench bench-all: rows that failed ({}{from_before}): their `status` and \
             `error` columns say why (`--resume --rerun-failed` measures them again)",
            join_counts(&all_failed)
        );
        failed = true;
    }
    if !failed {
        // One verdict line either way: the failures above, or this.
        crate::say!(
            "densebench bench-all: verdict: no row of this run's jobs failed or is out of \
             tolerance ({})",
            if all.is_empty() {
                "no rows".to_string()
            } else {
                join_counts(&all)
            }
        );
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Resuming a file whose GPU bc rows were measured with densebench's direct kernels is
    /// refused under the default tap stack, naming the file, the count, the first key and the
    /// setting; rows of the tap stack, CPU rows and another job's rows pass.
    #[test]
    fn a_resume_never_mixes_two_convolutions() {
        if std::env::var_os(impls::layer::CONV_ENV).is_some() {
            println!("skipped: {} is set in this process", impls::layer::CONV_ENV);
            return;
        }
        let row = conv_path::test_row;
        let out = Path::new("results/reference-gpu.csv");
        let tap = row("cat-store-copy", "cuda:0", "3×3 tap stack in 1 chunk");
        let cpu = row("cat-store-copy", "cpu", "");
        let direct = row(
            "buffer-recompute-inplace",
            "cuda:0",
            "3×3 convolution in densebench's direct kernels (TF32 tensor cores, weight-gradient \
             partials 663552 B)",
        );
        assert!(refuse_other_convolution(out, [&tap, &cpu]).is_ok());
        let e = refuse_other_convolution(out, [&tap, &direct, &cpu])
            .expect_err("a direct row resumed under the tap stack")
            .to_string();
        for part in [
            "results/reference-gpu.csv: 1 of the rows",
            "densebench's direct kernels on tensor cores",
            direct.key.as_str(),
            "DENSEBENCH_CONV=tap-stack",
            "the file was not changed",
        ] {
            assert!(e.contains(part), "{part:?} missing from: {e}");
        }
    }

    /// A kept CPU row of another CPU model is warned about (its thread count and warning not
    /// part of the model); rows of this CPU, and GPU rows, are not.
    #[test]
    fn kept_rows_of_another_cpu_are_warned_about() {
        let row = |device: &str, desc: &str| Row {
            device: device.to_string(),
            device_desc: desc.to_string(),
            ..Row::default()
        };
        let here = "Intel(R) Xeon(R) Processor, AVX-512";
        let mine = row("cpu", "Intel(R) Xeon(R) Processor, AVX-512 (2 threads)");
        let mine_warned = row(
            "cpu",
            "Intel(R) Xeon(R) Processor, AVX-512 (1 threads) [warning: busy]",
        );
        let gpu = row("cuda:0", "NVIDIA H200 (sm_90)");
        assert_eq!(other_cpu_warning(&[&mine, &mine_warned, &gpu], here), None);
        let epyc = row("cpu", "AMD EPYC, AVX-512 (2 threads)");
        let w = other_cpu_warning(&[&mine, &epyc, &epyc], here).expect("a warning");
        assert!(
            w.starts_with("2 of the rows --resume keeps were measured on another CPU (AMD EPYC, AVX-512; this one is Intel"),
            "{w}"
        );
    }

    /// The continue command an interrupted run prints: the main job (no subcommand, no --out)
    /// gets `bench-all`, the file it wrote and `--resume`; a run that named its file keeps it;
    /// a word with a space is quoted; `--resume` is not added twice.
    #[test]
    fn the_resume_command_names_the_file_and_the_subcommand() {
        let argv = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let out = Path::new("results/bench-20261126-002548.csv");
        assert_eq!(
            resume_command(argv(&["target/release/densebench"]), out),
            "densebench bench-all --out results/bench-20261126-002548.csv --resume"
        );
        assert_eq!(
            resume_command(
                argv(&["densebench", "bench-all", "--sweep", "my sweep.toml"]),
                out
            ),
            "densebench bench-all --sweep 'my sweep.toml' --out \
             results/bench-20261126-002548.csv --resume"
        );
        assert_eq!(
            resume_command(
                argv(&[
                    "db",
                    "bench-all",
                    "--out=x.csv",
                    "--resume",
                    "--rerun-failed"
                ]),
                out
            ),
            "densebench bench-all --out=x.csv --resume --rerun-failed"
        );
    }
}
