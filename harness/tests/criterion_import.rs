//! `criterion-import` on a fake `target/criterion` tree in a temp dir: the files criterion 0.5
//! writes (`estimates.json`, `sample.json`, `benchmark.json` under `<group>/<fn>/<param>/new/`),
//! imported through the library and through the binary, and the errors for broken trees.

use densebench::results::criterion::{import, write_csv};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_densebench");

/// `estimates.json` as criterion 0.5 writes it (every statistic, `slope` null in flat sampling),
/// with the median at `median` ns and every other number derived from it so each column can be
/// told apart: CI ±1 %, mean = median + 5 %, std_dev = 2 % of the median.
fn estimates(median: f64) -> String {
    let est = |point: f64| {
        format!(
            r#"{{"confidence_interval":{{"confidence_level":0.95,"lower_bound":{},"upper_bound":{}}},"point_estimate":{point},"standard_error":1.5}}"#,
            point * 0.99,
            point * 1.01
        )
    };
    format!(
        r#"{{"mean":{},"median":{},"median_abs_dev":{},"slope":null,"std_dev":{}}}"#,
        est(median * 1.05),
        est(median),
        est(median * 0.01),
        est(median * 0.02)
    )
}

/// Writes `files` (name, contents) into `root/<rel>/new/`.
fn bench_dir(root: &Path, rel: &str, files: &[(&str, String)]) -> PathBuf {
    let dir = root.join(rel).join("new");
    fs::create_dir_all(&dir).unwrap();
    for (name, text) in files {
        fs::write(dir.join(name), text).unwrap();
    }
    dir
}

/// A tree with two step groups' worth of benchmarks, a layout one, and things to ignore.
fn fake_tree(root: &Path) {
    let mlp = "mlp-N4096-C256-k64";
    // Criterion keeps the exact ids in benchmark.json; the folder names may differ (it replaces
    // characters such as `/` and `:`), so the ids must come from the file.
    bench_dir(
        root,
        &format!("{mlp}/cat_store_copy_dir/8"),
        &[
            ("estimates.json", estimates(3.0e8)),
            (
                "sample.json",
                r#"{"sampling_mode":"Flat","iters":[2.0,2.0,2.0],"times":[6.1e8,6.0e8,5.9e8]}"#
                    .to_string(),
            ),
            (
                "benchmark.json",
                format!(
                    r#"{{"group_id":"{mlp}","function_id":"cat-store-copy","value_str":"8","throughput":null,"full_id":"{mlp}/cat-store-copy/8","directory_name":"{mlp}/cat_store_copy_dir/8","title":"{mlp}/cat-store-copy/8"}}"#
                ),
            ),
        ],
    );
    // No sample.json and no benchmark.json: ids from the folders, samples empty.
    bench_dir(
        root,
        &format!("{mlp}/buffer-store-copy/16"),
        &[("estimates.json", estimates(5.0e8))],
    );
    bench_dir(
        root,
        &format!("{mlp}/autograd/16"),
        &[("estimates.json", estimates(1.5e9))],
    );
    // An older run criterion kept as the comparison base: not the latest, ignored.
    let base = root.join(format!("{mlp}/autograd/16/base"));
    fs::create_dir_all(&base).unwrap();
    fs::write(base.join("estimates.json"), estimates(9.9e9)).unwrap();
    // A report folder without estimates: ignored.
    fs::create_dir_all(root.join("report")).unwrap();
    fs::write(root.join("report/index.html"), "<html></html>").unwrap();
    // A layout group: the parameter is not a depth.
    bench_dir(
        root,
        "layout-N64-C120-o48-32x32/bn-relu-conv1x1/nchw-candle",
        &[("estimates.json", estimates(4.0e7))],
    );
}

#[test]
fn imports_every_latest_run_in_order_with_its_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    fake_tree(tmp.path());
    let rows = import(tmp.path()).unwrap();
    // Sorted by group name, then the stable variant order (autograd first), then depth; the
    // `base/` run and the report folder do not appear.
    let ids: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|r| (r.group.as_str(), r.variant.as_str(), r.param.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            (
                "layout-N64-C120-o48-32x32",
                "bn-relu-conv1x1",
                "nchw-candle"
            ),
            ("mlp-N4096-C256-k64", "autograd", "16"),
            ("mlp-N4096-C256-k64", "cat-store-copy", "8"),
            ("mlp-N4096-C256-k64", "buffer-store-copy", "16"),
        ]
    );
    let layout = &rows[0];
    assert_eq!(layout.family, "layout");
    assert_eq!(layout.config, "N64-C120-o48-32x32");
    assert_eq!(layout.depth, None, "a layout parameter is not a depth");

    // autograd's latest run is 1.5e9, not the base run's 9.9e9.
    assert_eq!(rows[1].median_ns, 1.5e9);

    let cat = &rows[2];
    assert_eq!(
        (cat.family.as_str(), cat.config.as_str()),
        ("mlp", "N4096-C256-k64")
    );
    assert_eq!(cat.depth, Some(8));
    // The numbers estimates() wrote for a 3e8 ns median.
    assert_eq!(cat.median_ns, 3.0e8);
    assert_eq!(cat.median_lo_ns, Some(3.0e8 * 0.99));
    assert_eq!(cat.median_hi_ns, Some(3.0e8 * 1.01));
    assert_eq!(cat.mean_ns, Some(3.0e8 * 1.05));
    assert_eq!(cat.std_dev_ns, Some(3.0e8 * 0.02));
    // sample.json: 3 samples of 2 iterations.
    assert_eq!((cat.samples, cat.iterations), (Some(3), Some(6)));
    assert!(cat
        .estimates_file
        .ends_with("cat_store_copy_dir/8/new/estimates.json"));

    // The file was written moments ago: its RFC 3339 UTC time is within the hour.
    let written = chrono::DateTime::parse_from_rfc3339(&cat.measured_at).unwrap();
    let age = chrono::Utc::now().signed_duration_since(written);
    assert!(
        age.num_minutes().abs() < 60,
        "measured_at {}",
        cat.measured_at
    );

    let buffer = &rows[3];
    assert_eq!((buffer.samples, buffer.iterations), (None, None));
}

#[test]
fn csv_has_the_documented_header_and_one_line_per_benchmark() {
    let tmp = tempfile::tempdir().unwrap();
    fake_tree(&tmp.path().join("criterion"));
    let rows = import(&tmp.path().join("criterion")).unwrap();
    let out = tmp.path().join("results/criterion.csv");
    write_csv(&rows, &out).unwrap();
    let text = fs::read_to_string(&out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The columns results/README.md documents, in that order.
    assert_eq!(
        lines[0],
        "group,family,config,variant,depth,param,median_ns,median_lo_ns,median_hi_ns,mean_ns,\
         mean_lo_ns,mean_hi_ns,std_dev_ns,samples,iterations,measured_at,estimates_file"
    );
    assert_eq!(lines.len(), 1 + rows.len());
    // Empty cells where a value does not exist (no depth for layouts, no sample.json).
    // ns are floats (criterion's estimates are fractional for fast benchmarks).
    let expected = "layout-N64-C120-o48-32x32,layout,N64-C120-o48-32x32,bn-relu-conv1x1,,\
                    nchw-candle,40000000.0,";
    assert!(lines[1].starts_with(expected), "{}", lines[1]);
    assert!(
        lines[4].contains(",,,"),
        "buffer row has no samples: {}",
        lines[4]
    );
}

#[test]
fn binary_imports_and_names_broken_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("criterion");
    fake_tree(&dir);
    let out = tmp.path().join("criterion.csv");
    let ok = Command::new(BIN)
        .args(["criterion-import", "--dir"])
        .arg(&dir)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert_eq!(fs::read_to_string(&out).unwrap().lines().count(), 5);

    // A truncated estimates.json: the error names the file.
    let broken = bench_dir(&dir, "bc-N16-C24-k12-bn4-8x8/cat-store-copy/8", &[]);
    fs::write(broken.join("estimates.json"), r#"{"median":{"point_esti"#).unwrap();
    let bad = Command::new(BIN)
        .args(["criterion-import", "--dir"])
        .arg(&dir)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains(&broken.join("estimates.json").display().to_string()),
        "{stderr}"
    );
}

#[test]
fn broken_trees_give_errors_that_say_what_is_wrong() {
    let tmp = tempfile::tempdir().unwrap();

    let missing = tmp.path().join("nope");
    let e = format!("{:#}", import(&missing).unwrap_err());
    assert!(e.contains("nope") && e.contains("cargo bench"), "{e}");

    let empty = tmp.path().join("empty");
    fs::create_dir_all(empty.join("report")).unwrap();
    let e = format!("{:#}", import(&empty).unwrap_err());
    assert!(e.contains("no benchmark results"), "{e}");

    // Valid JSON without the one required statistic.
    let no_median = tmp.path().join("no-median");
    let d = bench_dir(
        &no_median,
        "g/f/1",
        &[(
            "estimates.json",
            r#"{"mean":{"point_estimate":1.0}}"#.to_string(),
        )],
    );
    let e = format!("{:#}", import(&no_median).unwrap_err());
    assert!(
        e.contains(&d.join("estimates.json").display().to_string()) && e.contains("median"),
        "{e}"
    );

    // sample.json whose arrays disagree.
    let bad_sample = tmp.path().join("bad-sample");
    bench_dir(
        &bad_sample,
        "g/f/1",
        &[
            ("estimates.json", estimates(1.0)),
            (
                "sample.json",
                r#"{"iters":[1.0,2.0],"times":[1.0]}"#.to_string(),
            ),
        ],
    );
    let e = format!("{:#}", import(&bad_sample).unwrap_err());
    assert!(
        e.contains("sample.json") && e.contains("2 iteration counts but 1 times"),
        "{e}"
    );

    // Estimates too deep to be <group>/<function>/<param>.
    let deep = tmp.path().join("deep");
    bench_dir(&deep, "a/b/c/d", &[("estimates.json", estimates(1.0))]);
    let e = format!("{:#}", import(&deep).unwrap_err());
    assert!(e.contains("expected <group>/<function>/<param>"), "{e}");
}
