//! `densebench compare` as a user meets it, through the real binary, on small CSVs cut from the
//! committed `results/reference-cpu.csv`: a comparison that matched nothing is refused (exit 2),
//! the verdict never says `ok` when the run fails, every CSV line names its family, config,
//! depth and variant, a bad `--max-regression` is a usage error (exit 2) that says what a valid
//! one is, the justfile's `compare` recipe takes the README's `--max-regression`, and a time
//! regression on rows of few timed steps is called what it likely is: noise.

mod common;

use common::{densebench, path_str, stderr};
use densebench::results::row::{read_rows, Row};
use densebench::results::store::csv_bytes;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (the harness crate's parent).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the harness crate is in the workspace")
        .to_path_buf()
}

/// densebench's own rows of the reference (no PyTorch peers) of one family.
fn reference(family: &str) -> Vec<Row> {
    let rows = read_rows(&root().join("results/reference-cpu.csv")).expect("the reference reads");
    let mine: Vec<Row> = rows
        .into_iter()
        .filter(|r| r.family == family && !r.is_peer() && r.is_ok())
        .collect();
    assert!(
        mine.len() >= 4,
        "the reference has too few {family} rows for these tests"
    );
    mine
}

fn write(dir: &Path, name: &str, rows: &[Row]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, csv_bytes(rows).expect("csv")).expect("writing a test CSV");
    p
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stdout then stderr.
fn text(o: &Output) -> String {
    format!("{}{}", stdout(o), stderr(o))
}

fn compare(base: &Path, new: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["compare", path_str(base), path_str(new)];
    args.extend_from_slice(extra);
    densebench(&args)
}

/// Lines of the verdict that read as a pass.
fn ok_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.trim_start().starts_with("ok"))
        .collect()
}

/// Defect 1: two files with no row in common, or a NEW with a header only, compared nothing:
/// refused as unusable input (exit 2) with what each side holds, never "ok" (exit 0), with
/// `--allow-missing` too and in every format.
#[test]
fn compare_refuses_a_comparison_that_matched_no_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mlp = write(dir.path(), "mlp.csv", &reference("mlp")[..3]);
    let bc = write(dir.path(), "bc.csv", &reference("bc")[..3]);
    let empty = write(dir.path(), "empty.csv", &[]);
    let (mlp, bc, empty) = (mlp.as_path(), bc.as_path(), empty.as_path());
    let cases: [(&Path, &Path, &[&str]); 5] = [
        (mlp, bc, &["--allow-missing"]),
        (mlp, bc, &["--allow-missing", "--max-regression", "10"]),
        (mlp, bc, &["--allow-missing", "--format", "csv"]),
        (mlp, empty, &["--allow-missing"]),
        (empty, empty, &[]),
    ];
    for (base, new, extra) in cases {
        let o = compare(base, new, extra);
        let log = text(&o);
        let what = format!("{} vs {} {extra:?}", base.display(), new.display());
        assert_eq!(o.status.code(), Some(2), "{what}:\n{log}");
        assert!(
            stderr(&o).contains("no row of NEW matches a row of BASE"),
            "{what}:\n{log}"
        );
        assert!(ok_lines(&log).is_empty(), "{what} says ok:\n{log}");
        assert!(stdout(&o).is_empty(), "{what}: a report of nothing:\n{log}");
    }
    // What each side holds, so the user sees which file is the wrong one.
    let log = stderr(&compare(mlp, bc, &["--allow-missing"]));
    assert!(
        log.contains("has 3 row(s) of mlp N=4096") && log.contains("has 3 row(s) of bc N="),
        "{log}"
    );
    let log = stderr(&compare(mlp, empty, &["--allow-missing"]));
    assert!(
        log.contains(&format!(
            "NEW {} has no rows (a header only)",
            empty.display()
        )),
        "{log}"
    );
}

/// Defect 2: a run that fails (a row of BASE missing from NEW) has no `ok` verdict line, in any
/// format; the FAIL line says why and how to accept it. Accepted, the ok line says so.
#[test]
fn compare_verdict_never_says_ok_when_it_fails() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = reference("mlp");
    let base = write(dir.path(), "base.csv", &rows[..3]);
    let new = write(dir.path(), "new.csv", &rows[..2]);
    for format in ["text", "markdown", "csv"] {
        for threshold in [&["--max-regression", "1"][..], &[]] {
            let mut extra = vec!["--format", format];
            extra.extend_from_slice(threshold);
            let o = compare(&base, &new, &extra);
            let log = text(&o);
            assert_eq!(o.status.code(), Some(1), "{extra:?}:\n{log}");
            assert!(
                ok_lines(&log).is_empty(),
                "{extra:?}: an ok line in a failed run:\n{log}"
            );
            let fail: Vec<&str> = log.lines().filter(|l| l.contains("FAIL")).collect();
            assert_eq!(fail.len(), 1, "{extra:?}: one verdict line:\n{log}");
            assert!(
                fail[0].contains("1 row(s) of BASE are missing from NEW")
                    && fail[0].contains("--allow-missing"),
                "{extra:?}:\n{log}"
            );
        }
    }
    let o = compare(&base, &new, &["--max-regression", "1", "--allow-missing"]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(!log.contains("FAIL"), "{log}");
    let ok = ok_lines(&log);
    assert_eq!(ok.len(), 1, "{log}");
    assert!(
        ok[0].contains("no regression beyond 1%")
            && ok[0].contains("1 row(s) of BASE missing from NEW accepted"),
        "{log}"
    );
}

/// Defect 3: rows on one side only and rows whose health changed fill the same columns as a
/// matched row (family, config, depth, variant), so a script can tell which variant at which
/// depth broke; a changed row says its status on each side.
#[test]
fn compare_csv_names_family_config_depth_and_variant_of_every_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows = reference("mlp");
    let (kept, dropped) = (&rows[..3], &rows[3]);
    let mut base = kept.to_vec();
    base.push(dropped.clone());
    // rows[2] fixed: failed gradients in BASE, ok in NEW
    base[2].grad_ok = Some(false);
    base[2].max_rel_err = Some(0.5);
    base[2].tolerance = Some(0.2);
    let mut new = kept.to_vec();
    // rows[0] broke: ok in BASE, gradients out of tolerance in NEW
    new[0].grad_ok = Some(false);
    new[0].max_rel_err = Some(0.5);
    new[0].tolerance = Some(0.2);
    let extra = reference("bc")[0].clone();
    new.push(extra.clone());
    let base_csv = write(dir.path(), "base.csv", &base);
    let new_csv = write(dir.path(), "new.csv", &new);
    let o = compare(&base_csv, &new_csv, &["--format", "csv", "--allow-missing"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let mut r = csv::Reader::from_reader(out.as_bytes());
    let headers = r.headers().expect("a header").clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect(name);
    let (family, config, depth, variant) =
        (col("family"), col("config"), col("depth"), col("variant"));
    let (metric, b, n, verdict) = (col("metric"), col("base"), col("new"), col("verdict"));
    let records: Vec<csv::StringRecord> = r.records().map(|x| x.expect("a record")).collect();
    // The config of a matched line: the one every listed mlp row must repeat.
    let matched_config = records
        .iter()
        .find(|x| x[verdict] == *"same")
        .map(|x| x[config].to_string())
        .unwrap_or_else(|| panic!("no matched line:\n{out}"));
    let find = |v: &str| {
        records
            .iter()
            .find(|x| &x[verdict] == v)
            .unwrap_or_else(|| panic!("no {v} line:\n{out}"))
    };
    for (v, row) in [
        ("only-base", dropped),
        ("only-new", &extra),
        ("broke", &rows[0]),
        ("fixed", &rows[2]),
    ] {
        let x = find(v);
        assert_eq!(&x[family], row.family.as_str(), "{v}:\n{out}");
        assert_eq!(&x[depth], row.depth.to_string().as_str(), "{v}:\n{out}");
        assert_eq!(&x[variant], row.variant.as_str(), "{v}:\n{out}");
        assert!(
            !x[config].is_empty()
                && !x[config].contains(" L=")
                && !x[config].contains(&row.variant),
            "{v}: config holds more than the config:\n{out}"
        );
        if row.family == "mlp" {
            assert_eq!(&x[config], matched_config.as_str(), "{v}:\n{out}");
        }
    }
    let broke = find("broke");
    assert_eq!(&broke[metric], "status", "{out}");
    assert_eq!(&broke[b], "ok", "{out}");
    assert!(broke[n].starts_with("gradients out of tolerance"), "{out}");
    let fixed = find("fixed");
    assert!(
        fixed[b].starts_with("gradients out of tolerance") && &fixed[n] == "ok",
        "{out}"
    );
    // Every line has every identifying column.
    for x in &records {
        for c in [family, config, depth, variant, verdict] {
            assert!(
                !x[c].is_empty(),
                "an empty column {}: {x:?}\n{out}",
                &headers[c]
            );
        }
        assert!(x[depth].parse::<usize>().is_ok(), "{x:?}");
    }
}

/// Defect 4: a `--max-regression` that is no finite percentage ≥ 0 is a usage error (exit 2, as
/// every bad flag value; exit 1 means a regression), saying what a valid value is, before any
/// file is read; 0 and -0 are valid.
#[test]
fn compare_refuses_a_bad_max_regression_as_a_usage_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = write(dir.path(), "base.csv", &reference("mlp")[..2]);
    // (`--max-regression -inf` is clap's "unexpected argument '-i'": exit 2 all the same)
    for bad in ["-5", "-0.5", "NaN", "inf", "-inf", "1e400", "ten"] {
        let joined = format!("--max-regression={bad}");
        let spaced = vec!["--max-regression", bad];
        let forms = match bad {
            "-inf" => vec![vec![joined.as_str()]],
            _ => vec![vec![joined.as_str()], spaced],
        };
        for args in forms {
            let o = compare(&base, &base, &args);
            let log = text(&o);
            assert_eq!(o.status.code(), Some(2), "{args:?}:\n{log}");
            assert!(
                log.contains("--max-regression") && log.contains("a finite number ≥ 0 such as 10"),
                "{args:?}: no word of what is valid:\n{log}"
            );
            assert!(
                !log.contains("REGRESSION") && ok_lines(&log).is_empty(),
                "{log}"
            );
        }
    }
    for good in ["0", "-0", "2.5"] {
        let o = compare(&base, &base, &["--max-regression", good]);
        let log = text(&o);
        assert_eq!(o.status.code(), Some(0), "{good}:\n{log}");
        let pct = if good == "-0" { "0" } else { good };
        assert!(
            log.contains(&format!("no regression beyond {pct}%")),
            "{log}"
        );
    }
}

/// The `just` binary: `$JUST`, else `just` on the PATH; `None` where there is none.
fn just() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("JUST").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    Command::new("just")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("just"))
}

/// Every `just compare …` the README shows, between backticks.
fn readme_just_compares() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    // inline snippets (one line each), then lines of code blocks
    readme
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| !s.contains('\n'))
        .chain(readme.lines())
        .map(str::trim)
        .filter(|s| s.starts_with("just compare "))
        .map(str::to_string)
        .collect()
}

/// Defect 5: the README's `just compare` examples, `--max-regression 1` among them, run as
/// shown: `just --dry-run` gives the command, which the binary accepts with that threshold (the
/// recipe's own 10% only without one). Skipped without `just` (`cargo install just`, or
/// `JUST=/path/to/just`).
#[test]
fn readme_just_compare_examples_take_their_threshold() {
    let examples = readme_just_compares();
    assert!(
        examples.iter().any(|e| e.contains("--max-regression 1")),
        "the README shows no `just compare … --max-regression 1`: {examples:?}"
    );
    let Some(just) = just() else {
        eprintln!("skipped: no `just` (install it with `cargo install just`, or set JUST)");
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let csv = write(dir.path(), "base.csv", &reference("mlp")[..2]);
    for example in examples
        .iter()
        .map(String::as_str)
        .chain(["just compare A B"])
    {
        // The two file arguments become a real file, compared with itself.
        let mut words: Vec<&str> = example.split_whitespace().skip(2).collect();
        words[0] = path_str(&csv);
        words[1] = path_str(&csv);
        let o = Command::new(&just)
            .arg("--justfile")
            .arg(root().join("justfile"))
            .arg("--working-directory")
            .arg(root())
            .args(["--dry-run", "compare"])
            .args(&words)
            .output()
            .expect("just runs");
        let shown = text(&o);
        assert!(o.status.success(), "{example}:\n{shown}");
        let line = shown
            .lines()
            .find(|l| l.contains(" -- compare "))
            .unwrap_or_else(|| panic!("{example}: no compare command:\n{shown}"));
        let args: Vec<&str> = line
            .split(" -- ")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect();
        let o = densebench(&args);
        let log = text(&o);
        assert_eq!(o.status.code(), Some(0), "{example} → {line}:\n{log}");
        let want = if example.contains("--max-regression 1") {
            "no regression beyond 1%"
        } else {
            "no regression beyond 10%"
        };
        assert!(log.contains(want), "{example} → {line}:\n{log}");
    }
}

/// Defect: a time of 0 ns in NEW (no measurement, an edited cell) was `missing`, but its CSV
/// line wrote the ratio `0`, which reads as infinitely faster. The ratio is empty now.
#[test]
fn compare_csv_writes_no_ratio_for_a_missing_measurement() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = reference("mlp");
    let mut new = base.clone();
    new[1].median_ns = Some(0);
    new[1].min_ns = Some(0);
    // the rate is flops / median_ns, none for a 0 ns median: a stale one is refused
    new[1].gflops_per_s = None;
    let o = compare(
        &write(dir.path(), "base.csv", &base),
        &write(dir.path(), "new.csv", &new),
        &["--format", "csv"],
    );
    let out = stdout(&o);
    let mut r = csv::Reader::from_reader(out.as_bytes());
    let headers = r.headers().expect("a header").clone();
    let col = |name: &str| headers.iter().position(|h| h == name).expect(name);
    let records: Vec<csv::StringRecord> = r.records().map(|x| x.expect("a record")).collect();
    let line = records
        .iter()
        .find(|x| &x[col("metric")] == "median_ns" && &x[col("new")] == "0")
        .unwrap_or_else(|| panic!("no median_ns line with new 0:\n{out}"));
    assert_eq!(&line[col("verdict")], "missing", "{out}");
    assert_eq!(&line[col("ratio")], "", "{out}");
}

/// Defect: `compare` believed a row's `grad_ok = true` whose `max_rel_err` (0.5) was above its
/// `tolerance` (0.2), an edited row, and passed it. Such a row is refused on reading (exit 2),
/// naming the line and the column, as a key that disagrees with its fields is.
#[test]
fn compare_refuses_a_grad_ok_that_contradicts_its_error_and_tolerance() {
    let dir = tempfile::tempdir().expect("temp dir");
    let base = reference("mlp");
    let mut new = base.clone();
    new[0].grad_ok = Some(true);
    new[0].max_rel_err = Some(0.5);
    new[0].tolerance = Some(0.2);
    let o = compare(
        &write(dir.path(), "base.csv", &base),
        &write(dir.path(), "new.csv", &new),
        &[],
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(
        log.contains("line 2, column `grad_ok`") && log.contains("tolerance"),
        "{log}"
    );
}

/// A time regression on rows timed over few steps carries a warning that single steps are
/// noise (with the step count), in every format; rows of enough steps, a memory regression and
/// a run without a threshold carry none.
#[test]
fn compare_warns_that_time_regressions_on_few_steps_are_noise() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows: Vec<Row> = reference("mlp")[..3].to_vec();
    let with = |steps: usize, slower: f64, bigger: f64| -> Vec<Row> {
        rows.iter()
            .map(|r| {
                let mut r = r.clone();
                r.steps = steps;
                for t in [&mut r.median_ns, &mut r.min_ns, &mut r.max_ns] {
                    *t = t.map(|t| (t as f64 * slower) as u64);
                }
                // the rate is flops / median_ns: a reader refuses one that is not
                r.gflops_per_s = densebench::measure::estimates::gflops_per_s(r.flops, r.median_ns);
                r.peak_bytes = r.peak_bytes.map(|b| (b as f64 * bigger) as u64);
                r
            })
            .collect()
    };
    let warning = "time regression(s) are on rows timed over fewer than 5 steps";
    for (steps, slower, bigger, threshold, warned) in [
        (2, 1.5, 1.0, Some("10"), true),
        (4, 1.5, 1.0, Some("10"), true),
        (5, 1.5, 1.0, Some("10"), false),
        (2, 1.0, 1.5, Some("10"), false),
        (2, 1.5, 1.0, None, false),
    ] {
        let base = write(dir.path(), "base.csv", &with(steps, 1.0, 1.0));
        let new = write(dir.path(), "new.csv", &with(steps, slower, bigger));
        for format in ["text", "markdown", "csv"] {
            let mut extra = vec!["--format", format];
            if let Some(t) = threshold {
                extra.extend_from_slice(&["--max-regression", t]);
            }
            let o = compare(&base, &new, &extra);
            let log = text(&o);
            let what = format!("steps {steps}, time ×{slower}, peak ×{bigger}, {extra:?}");
            assert_eq!(
                o.status.code(),
                Some(if threshold.is_some() { 1 } else { 0 }),
                "{what}:\n{log}"
            );
            assert_eq!(log.contains(warning), warned, "{what}:\n{log}");
            if warned {
                assert!(
                    log.contains(&format!("3 of the 3 {warning} ({steps} on the fewer side")),
                    "{what}:\n{log}"
                );
            }
        }
    }
}

/// A peak_bytes regression on a CPU row under 1 MiB measured at more than one thread carries a
/// warning that such peaks vary with the threads that took part (a tiny bc row at 2 threads
/// peaked at 136,340 or 156,360 bytes run to run, session 25); at one thread, or at MB scale, no
/// warning.
#[test]
fn compare_warns_that_small_multi_thread_peaks_vary() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rows: Vec<Row> = reference("mlp")[..2].to_vec();
    let with = |peak: u64, bigger: f64, threads: usize| -> Vec<Row> {
        rows.iter()
            .map(|r| {
                let mut r = r.clone();
                r.threads = threads;
                r.peak_bytes = Some((peak as f64 * bigger) as u64);
                r
            })
            .collect()
    };
    let warning = "peak_bytes regression(s) are on CPU rows under 1 MiB measured at more than one";
    for (peak, threads, warned) in [
        (136_340, 2, true),
        (136_340, 1, false),
        (50 << 20, 2, false),
    ] {
        let base = write(dir.path(), "base.csv", &with(peak, 1.0, threads));
        let new = write(dir.path(), "new.csv", &with(peak, 1.147, threads));
        let o = compare(
            &base,
            &new,
            &["--metric", "peak_bytes", "--max-regression", "1"],
        );
        let log = text(&o);
        assert_eq!(o.status.code(), Some(1), "{peak} B at {threads}:\n{log}");
        assert_eq!(
            log.contains(warning),
            warned,
            "{peak} B at {threads}:\n{log}"
        );
        if warned {
            assert!(log.contains(&format!("2 {warning}")), "{log}");
        }
    }
}
