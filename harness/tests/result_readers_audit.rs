//! The result-reading commands (`compare`, `report`, `plots`) fed damaged or unusual copies of
//! the committed result CSVs, through the real binary: no silently wrong number, and every
//! refusal one line naming the file, the line and the column.
//!
//! - `compare` pairs eager and CUDA-graph rows of one variant apart, and CPU and GPU rows apart
//!   (it used to collapse them as "duplicates" and compare whichever came last on each side);
//! - a negative gradient error, a timeline that does not read or a `size` that does not read is
//!   refused where it is read, with its file, line and column;
//! - a file mixing CRLF and LF lines names the right line;
//! - `report` and `plots` refuse rows of two 3×3 convolutions of one machine (their keys are
//!   the same: one was taken for a repeat of the other and dropped);
//! - a metric named twice is compared once;
//! - timings out of order (a median below its minimum), a rate that is not flops / median_ns
//!   and a status no run writes are refused with their place;
//! - a peer's timeline that does not read makes its row an error row, so that the file it is
//!   written to still reads.

mod common;
#[path = "common/peer.rs"]
mod peer_common;

use common::{densebench, path_str, stderr};
use densebench::results::row::{read_rows, Row};
use densebench::results::store::csv_bytes;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The repository root (the harness crate's parent).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness crate is in the workspace")
        .to_path_buf()
}

fn committed(name: &str) -> PathBuf {
    root().join("results").join(name)
}

fn rows_of(name: &str) -> Vec<Row> {
    read_rows(&committed(name)).unwrap_or_else(|e| panic!("{name} reads: {e:#}"))
}

fn write(dir: &Path, name: &str, rows: &[Row]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, csv_bytes(rows).expect("csv")).expect("writing a test CSV");
    p
}

/// stdout then stderr.
fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(o))
}

/// `src` with the cell of `column` in data row `row` (0: the first after the header) replaced
/// by `value`, written to `dir/name`.
fn with_cell(dir: &Path, name: &str, src: &Path, row: usize, column: &str, value: &str) -> PathBuf {
    let mut rdr = csv::Reader::from_path(src).expect("the source reads");
    let header = rdr.headers().expect("header").clone();
    let at = header
        .iter()
        .position(|h| h == column)
        .unwrap_or_else(|| panic!("no column {column}"));
    let p = dir.join(name);
    let mut w = csv::Writer::from_path(&p).expect("create");
    w.write_record(&header).expect("header");
    for (i, rec) in rdr.records().enumerate() {
        let rec = rec.expect("record");
        let cells: Vec<&str> = rec
            .iter()
            .enumerate()
            .map(|(j, c)| if i == row && j == at { value } else { c })
            .collect();
        w.write_record(&cells).expect("row");
    }
    w.flush().expect("flush");
    p
}

/// One refusal: exit 2, no panic, one error line naming the file, line and column.
fn assert_refused(o: &Output, file: &Path, line: usize, column: &str, what: &str) {
    let log = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("error")).collect();
    assert_eq!(errors.len(), 1, "one error line:\n{log}");
    let want = format!("{} line {line}, column `{column}`", file.display());
    assert!(
        errors[0].contains(&want) && errors[0].contains(what),
        "wanted `{want}` … `{what}`:\n{log}"
    );
}

/// `results/reference-h200.csv` holds an eager and a CUDA-graph row of each densebench variant
/// at BC-100 L=16. Compared with its own eager rows, every eager row must pair with itself: the
/// graph rows are rows of their own (only in BASE), never the BASE side of an eager row. Before,
/// the graph rows replaced the eager ones as "duplicates" and 9 eager times were flagged as
/// regressions of up to ×2.0 against them.
#[test]
fn compare_pairs_eager_and_graph_rows_apart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let all = rows_of("reference-h200.csv");
    let eager: Vec<Row> = all
        .iter()
        .filter(|r| r.execution == "eager")
        .cloned()
        .collect();
    let graphs = all.len() - eager.len();
    assert!(
        eager.len() >= 9 && graphs >= 9,
        "the reference has both executions"
    );
    let new = write(dir.path(), "eager.csv", &eager);
    let base = committed("reference-h200.csv");
    let o = densebench(&[
        "compare",
        path_str(&base),
        path_str(&new),
        "--max-regression",
        "0",
        "--allow-missing",
        "--format",
        "csv",
    ]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(!log.contains("duplicate"), "{log}");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = stdout.lines().skip(1).collect();
    let compared = lines.iter().filter(|l| l.ends_with(",same")).count();
    assert_eq!(
        compared,
        2 * eager.len(),
        "every eager row, both metrics:\n{log}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.ends_with(",regression") || l.ends_with(",improvement")),
        "an eager row compared with a graph row:\n{log}"
    );
    assert_eq!(
        lines.iter().filter(|l| l.ends_with(",only-base")).count(),
        graphs,
        "{log}"
    );
    // The graph rows, compared with BASE, carry their execution in their label.
    assert!(
        lines
            .iter()
            .filter(|l| l.ends_with(",only-base"))
            .all(|l| l.contains(" graph,")),
        "{log}"
    );

    // An eager-only file against a graph-only one still pairs, with a warning that says so.
    let graph_rows: Vec<Row> = all
        .iter()
        .filter(|r| r.execution == "graph")
        .cloned()
        .collect();
    let graph = write(dir.path(), "graph.csv", &graph_rows);
    let o = densebench(&[
        "compare",
        path_str(&new),
        path_str(&graph),
        "--allow-missing",
    ]);
    let log = text(&o);
    assert!(
        log.contains("executions differ: BASE eager vs NEW graph"),
        "{log}"
    );
}

/// Two merges of the same CPU and GPU references in the opposite order hold the same rows; the
/// CPU and the GPU row of one variant and config are two rows (their keys' devices differ).
/// Before, each side kept its last one of the two, so CPU rows were compared with GPU rows:
/// 15 "regressions" and a geometric mean of ×1.33 between identical files.
#[test]
fn compare_pairs_cpu_and_gpu_rows_apart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cpu = rows_of("reference-cpu.csv");
    let gpu = rows_of("reference-h200.csv");
    let a: Vec<Row> = cpu.iter().chain(&gpu).cloned().collect();
    let b: Vec<Row> = gpu.iter().chain(&cpu).cloned().collect();
    let (a, b) = (
        write(dir.path(), "a.csv", &a),
        write(dir.path(), "b.csv", &b),
    );
    let o = densebench(&[
        "compare",
        path_str(&a),
        path_str(&b),
        "--max-regression",
        "0",
    ]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    let n = cpu.len() + gpu.len();
    assert!(
        log.contains(&format!("{n} rows matched, 0 only in BASE, 0 only in NEW")),
        "{log}"
    );
    assert!(
        !log.contains("duplicate") && !log.contains("REGRESSION"),
        "{log}"
    );
    assert!(log.contains("geometric mean NEW/BASE: 1.000"), "{log}");
}

/// A gradient error is a magnitude: a negative one is refused where it is read (it passed any
/// tolerance, and the report printed it as the worst error, "within tolerance").
#[test]
fn a_negative_gradient_error_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = committed("reference-cpu.csv");
    for column in ["max_rel_err", "max_abs_err", "grad_params_max_abs_err"] {
        let bad = with_cell(dir.path(), "bad.csv", &src, 3, column, "-0.001");
        let out = dir.path().join("r.md");
        let o = densebench(&["report", path_str(&bad), "--out", path_str(&out)]);
        assert_refused(&o, &bad, 5, column, "is negative");
        assert!(!out.exists(), "a report of a refused file");
        let o = densebench(&["compare", path_str(&src), path_str(&bad)]);
        assert_refused(&o, &bad, 5, column, "is negative");
    }
}

/// Timings and rates that no measurement gives are refused where the file is read, with their
/// place: before, a median below its minimum or above its maximum, a rate that is not flops /
/// median_ns, a negative machine rate and a status no run writes were all read as they stood.
#[test]
fn timings_and_rates_that_no_measurement_gives_are_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = committed("reference-cpu.csv");
    // (edited cell, its value, the column refused, what the refusal says)
    let cases = [
        (
            "fwd_min_ns",
            "999999999999",
            "fwd_median_ns",
            "is below its fwd_min_ns",
        ),
        (
            "bwd_max_ns",
            "1",
            "bwd_median_ns",
            "is above its bwd_max_ns",
        ),
        (
            "gflops_per_s",
            "123.4",
            "gflops_per_s",
            "is not its flops / median_ns",
        ),
        (
            "machine_gflops",
            "-5",
            "machine_gflops",
            "is not a machine's rate",
        ),
        ("status", "passed", "status", "is not a status a run writes"),
    ];
    for (i, (cell, value, column, what)) in cases.into_iter().enumerate() {
        let bad = with_cell(dir.path(), &format!("bad{i}.csv"), &src, 3, cell, value);
        let o = densebench(&["compare", path_str(&src), path_str(&bad)]);
        assert_refused(&o, &bad, 5, column, what);
        let out = dir.path().join(format!("r{i}.md"));
        let o = densebench(&["report", path_str(&bad), "--out", path_str(&out)]);
        assert_refused(&o, &bad, 5, column, what);
        assert!(!out.exists(), "a report of a refused file");
    }
    // The committed file itself reads: every check above is of the edit.
    let o = densebench(&["compare", path_str(&src), path_str(&src)]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

/// A timeline that does not read is refused where the file is read, with its place; before,
/// `plots` stopped half way through drawing (exit 1), naming a figure and a variant.
#[test]
fn a_timeline_that_does_not_read_is_refused_with_its_place() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = committed("reference-cpu.csv");
    for (i, timeline) in ["f0=abc", "f0=1;;b0=2", "f0"].into_iter().enumerate() {
        // the `autograd` row of the forum mlp at L=32: drawn in a timeline figure
        let bad = with_cell(dir.path(), "bad.csv", &src, 20, "timeline", timeline);
        let out = dir.path().join(format!("plots{i}"));
        let o = densebench(&["plots", path_str(&bad), "--out", path_str(&out)]);
        assert_refused(&o, &bad, 22, "timeline", "label=bytes");
        assert!(!out.exists(), "figures of a refused file");
    }
}

/// A `size` cell that does not read names its column like every other cell.
#[test]
fn a_size_that_does_not_read_names_its_column() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = committed("reference-cpu.csv");
    for size in ["-5", "NaN", "1e3", "abc", "8x"] {
        let bad = with_cell(dir.path(), "bad.csv", &src, 3, "size", size);
        let o = densebench(&["compare", path_str(&src), path_str(&bad)]);
        assert_refused(&o, &bad, 5, "size", "size");
    }
}

/// A file whose lines end in LF, then in CRLF (rows pasted from a Windows editor), and with
/// blank lines: the error names the line the bad row is on. The line count the csv crate
/// keeps is one low after every CRLF line and counts blank lines before the row.
#[test]
fn errors_name_the_line_in_a_file_of_mixed_line_endings() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = committed("reference-cpu.csv");
    let bad = with_cell(dir.path(), "bad.csv", &src, 9, "peak_bytes", "many");
    let text = std::fs::read_to_string(&bad).expect("read");
    let lines: Vec<&str> = text.lines().collect();
    // line 11 is the bad row (header, then rows 0..): LF for 4 lines, CRLF after, two blank
    // lines before line 7
    let mut mixed = String::new();
    for (i, l) in lines.iter().enumerate() {
        if i == 6 {
            mixed.push_str("\r\n\n");
        }
        mixed.push_str(l);
        mixed.push_str(if i < 4 { "\n" } else { "\r\n" });
    }
    let bad_line = 11 + 2;
    assert!(mixed
        .lines()
        .nth(bad_line - 1)
        .is_some_and(|l| l.contains(",many,")));
    let mixed_path = dir.path().join("mixed.csv");
    std::fs::write(&mixed_path, &mixed).expect("write");
    let o = densebench(&["compare", path_str(&src), path_str(&mixed_path)]);
    assert_refused(
        &o,
        &mixed_path,
        bad_line,
        "peak_bytes",
        "expected an integer",
    );
    // a key that disagrees with its fields, past the blank lines and CRLF lines
    let key_bad = with_cell(dir.path(), "key.csv", &src, 9, "key", "nope");
    let text = std::fs::read_to_string(&key_bad).expect("read");
    let mut mixed = String::new();
    for (i, l) in text.lines().enumerate() {
        if i == 6 {
            mixed.push_str("\r\n\n");
        }
        mixed.push_str(l);
        mixed.push_str(if i < 4 { "\n" } else { "\r\n" });
    }
    std::fs::write(&mixed_path, &mixed).expect("write");
    let o = densebench(&["compare", path_str(&src), path_str(&mixed_path)]);
    assert_refused(&o, &mixed_path, bad_line, "key", "`nope` disagrees");
}

/// The `conv` stage's files hold rows of one 3×3 convolution each, with the keys of the
/// reference's rows (a key does not name its convolution). Given together to `report` or
/// `plots`, one file's rows were taken for repeats of the other's and dropped, leaving a mix of
/// both convolutions under one machine; now refused, naming each convolution and its file.
/// Different machines' rows stay apart, as before.
#[test]
fn report_and_plots_refuse_two_convolutions_of_one_machine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cudnn, fma) = (
        committed("conv-h200-cudnn.csv"),
        committed("conv-h200-direct-fma.csv"),
    );
    let out = dir.path().join("r.md");
    for args in [
        vec![
            "report",
            path_str(&cudnn),
            path_str(&fma),
            "--out",
            path_str(&out),
        ],
        vec![
            "plots",
            path_str(&cudnn),
            path_str(&fma),
            "--out",
            path_str(&out),
        ],
    ] {
        let o = densebench(&args);
        let log = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}:\n{log}");
        assert!(
            log.contains("3×3 convolutions")
                && log.contains("cuDNN: 10 rows, the first ")
                && log.contains(&format!("in {}", cudnn.display()))
                && log.contains(&format!("in {}", fma.display())),
            "{args:?}:\n{log}"
        );
        assert!(!out.exists(), "{args:?}: written");
    }
    // an H100's tap-stack rows beside an H200's cuDNN rows: two machines, reported
    let h100 = committed("reference-h100.csv");
    let o = densebench(&[
        "report",
        path_str(&h100),
        path_str(&cudnn),
        "--out",
        path_str(&out),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// `report --max-depth` names the right line in a file of mixed line endings too.
#[test]
fn max_depth_errors_name_the_line_in_a_file_of_mixed_line_endings() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = std::fs::read_to_string(committed("max-depth-bc-1GiB.csv")).expect("read");
    let lines: Vec<&str> = src.lines().collect();
    assert!(lines.len() >= 6, "the committed max-depth CSV has rows");
    let mut text = String::new();
    for (i, l) in lines.iter().enumerate() {
        // the fifth line's first cell made unreadable as a number further on
        let l = if i == 4 {
            l.replacen(",1073741824,", ",lots,", 1)
        } else {
            l.to_string()
        };
        text.push_str(&l);
        text.push_str(if i < 2 { "\n" } else { "\r\n" });
    }
    assert!(text.contains(",lots,"), "the budget cell was replaced");
    let md = dir.path().join("md.csv");
    std::fs::write(&md, text).expect("write");
    let out = dir.path().join("r.md");
    let o = densebench(&[
        "report",
        path_str(&committed("reference-cpu.csv")),
        "--max-depth",
        path_str(&md),
        "--out",
        path_str(&out),
    ]);
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(log.contains(&format!("{} line 5", md.display())), "{log}");
}

/// A metric named twice (not only twice in a row) is compared once: it was compared twice, its
/// table printed twice with every row twice, its geometric mean taken over twice the rows and
/// its regressions counted twice in the verdict.
#[test]
fn a_metric_named_twice_is_compared_once() {
    let base = committed("reference-cpu.csv");
    let new = committed("reference-cpu-rerun.csv");
    let run = |metrics: &[&str]| {
        let mut args = vec!["compare", path_str(&base), path_str(&new)];
        for m in metrics {
            args.extend_from_slice(&["--metric", m]);
        }
        args.extend_from_slice(&["--max-regression", "10", "--allow-missing"]);
        text(&densebench(&args))
    };
    let once = run(&["median_ns", "peak_bytes"]);
    let twice = run(&["median_ns", "peak_bytes", "median_ns"]);
    let verdict = |log: &str| log.lines().last().unwrap_or_default().to_string();
    assert!(verdict(&once).starts_with("FAIL: "), "{once}");
    assert_eq!(verdict(&once), verdict(&twice), "{twice}");
    assert_eq!(
        twice.matches("median_ns (ms").count(),
        1,
        "one table per metric:\n{twice}"
    );
    assert_eq!(once, twice);
}

/// A peer whose JSON line carries a timeline that does not read (`f0=1.5`): its row is an
/// `error` row saying so, and the file reads back (every reader, `--resume` included, refuses a
/// row whose timeline does not read; the row used to be written `ok` with it).
#[test]
fn a_peer_timeline_that_does_not_read_is_an_error_row() {
    let line = r#"{"framework":"pytorch","framework_version":"fake-torch 0.0","device_desc":"fake CPU (1 threads)","threads":1,"math":"ieee","peak_bytes":1000,"baseline_bytes":500,"saved_bytes":300,"peak_rss_bytes":null,"median_ns":9,"min_ns":8,"max_ns":10,"fwd_median_ns":4,"fwd_min_ns":4,"fwd_max_ns":4,"bwd_median_ns":5,"bwd_min_ns":5,"bwd_max_ns":5,"timeline":"f0=1.5;f1=2","bn_updates":{"denselayer1.norm1":1,"denselayer1.norm2":1},"running_snapshot":"after_forward"}"#;
    let (o, rows) = peer_common::bench(
        peer_common::BC_SWEEP,
        &["--peer", "pytorch"],
        &[("FAKE_STDOUT", line)],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    let rows = rows.unwrap_or_else(|| panic!("no rows written: {err}"));
    let peers: Vec<&Row> = rows.iter().filter(|r| r.is_peer()).collect();
    assert!(!peers.is_empty(), "{rows:?}");
    for r in peers {
        assert_eq!(r.status, "error", "{}: {}", r.variant, r.error);
        assert!(
            r.error.contains("the peer's timeline") && r.error.contains("`f0=1.5`"),
            "{}: {}",
            r.variant,
            r.error
        );
        assert!(r.timeline.is_empty(), "{}: {}", r.variant, r.timeline);
    }
}

/// A device description (or note) with a line break, as a spreadsheet may leave it: every
/// markdown table row of the report stays on one line (the break ended the row, its other cells
/// spilling out of the table).
#[test]
fn a_line_break_in_a_cell_stays_inside_its_markdown_table_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows: Vec<Row> = rows_of("reference-cpu.csv")
        .into_iter()
        .map(|mut r| {
            r.device_desc = "AMD EPYC,\r\nAVX-512 (2 threads)".to_string();
            if r.is_peer() {
                r.note = "first line\nsecond line".to_string();
            }
            r
        })
        .collect();
    let csv = write(dir.path(), "nl.csv", &rows);
    let out = dir.path().join("r.md");
    let o = densebench(&["report", path_str(&csv), "--out", path_str(&out)]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let md = std::fs::read_to_string(&out).expect("the report");
    let mut in_table = false;
    for line in md.lines() {
        if line.starts_with('|') {
            in_table = true;
            assert!(line.ends_with('|'), "a table row cut short: {line}");
        } else if in_table {
            assert!(
                line.is_empty(),
                "a table followed by a spilled cell: `{line}`"
            );
            in_table = false;
        }
    }
    assert!(
        md.contains("AMD EPYC, AVX-512"),
        "the description, on one line"
    );
}

/// `plan --shards -1` says what a shard count is, not "unexpected argument '-1'".
#[test]
fn a_negative_shard_count_is_a_bad_value_not_an_unknown_argument() {
    let o = densebench(&["plan", "--quick", "--shards", "-1"]);
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains("invalid value '-1' for '--shards <N>'") && !log.contains("unexpected"),
        "{log}"
    );
}

/// A header that names a column twice is refused as the header's fault (it was "line 2:
/// duplicate field", blaming the first row), and an unnamed extra column (a comma at the end of
/// every line) is named (it read "extra columns []").
#[test]
fn a_header_with_a_repeated_or_unnamed_column_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = committed("reference-cpu.csv");
    let text = std::fs::read_to_string(&src).expect("read");
    let (header, body) = text.split_once('\n').expect("a header line");
    let edit = |name: &str, header_suffix: &str, row_suffix: &str| {
        let p = dir.path().join(name);
        let mut out = format!("{header}{header_suffix}\n");
        for line in body.lines() {
            out.push_str(line);
            out.push_str(row_suffix);
            out.push('\n');
        }
        std::fs::write(&p, out).expect("write");
        p
    };
    let columns = header.split(',').count();
    let twice = edit("twice.csv", ",median_ns", ",1");
    let o = densebench(&["compare", path_str(&src), path_str(&twice)]);
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains(&format!(
            "{}: its header names the column `median_ns` twice",
            twice.display()
        )) && log.contains(&format!("and {})", columns + 1))
            && !log.contains("line 2"),
        "{log}"
    );
    // `--resume` of it: refused, the file unchanged, the repeat named (it said "the same
    // columns in another order")
    let before = std::fs::read(&twice).expect("read");
    let o = densebench(&[
        "bench-all",
        "--quick",
        "--resume",
        "--out",
        path_str(&twice),
    ]);
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains("it names the column `median_ns` twice") && !log.contains("another order"),
        "{log}"
    );
    assert_eq!(std::fs::read(&twice).expect("read"), before, "changed");
    let unnamed = edit("unnamed.csv", ",", ",");
    let o = densebench(&["compare", path_str(&src), path_str(&unnamed)]);
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains(&format!("extra columns [an unnamed column {}", columns + 1)),
        "{log}"
    );
    let o = densebench(&[
        "bench-all",
        "--quick",
        "--resume",
        "--out",
        path_str(&unnamed),
    ]);
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains(&format!("extra columns [an unnamed column {}", columns + 1)),
        "{log}"
    );
}

/// `compare … | head`: the reader of stdout goes away, and the exit status is still the
/// verdict's (a broken pipe was an error, exit 1, which reads as "a regression").
#[test]
fn a_closed_stdout_leaves_the_verdicts_exit_status() {
    let src = committed("reference-cpu.csv");
    for format in ["csv", "text"] {
        let mut child = std::process::Command::new(common::bin())
            .args([
                "compare",
                path_str(&src),
                path_str(&src),
                "--format",
                format,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("densebench starts");
        // closed before the comparison is written (it reads both files first)
        drop(child.stdout.take());
        let o = child.wait_with_output().expect("densebench ends");
        let log = stderr(&o);
        assert_eq!(o.status.code(), Some(0), "{format}: {log}");
        assert!(!log.contains("Broken pipe"), "{format}: {log}");
    }
}
