//! The results store under hostile conditions, through the real binary: files that are not
//! result CSVs, rows torn or merely missing their newline, two writers at once, outputs that are
//! inputs, a full disk (a file-size limit), rows that lie about their schema or key, NaN errors,
//! and a bounded fuzz of the CSV reader. Each case asserts the exact outcome: a clear error with
//! every input byte for byte unchanged, or the correct result.

mod common;

use common::{densebench, path_str, stderr};
use densebench::results::row::{
    key_of_fields, read_rows, Row, SCHEMA_2_COLUMNS, SCHEMA_3_COLUMNS, SCHEMA_VERSION,
};
use densebench::results::store::{csv_bytes, write_rows};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A complete, valid row (a small mlp config) with a measured time and checked gradients.
fn good_row(variant: &str, depth: usize) -> Row {
    let mut r = Row {
        schema: SCHEMA_VERSION,
        framework: "densebench".to_string(),
        math: "ieee".to_string(),
        execution: "eager".to_string(),
        variant: variant.to_string(),
        family: "mlp".to_string(),
        batch: 4,
        channels: 3,
        growth: 2,
        depth,
        bn_size: 1,
        size: impls::Spatial::square(1),
        activation: true,
        dtype: "f32".to_string(),
        device: "cpu".to_string(),
        device_desc: "test CPU".to_string(),
        threads: 1,
        timestamp: "2026-01-01T00:00:00Z".to_string(),
        status: "ok".to_string(),
        steps: 1,
        warmup: 1,
        peak_bytes: Some(1000 * depth as u64),
        median_ns: Some(1_000_000),
        reference: "autograd (f64)".to_string(),
        max_abs_err: Some(1e-7),
        max_rel_err: Some(1e-7),
        grad_ok: Some(true),
        ..Row::default()
    };
    r.key = key_of_fields(&r);
    r
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("writing a test file");
    p
}

/// `bench-all --quick` into `out` with a private reference cache.
fn quick(dir: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    let cache = dir.join("cache");
    let mut args = vec![
        "bench-all",
        "--quick",
        "--out",
        path_str(out),
        "--cache-dir",
        path_str(&cache),
    ];
    args.extend_from_slice(extra);
    densebench(&args)
}

#[test]
fn resume_refuses_a_file_that_is_not_a_result_csv_and_leaves_it_unchanged() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (name, bytes) in [
        // A one-line note without a final newline: once cut as a "torn row", now untouched.
        ("notes.txt", &b"remember to buy milk"[..]),
        ("other.csv", &b"a,b,c\n1,2,3\n4,5"[..]),
    ] {
        let f = write(dir.path(), name, bytes);
        let o = quick(dir.path(), &f, &["--resume"]);
        let e = stderr(&o);
        assert!(!o.status.success(), "{name}: accepted");
        assert!(
            e.contains("not a densebench schema-") && e.contains("not changed"),
            "{name}: {e}"
        );
        assert_eq!(
            std::fs::read(&f).expect("still there"),
            bytes,
            "{name} changed"
        );
    }
}

/// A result CSV re-saved with Windows line endings (a spreadsheet, Python's csv module): read
/// by every reader with errors on the right line, and refused for appending with the real
/// reason, the file unchanged.
#[test]
fn crlf_files_are_read_with_true_line_numbers_and_refused_for_appending_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = [
        good_row("cat-store-copy", 1),
        good_row("cat-store-copy", 2),
        good_row("cat-store-copy", 3),
    ];
    let lf = String::from_utf8(csv_bytes(&rows).expect("csv")).expect("utf8");
    let crlf = lf.replace('\n', "\r\n");
    let p = write(dir.path(), "crlf.csv", crlf.as_bytes());
    assert_eq!(read_rows(&p).expect("readable"), rows.to_vec());
    // a bad cell on the file's line 3 and an edited key on its line 4, LF and CRLF alike
    let lines: Vec<&str> = lf.lines().collect();
    for (line, edit, needle) in [
        (3, (",2000,", ",lots,"), "line 3, column `peak_bytes`"),
        (4, ("/3/", "/9/"), "line 4, column `key`"),
    ] {
        let mut edited: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        edited[line - 1] = edited[line - 1].replacen(edit.0, edit.1, 1);
        assert_ne!(edited[line - 1], lines[line - 1], "the edit must apply");
        for eol in ["\n", "\r\n"] {
            let text = edited
                .iter()
                .map(|l| format!("{l}{eol}"))
                .collect::<String>();
            let f = write(dir.path(), "edited.csv", text.as_bytes());
            let e = read_rows(&f)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default();
            assert!(e.contains(needle), "{eol:?}: {e}");
        }
    }
    let o = quick(dir.path(), &p, &["--resume"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("Windows (CRLF) line endings") && e.contains("not changed"),
        "{e}"
    );
    assert_eq!(std::fs::read(&p).expect("still there"), crlf.as_bytes());
    // a byte-order mark before the header: read, and refused for appending by name (it was
    // "the same columns in another order", the mark invisible in the quoted line)
    let bom = [b"\xEF\xBB\xBF".as_slice(), lf.as_bytes()].concat();
    let p = write(dir.path(), "bom.csv", &bom);
    assert_eq!(read_rows(&p).expect("readable"), rows.to_vec());
    let o = quick(dir.path(), &p, &["--resume"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("UTF-8 byte-order mark") && !e.contains("another order"),
        "{e}"
    );
    assert_eq!(std::fs::read(&p).expect("still there"), bom);
}

#[test]
fn resume_keeps_a_complete_last_row_without_newline_and_cuts_only_a_torn_one() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = [good_row("cat-store-copy", 1), good_row("autograd", 1)];
    let full = csv_bytes(&rows).expect("csv");
    // The last row complete but without its newline: it must survive a resume.
    let f = write(dir.path(), "no-newline.csv", &full[..full.len() - 1]);
    let cache = dir.path().join("cache");
    // A sweep of exactly these two keys: nothing is left to run, so the file is only repaired.
    let sweep = write(
        dir.path(),
        "two.toml",
        b"[[group]]\nfamily = 'mlp'\nbatch = 4\nchannels = 3\ngrowth = 2\ndepth = 1\n\
          variants = ['cat-store-copy', 'autograd']\nsteps = 1\n",
    );
    let o = densebench(&[
        "bench-all",
        "--sweep",
        path_str(&sweep),
        "--out",
        path_str(&f),
        "--resume",
        "--cache-dir",
        path_str(&cache),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("kept it"), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(&f).expect("file"),
        full,
        "the complete row was lost"
    );
    // A torn last row (cut mid-line) is removed, and the sweep measures it again.
    let torn = write(dir.path(), "torn.csv", &full[..full.len() - 20]);
    let o = densebench(&[
        "bench-all",
        "--sweep",
        path_str(&sweep),
        "--out",
        path_str(&torn),
        "--resume",
        "--cache-dir",
        path_str(&cache),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("torn last line"), "{}", stderr(&o));
    let keys: Vec<String> = read_rows(&torn)
        .expect("valid")
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(keys, [rows[0].key.clone(), rows[1].key.clone()]);
    // A file of the header alone, without its newline: the header is kept (it was cut as a
    // torn row, which emptied the file and then refused it for missing columns).
    let header_end = full
        .iter()
        .position(|&b| b == b'\n')
        .expect("a header line");
    let bare = write(dir.path(), "header-only.csv", &full[..header_end]);
    let o = densebench(&[
        "bench-all",
        "--sweep",
        path_str(&sweep),
        "--out",
        path_str(&bare),
        "--resume",
        "--cache-dir",
        path_str(&cache),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("header had no newline"),
        "{}",
        stderr(&o)
    );
    let bytes = std::fs::read(&bare).expect("file");
    assert_eq!(&bytes[..=header_end], &full[..=header_end], "the header");
    assert_eq!(read_rows(&bare).expect("valid").len(), 2);
}

/// `--resume --rerun-failed` measures again the failed rows of this run's jobs (here a crashed
/// one, its error text with a comma, a quote and a newline): removed, measured, appended; the ok
/// row, an `oom` row and another sweep's failed row stay byte for byte. Plain `--resume` keeps
/// the failed row (and exits 1 for it), and `--rerun-failed` without `--resume` is refused.
#[test]
fn rerun_failed_measures_this_runs_failed_rows_again_and_keeps_every_other_byte() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    let sweep = write(
        dir.path(),
        "two.toml",
        b"[[group]]\nfamily = 'mlp'\nbatch = 4\nchannels = 3\ngrowth = 2\ndepth = 1\n\
          variants = ['cat-store-copy', 'autograd']\nsteps = 1\n",
    );
    let ok = good_row("cat-store-copy", 1);
    let mut crashed = good_row("autograd", 1);
    crashed.status = "crashed".to_string();
    crashed.error = "crashed (SIGSEGV), \"deep\"\nin gemm".to_string();
    (crashed.peak_bytes, crashed.median_ns, crashed.grad_ok) = (None, None, None);
    (crashed.max_abs_err, crashed.max_rel_err) = (None, None);
    let mut oom = good_row("cat-store-copy", 7);
    oom.status = "oom".to_string();
    let mut foreign = good_row("autograd", 9);
    foreign.status = "error".to_string();
    let rows = [ok.clone(), crashed.clone(), oom.clone(), foreign.clone()];
    let bytes = csv_bytes(&rows).expect("csv");
    let f = write(dir.path(), "r.csv", &bytes);
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench-all",
            "--sweep",
            path_str(&sweep),
            "--out",
            path_str(&f),
            "--cache-dir",
            path_str(&cache),
        ];
        args.extend_from_slice(extra);
        densebench(&args)
    };
    // without --resume: refused, nothing changed
    let o = run(&["--rerun-failed"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert_eq!(std::fs::read(&f).expect("file"), bytes);
    // plain --resume: nothing to run, the crashed row stays, and fails the run as it did the
    // run that wrote it (the other sweep's failed row is not this run's: not counted)
    let o = run(&["--resume"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("rows that failed (crashed: 1; 1 of them kept from before (crashed: 1))"),
        "{e}"
    );
    assert_eq!(std::fs::read(&f).expect("file"), bytes);
    // --rerun-failed: the crashed row is measured again, everything else kept byte for byte
    let o = run(&["--resume", "--rerun-failed"]);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    assert!(
        e.contains("removed 1 rows to measure them again (crashed: 1)"),
        "{e}"
    );
    let kept = csv_bytes(&[ok.clone(), oom.clone(), foreign.clone()]).expect("csv");
    let now = std::fs::read(&f).expect("file");
    assert_eq!(&now[..kept.len()], &kept[..], "other rows changed");
    let after = read_rows(&f).expect("valid");
    assert_eq!(after.len(), 4);
    let new = &after[3];
    assert_eq!(
        (new.key.as_str(), new.status.as_str(), new.grad_ok),
        (crashed.key.as_str(), "ok", Some(true))
    );
    // a second time: nothing left to rerun, said so, file unchanged
    let o = run(&["--resume", "--rerun-failed"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("no failed rows of this run"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&f).expect("file"), now);
}

#[test]
fn a_second_writer_of_the_same_output_fails_at_once_naming_the_first() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("results.csv");
    let cache = dir.path().join("cache");
    let mut first = Command::new(common::bin())
        .args([
            "bench-all",
            "--quick",
            "--out",
            path_str(&out),
            "--cache-dir",
            path_str(&cache),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("first writer starts");
    let lock = dir.path().join(".results.csv.lock");
    let start = Instant::now();
    while !lock.exists() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(lock.exists(), "the first writer never took its lock");
    let begun = Instant::now();
    let o = quick(dir.path(), &out, &["--resume"]);
    let e = stderr(&o);
    let _ = first.kill();
    let _ = first.wait();
    assert!(!o.status.success(), "a second writer was let in");
    assert!(
        e.contains("being written by densebench pid") && e.contains(&first.id().to_string()),
        "{e}"
    );
    assert!(begun.elapsed() < Duration::from_secs(10), "it waited");
}

#[test]
fn outputs_that_are_inputs_are_refused_before_anything_is_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = [good_row("cat-store-copy", 1)];
    let csv = dir.path().join("x.csv");
    write_rows(&csv, &rows).expect("csv");
    let before = std::fs::read(&csv).expect("csv");
    let link = dir.path().join("link.csv");
    std::os::unix::fs::symlink(&csv, &link).expect("symlink");
    for out in [&csv, &link] {
        let o = densebench(&["report", path_str(&csv), "--out", path_str(out)]);
        assert!(!o.status.success());
        assert!(
            stderr(&o).contains("refusing to overwrite an input"),
            "{}",
            stderr(&o)
        );
    }
    let case = write(dir.path(), "case.safetensors", b"not really a case");
    let o = densebench(&[
        "step",
        "--case",
        path_str(&case),
        "--variant",
        "cat-store-copy",
        "--out",
        path_str(&case),
    ]);
    assert!(
        stderr(&o).contains("refusing to overwrite an input"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&csv).expect("csv"), before);
    assert_eq!(std::fs::read(&case).expect("case"), b"not really a case");
}

/// Runs `densebench ARGS` with a file-size limit of `kib` KiB (SIGXFSZ ignored, so a write past
/// it fails with EFBIG as on a full disk).
fn with_fsize_limit(kib: u64, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!("trap '' XFSZ; ulimit -f {kib}; exec \"$0\" \"$@\""))
        .arg(common::bin())
        .args(args);
    cmd.output().expect("bash runs")
}

#[test]
fn a_full_disk_leaves_the_previous_files_intact_with_one_clear_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows: Vec<Row> = (1..=4)
        .flat_map(|d| {
            [
                good_row("cat-store-copy", d),
                good_row("buffer-store-copy", d),
            ]
        })
        .collect();
    let csv = dir.path().join("x.csv");
    write_rows(&csv, &rows).expect("csv");
    // The report grows past 1 KiB: the write fails, the old report stays.
    let old_report: &[u8] = b"# densebench report\n\nthe old one\n";
    let report = write(dir.path(), "REPORT.md", old_report);
    let o = with_fsize_limit(1, &["report", path_str(&csv), "--out", path_str(&report)]);
    let e = stderr(&o);
    assert!(!o.status.success(), "{e}");
    assert!(
        e.contains("file too large") && e.contains("unchanged"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1, "one line: {e}");
    assert_eq!(std::fs::read(&report).expect("report"), old_report);
    // Merge: the merged file would exceed the limit.
    let merged = write(dir.path(), "merged.csv", b"old merge");
    let o = with_fsize_limit(1, &["merge", path_str(&merged), path_str(&csv), "--force"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("file too large"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&merged).expect("merged"), b"old merge");
    // Plots: a figure cannot be written; an older figure of the same name survives.
    let plots = dir.path().join("plots");
    std::fs::create_dir_all(&plots).expect("plots dir");
    let fig = write(&plots, "grad-error-mlp.svg", b"<svg>old</svg>");
    let o = with_fsize_limit(1, &["plots", path_str(&csv), "--out", path_str(&plots)]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("file too large"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&fig).expect("figure"), b"<svg>old</svg>");
    let tmp: Vec<String> = std::fs::read_dir(dir.path())
        .expect("dir")
        .chain(std::fs::read_dir(&plots).expect("plots"))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(tmp.is_empty(), "temporary files left: {tmp:?}");
    // A sweep whose rows no longer fit: it stops with the message, the file ends in whole rows.
    let out = dir.path().join("sweep.csv");
    let o = with_fsize_limit(
        4,
        &[
            "bench-all",
            "--quick",
            "--out",
            path_str(&out),
            "--cache-dir",
            path_str(&dir.path().join("cache")),
        ],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("file too large"), "{}", stderr(&o));
    let bytes = std::fs::read(&out).expect("sweep csv");
    assert!(bytes.ends_with(b"\n"), "a torn row was left");
    assert!(
        read_rows(&out).is_ok_and(|r| !r.is_empty()),
        "rows before it lost"
    );
}

#[test]
fn older_schemas_files_are_read_refused_for_appending_and_upgraded_by_merge() {
    for old_schema in [1u32, 2] {
        older_schema_case(old_schema);
    }
}

/// A file of `old_schema` (1 or 2): read with what that schema meant, refused for appending
/// (naming the way out), rewritten in the current schema by merge.
fn older_schema_case(old_schema: u32) {
    let dir = tempfile::tempdir().expect("temp dir");
    // The current schema's bytes without the columns the later schemas added.
    let mut old = good_row("cat-store-copy", 1);
    old.schema = old_schema;
    let text = String::from_utf8(csv_bytes(&[old]).expect("csv")).expect("utf8");
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(text.as_bytes());
    let dropped = |c: &str| {
        SCHEMA_3_COLUMNS.contains(&c) || (old_schema == 1 && SCHEMA_2_COLUMNS.contains(&c))
    };
    let keep: Vec<usize> = {
        let header = rdr.records().next().expect("header").expect("header");
        header
            .iter()
            .enumerate()
            .filter(|(_, c)| !dropped(c))
            .map(|(i, _)| i)
            .collect()
    };
    let mut w = csv::Writer::from_writer(Vec::new());
    for rec in csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(text.as_bytes())
        .records()
    {
        let rec = rec.expect("record");
        w.write_record(keep.iter().map(|&i| &rec[i]))
            .expect("write");
    }
    let bytes = w.into_inner().expect("bytes");
    let f = write(dir.path(), "old.csv", &bytes);
    let rows = read_rows(&f).expect("an older schema's file is read");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].schema, SCHEMA_VERSION);
    assert_eq!(rows[0].framework, "densebench");
    assert_eq!(rows[0].math, "ieee");
    assert_eq!(
        rows[0].execution, "eager",
        "every row before schema 3 was eager"
    );
    assert_eq!(rows[0].compile_ns, None);
    assert_eq!(rows[0].framework_version, rows[0].densebench_version);
    // Appending current rows to it is refused, naming the way out; the file is unchanged.
    let o = quick(dir.path(), &f, &["--resume"]);
    assert!(
        !o.status.success(),
        "appended to a schema-{old_schema} file"
    );
    let e = stderr(&o);
    assert!(
        e.contains(&format!("schema {old_schema}")) && e.contains("densebench merge"),
        "{e}"
    );
    assert_eq!(std::fs::read(&f).expect("still there"), bytes);
    // merge rewrites it in the current schema.
    let merged = dir.path().join("merged.csv");
    let o = densebench(&["merge", path_str(&merged), path_str(&f)]);
    assert!(o.status.success(), "merge: {}", stderr(&o));
    let rows = read_rows(&merged).expect("merged file");
    assert_eq!(rows[0].framework, "densebench");
    let header = std::fs::read_to_string(&merged).expect("merged");
    assert!(header
        .lines()
        .next()
        .is_some_and(|h| h.ends_with("tolerance,note,execution,compile_ns")));
}

/// The `size` cells of a CSV's text, in order.
fn size_cells(bytes: &[u8]) -> Vec<String> {
    let mut rdr = csv::Reader::from_reader(bytes);
    let at = rdr
        .headers()
        .expect("header")
        .iter()
        .position(|c| c == "size")
        .expect("a size column");
    rdr.records()
        .map(|r| r.expect("record")[at].to_string())
        .collect()
}

#[test]
fn integer_sizes_of_existing_files_read_and_write_back_unchanged_and_hxw_round_trips() {
    // The committed reference (schema 1, integer sizes: bc 32, mlp 1) reads, and its rows
    // written again carry the same `size` cells and keys.
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let original = std::fs::read(&reference).expect("results/reference-cpu.csv");
    let rows = read_rows(&reference).expect("the committed reference reads");
    assert!(rows
        .iter()
        .any(|r| r.family == "bc" && r.size == impls::Spatial::square(32)));
    let again = csv_bytes(&rows).expect("csv");
    assert_eq!(size_cells(&again), size_cells(&original));
    assert!(rows.iter().all(|r| r.key == key_of_fields(r)));
    // A non-square row: `3x5` in the cell and in the key, read back as H = 3, W = 5.
    let dir = tempfile::tempdir().expect("temp dir");
    let mut r = good_row("cat-store-copy", 1);
    (r.family, r.bn_size, r.size) = ("bc".to_string(), 2, impls::Spatial::new(3, 5));
    r.key = key_of_fields(&r);
    assert_eq!(r.key, "cat-store-copy/bc/4/3/2/1/2/3x5/on/f32/0/cpu");
    let p = dir.path().join("hxw.csv");
    let bytes = csv_bytes(std::slice::from_ref(&r)).expect("csv");
    assert_eq!(size_cells(&bytes), ["3x5"]);
    std::fs::write(&p, &bytes).expect("write");
    assert_eq!(read_rows(&p).expect("readable"), vec![r.clone()]);
    assert!(r.config_label().contains(" 3x5 "), "{}", r.config_label());
    // A size cell that is neither names the line, the column and the value, and says what a
    // size is (csv gives no column index for a custom error: the message names `size`).
    let text = String::from_utf8(bytes).expect("utf8");
    for (bad, cell) in [
        ("3x", "size \"3x\""),
        ("axb", "size \"axb\""),
        ("-3", "size -3"),
    ] {
        let p = write(
            dir.path(),
            "bad.csv",
            text.replace(",3x5,", &format!(",{bad},")).as_bytes(),
        );
        let e = read_rows(&p)
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_default();
        assert!(
            e.contains("bad.csv line 2")
                && e.contains(cell)
                && e.contains("360x480")
                && !e.contains('\n'),
            "{bad}: {e}"
        );
    }
}

#[test]
fn tf32_rows_carry_their_math_in_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut tf32 = good_row("cat-store-copy", 1);
    tf32.device = "cuda:0".to_string();
    tf32.math = "tf32".to_string();
    tf32.key = key_of_fields(&tf32);
    assert!(tf32.key.ends_with("/cuda:0/tf32"), "{}", tf32.key);
    let p = dir.path().join("tf32.csv");
    write_rows(&p, std::slice::from_ref(&tf32)).expect("csv");
    assert_eq!(read_rows(&p).expect("reads")[0].math, "tf32");
    // A tf32 row whose key lacks the suffix (or an ieee row that has it) is refused.
    let mut lying = tf32.clone();
    lying.math = "ieee".to_string();
    std::fs::write(&p, csv_bytes(&[lying]).expect("csv")).expect("write");
    let e = read_rows(&p)
        .err()
        .map(|e| format!("{e:#}"))
        .unwrap_or_default();
    assert!(e.contains("column `key`"), "{e}");
}

#[test]
fn rows_that_lie_about_schema_or_key_are_refused_and_nan_errors_are_never_ok() {
    let dir = tempfile::tempdir().expect("temp dir");
    let good = dir.path().join("good.csv");
    write_rows(&good, &[good_row("cat-store-copy", 1)]).expect("csv");
    let mut future = good_row("cat-store-copy", 1);
    future.schema = 99;
    let mut mixed = good_row("cat-store-copy", 1);
    mixed.depth = 7;
    for (name, row, needle) in [
        ("future.csv", future, "column `schema`: 99"),
        ("mixed.csv", mixed, "column `key`"),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, csv_bytes(&[row]).expect("csv")).expect("write");
        for args in [
            vec!["compare", path_str(&good), path_str(&p)],
            vec![
                "report",
                path_str(&p),
                "--out",
                path_str(&dir.path().join("r.md")),
            ],
            vec!["merge", path_str(&dir.path().join("m.csv")), path_str(&p)],
        ] {
            let o = densebench(&args);
            assert!(!o.status.success(), "{name} accepted by {args:?}");
            assert!(
                stderr(&o).contains(needle),
                "{name} {args:?}: {}",
                stderr(&o)
            );
        }
    }
    // A cell of the wrong type names its column, not a field number.
    let bad = write(
        dir.path(),
        "typed.csv",
        &csv_bytes(&[good_row("cat-store-copy", 1)])
            .map(|b| {
                String::from_utf8(b)
                    .expect("utf8")
                    .replace(",1000,", ",lots,")
            })
            .expect("csv")
            .into_bytes(),
    );
    let e = read_rows(&bad).err().map(|e| format!("{e:#}"));
    assert!(
        e.as_deref()
            .is_some_and(|e| e.contains("column `peak_bytes`") && !e.contains("field")),
        "{e:?}"
    );
    // NaN in an error column: grad_ok is false wherever it is read.
    let mut nan = good_row("cat-store-copy", 1);
    nan.max_rel_err = Some(f64::NAN);
    let p = dir.path().join("nan.csv");
    std::fs::write(&p, csv_bytes(&[nan]).expect("csv")).expect("write");
    let rows = read_rows(&p).expect("readable");
    assert_eq!(rows[0].grad_ok, Some(false));
}

#[test]
fn the_csv_reader_never_panics_on_random_or_mutated_input() {
    use proptest::prelude::*;
    let dir = tempfile::tempdir().expect("temp dir");
    let valid = csv_bytes(&[good_row("cat-store-copy", 1), good_row("autograd", 2)]).expect("csv");
    let p = dir.path().join("fuzz.csv");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 200,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = (
        proptest::collection::vec(any::<u8>(), 0..400),
        proptest::collection::vec((0usize..4096, any::<u8>()), 0..8),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(random, edits, mutate)| {
            let bytes = if mutate {
                let mut b = valid.clone();
                for (at, v) in edits {
                    let i = at % b.len();
                    b[i] = v;
                }
                b
            } else {
                random
            };
            std::fs::write(&p, &bytes).expect("write");
            // Any outcome is fine but a panic: Ok rows or an error naming the file.
            if let Err(e) = read_rows(&p) {
                let text = format!("{e:#}");
                prop_assert!(text.contains("fuzz.csv"), "{}", text);
            }
            Ok(())
        })
        .expect("read_rows never panics and every error names the file");
}

/// The committed reference's `predicted_peak_bytes` is what the memory model predicts now: a
/// change to the model (or to what a step allocates) shows here until the reference run is
/// regenerated, so the figures and REPORT.md never quote a model the code no longer has.
#[test]
fn committed_reference_predictions_are_the_current_models() {
    use densebench::measure::estimates::predicted_peak_bytes;
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let rows = read_rows(&reference).expect("the committed reference reads");
    let mut checked = 0;
    for r in rows.iter().filter(|r| r.framework == "densebench") {
        let variant = impls::Variant::parse(&r.variant).expect("a known variant");
        let cfg = r.config().expect("a valid config");
        assert_eq!(r.device, "cpu", "{}", r.key);
        let now = predicted_peak_bytes(variant, &cfg, true, r.threads);
        assert_eq!(
            now, r.predicted_peak_bytes,
            "{}: the model now predicts {now:?} B, the committed reference says {:?} B",
            r.key, r.predicted_peak_bytes
        );
        checked += usize::from(now.is_some());
    }
    assert!(checked > 50, "only {checked} modelled rows checked");
}

/// Progress lines go to stderr; a stderr that cannot be written (a full disk behind `2>`, a
/// closed pipe) must not kill the sweep: every row is measured and written all the same.
#[test]
fn a_sweep_survives_a_stderr_it_cannot_write() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("q.csv");
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full");
    let status = Command::new(common::bin())
        .args([
            "bench-all",
            "--quick",
            "--out",
            path_str(&out),
            "--cache-dir",
        ])
        .arg(dir.path().join("cache"))
        .stderr(full)
        .stdout(Stdio::null())
        .status()
        .expect("densebench");
    assert_eq!(status.code(), Some(0));
    let rows = read_rows(&out).expect("valid CSV");
    assert_eq!(rows.len(), 49, "every quick-sweep job");
    assert!(rows.iter().all(|r| r.status == "ok"));
}

/// A reference cache that cannot be made or written is refused before the output is touched
/// (it used to be found by every configuration in turn, each of its rows an `error`).
#[test]
fn an_unusable_reference_cache_is_refused_before_any_work() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(dir.path(), "not-a-dir", b"x");
    let out = dir.path().join("q.csv");
    let o = densebench(&[
        "bench-all",
        "--quick",
        "--out",
        path_str(&out),
        "--cache-dir",
        path_str(&file.join("cache")),
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{e}");
    assert!(
        e.contains("reference cache") && e.contains("not-a-dir"),
        "{e}"
    );
    assert!(!out.exists(), "{} was written", out.display());
}

/// `merge` refuses inputs whose GPU bc rows were measured with two 3×3 convolutions (a key does
/// not name `DENSEBENCH_CONV`'s choice; the rows' notes do): one line naming both with counts and
/// first keys, nothing written. Rows of one convolution merge as before.
#[test]
fn merge_never_mixes_two_convolutions() {
    let dir = tempfile::tempdir().expect("temp dir");
    let gpu_row = |variant: &str, depth: usize, note: &str| {
        let mut r = good_row(variant, depth);
        r.family = "bc".to_string();
        r.bn_size = 4;
        r.device = "cuda:0".to_string();
        r.device_desc = "test GPU".to_string();
        r.note = note.to_string();
        r.key = key_of_fields(&r);
        r
    };
    let tap = dir.path().join("tap.csv");
    let tap_rows = [
        gpu_row("cat-store-copy", 4, "3×3 tap stack in 1 chunk"),
        gpu_row("cat-store-copy", 8, "3×3 tap stack in 1 chunk"),
    ];
    write_rows(&tap, &tap_rows).expect("csv");
    let direct = dir.path().join("direct.csv");
    let direct_row = gpu_row(
        "buffer-recompute-inplace",
        4,
        "3×3 convolution in densebench's direct kernels (TF32 tensor cores, weight-gradient \
         partials 1 B)",
    );
    write_rows(&direct, std::slice::from_ref(&direct_row)).expect("csv");
    let out = dir.path().join("merged.csv");
    let o = densebench(&["merge", path_str(&out), path_str(&tap), path_str(&direct)]);
    let e = stderr(&o);
    assert!(!o.status.success(), "mixed convolutions merged: {e}");
    for part in [
        "2 3×3 convolutions",
        "the tap stack: 2 rows",
        tap_rows[0].key.as_str(),
        "densebench's direct kernels: 1 rows",
        direct_row.key.as_str(),
        "nothing was written",
    ] {
        assert!(e.contains(part), "{part:?} missing: {e}");
    }
    assert!(!out.exists(), "a refused merge wrote {}", out.display());
    // one convolution (and CPU rows beside it) merges
    let cpu = dir.path().join("cpu.csv");
    write_rows(&cpu, &[good_row("cat-store-copy", 3)]).expect("csv");
    let o = densebench(&["merge", path_str(&out), path_str(&tap), path_str(&cpu)]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Defect (session 25): a `cargo build` that replaced the binary while its sweep ran stopped
/// the sweep at the next row ("starting …/densebench (deleted): No such file or directory").
/// Now every child runs the image that is running (`/proc/self/exe`): the sweep finishes, on the
/// binary its first rows were measured with.
#[test]
#[cfg(target_os = "linux")]
fn a_sweep_finishes_when_its_binary_is_replaced_under_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let exe = dir.path().join("densebench");
    std::fs::copy(common::bin(), &exe).expect("a copy of the binary");
    let out = dir.path().join("results.csv");
    let sweep = write(
        dir.path(),
        "s.toml",
        b"[defaults]\nsteps = 1\nwarmup = 0\n[[group]]\nfamily = 'mlp'\nbatch = 4\n\
          channels = 3\ngrowth = 2\ndepth = [1, 2, 3, 4, 5, 6, 7, 8]\n\
          variants = ['cat-store-copy', 'buffer-store-inplace']\n",
    );
    let mut sweep_run = Command::new(&exe)
        .args([
            "bench-all",
            "--sweep",
            path_str(&sweep),
            "--out",
            path_str(&out),
        ])
        .args(["--cache-dir", path_str(&dir.path().join("cache"))])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the sweep starts");
    // the first row written: then the binary is replaced (a new file renamed over it, as cargo
    // does) by one that cannot run
    let start = Instant::now();
    let rows = || std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
    while rows() < 2 && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(10));
    }
    if rows() < 2 {
        let _ = sweep_run.kill();
        let o = sweep_run.wait_with_output().expect("the sweep ends");
        panic!(
            "no row within 2 minutes: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let new = write(dir.path(), "densebench.new", b"#!/bin/sh\nexit 99\n");
    std::fs::rename(&new, &exe).expect("replacing the binary");
    // jobs were left to run on the replaced binary (else this test tests nothing)
    let at_rename = rows();
    let o = sweep_run.wait_with_output().expect("the sweep ends");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    let written = read_rows(&out).expect("the rows");
    assert_eq!(written.len(), 16, "{e}");
    assert!(written.iter().all(|r| r.status == "ok"), "{e}");
    assert!(
        at_rename < 17,
        "all 16 rows were written before the binary was replaced"
    );
}

/// Defect (session 25): `--resume` on a file that holds one key twice (an edited or
/// concatenated file) counted both rows in its verdict ("holds 5 rows of this run's jobs … ok:
/// 5" for a 4-job sweep) and said nothing. Now each key counts once, its last row, and a warning
/// names the key.
#[test]
fn resume_counts_a_repeated_key_once_and_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("results.csv");
    let sweep = write(
        dir.path(),
        "s.toml",
        b"[defaults]\nsteps = 1\nwarmup = 0\n[[group]]\nfamily = 'mlp'\nbatch = 4\n\
          channels = 3\ngrowth = 2\ndepth = [1, 2]\n\
          variants = ['cat-store-copy', 'buffer-store-inplace']\n",
    );
    let cache = dir.path().join("cache");
    let args = [
        "bench-all",
        "--sweep",
        path_str(&sweep),
        "--out",
        path_str(&out),
        "--cache-dir",
        path_str(&cache),
    ];
    let o = densebench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let second = text.lines().nth(1).unwrap().to_string();
    std::fs::write(&out, format!("{text}{second}\n")).unwrap();
    let mut resume = args.to_vec();
    resume.push("--resume");
    let o = densebench(&resume);
    let e = stderr(&o);
    assert!(o.status.success(), "{e}");
    let key = read_rows(&out).unwrap()[0].key.clone();
    assert!(
        e.contains("holds 1 earlier row(s) of keys it also holds later") && e.contains(&key),
        "{e}"
    );
    assert!(
        e.contains("holds 4 rows of this run's jobs from before (ok: 4)"),
        "{e}"
    );
}

/// `report`, `plots` and `compare` on a result CSV a sweep is still writing say so (they show
/// the rows written so far), where they said nothing (session 25); without a live writer, no
/// warning.
#[test]
fn readers_say_when_their_input_is_being_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("results.csv");
    let cache = dir.path().join("cache");
    let mut sweep = Command::new(common::bin())
        .args(["bench-all", "--quick", "--out", path_str(&out)])
        .args(["--cache-dir", path_str(&cache)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the sweep starts");
    let lock = dir.path().join(".results.csv.lock");
    let start = Instant::now();
    let rows = || std::fs::read_to_string(&out).map_or(0, |t| t.lines().count());
    while (!lock.exists() || rows() < 2) && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let md = dir.path().join("REPORT.md");
    let figs = dir.path().join("figs");
    let outs = [
        densebench(&["report", path_str(&out), "--out", path_str(&md)]),
        densebench(&["plots", path_str(&out), "--out", path_str(&figs)]),
        densebench(&["compare", path_str(&out), path_str(&out)]),
    ];
    let running = sweep.try_wait().expect("the sweep's status").is_none();
    let _ = sweep.kill();
    let _ = sweep.wait();
    assert!(
        running,
        "the sweep ended before the readers ran: nothing was tested"
    );
    let warning = format!("is being written by densebench pid {}", sweep.id());
    for o in &outs {
        assert!(stderr(o).contains(&warning), "{}", stderr(o));
    }
    // the sweep stopped: its lock is gone, and no reader warns
    let o = densebench(&["report", path_str(&out), "--out", path_str(&md)]);
    assert!(!stderr(&o).contains("is being written"), "{}", stderr(&o));
}
