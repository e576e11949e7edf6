//! Hostile files, through the real binary (issue 37, items 1, 3 and 5): outputs that are not
//! regular files (a FIFO, `--force` included), an output that appears or a second writer that
//! starts while a command reads its inputs, inputs that never end or are too large (a device, a
//! FIFO, a CSV over its byte limit), a file-size limit in the middle of a sweep, and lock files
//! left by a full disk, a stop signal or a writer killed with SIGKILL. Each case asserts a clear
//! error (or the correct result), files left as they were, and no lock file behind.
//!
//! System devices are only ever read (`/dev/zero`); every output under test is a FIFO or a file
//! this test creates.

mod common;

use common::{densebench, path_str, stderr};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The committed CPU reference run: a valid result CSV with ok rows.
fn reference_csv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv")
}

/// One tiny job: a sweep that finishes in seconds.
const TINY_SWEEP: &str = r#"
[[group]]
family = "mlp"
batch = 2
channels = 2
growth = 2
depth = 1
variants = ["cat-store-copy"]
steps = 1
warmup = 0
"#;

/// Every variant at two tiny depths: rows enough to pass a 4 KiB file-size limit.
const TINY_ALL_SWEEP: &str = r#"
[[group]]
family = "mlp"
batch = 2
channels = 2
growth = 2
depth = [1, 2]
steps = 1
warmup = 0
"#;

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(path_str(p)).expect("no NUL");
    // SAFETY: mkfifo(3) on a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

fn is_fifo(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_fifo())
}

/// The lock file of an output (`.NAME.lock` beside it).
fn lock_of(out: &Path) -> PathBuf {
    let name = out.file_name().expect("a file name").to_string_lossy();
    out.with_file_name(format!(".{name}.lock"))
}

/// Runs `cmd` to completion, killing it after `limit` (then the test fails: it hung).
fn run_with_limit(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("densebench starts");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().expect("output");
            panic!("hung for {limit:?}: {}", stderr(&o));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn cmd(args: &[&str]) -> Command {
    let mut c = Command::new(common::bin());
    c.args(args);
    c
}

/// Runs `densebench ARGS` under a file-size limit of `kib` KiB, SIGXFSZ left at its default (it
/// kills a process that does not ignore it).
fn with_fsize_limit(kib: u64, args: &[&str]) -> Output {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!("ulimit -f {kib}; exec \"$0\" \"$@\""))
        .arg(common::bin())
        .args(args);
    run_with_limit(c, Duration::from_secs(300))
}

/// Every writer refuses a FIFO as its output, `--force` included, with one line, and leaves it
/// a FIFO with no lock file beside it. (bench-all replaced it with a CSV, exit 0, and `report
/// --force`, `merge --force`, … did too.)
#[test]
fn every_writer_refuses_a_fifo_output_force_included() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let sweep = d.join("tiny.toml");
    std::fs::write(&sweep, TINY_SWEEP).expect("sweep");
    let case = d.join("case.safetensors");
    let tiny = ["--family", "mlp", "--depth", "2", "--batch", "2"];
    let mut make = vec!["case"];
    make.extend(tiny);
    make.extend(["--growth", "2", "--channels", "2", "--out", path_str(&case)]);
    let o = densebench(&make);
    assert!(o.status.success(), "{}", stderr(&o));
    let empty = d.join("criterion");
    std::fs::create_dir(&empty).expect("folder");
    let reference = reference_csv();
    let fifo = d.join("out.fifo");
    mkfifo(&fifo);
    let f = path_str(&fifo);
    let cache = d.join("cache");
    let bench = [
        "bench-all",
        "--sweep",
        path_str(&sweep),
        "--cache-dir",
        path_str(&cache),
        "--out",
        f,
    ];
    let mut commands: Vec<Vec<&str>> = vec![
        bench.to_vec(),
        [&bench[..], &["--force"]].concat(),
        vec!["report", path_str(&reference), "--out", f, "--force"],
        vec!["merge", f, path_str(&reference), "--force"],
        vec![
            "step",
            "--case",
            path_str(&case),
            "--variant",
            "cat-store-copy",
            "--out",
            f,
            "--force",
        ],
        vec![
            "criterion-import",
            "--dir",
            path_str(&empty),
            "--out",
            f,
            "--force",
        ],
    ];
    let mut case_cmd = make.clone();
    case_cmd.truncate(make.len() - 1);
    case_cmd.extend([f, "--force"]);
    commands.push(case_cmd);
    let mut depth = vec!["max-depth"];
    depth.extend_from_slice(common::TINY_MLP);
    depth.extend(["--budget", "3MiB", "--no-confirm", "--out", f, "--force"]);
    commands.push(depth);
    for args in &commands {
        let o = run_with_limit(cmd(args), Duration::from_secs(120));
        let e = stderr(&o);
        assert!(!o.status.success(), "{args:?} wrote to a FIFO: {e}");
        assert!(
            e.contains("a FIFO (named pipe), not a regular file"),
            "{args:?}: {e}"
        );
        assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: one line: {e}");
        assert!(is_fifo(&fifo), "{args:?} replaced the FIFO");
        assert!(!lock_of(&fifo).exists(), "{args:?} left a lock file");
    }
}

/// `merge` and `report` take OUT's lock before they read their inputs: a second writer of OUT
/// (here: this test holding the lock) makes them fail at once naming it, even when their inputs
/// are unreadable. (They read the inputs first and took the lock only to write: two `report
/// --out X` both exited 0, the last one winning.)
#[test]
fn merge_and_report_take_the_output_lock_before_reading() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let garbage = d.join("garbage.csv");
    std::fs::write(&garbage, "not a result CSV\n").expect("garbage");
    let me = std::process::id().to_string();
    for (out, args) in [
        (d.join("R.md"), vec!["report", path_str(&garbage), "--out"]),
        (d.join("M.csv"), vec!["merge"]),
    ] {
        let lock = lock_of(&out);
        let held = std::fs::File::create(&lock).expect("lock file");
        held.try_lock().expect("our lock");
        std::fs::write(&lock, &me).expect("pid");
        let mut a = args.clone();
        a.push(path_str(&out));
        if a[0] == "merge" {
            a.push(path_str(&garbage));
        }
        let o = densebench(&a);
        let e = stderr(&o);
        assert!(!o.status.success(), "{a:?}: {e}");
        assert!(
            e.contains("is being written by densebench") && e.contains(&me),
            "{a:?} read its inputs before taking the lock: {e}"
        );
        assert!(!out.exists(), "{a:?} wrote");
        drop(held);
    }
}

/// An output that appears while `report` works (after its lock and before its rename: the test
/// hook `DENSEBENCH_TEST_RENAME_DELAY_MS` holds that window open) is not replaced: the report
/// refuses, naming the temporary file that keeps its new output.
#[test]
fn an_output_that_appears_meanwhile_is_kept_and_the_new_one_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let out = d.join("R.md");
    let mut c = cmd(&[
        "report",
        path_str(&reference_csv()),
        "--out",
        path_str(&out),
        "--plots",
        path_str(&d.join("plots")),
    ]);
    c.env("DENSEBENCH_TEST_RENAME_DELAY_MS", "3000");
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("report starts");
    let start = Instant::now();
    let tmp = loop {
        let found = std::fs::read_dir(d)
            .expect("dir")
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains(".R.md.tmp"));
        if let Some(t) = found {
            break t;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no temporary report appeared"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    std::fs::write(&out, "precious: written by someone else meanwhile\n").expect("write");
    let o = child.wait_with_output().expect("report ends");
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("changed while densebench worked") && e.contains(path_str(&tmp)),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(&out).expect("out"),
        "precious: written by someone else meanwhile\n"
    );
    assert!(
        std::fs::read_to_string(&tmp).is_ok_and(|t| t.starts_with("# densebench report")),
        "the new report is kept in {}",
        tmp.display()
    );
    assert!(!lock_of(&out).exists(), "lock file left");
}

/// Inputs that never end or never start — `/dev/zero`, a FIFO with no writer — are refused at
/// once with one line by every reader (`compare`, `merge`, `report`, `bench-all --sweep`), no
/// panic, nothing written. (`compare base.csv /dev/zero` grew to 24 GB; a FIFO hung.)
#[test]
fn endless_inputs_are_refused_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let fifo = d.join("in.fifo");
    mkfifo(&fifo);
    let reference = reference_csv();
    let r = path_str(&reference);
    let merged = d.join("merged.csv");
    let report = d.join("R.md");
    for endless in ["/dev/zero", path_str(&fifo)] {
        let what = if endless == "/dev/zero" {
            "a character device, not a regular file"
        } else {
            "a FIFO (named pipe), not a regular file"
        };
        for args in [
            vec!["compare", r, endless],
            vec!["compare", endless, r],
            vec!["merge", path_str(&merged), r, endless],
            vec!["report", endless, "--out", path_str(&report)],
            vec![
                "bench-all",
                "--sweep",
                endless,
                "--out",
                path_str(&d.join("never.csv")),
            ],
        ] {
            let o = run_with_limit(cmd(&args), Duration::from_secs(60));
            let e = stderr(&o);
            assert!(!o.status.success(), "{args:?}: {e}");
            assert!(e.contains(what) && e.contains(endless), "{args:?}: {e}");
            assert!(!e.contains("panicked"), "{args:?}: {e}");
            assert_eq!(e.trim_end().lines().count(), 1, "{args:?}: one line: {e}");
        }
    }
    assert!(!merged.exists() && !report.exists(), "written");
    assert!(is_fifo(&fifo));
    let left: Vec<_> = std::fs::read_dir(d)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "lock or temporary files left: {left:?}");
}

/// A result CSV over the byte limit is refused before it is read, naming its size, the limit
/// and the variable that sets it; a malformed limit is refused naming the variable.
#[test]
fn a_csv_over_the_byte_limit_is_refused_and_the_limit_is_settable() {
    let reference = reference_csv();
    let len = std::fs::metadata(&reference).expect("reference").len();
    let compare = |limit: &str| {
        let mut c = cmd(&["compare", path_str(&reference), path_str(&reference)]);
        c.env("DENSEBENCH_MAX_CSV_BYTES", limit);
        run_with_limit(c, Duration::from_secs(120))
    };
    let o = compare("1000");
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains(&format!("is {len} bytes"))
            && e.contains("limit of 1000 bytes")
            && e.contains("DENSEBENCH_MAX_CSV_BYTES"),
        "{e}"
    );
    let o = compare("lots");
    assert!(
        stderr(&o).contains("DENSEBENCH_MAX_CSV_BYTES=lots is not a byte limit"),
        "{}",
        stderr(&o)
    );
    // At its size exactly it is read (compare of a file with itself: no regression).
    let o = compare(&len.to_string());
    assert!(o.status.success(), "{}", stderr(&o));
}

/// A sweep under a file-size limit (`ulimit -f`, SIGXFSZ at its default) stops with one line
/// like a full disk: whole rows kept, exit status 1 (not killed by SIGXFSZ mid-row), no lock
/// file left.
#[test]
fn a_sweep_past_a_file_size_limit_keeps_whole_rows_and_no_lock() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let sweep = d.join("tiny.toml");
    std::fs::write(&sweep, TINY_ALL_SWEEP).expect("sweep");
    let out = d.join("sweep.csv");
    let o = with_fsize_limit(
        4,
        &[
            "bench-all",
            "--sweep",
            path_str(&sweep),
            "--out",
            path_str(&out),
            "--cache-dir",
            path_str(&d.join("cache")),
        ],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "killed by a signal? {e}");
    assert!(e.contains("file too large"), "{e}");
    let bytes = std::fs::read(&out).expect("sweep csv");
    assert!(bytes.ends_with(b"\n"), "a torn row was left");
    let rows = densebench::results::row::read_rows(&out).expect("whole rows");
    assert!(!rows.is_empty(), "rows before the limit lost");
    assert!(!lock_of(&out).exists(), "lock file left");
}

/// A lock file that cannot be written (no room for the pid: a file-size limit of 0, as a full
/// disk) is removed again, with one line saying why.
#[test]
fn a_lock_file_that_cannot_be_written_is_removed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("R.md");
    let reference = reference_csv();
    let o = with_fsize_limit(
        0,
        &["report", path_str(&reference), "--out", path_str(&out)],
    );
    let e = stderr(&o);
    assert!(o.status.code().is_some(), "killed by a signal: {e}");
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("writing the lock file") && e.contains("file too large"),
        "{e}"
    );
    assert!(!lock_of(&out).exists(), "lock file left");
    assert!(!out.exists());
}

/// A stop signal to a command that holds a lock and a temporary file (`report`, kept in its
/// write by the test hook) removes both and exits with 128 + the signal.
#[test]
fn a_stop_signal_removes_the_lock_and_the_temporary_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let out = d.join("R.md");
    let mut c = cmd(&[
        "report",
        path_str(&reference_csv()),
        "--out",
        path_str(&out),
        "--plots",
        path_str(&d.join("plots")),
    ]);
    c.env("DENSEBENCH_TEST_RENAME_DELAY_MS", "20000");
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("report starts");
    let start = Instant::now();
    while !std::fs::read_dir(d)
        .expect("dir")
        .flatten()
        .any(|e| e.file_name().to_string_lossy().contains(".R.md.tmp"))
    {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no temporary file"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let pid = i32::try_from(child.id()).expect("pid");
    // SAFETY: kill(2) has no memory-safety preconditions.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let o = child.wait_with_output().expect("report ends");
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{}", stderr(&o));
    let left: Vec<_> = std::fs::read_dir(d)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with(".R.md"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert!(!out.exists());
}

/// A lock file left by a writer killed with SIGKILL (its pid dead, its lock gone with it) is
/// said on stderr, naming the pid, and taken over: the command succeeds and removes it.
#[test]
fn a_stale_lock_is_reported_and_taken_over() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("M.csv");
    let mut gone = Command::new("true").spawn().expect("true runs");
    let dead = gone.id();
    gone.wait().expect("reaped");
    std::fs::write(lock_of(&out), dead.to_string()).expect("stale lock");
    let o = densebench(&["merge", path_str(&out), path_str(&reference_csv())]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("taking over the stale lock") && e.contains(&format!("pid {dead}")),
        "{e}"
    );
    assert!(!lock_of(&out).exists(), "lock file left");
    assert!(densebench::results::row::read_rows(&out).is_ok_and(|r| !r.is_empty()));
}

/// A FIFO planted at an output's lock-file name is refused with one line, not read (a read of it
/// blocked until something wrote to it).
#[test]
fn a_fifo_at_the_lock_files_name_is_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("M.csv");
    mkfifo(&lock_of(&out));
    let o = run_with_limit(
        cmd(&["merge", path_str(&out), path_str(&reference_csv())]),
        Duration::from_secs(60),
    );
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(e.contains("is not a regular file: remove it"), "{e}");
    assert!(!out.exists());
    assert!(is_fifo(&lock_of(&out)), "someone else's FIFO is left alone");
}
