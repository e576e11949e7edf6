//! Comparing two result sets: rows matched by variant and every config field (not timestamp,
//! git revision or device), NEW/BASE per metric, regressions beyond a threshold, rows present
//! on one side only, device, thread, math and PyTorch-version warnings; rendered as text,
//! markdown or CSV. PyTorch peer rows are matched like any other: their variant names
//! (`pytorch-naive`, …) never collide with densebench's, and nothing here parses a variant.

use crate::outputs::plots::data::{fmt_num, variant_order, MIB, NS_PER_MS};
use crate::results::row::Row;
use anyhow::Result;
use clap::ValueEnum;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

/// Exit status when a regression beyond the threshold was found.
pub const EXIT_REGRESSION: u8 = 1;

/// A numeric column of the result CSV that can be compared.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[value(rename_all = "snake_case")]
pub enum Metric {
    PeakBytes,
    SavedBytes,
    PredictedPeakBytes,
    BaselineBytes,
    PeakRssBytes,
    MedianNs,
    MinNs,
    MaxNs,
    FwdMedianNs,
    BwdMedianNs,
    GflopsPerS,
}

impl Metric {
    /// The column name.
    pub fn name(self) -> &'static str {
        match self {
            Metric::PeakBytes => "peak_bytes",
            Metric::SavedBytes => "saved_bytes",
            Metric::PredictedPeakBytes => "predicted_peak_bytes",
            Metric::BaselineBytes => "baseline_bytes",
            Metric::PeakRssBytes => "peak_rss_bytes",
            Metric::MedianNs => "median_ns",
            Metric::MinNs => "min_ns",
            Metric::MaxNs => "max_ns",
            Metric::FwdMedianNs => "fwd_median_ns",
            Metric::BwdMedianNs => "bwd_median_ns",
            Metric::GflopsPerS => "gflops_per_s",
        }
    }

    /// The raw value in the column's unit (bytes, ns, GFLOP/s).
    pub fn value(self, r: &Row) -> Option<f64> {
        let u = |v: Option<u64>| v.map(|x| x as f64);
        match self {
            Metric::PeakBytes => u(r.peak_bytes),
            Metric::SavedBytes => u(r.saved_bytes),
            Metric::PredictedPeakBytes => u(r.predicted_peak_bytes),
            Metric::BaselineBytes => u(r.baseline_bytes),
            Metric::PeakRssBytes => u(r.peak_rss_bytes),
            Metric::MedianNs => u(r.median_ns),
            Metric::MinNs => u(r.min_ns),
            Metric::MaxNs => u(r.max_ns),
            Metric::FwdMedianNs => u(r.fwd_median_ns),
            Metric::BwdMedianNs => u(r.bwd_median_ns),
            Metric::GflopsPerS => r.gflops_per_s,
        }
    }

    /// Throughput is better higher; memory and time are better lower.
    pub fn higher_is_better(self) -> bool {
        self == Metric::GflopsPerS
    }

    /// A time of 0 ns (or 0 GFLOP/s) is no measurement: such a value is compared as missing,
    /// never as an infinitely better or worse one.
    fn zero_is_unmeasured(self) -> bool {
        !matches!(
            self,
            Metric::PeakBytes
                | Metric::SavedBytes
                | Metric::PredictedPeakBytes
                | Metric::BaselineBytes
                | Metric::PeakRssBytes
        )
    }

    /// The human unit of the text and markdown tables and the divisor from the raw unit.
    fn unit(self) -> (&'static str, f64) {
        match self {
            Metric::PeakBytes
            | Metric::SavedBytes
            | Metric::PredictedPeakBytes
            | Metric::BaselineBytes
            | Metric::PeakRssBytes => ("MiB", MIB),
            Metric::MedianNs
            | Metric::MinNs
            | Metric::MaxNs
            | Metric::FwdMedianNs
            | Metric::BwdMedianNs => ("ms", NS_PER_MS),
            Metric::GflopsPerS => ("GFLOP/s", 1.0),
        }
    }
}

/// The identity of a measurement across runs: the variant and every config field; not the
/// device (a cross-device comparison is allowed, with a warning), timestamp or git revision.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MatchKey {
    pub family: String,
    pub batch: usize,
    pub channels: usize,
    pub growth: usize,
    pub bn_size: usize,
    pub size: impls::Spatial,
    pub activation: bool,
    pub dtype: String,
    pub seed: u64,
    pub depth: usize,
    pub variant: String,
    /// The row's math mode (`ieee`, `tf32`), or empty where the comparison pairs rows across
    /// modes: when BASE ran in one mode only and NEW in another (compared, with a warning).
    /// Where a file holds rows of both modes, each mode is its own row: never collapsed.
    pub math: String,
}

impl MatchKey {
    /// The key of a row; `by_math` keeps its math mode in the key.
    pub fn of(r: &Row, by_math: bool) -> Self {
        Self {
            family: r.family.clone(),
            batch: r.batch,
            channels: r.channels,
            growth: r.growth,
            bn_size: r.bn_size,
            size: r.size,
            activation: r.activation,
            dtype: r.dtype.clone(),
            seed: r.seed,
            depth: r.depth,
            variant: r.variant.clone(),
            math: if by_math {
                r.math.clone()
            } else {
                String::new()
            },
        }
    }

    /// The config label of a row, with its math mode where the key carries a non-ieee one.
    fn label(&self, r: &Row) -> String {
        if self.math.is_empty() || self.math == "ieee" {
            r.config_label()
        } else {
            format!("{} {}", r.config_label(), self.math)
        }
    }
}

/// The verdict on one metric of one matched row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the threshold (or no threshold).
    Same,
    /// Worse by more than the threshold.
    Regression,
    /// Better by more than the threshold.
    Improvement,
    /// A value is missing on one side (e.g. the row failed).
    Missing,
}

/// One metric of one matched row.
#[derive(Debug, Clone)]
pub struct Line {
    pub key: MatchKey,
    pub config: String,
    pub metric: Metric,
    pub base: Option<f64>,
    pub new: Option<f64>,
    pub verdict: Verdict,
}

impl Line {
    pub fn ratio(&self) -> Option<f64> {
        match (self.base, self.new) {
            (Some(b), Some(n)) if b > 0.0 => Some(n / b),
            _ => None,
        }
    }
}

/// Everything `compare` found.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    pub lines: Vec<Line>,
    /// Rows (config label, variant, depth) only in BASE, then only in NEW.
    pub only_base: Vec<String>,
    /// PyTorch peer rows of BASE when NEW has none at all (a run without `--peer`): listed, not
    /// counted as missing — a different run mode, not configurations NEW silently dropped.
    pub peers_not_run: Vec<String>,
    pub only_new: Vec<String>,
    /// Rows ok in BASE (status `ok`, gradients within tolerance) that are not in NEW: another
    /// status, or gradients out of tolerance or unchecked. They fail the comparison.
    pub broke: Vec<String>,
    /// Rows not ok in BASE (as for `broke`) that are ok in NEW.
    pub fixed: Vec<String>,
    pub warnings: Vec<String>,
    pub matched: usize,
}

impl Comparison {
    pub fn regressions(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.verdict == Verdict::Regression)
            .count()
    }
}

/// What is wrong with a row as a result, `None` when nothing is: its status when it is not
/// `ok`, else its gradient check when that failed (out of tolerance, a NaN error) or is absent.
/// A row whose gradients are wrong is no result, whatever its `status` cell says.
fn health(r: &Row) -> Option<String> {
    if !r.is_ok() {
        return Some(r.status.clone());
    }
    match r.grad_ok {
        Some(true) if !r.has_non_finite_error() => None,
        Some(_) => Some(match (r.max_rel_err, r.tolerance) {
            (Some(e), Some(t)) => {
                format!("gradients out of tolerance (max_rel_err {e:.1e} > {t:.1e})")
            }
            (Some(e), None) => format!("gradients out of tolerance (max_rel_err {e:.1e})"),
            _ => "gradients out of tolerance".to_string(),
        }),
        None => Some("gradients not checked".to_string()),
    }
}

fn describe(k: &MatchKey, r: &Row) -> String {
    format!("{} L={} {}", k.label(r), r.depth, r.variant)
}

/// Keyed rows of one file; duplicates (same key twice) keep the last and are counted.
fn index(rows: &[Row], by_math: bool) -> (BTreeMap<MatchKey, &Row>, usize) {
    let mut map = BTreeMap::new();
    let mut dup = 0;
    for r in rows {
        if map.insert(MatchKey::of(r, by_math), r).is_some() {
            dup += 1;
        }
    }
    (map, dup)
}

fn distinct<'a>(rows: &'a [Row], f: impl Fn(&'a Row) -> String) -> BTreeSet<String> {
    rows.iter().map(f).collect()
}

/// Compares two sets of rows. `threshold_pct` is the largest tolerated worsening in percent.
pub fn compare_rows(
    base: &[Row],
    new: &[Row],
    metrics: &[Metric],
    threshold_pct: Option<f64>,
) -> Comparison {
    let mut c = Comparison::default();
    let dev = |r: &Row| format!("{} ({})", r.device, r.device_desc.trim());
    let (bd, nd) = (distinct(base, dev), distinct(new, dev));
    if !base.is_empty() && !new.is_empty() && bd != nd {
        c.warnings.push(format!(
            "devices differ: BASE ran on {} and NEW on {}; ratios compare different machines",
            bd.into_iter().collect::<Vec<_>>().join(", "),
            nd.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let thr = |r: &Row| r.threads.to_string();
    let (bt, nt) = (distinct(base, thr), distinct(new, thr));
    if !base.is_empty() && !new.is_empty() && bt != nt {
        c.warnings.push(format!(
            "thread counts differ: BASE {} vs NEW {}; times are not comparable one to one",
            bt.into_iter().collect::<Vec<_>>().join("/"),
            nt.into_iter().collect::<Vec<_>>().join("/")
        ));
    }
    let math = |r: &Row| r.math.clone();
    let (bm, nm) = (distinct(base, math), distinct(new, math));
    // Rows pair across math modes only when each side ran in one mode (a tf32 run against an
    // ieee one, with a warning); where a side holds both modes, rows pair within their mode.
    let by_math = !(bm.len() == 1 && nm.len() == 1);
    if !base.is_empty() && !new.is_empty() && bm != nm {
        c.warnings.push(format!(
            "math modes differ: BASE {} vs NEW {}; {}",
            bm.iter().cloned().collect::<Vec<_>>().join("/"),
            nm.iter().cloned().collect::<Vec<_>>().join("/"),
            if by_math {
                "rows are paired within their math mode"
            } else {
                "tf32 and ieee times are not comparable"
            }
        ));
    }
    let (bi, bdup) = index(base, by_math);
    let (ni, ndup) = index(new, by_math);
    for (side, n) in [("BASE", bdup), ("NEW", ndup)] {
        if n > 0 {
            c.warnings.push(format!(
                "{side} has {n} duplicate row(s) for the same variant and config; the last of each is compared"
            ));
        }
    }
    // Peer versions only where both sides have peer rows: a side without any is no difference.
    let peer_versions = |rows: &[Row]| -> BTreeSet<String> {
        rows.iter()
            .filter(|r| r.is_peer())
            .map(|r| r.framework_version.clone())
            .collect()
    };
    let (bv, nv) = (peer_versions(base), peer_versions(new));
    if !bv.is_empty() && !nv.is_empty() && bv != nv {
        c.warnings.push(format!(
            "PyTorch versions differ: BASE {} vs NEW {}; peer rows compare different PyTorch builds",
            bv.into_iter().collect::<Vec<_>>().join("; "),
            nv.into_iter().collect::<Vec<_>>().join("; ")
        ));
    }
    let limit = threshold_pct.map(|p| p / 100.0);
    let new_has_peers = new.iter().any(Row::is_peer);
    for (k, b) in &bi {
        let Some(n) = ni.get(k) else {
            if b.is_peer() && !new_has_peers {
                c.peers_not_run.push(describe(k, b));
            } else {
                c.only_base.push(describe(k, b));
            }
            continue;
        };
        c.matched += 1;
        match (health(b), health(n)) {
            (None, Some(why)) => c.broke.push(format!("{}: ok → {why}", describe(k, b))),
            (Some(why), None) => c.fixed.push(format!("{}: {why} → ok", describe(k, b))),
            _ => {}
        }
        for &m in metrics {
            let (bv, nv) = (m.value(b), m.value(n));
            let verdict = match (bv, nv, limit) {
                (Some(bv), Some(nv), _) if m.zero_is_unmeasured() && (bv <= 0.0 || nv <= 0.0) => {
                    Verdict::Missing
                }
                // from nothing to something (bytes): worse where lower is better
                (Some(bv), Some(nv), Some(_)) if bv <= 0.0 && nv > 0.0 => {
                    if m.higher_is_better() {
                        Verdict::Improvement
                    } else {
                        Verdict::Regression
                    }
                }
                (Some(bv), Some(nv), Some(lim)) if bv > 0.0 => {
                    let r = nv / bv;
                    // Worse means larger for lower-is-better metrics, smaller otherwise.
                    let worse = if m.higher_is_better() {
                        r < 1.0 - lim
                    } else {
                        r > 1.0 + lim
                    };
                    let better = if m.higher_is_better() {
                        r > 1.0 + lim
                    } else {
                        r < 1.0 - lim
                    };
                    if worse {
                        Verdict::Regression
                    } else if better {
                        Verdict::Improvement
                    } else {
                        Verdict::Same
                    }
                }
                (Some(_), Some(_), _) => Verdict::Same,
                _ => Verdict::Missing,
            };
            c.lines.push(Line {
                key: k.clone(),
                config: k.label(b),
                metric: m,
                base: bv,
                new: nv,
                verdict,
            });
        }
    }
    for (k, n) in &ni {
        if !bi.contains_key(k) {
            c.only_new.push(describe(k, n));
        }
    }
    // Lines by metric (in the order asked for), then config, depth and the stable variant order.
    let order = variant_order(c.lines.iter().map(|l| l.key.variant.as_str()));
    let rank = |v: &str| order.iter().position(|o| o == v);
    let config = |k: &MatchKey| {
        (
            k.family.clone(),
            k.batch,
            k.channels,
            k.growth,
            k.bn_size,
            k.size,
            k.activation,
            k.dtype.clone(),
            k.seed,
            k.depth,
            k.math.clone(),
        )
    };
    c.lines.sort_by(|a, b| {
        let pa = metrics.iter().position(|m| *m == a.metric);
        let pb = metrics.iter().position(|m| *m == b.metric);
        pa.cmp(&pb)
            .then_with(|| config(&a.key).cmp(&config(&b.key)))
            .then_with(|| rank(&a.key.variant).cmp(&rank(&b.key.variant)))
    });
    c
}

/// Aligned plain-text table: the columns listed in `left` left-aligned, the rest right-aligned.
pub(crate) fn text_table(headers: &[&str], rows: &[Vec<String>], left: &[usize]) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            if let Some(wi) = w.get_mut(i) {
                *wi = (*wi).max(cell.chars().count());
            }
        }
    }
    let fmt_row = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(cell.chars().count());
            if i > 0 {
                s.push_str("  ");
            }
            if left.contains(&i) {
                s.push_str(cell);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str(&" ".repeat(pad));
                s.push_str(cell);
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = fmt_row(headers.to_vec());
    for r in rows {
        out.push_str(&fmt_row(r.iter().map(String::as_str).collect()));
    }
    out
}

/// GitHub-flavoured markdown table: the columns listed in `left` left-aligned, the rest right.
pub(crate) fn markdown_table(headers: &[&str], rows: &[Vec<String>], left: &[usize]) -> String {
    let esc = |s: &str| s.replace('|', "\\|");
    let mut out = format!(
        "| {} |\n|{}|\n",
        headers
            .iter()
            .map(|h| esc(h))
            .collect::<Vec<_>>()
            .join(" | "),
        (0..headers.len())
            .map(|i| if left.contains(&i) { " --- " } else { " ---: " })
            .collect::<Vec<_>>()
            .join("|")
    );
    for r in rows {
        out.push_str(&format!(
            "| {} |\n",
            r.iter().map(|c| esc(c)).collect::<Vec<_>>().join(" | ")
        ));
    }
    out
}

fn flag(v: Verdict) -> &'static str {
    match v {
        Verdict::Same => "",
        Verdict::Regression => "REGRESSION",
        Verdict::Improvement => "better",
        Verdict::Missing => "n/a",
    }
}

fn human(v: Option<f64>, div: f64) -> String {
    v.map(|x| fmt_num(x / div))
        .unwrap_or_else(|| "-".to_string())
}

/// The report as text or markdown.
pub fn render_human(
    c: &Comparison,
    base: &Path,
    new: &Path,
    max_regression: Option<f64>,
    metrics: &[Metric],
    md: bool,
) -> String {
    let mut out = String::new();
    let h1 = |s: &str| {
        if md {
            format!("## {s}\n\n")
        } else {
            format!("{s}\n")
        }
    };
    let warn = |s: &str| {
        if md {
            format!("> **warning:** {s}\n\n")
        } else {
            format!("warning: {s}\n")
        }
    };
    let para_end = if md { "\n" } else { "" };
    out.push_str(&format!(
        "compare: BASE {} vs NEW {}: {} rows matched, {} only in BASE, {} only in NEW{}\n{para_end}",
        base.display(),
        new.display(),
        c.matched,
        c.only_base.len(),
        c.only_new.len(),
        if c.peers_not_run.is_empty() {
            String::new()
        } else {
            format!(
                ", {} PyTorch rows of BASE not run (NEW has no peer rows)",
                c.peers_not_run.len()
            )
        }
    ));
    for w in &c.warnings {
        out.push_str(&warn(w));
    }
    for &m in metrics {
        let (unit, div) = m.unit();
        let dir = if m.higher_is_better() {
            "higher is better"
        } else {
            "lower is better"
        };
        let thr = match max_regression {
            Some(p) => format!(
                "; regression when NEW/BASE {} {:.3}",
                if m.higher_is_better() { "<" } else { ">" },
                if m.higher_is_better() {
                    1.0 - p / 100.0
                } else {
                    1.0 + p / 100.0
                }
            ),
            None => String::new(),
        };
        out.push_str(&format!(
            "\n{}",
            h1(&format!("{} ({unit}, {dir}{thr})", m.name()))
        ));
        let rows: Vec<Vec<String>> = c
            .lines
            .iter()
            .filter(|l| l.metric == m)
            .map(|l| {
                vec![
                    l.config.clone(),
                    l.key.depth.to_string(),
                    l.key.variant.clone(),
                    human(l.base, div),
                    human(l.new, div),
                    l.ratio()
                        .map(|r| format!("{r:.3}"))
                        .unwrap_or_else(|| "-".to_string()),
                    flag(l.verdict).to_string(),
                ]
            })
            .collect();
        let headers = ["config", "L", "variant", "BASE", "NEW", "NEW/BASE", ""];
        let left = [0, 2, 6];
        if md {
            out.push_str(&markdown_table(&headers, &rows, &left));
        } else {
            out.push_str(&text_table(&headers, &rows, &left));
        }
        let ratios: Vec<f64> = c
            .lines
            .iter()
            .filter(|l| l.metric == m)
            .filter_map(Line::ratio)
            .filter(|r| *r > 0.0)
            .collect();
        if !ratios.is_empty() {
            let geo = (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len() as f64).exp();
            out.push_str(&format!(
                "{}geometric mean NEW/BASE: {geo:.3} over {} rows\n",
                if md { "\n" } else { "" },
                ratios.len()
            ));
        }
    }
    let list = |title: &str, items: &[String], out: &mut String| {
        if items.is_empty() {
            return;
        }
        out.push_str(&format!("\n{}", h1(&format!("{title} ({})", items.len()))));
        for i in items {
            out.push_str(&format!("{}{i}\n", if md { "- " } else { "  " }));
        }
    };
    list("only in BASE", &c.only_base, &mut out);
    list(
        "PyTorch rows of BASE not run in NEW (no --peer there; not counted as missing)",
        &c.peers_not_run,
        &mut out,
    );
    list("only in NEW", &c.only_new, &mut out);
    list("ok in BASE, failed in NEW", &c.broke, &mut out);
    list("failed in BASE, ok in NEW", &c.fixed, &mut out);
    out.push('\n');
    out.push_str(&summary(c, max_regression));
    out.push('\n');
    out
}

/// The verdict line: FAIL with counts, ok, or nothing judged.
pub fn summary(c: &Comparison, thr: Option<f64>) -> String {
    match thr {
        Some(p) => {
            let n = c.regressions() + c.broke.len();
            if n > 0 {
                format!(
                    "FAIL: {} metric regression(s) beyond {p}% and {} row(s) that stopped working (exit {EXIT_REGRESSION})",
                    c.regressions(),
                    c.broke.len()
                )
            } else {
                format!("ok: no regression beyond {p}%")
            }
        }
        None if !c.broke.is_empty() => format!(
            "FAIL: {} row(s) that stopped working (exit {EXIT_REGRESSION}); no --max-regression \
             given: metrics not judged",
            c.broke.len()
        ),
        None => "no --max-regression given: nothing judged".to_string(),
    }
}

/// CSV: one line per (row, metric) in raw units, then the one-sided rows.
pub fn write_csv(c: &Comparison, out: impl Write) -> Result<()> {
    let mut w = csv::Writer::from_writer(out);
    w.write_record([
        "family", "config", "depth", "variant", "metric", "base", "new", "ratio", "verdict",
    ])?;
    let opt = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    for l in &c.lines {
        w.write_record([
            l.key.family.clone(),
            l.config.clone(),
            l.key.depth.to_string(),
            l.key.variant.clone(),
            l.metric.name().to_string(),
            opt(l.base),
            opt(l.new),
            opt(l.ratio()),
            match l.verdict {
                Verdict::Same => "same",
                Verdict::Regression => "regression",
                Verdict::Improvement => "improvement",
                Verdict::Missing => "missing",
            }
            .to_string(),
        ])?;
    }
    for (items, verdict) in [
        (&c.only_base, "only-base"),
        (&c.only_new, "only-new"),
        (&c.peers_not_run, "peer-not-run"),
    ] {
        for i in items {
            w.write_record(["", i.as_str(), "", "", "", "", "", "", verdict])?;
        }
    }
    for (items, verdict) in [(&c.broke, "broke"), (&c.fixed, "fixed")] {
        for i in items {
            w.write_record(["", i.as_str(), "", "", "status", "", "", "", verdict])?;
        }
    }
    w.flush()?;
    Ok(())
}
