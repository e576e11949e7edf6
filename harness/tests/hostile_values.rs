//! Values a file or a flag claims that densebench must not trust (issue 37): a row's verdict and
//! tolerance recomputed on reading, NaN and infinite metrics in `compare`, rows that repeat a
//! key, a variant named twice, and configs too large for the memory limit refused before any
//! allocation.

mod common;

use common::{densebench, path_str, stderr};
use densebench::results::row::{key_of_fields, Row, SCHEMA_VERSION};
use densebench::results::store::write_rows;
use std::path::{Path, PathBuf};

/// A checked `ok` row of a tiny f32 mlp config, its key from its fields.
fn row(variant: &str, depth: usize) -> Row {
    let mut r = Row {
        schema: SCHEMA_VERSION,
        framework: "densebench".to_string(),
        math: "ieee".to_string(),
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
        flops: Some(2_000_000),
        gflops_per_s: Some(2.0),
        reference: "autograd/f64".to_string(),
        max_abs_err: Some(1e-7),
        max_rel_err: Some(1e-7),
        grad_ok: Some(true),
        tolerance: Some(0.2),
        ..Row::default()
    };
    r.key = key_of_fields(&r);
    r
}

fn csv(dir: &Path, name: &str, rows: &[Row]) -> PathBuf {
    let p = dir.join(name);
    write_rows(&p, rows).expect("writing a test CSV");
    p
}

/// The output of `densebench ARGS` as (exit status, stdout and stderr together).
fn run(args: &[&str]) -> (Option<i32>, String) {
    let o = densebench(args);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    (o.status.code(), text)
}

/// Every reader of result CSVs refuses `path` with status 2, naming its line 2 and `column`.
fn refused_by_every_reader(dir: &Path, path: &Path, column: &str, what: &str) {
    let good = csv(dir, "good.csv", &[row("buffer-store-copy", 2)]);
    let out = dir.join("out");
    let p = path_str(path);
    for args in [
        vec!["compare", path_str(&good), p],
        vec!["report", p, "--out", path_str(&out.with_extension("md"))],
        vec!["plots", p, "--out", path_str(&out)],
    ] {
        let (code, log) = run(&args);
        assert_eq!(code, Some(2), "{what}: {args:?}:\n{log}");
        assert!(
            log.contains("line 2, column `") && log.contains(&format!("column `{column}`")),
            "{what}: {args:?} must name line 2 and column `{column}`:\n{log}"
        );
    }
    // merge's "nothing written" status is 1 (2 is "merged, keys missing"); same message.
    let (code, log) = run(&["merge", path_str(&out.with_extension("csv")), p]);
    assert_eq!(code, Some(1), "{what}: merge:\n{log}");
    assert!(
        log.contains(&format!("column `{column}`")),
        "{what}: merge:\n{log}"
    );
}

/// A stored tolerance is a claim: 1e9 would pass any error (`max_rel_err = 5` passed `compare`,
/// and `report` called it within tolerance); NaN passed because `5 ≤ NaN` is false yet the row
/// counted as ok; a negative one fails every row. The documented rule caps an f32 row's at
/// 2e-1 and an f64 row's at 1e-10.
#[test]
fn a_tolerance_beyond_the_rule_is_refused_with_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases: [(&str, f64, f64, &str); 5] = [
        ("tolerance 1e9", 5.0, 1e9, "f32"),
        ("tolerance NaN", 5.0, f64::NAN, "f32"),
        ("tolerance -1", 1e-7, -1.0, "f32"),
        ("tolerance above the f32 cap", 0.25, 0.3, "f32"),
        ("an f64 row with the f32 bound", 1e-3, 0.2, "f64"),
    ];
    for (what, err, tol, dtype) in cases {
        let mut r = row("buffer-store-copy", 2);
        r.dtype = dtype.to_string();
        r.key = key_of_fields(&r);
        r.max_rel_err = Some(err);
        r.tolerance = Some(tol);
        let p = csv(dir.path(), "hostile.csv", &[r]);
        refused_by_every_reader(dir.path(), &p, "tolerance", what);
    }
}

/// `grad_ok = true` with no `max_rel_err` is a verdict no check gave: refused. (A NaN error is
/// read as a failed check, results/README.md: `the_verdict_is_recomputed_from_the_errors`.)
#[test]
fn a_passing_verdict_the_errors_do_not_give_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut none = row("buffer-store-copy", 2);
    none.max_rel_err = None;
    let p = csv(dir.path(), "none.csv", &[none]);
    refused_by_every_reader(dir.path(), &p, "grad_ok", "max_rel_err empty");
}

/// An empty `grad_ok` cell is not "unchecked" when the row's errors say how it fared: the
/// verdict is recomputed (`max_rel_err ≤ tolerance`), so a row 0.5 off against 0.2 is out of
/// tolerance, and one within it passes.
#[test]
fn the_verdict_is_recomputed_from_the_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = csv(dir.path(), "base.csv", &[row("buffer-store-copy", 2)]);
    let mut off = row("buffer-store-copy", 2);
    off.grad_ok = None;
    off.max_rel_err = Some(0.5);
    let new = csv(dir.path(), "new.csv", &[off]);
    let (code, log) = run(&["compare", path_str(&base), path_str(&new)]);
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("ok → gradients out of tolerance (max_rel_err 5.0e-1 > 2.0e-1)"),
        "{log}"
    );
    // A peer-derived tolerance below the cap is the row's own: 1e-3 against 1e-4 fails.
    let mut tight = row("buffer-store-copy", 2);
    tight.grad_ok = None;
    tight.max_rel_err = Some(1e-3);
    tight.tolerance = Some(1e-4);
    let new = csv(dir.path(), "tight.csv", &[tight]);
    let (code, log) = run(&["compare", path_str(&base), path_str(&new)]);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("max_rel_err 1.0e-3 > 1.0e-4"), "{log}");
    // A NaN max_rel_err under `grad_ok = true`: failed, whatever the cell says.
    let mut nan = row("buffer-store-copy", 2);
    nan.max_rel_err = Some(f64::NAN);
    let new = csv(dir.path(), "nan.csv", &[nan]);
    let (code, log) = run(&["compare", path_str(&base), path_str(&new)]);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("ok → gradients out of tolerance"), "{log}");
    // Within its tolerance with an empty cell: checked and passed.
    let mut fine = row("buffer-store-copy", 2);
    fine.grad_ok = None;
    let new = csv(dir.path(), "fine.csv", &[fine]);
    let (code, log) = run(&["compare", path_str(&base), path_str(&new)]);
    assert_eq!(code, Some(0), "{log}");
}

/// `compare --metric gflops_per_s` said "no regression" for a NaN in NEW and "improvement" for
/// an infinite one. The rate is flops / median_ns, which is never NaN or infinite: such a cell
/// is an edited row, refused on reading (exit 2) with its file, line and column, on either
/// side, with or without a threshold.
#[test]
fn a_nan_or_infinite_rate_is_refused_on_reading() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = csv(dir.path(), "base.csv", &[row("buffer-store-copy", 2)]);
    for (side, v) in [
        ("NEW", f64::NAN),
        ("NEW", f64::INFINITY),
        ("NEW", f64::NEG_INFINITY),
        ("BASE", f64::NAN),
    ] {
        let mut odd = row("buffer-store-copy", 2);
        odd.gflops_per_s = Some(v);
        let odd = csv(dir.path(), "odd.csv", &[odd]);
        let (b, n) = if side == "NEW" {
            (&base, &odd)
        } else {
            (&odd, &base)
        };
        for threshold in [None, Some("10")] {
            let mut args = vec![
                "compare",
                path_str(b),
                path_str(n),
                "--metric",
                "gflops_per_s",
            ];
            if let Some(t) = threshold {
                args.extend(["--max-regression", t]);
            }
            let (code, log) = run(&args);
            assert_eq!(code, Some(2), "{side} {v}, {threshold:?}:\n{log}");
            assert!(
                log.contains(&format!(
                    "{} line 2, column `gflops_per_s`: {v} is not its flops / median_ns",
                    odd.display()
                )) && log.contains(if side == "NEW" {
                    "reading NEW"
                } else {
                    "reading BASE"
                }) && !log.lines().any(|l| l.ends_with(" better")),
                "{side} {v}, {threshold:?}:\n{log}"
            );
        }
    }
}

/// `report` counted a repeated row twice without a word; now every reader of several rows
/// warns and counts each key once (the last row of it), as `compare` does.
#[test]
fn repeated_rows_are_warned_about_and_counted_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = row("cat-store-copy", 2);
    let b = row("buffer-store-copy", 2);
    let p = csv(dir.path(), "dup.csv", &[a.clone(), b, a]);
    let out = dir.path().join("report.md");
    let (code, log) = run(&["report", path_str(&p), "--out", path_str(&out)]);
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains(
            "warning: 1 row(s) repeat the key of an earlier row of the same machine \
             (cat-store-copy/mlp/"
        ) && log.contains("each measurement counted once"),
        "{log}"
    );
    let md = std::fs::read_to_string(&out).expect("the report");
    assert!(md.contains("from 2 rows (2 ok, 0 not ok)"), "{md}");
    // The same key measured on another machine is another measurement: kept, no warning.
    let mut elsewhere = row("cat-store-copy", 2);
    elsewhere.device_desc = "another CPU".to_string();
    let q = csv(dir.path(), "elsewhere.csv", &[elsewhere]);
    let (code, log) = run(&[
        "report",
        path_str(&p),
        path_str(&q),
        "--out",
        path_str(&out),
    ]);
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("warning: 1 row(s) repeat"),
        "only dup.csv's own:\n{log}"
    );
    let md = std::fs::read_to_string(&out).expect("the report");
    assert!(md.contains("from 3 rows (3 ok, 0 not ok)"), "{md}");
    // The same file named as two inputs is still refused (its rows would all count twice).
    let (code, log) = run(&[
        "report",
        path_str(&p),
        path_str(&p),
        "--out",
        path_str(&out),
    ]);
    assert_eq!(code, Some(2), "{log}");
}

/// `max-depth --variants a,a` searched and wrote the variant twice.
#[test]
fn a_variant_named_twice_is_refused() {
    let mut args = vec!["max-depth"];
    args.extend(common::TINY_MLP);
    args.extend([
        "--budget",
        "4MiB",
        "--variants",
        "cat-store-copy,buffer-store-copy,cat-store-copy",
    ]);
    let (code, log) = run(&args);
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("--variants: `cat-store-copy` is named twice"),
        "{log}"
    );
}

/// The issue's block: mlp N=4, C0=4, k=2, L=100000 has 2·10^10 parameters (80 GB in f32).
const HUGE_MLP: &[&str] = &[
    "--family",
    "mlp",
    "--batch",
    "4",
    "--growth",
    "2",
    "--channels",
    "4",
    "--depth",
    "100000",
];

/// `run` passed validation and grew silently to 16 GB before it was stopped: the config's least
/// footprint (parameters, input, output and their gradients: 160012800256 bytes) is compared
/// with the memory limit before any child starts (no reference cache is even made).
#[test]
fn a_run_too_large_for_the_memory_limit_is_refused_before_any_child() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let mut args = vec!["run", "--variant", "buffer-store-copy"];
    args.extend(HUGE_MLP);
    args.extend(["--mem-limit", "16GiB", "--cache-dir", path_str(&cache)]);
    let (code, log) = run(&args);
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("L=100000")
            && log.contains("needs at least 160012800256 bytes")
            && log.contains("17179869184 bytes"),
        "{log}"
    );
    assert_eq!(log.trim().lines().count(), 1, "one line:\n{log}");
    assert!(!cache.exists(), "nothing ran: {log}");
}

/// In a sweep, a job whose least footprint is over its memory limit is an `oom` row at once
/// ("not run", with the number), no child started, and the sweep's other jobs run: an
/// out-of-memory is a result, never a dead sweep.
#[test]
fn a_sweep_job_too_large_for_its_limit_is_an_oom_row_and_the_sweep_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sweep = dir.path().join("huge.toml");
    std::fs::write(
        &sweep,
        r#"
[defaults]
steps = 1
warmup = 0
mem_limit = "16GiB"
[[group]]
family = "mlp"
batch = 4
channels = 4
growth = 2
depth = 100000
variants = ["buffer-store-copy"]
[[group]]
family = "mlp"
batch = 8
channels = 4
growth = 2
depth = 2
variants = ["cat-store-copy"]
"#,
    )
    .expect("write the sweep");
    let out = dir.path().join("out.csv");
    let cache = dir.path().join("cache");
    let (code, log) = run(&[
        "bench-all",
        "--sweep",
        path_str(&sweep),
        "--out",
        path_str(&out),
        "--cache-dir",
        path_str(&cache),
    ]);
    assert_eq!(
        code,
        Some(0),
        "an oom row is a result, not a failure: {log}"
    );
    let rows = densebench::results::row::read_rows(&out).expect("the rows");
    assert_eq!(rows.len(), 2, "{log}");
    let huge = rows
        .iter()
        .find(|r| r.depth == 100000)
        .expect("the huge row");
    assert_eq!(huge.status, "oom", "{}", huge.error);
    assert!(
        huge.error.starts_with("not run: ") && huge.error.contains("needs at least 160012800256"),
        "{}",
        huge.error
    );
    assert_eq!(huge.median_ns, None);
    let small = rows.iter().find(|r| r.depth == 2).expect("the small row");
    assert_eq!(small.status, "ok", "{}", small.error);
}

/// `case` of a block beyond any machine aborted on allocation with a backtrace; it is refused
/// with the number (L=500000: 2·10^12 bytes, more than 75% of any test machine's RAM).
#[test]
fn a_case_too_large_for_the_machine_is_refused_with_the_number() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("case.safetensors");
    let mut args = vec!["case", "--out", path_str(&out)];
    args.extend(HUGE_MLP);
    let depth = args.iter().position(|a| *a == "100000").expect("depth");
    args[depth] = "500000";
    let o = std::process::Command::new(common::bin())
        .args(&args)
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("densebench runs");
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains("needs at least") && log.contains("75% of this machine's RAM"),
        "{log}"
    );
    assert!(!log.contains("backtrace") && !out.exists(), "{log}");
}

/// An allocation the system refuses (here a 2 GB address-space limit under a 3.2 GB case) ends
/// the process with Rust's one line and status 1 — no SIGABRT, no backtrace under
/// `RUST_BACKTRACE=1` (what a child's `oom` row is read from, too).
#[test]
fn an_allocation_failure_is_one_line_without_a_backtrace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("case.safetensors");
    let script = format!(
        "ulimit -v 2000000 && exec '{}' case --family mlp --batch 4 --growth 2 --channels 4 \
         --depth 20000 --out '{}'",
        common::bin().display(),
        out.display()
    );
    let o = std::process::Command::new("sh")
        .args(["-c", &script])
        .env("RUST_BACKTRACE", "1")
        .output()
        .expect("sh runs");
    let log = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{log}");
    assert!(
        log.contains("memory allocation of ") && log.contains(" bytes failed"),
        "{log}"
    );
    assert!(!log.contains("backtrace") && !out.exists(), "{log}");
}
