//! The last mile, end to end through the `densebench` binary: `plots`, `compare` and `report`
//! on small synthetic result CSVs built from `densebench::results::row::Row` values.

use densebench::results::row::Row;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_densebench");

/// Every variant name, in the stable order; `mlp` has no `buffer-recompute-*`.
const VARIANTS: [&str; 9] = [
    "autograd",
    "cat-store-copy",
    "cat-store-inplace",
    "cat-recompute-copy",
    "cat-recompute-inplace",
    "buffer-store-copy",
    "buffer-store-inplace",
    "buffer-recompute-copy",
    "buffer-recompute-inplace",
];

fn variants_of(family: &str) -> Vec<&'static str> {
    VARIANTS
        .iter()
        .copied()
        .filter(|v| !(family == "mlp" && v.starts_with("buffer-recompute")))
        .collect()
}

/// A plausible row: quadratic memory for `cat-store-*` and `autograd`, linear for the rest;
/// recompute saves memory and costs time; a layer-boundary timeline rising through forward, falling in backward.
fn row(family: &str, variant: &str, depth: usize) -> Row {
    let (batch, channels, growth, bn_size, size, unit) = if family == "bc" {
        // One channel of a 64×32×32 f32 feature map.
        (64, 24, 12, 4, 32, 64 * 32 * 32 * 4u64)
    } else {
        // One channel of a batch of 4096 f32 features.
        (4096, 256, 64, 0, 1, 4096 * 4u64)
    };
    let l = depth as u64;
    let (c0, k) = (channels as u64, growth as u64);
    let c_total = c0 + l * k;
    let sum_c_in = l * c0 + k * l * (l - 1) / 2;
    let quadratic = variant.starts_with("cat-store") || variant == "autograd";
    let mut chans = if quadratic {
        3 * sum_c_in + 2 * c_total
    } else if variant.contains("recompute") {
        2 * c_total + l * k
    } else {
        2 * c_total + 4 * l * k
    };
    if variant.ends_with("inplace") {
        chans = chans * 9 / 10;
    }
    if variant == "autograd" {
        chans = chans * 13 / 10;
    }
    let peak = chans * unit;
    let mut t = 1_000_000 * (sum_c_in + 10 * l);
    if variant.contains("recompute") {
        t = t * 115 / 100;
    }
    if variant.starts_with("buffer") {
        t = t * 95 / 100;
    }
    let timeline: Vec<String> = (0..depth)
        .map(|i| format!("f{i}={}", peak * (i as u64 + 1) / (l + 2)))
        .chain(
            (0..depth)
                .rev()
                .map(|i| format!("b{i}={}", peak * (i as u64 + 1) / (l + 3))),
        )
        .collect();
    let exact = variant == "autograd" || variant == "buffer-store-copy";
    let mut r = Row {
        schema: densebench::results::row::SCHEMA_VERSION,
        framework: "densebench".to_string(),
        math: "ieee".to_string(),
        execution: "eager".to_string(),
        key: String::new(),
        variant: variant.to_string(),
        family: family.to_string(),
        batch,
        channels,
        growth,
        depth,
        bn_size,
        size: size.into(),
        activation: true,
        dtype: "f32".to_string(),
        seed: 0,
        device: "cpu".to_string(),
        device_desc: "Synthetic CPU".to_string(),
        threads: 2,
        densebench_version: "0.1.0".to_string(),
        git_rev: "abc1234".to_string(),
        timestamp: format!("2025-01-01T00:00:{:02}Z", depth % 60),
        status: "ok".to_string(),
        steps: 5,
        warmup: 1,
        baseline_bytes: Some(1 << 20),
        peak_bytes: Some(peak),
        saved_bytes: Some(peak / 2),
        predicted_peak_bytes: (variant != "autograd").then_some(peak * 101 / 100),
        median_ns: Some(t),
        min_ns: Some(t * 97 / 100),
        max_ns: Some(t * 105 / 100),
        reference: "autograd".to_string(),
        max_abs_err: Some(if exact { 0.0 } else { 3e-6 }),
        max_rel_err: Some(if exact { 0.0 } else { 2e-7 }),
        bitwise_equal: Some(exact),
        grad_ok: Some(true),
        timeline: timeline.join(";"),
        ..Row::default()
    };
    // The key its fields give, as every reader checks.
    r.key = densebench::results::row::key_of_fields(&r);
    r
}

/// Both families at two depths each, every applicable variant.
fn synthetic(depths: &[usize]) -> Vec<Row> {
    let mut rows = Vec::new();
    for family in ["bc", "mlp"] {
        for &d in depths {
            for v in variants_of(family) {
                rows.push(row(family, v, d));
            }
        }
    }
    rows
}

/// Writes `rows`, each with its rate derived from its (edited) flops and median as densebench's
/// writer derives it: a reader refuses a `gflops_per_s` that is not flops / median_ns.
fn write_csv(path: &Path, rows: &[Row]) {
    let mut w = csv::Writer::from_path(path).unwrap();
    for r in rows {
        let mut r = r.clone();
        r.gflops_per_s = densebench::measure::estimates::gflops_per_s(r.flops, r.median_ns);
        w.serialize(&r).unwrap();
    }
    w.flush().unwrap();
}

fn densebench(args: &[&str], cwd: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn setup(rows: &[Row]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("results.csv");
    write_csv(&csv, rows);
    (dir, csv)
}

#[test]
fn plots_writes_svg_and_png_naming_every_variant() {
    let mut rows = synthetic(&[4, 8]);
    let mut failed = row("bc", "autograd", 12);
    failed.status = "oom".to_string();
    failed.error = "out of memory".to_string();
    failed.peak_bytes = None;
    rows.push(failed);
    let (dir, csv) = setup(&rows);
    let out = dir.path().join("figs");
    let o = densebench(
        &[
            "plots",
            csv.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    let log = text(&o);
    assert!(o.status.success(), "plots failed:\n{log}");
    // The skipped row is reported, not silently dropped.
    assert!(log.contains("autograd L=12: oom"), "{log}");
    let stems = [
        "memory-vs-depth-bc-N64-C24-k12-bn4-32",
        "time-vs-depth-bc-N64-C24-k12-bn4-32",
        "memory-vs-time-bc-N64-C24-k12-bn4-32-L8",
        "timeline-bc-N64-C24-k12-bn4-32-L8",
        "measured-vs-predicted-bc",
        "grad-error-bc",
        "memory-vs-depth-mlp-N4096-C256-k64-relu",
        "memory-vs-time-mlp-N4096-C256-k64-relu-L4",
        "grad-error-mlp",
    ];
    for stem in stems {
        for ext in ["svg", "png"] {
            let p = out.join(format!("{stem}.{ext}"));
            let len = std::fs::metadata(&p)
                .unwrap_or_else(|e| panic!("{} missing ({e}):\n{log}", p.display()))
                .len();
            // A frame with only a title is about 1 KB of SVG, and a blank 1280×800 canvas a few
            // KB of PNG; a drawn figure (axes, series, legend) is well above both.
            let min = if ext == "svg" { 5_000 } else { 20_000 };
            assert!(len > min, "{} is only {len} bytes", p.display());
            assert!(log.contains(&format!("{stem}.{ext}")), "not listed:\n{log}");
        }
        let png = std::fs::read(out.join(format!("{stem}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{stem}.png is not a PNG");
    }
    for family in ["bc", "mlp"] {
        let stem = if family == "bc" {
            "memory-vs-depth-bc-N64-C24-k12-bn4-32"
        } else {
            "memory-vs-depth-mlp-N4096-C256-k64-relu"
        };
        let svg = std::fs::read_to_string(out.join(format!("{stem}.svg"))).unwrap();
        for v in variants_of(family) {
            assert!(svg.contains(v), "{stem}.svg has no series `{v}`");
        }
        // The growth exponents are in the legend: quadratic naive, linear buffer variant.
        assert!(
            svg.contains("cat-store-copy  p = 1."),
            "{stem}: no exponent"
        );
        let grad = std::fs::read_to_string(out.join(format!("grad-error-{family}.svg"))).unwrap();
        assert!(
            grad.contains("0 (bitwise equal)"),
            "grad-error-{family}: zero floor unlabelled"
        );
    }
    // mlp has no buffer-recompute variants: none may be drawn.
    let mlp =
        std::fs::read_to_string(out.join("memory-vs-depth-mlp-N4096-C256-k64-relu.svg")).unwrap();
    assert!(!mlp.contains("buffer-recompute"));
}

/// The regression test a CI would run: 20% more memory in one row against a 10% threshold.
#[test]
fn compare_flags_an_injected_memory_regression() {
    let base = synthetic(&[4, 8]);
    let mut new = base.clone();
    let hit = new
        .iter_mut()
        .find(|r| r.family == "bc" && r.variant == "buffer-store-copy" && r.depth == 8)
        .unwrap();
    hit.peak_bytes = hit.peak_bytes.map(|p| p * 12 / 10);
    hit.timestamp = "2025-02-02T00:00:00Z".to_string();
    hit.git_rev = "def5678".to_string();
    let (dir, base_csv) = setup(&base);
    let new_csv = dir.path().join("new.csv");
    write_csv(&new_csv, &new);
    let args = [
        "compare",
        base_csv.to_str().unwrap(),
        new_csv.to_str().unwrap(),
        "--max-regression",
        "10",
    ];
    let o = densebench(&args, dir.path());
    let log = text(&o);
    assert_eq!(o.status.code(), Some(1), "expected exit 1:\n{log}");
    let flagged: Vec<&str> = log.lines().filter(|l| l.contains("REGRESSION")).collect();
    assert_eq!(flagged.len(), 1, "exactly one regression:\n{log}");
    assert!(flagged[0].contains("buffer-store-copy") && flagged[0].contains("1.200"));
    // 20% is within a 25% threshold: exit 0.
    let mut loose = args.to_vec();
    loose[4] = "25";
    let o = densebench(&loose, dir.path());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // The same comparison as markdown and CSV keeps the verdict.
    let mut md = args.to_vec();
    md.extend(["--format", "markdown"]);
    let o = densebench(&md, dir.path());
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("| bc N=64 C0=24 k=12 bn=4 32x32 f32 | 8 | buffer-store-copy |"));
    let mut c = args.to_vec();
    c.extend(["--format", "csv"]);
    let o = densebench(&c, dir.path());
    assert_eq!(o.status.code(), Some(1));
    let csv_out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(csv_out.starts_with("family,config,depth,variant,metric,base,new,ratio,verdict"));
    assert_eq!(csv_out.matches(",regression").count(), 1, "{csv_out}");
}

#[test]
fn compare_passes_on_identical_files() {
    let rows = synthetic(&[4, 8]);
    let (dir, csv) = setup(&rows);
    let p = csv.to_str().unwrap();
    let o = densebench(&["compare", p, p, "--max-regression", "0"], dir.path());
    let log = text(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(
        log.contains(&format!("{} rows matched", rows.len())),
        "{log}"
    );
    assert!(
        !log.contains("REGRESSION") && !log.contains("warning"),
        "{log}"
    );
}

#[test]
fn compare_lists_rows_on_one_side_and_warns_on_devices() {
    let base = synthetic(&[4, 8]);
    let mut new: Vec<Row> = base
        .iter()
        .filter(|r| !(r.family == "mlp" && r.variant == "cat-recompute-copy" && r.depth == 4))
        .cloned()
        .collect();
    new.push(row("bc", "buffer-recompute-copy", 16));
    for r in &mut new {
        r.device_desc = "Other CPU".to_string();
    }
    let (dir, base_csv) = setup(&base);
    let new_csv = dir.path().join("new.csv");
    write_csv(&new_csv, &new);
    let o = densebench(
        &[
            "compare",
            base_csv.to_str().unwrap(),
            new_csv.to_str().unwrap(),
            "--max-regression",
            "10",
            "--allow-missing",
        ],
        dir.path(),
    );
    let log = text(&o);
    // One-sided rows are listed; accepted with --allow-missing; the device change is a warning.
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(log.contains("only in BASE (1)"), "{log}");
    assert!(
        log.contains("mlp N=4096 C0=256 k=64 relu=on f32 L=4 cat-recompute-copy"),
        "{log}"
    );
    assert!(log.contains("only in NEW (1)"), "{log}");
    assert!(log.contains("bc N=64 C0=24 k=12 bn=4 32x32 f32 L=16 buffer-recompute-copy"));
    assert!(log.contains("warning: devices differ"), "{log}");
    assert!(
        log.contains("Synthetic CPU") && log.contains("Other CPU"),
        "{log}"
    );
    // Without --allow-missing a row of BASE missing from NEW fails the comparison.
    let o = densebench(
        &[
            "compare",
            base_csv.to_str().unwrap(),
            new_csv.to_str().unwrap(),
        ],
        dir.path(),
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(1), "{log}");
    assert!(
        log.contains("1 row(s) of BASE are missing from NEW") && log.contains("--allow-missing"),
        "{log}"
    );
}

#[test]
fn compare_rejects_another_schema_naming_the_column() {
    let rows = synthetic(&[4]);
    let (dir, csv) = setup(&rows);
    // Drop the `peak_bytes` column from a copy.
    let mut r = csv::Reader::from_path(&csv).unwrap();
    let headers = r.headers().unwrap().clone();
    let drop = headers.iter().position(|h| h == "peak_bytes").unwrap();
    let bad = dir.path().join("old.csv");
    let mut w = csv::Writer::from_path(&bad).unwrap();
    let keep = |rec: &csv::StringRecord| {
        rec.iter()
            .enumerate()
            .filter(|(i, _)| *i != drop)
            .map(|(_, s)| s.to_string())
            .collect::<Vec<_>>()
    };
    w.write_record(keep(&headers)).unwrap();
    for rec in r.records() {
        w.write_record(keep(&rec.unwrap())).unwrap();
    }
    w.flush().unwrap();
    let o = densebench(
        &["compare", csv.to_str().unwrap(), bad.to_str().unwrap()],
        dir.path(),
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(2), "{log}");
    assert!(log.contains("missing columns [peak_bytes]"), "{log}");
    assert!(log.contains("old.csv"), "{log}");
}

#[test]
fn report_names_every_variant_and_links_the_figures() {
    let rows = synthetic(&[4, 8]);
    let (dir, csv) = setup(&rows);
    let o = densebench(
        &[
            "report",
            csv.to_str().unwrap(),
            "--out",
            "results/REPORT.md",
            "--plots",
            "plots",
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::read_to_string(dir.path().join("results/REPORT.md")).unwrap();
    for v in VARIANTS {
        assert!(md.contains(&format!("`{v}`")), "report lacks `{v}`");
    }
    // Links are relative to the report's folder.
    assert!(md.contains("](../plots/memory-vs-depth-bc-N64-C24-k12-bn4-32.png)"));
    assert!(
        md.contains("5453 MB") && md.contains("1655 MB"),
        "published numbers"
    );
    assert!(
        md.contains("All 32 ok rows were checked"),
        "gradient verdict"
    );
    // Ratio of the synthetic model: buffer-store-copy at bc L=8 keeps 2·c_total + 4·L·k =
    // 2·120 + 384 = 624 channels against naive's 3·Σc_in + 2·c_total = 3·528 + 240 = 1824,
    // i.e. 0.34×.
    assert!(
        md.contains("624 (0.34×)") || md.contains("(0.34×)"),
        "ratio to naive missing:\n{md}"
    );
}

/// Not a test: writes a realistic-size synthetic CSV to look at the figures by eye
/// (`cargo test -p densebench --test last_mile -- --ignored --nocapture`).
#[test]
#[ignore]
fn write_synthetic_reference() {
    let mut rows = synthetic(&[16, 32, 48]);
    rows.retain(|r| r.family == "bc");
    rows.extend(
        synthetic(&[8, 16, 32, 64])
            .into_iter()
            .filter(|r| r.family == "mlp"),
    );
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("synthetic.csv");
    write_csv(&path, &rows);
    println!("{}", path.display());
}

/// A row whose gradients went wrong in NEW (out of tolerance, a NaN error, or no check at all)
/// fails the comparison even without `--max-regression`, and even though it got faster: a
/// result whose gradients are wrong is no result. A time of 0 ns is no measurement, never an
/// improvement.
#[test]
fn compare_fails_rows_whose_gradients_went_wrong() {
    let base = synthetic(&[4]);
    let (dir, base_csv) = setup(&base);
    let pick = |rows: &mut Vec<Row>, v: &str| -> usize {
        rows.iter()
            .position(|r| r.family == "bc" && r.variant == v)
            .unwrap()
    };
    type Edit = fn(&mut Row);
    let cases: [(&str, Edit, &str); 4] = [
        (
            // a tf32 row past the TF32 sanity bound: failed, though within its tolerance
            "failed within tolerance",
            |r| {
                r.grad_ok = Some(false);
                r.max_rel_err = Some(1e-6);
                r.tolerance = Some(0.2);
            },
            "ok → gradient check failed (max_rel_err 1.0e-6 is within 2.0e-1: see the row's note)",
        ),
        (
            "out of tolerance",
            |r| {
                r.grad_ok = Some(false);
                r.max_rel_err = Some(0.5);
                r.tolerance = Some(0.2);
            },
            "ok → gradients out of tolerance (max_rel_err 5.0e-1 > 2.0e-1)",
        ),
        (
            "NaN",
            |r| {
                // grad_ok still says true: the reader makes a NaN error a failed check
                r.max_abs_err = Some(f64::NAN);
            },
            "ok → gradients out of tolerance",
        ),
        (
            "unchecked",
            |r| {
                r.grad_ok = None;
                r.max_rel_err = None;
            },
            "ok → gradients not checked",
        ),
    ];
    for (what, edit, said) in cases {
        let mut new = base.clone();
        let i = pick(&mut new, "buffer-store-copy");
        edit(&mut new[i]);
        new[i].median_ns = new[i].median_ns.map(|t| t / 2);
        new[i].min_ns = new[i].min_ns.map(|t| t / 2);
        let new_csv = dir.path().join("new.csv");
        write_csv(&new_csv, &new);
        for threshold in [None, Some("10")] {
            let mut args = vec![
                "compare",
                base_csv.to_str().unwrap(),
                new_csv.to_str().unwrap(),
            ];
            if let Some(t) = threshold {
                args.extend(["--max-regression", t]);
            }
            let o = densebench(&args, dir.path());
            let log = text(&o);
            assert_eq!(o.status.code(), Some(1), "{what}, {threshold:?}:\n{log}");
            assert!(
                log.contains("ok in BASE, failed in NEW (1)")
                    && log.contains(&format!("buffer-store-copy: {said}"))
                    && log.contains("FAIL"),
                "{what}, {threshold:?}:\n{log}"
            );
        }
    }
    // The same row fixed in NEW is listed the other way and fails nothing.
    let mut broken = base.clone();
    let i = pick(&mut broken, "buffer-store-copy");
    broken[i].grad_ok = Some(false);
    let broken_csv = dir.path().join("broken.csv");
    write_csv(&broken_csv, &broken);
    let o = densebench(
        &[
            "compare",
            broken_csv.to_str().unwrap(),
            base_csv.to_str().unwrap(),
        ],
        dir.path(),
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(log.contains("failed in BASE, ok in NEW (1)"), "{log}");
    // A median of 0 ns in NEW is missing, not a 0.000 ratio.
    let mut zero = base.clone();
    let i = pick(&mut zero, "cat-store-copy");
    zero[i].median_ns = Some(0);
    zero[i].min_ns = Some(0);
    let zero_csv = dir.path().join("zero.csv");
    write_csv(&zero_csv, &zero);
    let o = densebench(
        &[
            "compare",
            base_csv.to_str().unwrap(),
            zero_csv.to_str().unwrap(),
            "--format",
            "csv",
        ],
        dir.path(),
    );
    let csv_out = String::from_utf8_lossy(&o.stdout).to_string();
    let line = csv_out
        .lines()
        .find(|l| l.contains(",cat-store-copy,median_ns,"))
        .unwrap_or_else(|| panic!("{csv_out}"));
    assert!(line.ends_with(",missing"), "{line}");
    // A threshold cannot pass what it could not judge: a time of 0, or a peak left empty, in
    // an ok row of NEW fails the gate (it passed, shown as n/a); without one it is listed only.
    let mut empty = base.clone();
    let j = pick(&mut empty, "buffer-store-copy");
    empty[j].peak_bytes = None;
    let empty_csv = dir.path().join("empty.csv");
    write_csv(&empty_csv, &empty);
    for (new_csv, metric) in [(&zero_csv, "median_ns"), (&empty_csv, "peak_bytes")] {
        let args = |gate: bool| {
            let mut a = vec![
                "compare".to_string(),
                base_csv.to_str().unwrap().to_string(),
                new_csv.to_str().unwrap().to_string(),
                "--metric".to_string(),
                metric.to_string(),
            ];
            if gate {
                a.extend(["--max-regression".to_string(), "10".to_string()]);
            }
            a
        };
        let run = |a: Vec<String>| {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            densebench(&a, dir.path())
        };
        let o = run(args(true));
        let log = text(&o);
        assert_eq!(o.status.code(), Some(1), "{metric}:\n{log}");
        assert!(
            log.contains("1 metric(s) measured in BASE and empty (or 0 ns) in NEW: not judged"),
            "{metric}:\n{log}"
        );
        let o = run(args(false));
        assert_eq!(o.status.code(), Some(0), "{metric}:\n{}", text(&o));
    }
}

/// `report` on a file with no `ok` row writes nothing and says why, like `plots`.
#[test]
fn report_refuses_a_file_without_ok_rows() {
    let (dir, csv) = setup(&[]);
    let out = dir.path().join("REPORT.md");
    // exit 1, nothing written; what it said
    let report = || {
        let args = [
            "report",
            csv.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        let o = densebench(&args, dir.path());
        let log = text(&o);
        assert_eq!(o.status.code(), Some(1), "{log}");
        assert!(!out.exists(), "{log}");
        log
    };
    // header only, as a sweep leaves it before its first row
    std::fs::write(&csv, densebench::results::store::csv_bytes(&[]).unwrap()).unwrap();
    let log = report();
    assert!(
        log.contains("no rows with status ok (0 rows in all)"),
        "{log}"
    );
    let mut rows = synthetic(&[4]);
    for r in &mut rows {
        r.status = "error".to_string();
        r.error = "no reference could be computed".to_string();
    }
    write_csv(&csv, &rows);
    let log = report();
    let n = rows.len();
    assert!(
        log.contains(&format!("({n} rows in all: error: {n})")),
        "{log}"
    );
}

/// A median of 0 ns (an edited cell: no step takes no time) is no measurement in the report:
/// shown as "–", never a 0.00× ratio, a −100% overhead or the fastest variant.
#[test]
fn report_takes_a_zero_time_for_no_measurement() {
    let mut rows = synthetic(&[4, 8]);
    for r in rows.iter_mut().filter(|r| r.variant == "buffer-store-copy") {
        r.median_ns = Some(0);
        r.min_ns = Some(0);
    }
    let (dir, csv) = setup(&rows);
    let out = dir.path().join("REPORT.md");
    let o = densebench(
        &[
            "report",
            csv.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("`buffer-store-copy`"), "{md}");
    for wrong in [
        "(0.00×)",
        "−100%",
        "-100%",
        "fastest linear-memory: `buffer-store-copy`",
    ] {
        assert!(!md.contains(wrong), "{wrong}:\n{md}");
    }
}

/// A reference with PyTorch peer rows against a run without `--peer`: the peer rows are listed
/// as not run, not as missing (a different run mode, not dropped configurations); a NEW with
/// peer rows that lacks one of BASE's still fails as missing.
#[test]
fn compare_lists_peer_rows_a_run_without_peer_did_not_make() {
    let mine = synthetic(&[4]);
    let peer = |v: &str, family: &str| {
        let mut r = row(family, "cat-store-copy", 4);
        r.variant = v.to_string();
        r.framework = "pytorch".to_string();
        r.framework_version = "torch 2.15.0".to_string();
        r.predicted_peak_bytes = None;
        r.key = densebench::results::row::key_of_fields(&r);
        r
    };
    let mut base = mine.clone();
    base.extend([peer("pytorch-naive", "bc"), peer("pytorch-naive", "mlp")]);
    let (dir, base_csv) = setup(&base);
    let new_csv = dir.path().join("new.csv");
    write_csv(&new_csv, &mine);
    let args = [
        "compare",
        base_csv.to_str().unwrap(),
        new_csv.to_str().unwrap(),
    ];
    let o = densebench(&args, dir.path());
    let log = text(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(
        log.contains("0 only in BASE")
            && log.contains("2 PyTorch rows of BASE not run (NEW has no peer rows)")
            && log.contains("pytorch-naive"),
        "{log}"
    );
    // NEW ran with --peer but lacks one of BASE's peer rows: that one is missing.
    let mut new = mine.clone();
    new.push(peer("pytorch-naive", "bc"));
    write_csv(&new_csv, &new);
    let o = densebench(&args, dir.path());
    let log = text(&o);
    assert_eq!(o.status.code(), Some(1), "{log}");
    assert!(
        log.contains("1 only in BASE") && log.contains("missing from NEW"),
        "{log}"
    );
}

/// `plots` records which CSV its figures are (`figures-source.txt`); `report` links them only
/// for that CSV, and for another one says so instead of embedding figures of other data. An
/// infinite or NaN gradient error is drawn (as a failure), never a hang, and the report's
/// worst-error column shows the NaN rather than skipping it.
#[test]
fn report_links_only_figures_drawn_from_its_own_csv() {
    let rows = synthetic(&[4, 8]);
    let (dir, csv) = setup(&rows);
    let o = densebench(
        &["plots", csv.to_str().unwrap(), "--out", "plots"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    let source = std::fs::read_to_string(dir.path().join("plots/figures-source.txt")).unwrap();
    assert!(source.contains("results.csv"), "{source}");
    let report = |csv: &Path| {
        let args = [
            "report",
            csv.to_str().unwrap(),
            "--out",
            "REPORT.md",
            "--plots",
            "plots",
        ];
        let o = densebench(&args, dir.path());
        assert!(o.status.success(), "{}", text(&o));
        std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap()
    };
    let md = report(&csv);
    assert!(
        md.contains("](plots/memory-vs-depth-bc-N64-C24-k12-bn4-32.png)"),
        "{md}"
    );
    assert!(!md.contains("drawn from another CSV"));
    // another CSV (one error made NaN, one infinite), the same figures folder
    let mut other = rows.clone();
    other[1].max_rel_err = Some(f64::NAN);
    other[2].max_rel_err = Some(f64::INFINITY);
    let other_csv = dir.path().join("other.csv");
    write_csv(&other_csv, &other);
    let md = report(&other_csv);
    assert!(md.contains("were drawn from another CSV"), "{md}");
    assert!(
        !md.contains(".png)"),
        "a figure of other data is linked:\n{md}"
    );
    assert!(
        md.contains("| NaN |"),
        "the NaN error is not shown as the worst:\n{md}"
    );
    let o = densebench(
        &["plots", other_csv.to_str().unwrap(), "--out", "plots2"],
        dir.path(),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(dir.path().join("plots2/grad-error-bc.png").exists());
}

/// A CPU and two GPUs' references drawn and reported together (`plots A B C`, `report A B C`;
/// both GPUs are `cuda:0`, one an H100, one an H200): every label names its device and model,
/// so no two headings or figure titles are one and the two GPUs are never one series; each
/// device keeps its own headline figures (memory vs time, timeline); `figures-source.txt`
/// records every file, and the report links the figures of exactly that set. A CSV named twice
/// is refused.
#[test]
fn plots_and_report_of_a_cpu_and_two_gpu_csvs_keep_the_devices_apart() {
    let cpu = synthetic(&[4, 8]);
    let on_gpu = |model: &str, extra: u64| -> Vec<Row> {
        cpu.iter()
            .map(|r| {
                let mut g = r.clone();
                g.device = "cuda:0".to_string();
                g.device_desc = format!("{model} (sm_90, 79.2 GiB; driver 580)");
                g.threads = 0;
                g.peak_bytes = g.peak_bytes.map(|b| b + extra);
                g.key = densebench::results::row::key_of_fields(&g);
                g
            })
            .collect()
    };
    let (dir, cpu_csv) = setup(&cpu);
    let gpu_csv = dir.path().join("gpu.csv");
    write_csv(&gpu_csv, &on_gpu("NVIDIA H100 80GB HBM3", 4096));
    let gpu2_csv = dir.path().join("gpu2.csv");
    write_csv(&gpu2_csv, &on_gpu("NVIDIA H200", 8192));
    let (a, b, c) = (
        cpu_csv.to_str().unwrap(),
        gpu_csv.to_str().unwrap(),
        gpu2_csv.to_str().unwrap(),
    );
    let o = densebench(&["plots", a, b, c, "--out", "plots"], dir.path());
    assert!(o.status.success(), "{}", text(&o));
    assert!(!text(&o).contains("repeat an earlier"), "{}", text(&o));
    let source = std::fs::read_to_string(dir.path().join("plots/figures-source.txt")).unwrap();
    assert!(
        source.contains("results.csv") && source.contains("gpu.csv") && source.contains("gpu2.csv"),
        "{source}"
    );
    for stem in [
        "memory-vs-time-bc-N64-C24-k12-bn4-32-L8",
        "memory-vs-time-bc-N64-C24-k12-bn4-32-cuda0-nvidia-h100-80gb-hbm3-L8",
        "memory-vs-time-bc-N64-C24-k12-bn4-32-cuda0-nvidia-h200-L8",
        "memory-vs-depth-bc-N64-C24-k12-bn4-32",
        "memory-vs-depth-bc-N64-C24-k12-bn4-32-cuda0-nvidia-h100-80gb-hbm3",
        "memory-vs-depth-bc-N64-C24-k12-bn4-32-cuda0-nvidia-h200",
    ] {
        assert!(
            dir.path().join(format!("plots/{stem}.png")).exists(),
            "{stem}.png missing:\n{}",
            text(&o)
        );
    }
    let report = |args: &[&str]| {
        let mut all = vec!["report"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--out", "REPORT.md", "--plots", "plots"]);
        let o = densebench(&all, dir.path());
        assert!(o.status.success(), "{}", text(&o));
        std::fs::read_to_string(dir.path().join("REPORT.md")).unwrap()
    };
    let md = report(&[a, b, c]);
    assert!(!md.contains("drawn from another CSV"), "{md}");
    let headings: Vec<&str> = md.lines().filter(|l| l.starts_with("### ")).collect();
    let mut unique = headings.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(
        unique.len(),
        headings.len(),
        "a heading repeats: {headings:#?}"
    );
    assert!(
        md.contains("### bc N=64 C0=24 k=12 bn=4 32x32 f32 on cpu (Synthetic CPU)")
            && md.contains(
                "### bc N=64 C0=24 k=12 bn=4 32x32 f32 on cuda:0 (NVIDIA H100 80GB HBM3)"
            )
            && md.contains("### bc N=64 C0=24 k=12 bn=4 32x32 f32 on cuda:0 (NVIDIA H200)"),
        "{md}"
    );
    assert!(
        md.contains("](plots/memory-vs-time-bc-N64-C24-k12-bn4-32-cuda0-nvidia-h200-L8.png)"),
        "{md}"
    );
    // the published comparison has a densebench line per device
    let frugal = md
        .lines()
        .filter(|l| l.starts_with("| densebench most frugal") && l.contains("bc N=64"))
        .count();
    assert_eq!(frugal, 3, "{md}");
    // two of the three CSVs: the set's figures are not theirs
    let md = report(&[a, b]);
    assert!(md.contains("were drawn from another CSV"), "{md}");
    // the CPU CSV alone: one device, no "on cpu"
    let md = report(&[a]);
    assert!(md.contains("were drawn from another CSV"), "{md}");
    assert!(!md.contains(" on cpu"), "{md}");
    // one file twice would count its rows twice, also through a link
    let link = dir.path().join("link.csv");
    std::os::unix::fs::symlink(&cpu_csv, &link).unwrap();
    for again in [a, link.to_str().unwrap()] {
        let o = densebench(&["report", a, again, "--out", "R2.md"], dir.path());
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(text(&o).contains("named twice"), "{}", text(&o));
    }
}

/// The report's growth sentence names the depths each fit used (an `oom` naive row has no
/// peak), and a CSV of naive rows alone gets no "most frugal" line comparing naive with itself.
#[test]
fn report_growth_sentences_say_what_was_fitted() {
    let mut rows: Vec<Row> = synthetic(&[4, 8, 16])
        .into_iter()
        .filter(|r| r.family == "bc")
        .collect();
    let naive8 = rows
        .iter_mut()
        .find(|r| r.variant == "cat-store-copy" && r.depth == 8)
        .unwrap();
    naive8.status = "oom".to_string();
    naive8.error = "memory allocation of 1 bytes failed".to_string();
    naive8.peak_bytes = None;
    let (dir, csv) = setup(&rows);
    let report = |csv: &Path| {
        let args = ["report", csv.to_str().unwrap(), "--out", "R.md"];
        let o = densebench(&args, dir.path());
        assert!(o.status.success(), "{}", text(&o));
        std::fs::read_to_string(dir.path().join("R.md")).unwrap()
    };
    let md = report(&csv);
    let line = md
        .lines()
        .find(|l| l.starts_with("- bc") && l.contains("peak ∝ L^p"))
        .unwrap_or_else(|| panic!("{md}"));
    assert!(line.contains("over L = 4, 16 and L = 4, 8, 16"), "{line}");
    let naive: Vec<Row> = rows
        .into_iter()
        .filter(|r| r.variant == "cat-store-copy" && r.status == "ok")
        .collect();
    let only = dir.path().join("naive.csv");
    write_csv(&only, &naive);
    let md = report(&only);
    assert!(!md.contains("most frugal"), "{md}");
    assert!(
        !md.lines()
            .any(|l| l.starts_with("- bc") && l.contains("peak ∝ L^p")),
        "{md}"
    );
}

/// Rows of both math modes in one file are two rows each, never one key: comparing such a file
/// with itself after the tf32 rows got slower flags the tf32 rows (and only those), labelled
/// `tf32`; a tf32-only run against an ieee-only one still pairs the rows, with a warning.
#[test]
fn compare_keeps_math_modes_of_one_file_apart() {
    let ieee = synthetic(&[4]);
    let tf32: Vec<Row> = ieee
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.math = "tf32".to_string();
            r.key = densebench::results::row::key_of_fields(&r);
            r
        })
        .collect();
    let mut base = ieee.clone();
    base.extend(tf32.iter().cloned());
    let (dir, base_csv) = setup(&base);
    let mut new = ieee.clone();
    new.extend(tf32.iter().cloned().map(|mut r| {
        r.median_ns = r.median_ns.map(|t| t * 2);
        r.max_ns = r.max_ns.map(|t| t * 2);
        r
    }));
    let new_csv = dir.path().join("new.csv");
    write_csv(&new_csv, &new);
    let o = densebench(
        &[
            "compare",
            base_csv.to_str().unwrap(),
            new_csv.to_str().unwrap(),
            "--metric",
            "median_ns",
            "--max-regression",
            "10",
        ],
        dir.path(),
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("{} rows matched", base.len()))
            && !log.contains("duplicate")
            && log.contains(&format!("FAIL: {} metric regression(s)", tf32.len())),
        "{log}"
    );
    for line in log.lines().filter(|l| l.contains("REGRESSION")) {
        assert!(
            line.contains(" tf32 "),
            "an ieee row flagged: {line}\n{log}"
        );
    }
    // tf32-only NEW against ieee-only BASE: paired, warned.
    let (ieee_csv, tf32_csv) = (dir.path().join("ieee.csv"), dir.path().join("tf32.csv"));
    write_csv(&ieee_csv, &ieee);
    write_csv(&tf32_csv, &tf32);
    let o = densebench(
        &[
            "compare",
            ieee_csv.to_str().unwrap(),
            tf32_csv.to_str().unwrap(),
        ],
        dir.path(),
    );
    let log = text(&o);
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(
        log.contains(&format!("{} rows matched, 0 only in BASE", ieee.len()))
            && log.contains("math modes differ: BASE ieee vs NEW tf32; tf32 and ieee times"),
        "{log}"
    );
}
