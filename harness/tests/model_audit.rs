//! An adversarial audit of `max-depth`, `plan` and `criterion-import` through the real binary:
//! the defects it found, one test each (each fails without its fix).
//!
//! - `max-depth … --out F | head`: a closed stdout ended the search with "Broken pipe"
//!   (status 1) and F was never written; the table is now dropped, the CSV still written.
//! - `max-depth --out DIR/F` where F cannot be created: found only after every measured run;
//!   the output is now reserved (folder made, writer lock taken) before the first run.
//! - `max-depth --budget -1` (or `--max-depth -5`): clap's "unexpected argument '-1'", naming
//!   no flag; the value now reaches the flag's parser, which says what it takes.
//! - `max-depth --budget 1`: "within 0.0 KiB" and "needs more than 0.0 KiB"; below 1 KiB the
//!   budget is now said in bytes.
//! - `criterion-import` took a negative median, a confidence interval whose lower bound is above
//!   its upper one, and negative iteration counts (summed to `iterations` 0) into the CSV; they
//!   are now refused as bad input (status 2), naming the file and the field.

use std::path::Path;
use std::process::{Command, Stdio};

mod common;
use common::{densebench, path_str, stderr, TINY_MLP};

/// A block whose measured runs take milliseconds, at a budget that needs a few of them.
const CONFIRMED: &[&str] = &[
    "max-depth",
    "--family",
    "mlp",
    "--batch",
    "64",
    "--channels",
    "16",
    "--growth",
    "16",
    "--budget",
    "300K",
    "--threads",
    "1",
    "--variants",
    "cat-store-copy",
];

fn max_depth_no_confirm(extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["max-depth", "--no-confirm", "--variants", "cat-store-copy"]
        .iter()
        .chain(TINY_MLP)
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn max_depth_writes_its_csv_when_stdout_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("md.csv");
    let (reader, writer) = std::io::pipe().unwrap();
    // Nobody reads the table (`max-depth … | head -0`): every write to stdout fails.
    drop(reader);
    let o = Command::new(common::bin())
        .args(max_depth_no_confirm(&[
            "--budget",
            "1GiB",
            "--out",
            path_str(&out),
        ]))
        .stdout(Stdio::from(writer))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(o.status.success(), "{:?}: {}", o.status, stderr(&o));
    let csv = std::fs::read_to_string(&out).unwrap_or_default();
    assert!(
        csv.starts_with("variant,") && csv.contains("\ncat-store-copy,mlp,"),
        "{csv}"
    );
}

#[test]
fn max_depth_refuses_an_unwritable_out_before_any_measured_run() {
    let dir = tempfile::tempdir().unwrap();
    // The output's folder is a regular file: nothing can be written under it.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("md.csv");
    let mut args = CONFIRMED.to_vec();
    args.extend(["--out", path_str(&out)]);
    let o = densebench(&args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{err}");
    assert!(
        err.contains(path_str(&file)),
        "the error names the path: {err}"
    );
    assert!(
        !err.contains("measuring"),
        "measured runs were made before the output was found unwritable: {err}"
    );
}

#[test]
fn max_depth_says_which_flag_a_negative_number_was_given_to() {
    for (flag, value) in [
        ("--budget", "-1"),
        ("--max-depth", "-5"),
        ("--bn-size", "-3"),
        ("--threads", "-2"),
        ("--timeout", "-1"),
    ] {
        let mut args = max_depth_no_confirm(&[flag, value]);
        if flag != "--budget" {
            args.extend(["--budget".into(), "1G".into()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = densebench(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(&format!("invalid value '{value}' for '{flag}")),
            "{flag} {value}: the error names the flag: {err}"
        );
    }
}

#[test]
fn max_depth_says_a_budget_below_one_kib_in_bytes() {
    let o = densebench(
        &max_depth_no_confirm(&["--budget", "1"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(o.status.success(), "{err}");
    assert!(out.contains("within 1 B on cpu"), "{out}");
    assert!(err.contains("needs more than 1 B"), "{err}");
    assert!(!format!("{out}{err}").contains("0.0 KiB"), "{out}{err}");
}

/// A one-benchmark criterion tree with `estimates` (and `sample`, if given) in its `new/`.
fn criterion_tree(root: &Path, estimates: &str, sample: Option<&str>) {
    let new = root.join("mlp-N4-C4-k2/cat-store-copy/2/new");
    std::fs::create_dir_all(&new).unwrap();
    std::fs::write(new.join("estimates.json"), estimates).unwrap();
    if let Some(s) = sample {
        std::fs::write(new.join("sample.json"), s).unwrap();
    }
}

#[test]
fn criterion_import_refuses_times_no_benchmark_can_have() {
    let good = r#"{"median":{"point_estimate":100.0,"confidence_interval":{"confidence_level":0.95,"lower_bound":90.0,"upper_bound":110.0}}}"#;
    let cases: [(&str, &str, Option<&str>, &str); 4] = [
        (
            "negative median",
            r#"{"median":{"point_estimate":-5.0}}"#,
            None,
            "median.point_estimate",
        ),
        (
            "interval upside down",
            r#"{"median":{"point_estimate":100.0,"confidence_interval":{"lower_bound":200.0,"upper_bound":50.0}}}"#,
            None,
            "confidence interval",
        ),
        (
            "negative standard deviation",
            r#"{"median":{"point_estimate":100.0},"std_dev":{"point_estimate":-1.0}}"#,
            None,
            "std_dev.point_estimate",
        ),
        (
            "negative iterations",
            good,
            Some(r#"{"iters":[-3.0,2.5],"times":[100.0,200.0]}"#),
            "iteration count",
        ),
    ];
    for (what, estimates, sample, names) in cases {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("criterion");
        criterion_tree(&root, estimates, sample);
        let out = dir.path().join("criterion.csv");
        let o = densebench(&[
            "criterion-import",
            "--dir",
            path_str(&root),
            "--out",
            path_str(&out),
        ]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(
            err.contains(names),
            "{what}: the error names `{names}`: {err}"
        );
        assert!(!out.exists(), "{what}: a CSV was written");
    }
    // The same tree with sound numbers imports.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("criterion");
    criterion_tree(
        &root,
        good,
        Some(r#"{"iters":[1.0,2.0],"times":[100.0,200.0]}"#),
    );
    let out = dir.path().join("criterion.csv");
    let o = densebench(&[
        "criterion-import",
        "--dir",
        path_str(&root),
        "--out",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}
