//! PyTorch peer rows through `report`, `plots` and `compare` (issue 12 item 4), end to end through
//! the `densebench` binary: the committed fixture's real peer rows beside synthetic densebench
//! rows of the same configurations (same threads and math, so ratios may be taken).

#[allow(dead_code)]
mod common;

use common::{densebench, path_str};
use densebench::outputs::plots::data::{fmt_num, mib, ms};
use densebench::results::row::{key_of_fields, read_rows, Row};
use std::path::{Path, PathBuf};

fn fixture() -> Vec<Row> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("peer/fixtures/peer-rows.csv");
    read_rows(&p).expect("the committed peer fixture reads")
}

/// A densebench row of the configuration of `peer` at `depth`: the peer's config, threads and
/// math, its own variant, peak and time; the key its fields give.
fn ours(peer: &Row, variant: &str, depth: usize, peak: u64, time: u64, grad_ok: bool) -> Row {
    let mut r = Row {
        variant: variant.to_string(),
        framework: "densebench".to_string(),
        framework_version: "0.1.0".to_string(),
        depth,
        peak_bytes: Some(peak),
        predicted_peak_bytes: Some(peak),
        median_ns: Some(time),
        min_ns: Some(time),
        max_ns: Some(time),
        max_rel_err: Some(if grad_ok { 1e-6 } else { 1.0 }),
        grad_ok: Some(grad_ok),
        error: String::new(),
        note: String::new(),
        timeline: String::new(),
        ..peer.clone()
    };
    r.key = key_of_fields(&r);
    r
}

fn peer<'a>(rows: &'a [Row], variant: &str, family: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.variant == variant && r.family == family && r.is_ok())
        .unwrap_or_else(|| panic!("fixture has no ok {variant} {family} row"))
}

/// densebench rows for both fixture configurations: at the peers' depth and one shallower (so
/// the figures against depth are planned), at L=48 beside the peer's oom row; one variant out of
/// tolerance. Sizes are multiples of the peer's so every ratio is a different number.
fn densebench_rows(fx: &[Row]) -> Vec<Row> {
    let bc = peer(fx, "pytorch-naive", "bc");
    let mlp = peer(fx, "pytorch-naive", "mlp");
    let (p, t) = (bc.peak_bytes.unwrap(), bc.median_ns.unwrap());
    let (mp, mt) = (mlp.peak_bytes.unwrap(), mlp.median_ns.unwrap());
    vec![
        ours(bc, "cat-store-copy", 8, p / 3, t / 3, true),
        ours(bc, "cat-store-copy", 16, p * 102 / 100, t * 127 / 100, true),
        ours(bc, "cat-store-copy", 48, p * 5, t * 4, true),
        ours(bc, "buffer-recompute-inplace", 8, p / 12, t / 2, true),
        ours(
            bc,
            "buffer-recompute-inplace",
            16,
            p * 15 / 100,
            t * 143 / 100,
            true,
        ),
        ours(
            bc,
            "cat-store-inplace",
            16,
            p * 97 / 100,
            t * 110 / 100,
            false,
        ),
        ours(mlp, "cat-store-copy", 16, mp / 3, mt / 3, true),
        ours(
            mlp,
            "cat-store-copy",
            32,
            mp * 104 / 100,
            mt * 90 / 100,
            true,
        ),
        ours(mlp, "buffer-store-copy", 16, mp / 9, mt / 4, true),
        ours(
            mlp,
            "buffer-store-copy",
            32,
            mp * 28 / 100,
            mt * 85 / 100,
            true,
        ),
    ]
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

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn setup(rows: &[Row], name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join(name);
    write_csv(&csv, rows);
    (dir, csv)
}

/// The versus-PyTorch section of a report.
fn versus(md: &str) -> &str {
    let start = md
        .find("## Versus PyTorch")
        .expect("the report has the section");
    let rest = &md[start + 3..];
    let end = rest.find("\n## ").map_or(rest.len(), |e| e + 1);
    &rest[..end]
}

/// `0.15×`, with ` †` when either row's gradients are out of tolerance: what the report must
/// print for a ratio of two rows (the rule of the section, restated here from the rows).
fn expected_ratio(a: u64, b: u64, ra: &Row, rb: &Row) -> String {
    let mark = if ra.grad_ok == Some(false) || rb.grad_ok == Some(false) {
        " †"
    } else {
        ""
    };
    format!("{:.2}×{mark}", a as f64 / b as f64)
}

#[test]
fn report_sets_every_densebench_variant_against_each_peer() {
    let fx = fixture();
    let mut rows = densebench_rows(&fx);
    rows.extend(fx.iter().cloned());
    let (dir, csv) = setup(&rows, "results.csv");
    let out = dir.path().join("REPORT.md");
    let o = densebench(&[
        "report",
        path_str(&csv),
        "--out",
        path_str(&out),
        "--plots",
        path_str(&dir.path().join("plots")),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::read_to_string(&out).unwrap();
    let v = versus(&md);
    assert!(
        v.contains("torch 2.15.0+cu132, torchvision 0.29.2+cu132"),
        "the PyTorch version is named:\n{v}"
    );
    // Every densebench row at a depth with ok peers, against every ok peer of its config:
    // the ratio cells of its table line, in the peer order (naive, then the memory-saving one).
    for (family, depth, peers) in [
        ("bc", 16, ["pytorch-naive", "pytorch-memory-efficient"]),
        ("mlp", 32, ["pytorch-naive", "pytorch-checkpoint"]),
    ] {
        let ps: Vec<&Row> = peers.iter().map(|p| peer(&fx, p, family)).collect();
        for r in rows
            .iter()
            .filter(|r| !r.is_peer() && r.family == family && r.depth == depth)
        {
            let mut cells = Vec::new();
            for p in &ps {
                cells.push(expected_ratio(
                    r.peak_bytes.unwrap(),
                    p.peak_bytes.unwrap(),
                    r,
                    p,
                ));
                cells.push(expected_ratio(
                    r.median_ns.unwrap(),
                    p.median_ns.unwrap(),
                    r,
                    p,
                ));
            }
            let line = format!(
                "| `{}` | {} | {} | {} | {} | {} |",
                r.variant,
                r.threads,
                fmt_num(mib(r.peak_bytes.unwrap())),
                fmt_num(ms(r.median_ns.unwrap())),
                if r.grad_ok == Some(true) {
                    "within tolerance"
                } else {
                    "out of tolerance †"
                },
                cells.join(" | ")
            );
            assert!(v.contains(&line), "missing `{line}` in:\n{v}");
        }
    }
    // The memory-efficient peer's double running-stats update is shown, not hidden.
    assert!(
        v.contains("| PyTorch memory-efficient | ok | 1 | ieee |"),
        "{v}"
    );
    assert!(v.contains("pytorch/pytorch#96136"), "{v}");
    assert!(v.contains("† PyTorch memory-efficient: gradients out of tolerance"));
    // The oom peer at L=48 feeds no ratio.
    assert!(v.contains("| PyTorch naive | oom |"), "{v}");
    assert!(v.contains("– (PyTorch oom)"), "{v}");
    // Peers never pass for densebench variants: not in the per-family tables or the check.
    let ours_part = &md[md.find("## Results: `bc`").unwrap()..];
    let ours_part = &ours_part[..ours_part.find("## Figures").unwrap()];
    assert!(
        !ours_part.contains("`pytorch-"),
        "a peer row in densebench's tables:\n{ours_part}"
    );
}

/// GPU rows with a CUDA-graph timing in their note get a "CUDA graph replay" section: eager and
/// graph medians, graph / eager, and graph / each comparable PyTorch peer of the same depth; a
/// row without one is not listed, and a report with none has no such section.
#[test]
fn report_lists_cuda_graph_timings_beside_eager_and_pytorch() {
    let fx = fixture();
    let mut rows = densebench_rows(&fx);
    let bc = peer(&fx, "pytorch-naive", "bc");
    let me = peer(&fx, "pytorch-memory-efficient", "bc");
    let eager = bc.median_ns.unwrap();
    let graph = eager / 4;
    let timed = rows
        .iter_mut()
        .find(|r| r.family == "bc" && r.depth == 16 && r.variant == "cat-store-copy")
        .expect("a bc L=16 cat-store-copy row");
    timed.note = format!(
        "cuda_graph_median_ns={graph};cuda_graph_min_ns={graph};cuda_graph_max_ns={graph} (…)"
    );
    let own_eager = timed.median_ns.unwrap();
    rows.extend(fx.iter().cloned());
    let (dir, csv) = setup(&rows, "results.csv");
    let out = dir.path().join("REPORT.md");
    let o = densebench(&["report", path_str(&csv), "--out", path_str(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::read_to_string(&out).unwrap();
    let section = md
        .split("## CUDA graph replay")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .unwrap_or_else(|| panic!("no CUDA graph section:\n{md}"));
    let line = section
        .lines()
        .find(|l| l.contains("`cat-store-copy`"))
        .unwrap_or_else(|| panic!("no cat-store-copy line:\n{section}"));
    let want = [
        format!("{:.2}×", graph as f64 / own_eager as f64),
        format!("{:.2}×", graph as f64 / eager as f64),
        format!("{:.2}×", graph as f64 / me.median_ns.unwrap() as f64),
    ];
    for w in &want {
        assert!(line.contains(w.as_str()), "{w} missing in: {line}");
    }
    assert_eq!(
        section.matches("`buffer-recompute-inplace`").count(),
        0,
        "a row without a graph timing is listed:\n{section}"
    );
    // without any graph timing, no section
    let (dir2, csv2) = setup(&densebench_rows(&fx), "results.csv");
    let out2 = dir2.path().join("REPORT.md");
    let o = densebench(&["report", path_str(&csv2), "--out", path_str(&out2)]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!std::fs::read_to_string(&out2)
        .unwrap()
        .contains("CUDA graph"));
}

#[test]
fn report_without_peers_says_how_to_get_them() {
    let fx = fixture();
    let (dir, csv) = setup(&densebench_rows(&fx), "results.csv");
    let out = dir.path().join("REPORT.md");
    let o = densebench(&["report", path_str(&csv), "--out", path_str(&out)]);
    assert!(o.status.success(), "{}", text(&o));
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(
        versus(&md).contains("`densebench bench-all --peer pytorch`"),
        "{md}"
    );
    assert!(!md.contains("PyTorch naive"), "{md}");
}

/// SVG strokes of one colour: plotters writes each dash of a dashed series as its own
/// `<polyline … stroke="#rrggbb" …>`, a solid series as one.
fn strokes(svg: &str, rgb: (u8, u8, u8)) -> usize {
    let c = format!("stroke=\"#{:02X}{:02X}{:02X}\"", rgb.0, rgb.1, rgb.2);
    svg.lines()
        .filter(|l| l.contains("<polyline") && l.contains(&c))
        .count()
}

#[test]
fn plots_draw_peers_as_their_own_dashed_series() {
    let fx = fixture();
    let ours_only = densebench_rows(&fx);
    // Peers of bc only: the mlp figures must come out byte for byte as without peers.
    let mut with_bc_peers = ours_only.clone();
    with_bc_peers.extend(fx.iter().filter(|r| r.family == "bc").cloned());
    let (dir, plain_csv) = setup(&ours_only, "plain.csv");
    let peer_csv = dir.path().join("peers.csv");
    write_csv(&peer_csv, &with_bc_peers);
    let (plain, peers) = (dir.path().join("plain"), dir.path().join("peers"));
    for (csv, out) in [(&plain_csv, &plain), (&peer_csv, &peers)] {
        let o = densebench(&["plots", path_str(csv), "--out", path_str(out)]);
        assert!(o.status.success(), "{}", text(&o));
    }
    let read = |dir: &Path, stem: &str| {
        std::fs::read_to_string(dir.join(format!("{stem}.svg")))
            .unwrap_or_else(|e| panic!("{stem}.svg: {e}"))
    };
    let naive_rgb = densebench::outputs::plots::data::variant_rgb("pytorch-naive");
    // The Pareto figure at L=16: both peers labelled, joined by a dashed line (many strokes).
    let pareto = read(&peers, "memory-vs-time-bc-N64-C24-k12-bn4-32-L16");
    for label in ["PyTorch naive", "PyTorch memory-efficient"] {
        assert!(pareto.contains(label), "no `{label}` in the Pareto figure");
    }
    assert!(
        strokes(&pareto, naive_rgb) > 5,
        "the peers' line is not dashed ({} strokes)",
        strokes(&pareto, naive_rgb)
    );
    assert_eq!(
        strokes(
            &read(&plain, "memory-vs-time-bc-N64-C24-k12-bn4-32-L16"),
            naive_rgb
        ),
        0,
        "the peer colour without peers"
    );
    for stem in [
        "memory-vs-depth-bc-N64-C24-k12-bn4-32",
        "time-vs-depth-bc-N64-C24-k12-bn4-32",
    ] {
        let svg = read(&peers, stem);
        assert!(svg.contains("PyTorch naive"), "{stem}: no peer legend");
        // The legend's dashed sample: more than one stroke in the peer's colour.
        assert!(strokes(&svg, naive_rgb) >= 3, "{stem}: no dashed sample");
        assert_ne!(svg, read(&plain, stem), "{stem}: peers changed nothing");
    }
    // No model for PyTorch: the measured-vs-predicted figure never shows a peer.
    assert!(!read(&peers, "measured-vs-predicted-bc").contains("pytorch"));
    for stem in [
        "memory-vs-depth-mlp-N4096-C256-k64-relu",
        "time-vs-depth-mlp-N4096-C256-k64-relu",
        "memory-vs-time-mlp-N4096-C256-k64-relu-L32",
        "measured-vs-predicted-mlp",
        "grad-error-mlp",
    ] {
        assert_eq!(
            read(&plain, stem),
            read(&peers, stem),
            "{stem} changed though its config has no peer row"
        );
    }
}

#[test]
fn compare_matches_peer_rows_by_key() {
    let fx = fixture();
    let mut new = fx.clone();
    let hit = new
        .iter_mut()
        .find(|r| r.variant == "pytorch-checkpoint")
        .unwrap();
    hit.peak_bytes = hit.peak_bytes.map(|p| p * 12 / 10);
    let (dir, base) = setup(&fx, "base.csv");
    let new_csv = dir.path().join("new.csv");
    write_csv(&new_csv, &new);
    let o = densebench(&[
        "compare",
        path_str(&base),
        path_str(&new_csv),
        "--max-regression",
        "10",
    ]);
    let log = text(&o);
    assert_eq!(o.status.code(), Some(1), "expected the regression:\n{log}");
    assert!(
        log.contains(&format!(
            "{} rows matched, 0 only in BASE, 0 only in NEW",
            fx.len()
        )),
        "{log}"
    );
    let flagged: Vec<&str> = log.lines().filter(|l| l.contains("REGRESSION")).collect();
    assert_eq!(flagged.len(), 1, "{log}");
    assert!(flagged[0].contains("pytorch-checkpoint") && flagged[0].contains("1.200"));
}
