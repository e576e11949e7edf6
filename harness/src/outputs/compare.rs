//! Comparing two result sets: rows matched by variant and every config field (not timestamp or
//! git revision; math mode, execution and device only where a side holds rows of several:
//! [`Split`]), NEW/BASE per metric, regressions beyond a threshold, rows present on one side
//! only, device, thread, math, execution and PyTorch-version warnings; rendered as text,
//! markdown or CSV. PyTorch peer rows are matched like any other: their variant names
//! (`pytorch-naive`, …) never collide with densebench's, and nothing here parses a variant.

use crate::outputs::plots::data::{fmt_num, variant_order, MIB, NS_PER_MS};
use crate::results::row::Row;
use anyhow::Result;
use clap::ValueEnum;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

/// Timed steps below which a row's time is too noisy to gate on alone: a time regression on a
/// row timed over fewer steps (on either side) is flagged with a warning. Two runs of one
/// binary on this project's shared 2-core machine (`results/reference-cpu.csv` and
/// `reference-cpu-rerun.csv`, rows of 1–3 steps) differ by more than 10 % in 48 of 182 median
/// times at a geometric mean of ×1.00.
pub const STEADY_STEPS: usize = 5;

/// Under this peak (bytes, either side) a CPU row at more than one thread has a peak that
/// varies between runs of one binary by the per-thread scratch of the threads that happened to
/// take part in a parallel region (measured: a bc N=2, 8×8, L=2 `cat-store-copy` row at 2
/// threads peaked at 136,340 or 156,360 bytes, +14.7%; at 1 thread 117,076 every time; at
/// MB-scale peaks every thread always takes part and the peaks repeat to the byte).
pub const SMALL_PEAK_BYTES: f64 = (1u64 << 20) as f64;

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
    /// The row's execution (`eager`, `graph`, `compiled`), or empty where each side ran one
    /// only ([`Split`]): as for `math`, a file holding eager and CUDA-graph rows of one variant
    /// (`results/reference-h200.csv`) keeps each its own row.
    pub execution: String,
    /// The row's device (`cpu`, `cuda:0`), or empty where each side ran on one only: a file
    /// merged from a CPU and a GPU run keeps each device's row.
    pub device: String,
}

/// Which fields beyond the config pair rows in one comparison: each where BASE or NEW holds
/// rows of more than one value of it (rows of one variant and config would otherwise collapse
/// into one, the last compared against whatever NEW's last is); where each side holds one value,
/// rows pair across (a tf32 run against an ieee one, an H200 against an H100), with a warning
/// where the values differ.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Split {
    pub math: bool,
    pub execution: bool,
    pub device: bool,
}

impl Split {
    /// The fields rows are paired by beyond the config, in words (empty: none).
    fn fields(self) -> Vec<&'static str> {
        [
            (self.math, "math mode"),
            (self.execution, "execution"),
            (self.device, "device"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

impl MatchKey {
    /// The key of a row, with the fields `split` pairs by.
    pub fn of(r: &Row, split: Split) -> Self {
        let keep = |on: bool, v: &str| if on { v.to_string() } else { String::new() };
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
            math: keep(split.math, &r.math),
            execution: keep(split.execution, r.execution()),
            device: keep(split.device, &r.device),
        }
    }

    /// The config label of a row, with its math mode where the key carries a non-ieee one, its
    /// execution where the key carries a non-eager one and its device where the key carries one.
    fn label(&self, r: &Row) -> String {
        let mut label = r.config_label();
        for (v, default) in [
            (&self.math, "ieee"),
            (&self.execution, "eager"),
            (&self.device, ""),
        ] {
            if !v.is_empty() && v != default {
                label.push(' ');
                label.push_str(v);
            }
        }
        label
    }
}

/// The verdict on one metric of one matched row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the threshold (or no threshold).
    Same,
    /// Worse by more than the threshold; also any NaN or infinite value on either side (not a
    /// measurement: never "no regression" or an improvement), with or without a threshold.
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
    /// Whether a side's value is NaN or infinite: no measurement, a regression whatever the
    /// threshold.
    pub fn non_finite(&self) -> bool {
        [self.base, self.new]
            .iter()
            .any(|v| v.is_some_and(|v| !v.is_finite()))
    }

    /// NEW / BASE; `None` where a side has no measurement (verdict `missing`: a 0-ns time is
    /// none) or a NaN or infinite value, never a 0 that reads as infinitely better.
    pub fn ratio(&self) -> Option<f64> {
        match (self.base, self.new) {
            _ if self.verdict == Verdict::Missing || self.non_finite() => None,
            (Some(b), Some(n)) if b > 0.0 => Some(n / b),
            _ => None,
        }
    }
}

/// A row listed rather than compared metric by metric: present on one side only, or matched
/// with a health that changed between BASE and NEW.
#[derive(Debug, Clone)]
pub struct Listed {
    pub key: MatchKey,
    /// The config label, as [`Line::config`].
    pub config: String,
    /// For a matched row whose health changed: what BASE and NEW were (`ok`, or their status or
    /// gradient failure); `None` for a row on one side only.
    pub change: Option<(String, String)>,
}

impl Listed {
    fn new(k: &MatchKey, r: &Row) -> Self {
        Self {
            key: k.clone(),
            config: k.label(r),
            change: None,
        }
    }
}

/// `config L=depth variant`, then `: BASE → NEW` for a changed row.
impl std::fmt::Display for Listed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} L={} {}",
            self.config, self.key.depth, self.key.variant
        )?;
        if let Some((b, n)) = &self.change {
            write!(f, ": {b} → {n}")?;
        }
        Ok(())
    }
}

/// A ratio NEW/BASE to 3 decimals, or to as many more (up to 9) as it takes not to read `1.000`
/// beside a regression or an improvement (`--max-regression 0` flags any change: a 17.8 → 17.8
/// "1.000 REGRESSION" told the reader nothing).
fn ratio_text(r: f64, verdict: Verdict) -> String {
    let changed = matches!(verdict, Verdict::Regression | Verdict::Improvement);
    (3..=9)
        .map(|d| format!("{r:.d$}"))
        .find(|t| !changed || t.trim_end_matches('0') != "1.")
        .unwrap_or_else(|| format!("{r:e}"))
}

/// What fails a comparison besides a broken row: the `--max-regression` threshold (none: no
/// metric fails) and whether rows of BASE may be missing from NEW (`--allow-missing`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Gate {
    pub max_regression: Option<f64>,
    pub allow_missing: bool,
}

/// Everything `compare` found.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    pub lines: Vec<Line>,
    /// Rows only in BASE, then only in NEW.
    pub only_base: Vec<Listed>,
    /// PyTorch peer rows of BASE when NEW has none at all (a run without `--peer`): listed, not
    /// counted as missing — a different run mode, not configurations NEW silently dropped.
    pub peers_not_run: Vec<Listed>,
    pub only_new: Vec<Listed>,
    /// Rows ok in BASE (status `ok`, gradients within tolerance) that are not in NEW: another
    /// status, or gradients out of tolerance or unchecked. They fail the comparison.
    pub broke: Vec<Listed>,
    /// Rows not ok in BASE (as for `broke`) that are ok in NEW.
    pub fixed: Vec<Listed>,
    pub warnings: Vec<String>,
    pub matched: usize,
    /// The fields beyond the config rows were paired by.
    pub split: Split,
}

impl Comparison {
    /// Metrics worse than BASE beyond the threshold (NaN or infinite values are counted by
    /// [`Comparison::non_finite`]).
    pub fn regressions(&self) -> usize {
        self.lines
            .iter()
            .filter(|l| l.verdict == Verdict::Regression && !l.non_finite())
            .count()
    }

    /// Metrics with a NaN or infinite value on either side: regressions with or without a
    /// threshold (a broken measurement, never "no regression" or an improvement).
    pub fn non_finite(&self) -> usize {
        self.lines.iter().filter(|l| l.non_finite()).count()
    }

    /// Metrics a threshold cannot judge because NEW lost them: BASE has a measurement (for a
    /// time, above zero), NEW none (an empty cell, or a time of 0) in a row whose health did
    /// not change (a row that broke is counted as broken).
    pub fn lost(&self) -> usize {
        let measured = |l: &Line, v: Option<f64>| {
            v.is_some_and(|v| !(l.metric.zero_is_unmeasured() && v <= 0.0))
        };
        self.lines
            .iter()
            .filter(|l| l.verdict == Verdict::Missing && measured(l, l.base) && !measured(l, l.new))
            .filter(|l| !self.broke.iter().any(|b| b.key == l.key))
            .count()
    }

    /// Why the comparison fails under `gate`, one reason each; empty when it passes. (A
    /// comparison that matched no row is refused before it is judged: [`nothing_matched`].)
    pub fn failures(&self, gate: Gate) -> Vec<String> {
        let mut why = Vec::new();
        if self.non_finite() > 0 {
            why.push(format!(
                "{} metric value(s) NaN or infinite (listed as REGRESSION: no measurement)",
                self.non_finite()
            ));
        }
        if let Some(p) = gate.max_regression {
            if self.regressions() > 0 {
                why.push(format!(
                    "{} metric regression(s) beyond {p}%",
                    self.regressions()
                ));
            }
            if self.lost() > 0 {
                why.push(format!(
                    "{} metric(s) measured in BASE and empty (or 0 ns) in NEW: not judged \
                     against {p}% (listed as n/a)",
                    self.lost()
                ));
            }
        }
        if !self.broke.is_empty() {
            why.push(format!(
                "{} row(s) that stopped working (ok in BASE, failed in NEW)",
                self.broke.len()
            ));
        }
        if !self.only_base.is_empty() && !gate.allow_missing {
            why.push(format!(
                "{} row(s) of BASE are missing from NEW, listed as only in BASE (pass \
                 --allow-missing to accept that)",
                self.only_base.len()
            ));
        }
        why
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
            // Failed within its tolerance: a tf32 row past the TF32 sanity bound (its note says
            // so), or an edited cell; never "6.6e-7 > 2.0e-2".
            (Some(e), Some(t)) if e <= t => format!(
                "gradient check failed (max_rel_err {e:.1e} is within {t:.1e}: see the row's \
                 note)"
            ),
            (Some(e), Some(t)) => {
                format!("gradients out of tolerance (max_rel_err {e:.1e} > {t:.1e})")
            }
            (Some(e), None) => format!("gradients out of tolerance (max_rel_err {e:.1e})"),
            _ => "gradients out of tolerance".to_string(),
        }),
        None => Some("gradients not checked".to_string()),
    }
}

/// Keyed rows of one file; duplicates (same key twice) keep the last and are counted, and of
/// those the ones whose rows were measured on different machines (`device_desc` differs).
fn index(rows: &[Row], split: Split) -> (BTreeMap<MatchKey, &Row>, usize, usize) {
    let mut map = BTreeMap::new();
    let (mut dup, mut machines) = (0, 0);
    for r in rows {
        if let Some(old) = map.insert(MatchKey::of(r, split), r) {
            dup += 1;
            if old.device_desc.trim() != r.device_desc.trim() {
                machines += 1;
            }
        }
    }
    (map, dup, machines)
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
    let execution = |r: &Row| r.execution().to_string();
    let (be, ne) = (distinct(base, execution), distinct(new, execution));
    let device = |r: &Row| r.device.clone();
    let (bdev, ndev) = (distinct(base, device), distinct(new, device));
    // Rows pair across math modes (executions, devices) only when each side ran in one (a tf32
    // run against an ieee one, with a warning); where a side holds several, rows pair within
    // theirs: else an eager and a CUDA-graph row of one variant, or a CPU and a GPU one, would
    // collapse into one and be compared with whichever of NEW's came last.
    let several = |b: &BTreeSet<String>, n: &BTreeSet<String>| b.len() > 1 || n.len() > 1;
    let split = Split {
        math: several(&bm, &nm),
        execution: several(&be, &ne),
        device: several(&bdev, &ndev),
    };
    c.split = split;
    let by_math = split.math;
    if !base.is_empty() && !new.is_empty() && be != ne {
        c.warnings.push(format!(
            "executions differ: BASE {} vs NEW {}; {}",
            be.iter().cloned().collect::<Vec<_>>().join("/"),
            ne.iter().cloned().collect::<Vec<_>>().join("/"),
            if split.execution {
                "rows are paired within their execution"
            } else {
                "times of different executions are not comparable"
            }
        ));
    }
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
    let (bi, bdup, bmach) = index(base, split);
    let (ni, ndup, nmach) = index(new, split);
    for (side, n, machines) in [("BASE", bdup, bmach), ("NEW", ndup, nmach)] {
        if n > 0 {
            c.warnings.push(format!(
                "{side} has {n} duplicate row(s) for the same variant and config; the last of each is compared{}",
                if machines > 0 {
                    format!(
                        " ({machines} of them measured on another machine than the row they \
                         replace: `device_desc` differs; compare one machine's rows at a time)"
                    )
                } else {
                    String::new()
                }
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
    // Time regressions, and the fewer side's step count of those on rows of few timed steps.
    let (mut time_regressions, mut few_steps) = (0usize, Vec::<usize>::new());
    let mut small_peaks = 0usize;
    let new_has_peers = new.iter().any(Row::is_peer);
    for (k, b) in &bi {
        let Some(n) = ni.get(k) else {
            if b.is_peer() && !new_has_peers {
                c.peers_not_run.push(Listed::new(k, b));
            } else {
                c.only_base.push(Listed::new(k, b));
            }
            continue;
        };
        c.matched += 1;
        let changed = |base: String, new: String| Listed {
            change: Some((base, new)),
            ..Listed::new(k, b)
        };
        match (health(b), health(n)) {
            (None, Some(why)) => c.broke.push(changed("ok".to_string(), why)),
            (Some(why), None) => c.fixed.push(changed(why, "ok".to_string())),
            _ => {}
        }
        for &m in metrics {
            let (bv, nv) = (m.value(b), m.value(n));
            let not_finite = |v: Option<f64>| v.filter(|v| !v.is_finite());
            for (side, v) in [("BASE", not_finite(bv)), ("NEW", not_finite(nv))] {
                if let Some(v) = v {
                    c.warnings.push(format!(
                        "{side} {} of {} L={} {} is {v}: not a measurement, judged a regression",
                        m.name(),
                        k.label(b),
                        k.depth,
                        k.variant
                    ));
                }
            }
            let verdict = match (bv, nv, limit) {
                _ if not_finite(bv).is_some() || not_finite(nv).is_some() => Verdict::Regression,
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
            if verdict == Verdict::Regression
                && m.zero_is_unmeasured()
                && not_finite(bv).is_none()
                && not_finite(nv).is_none()
            {
                time_regressions += 1;
                if b.steps.min(n.steps) < STEADY_STEPS {
                    few_steps.push(b.steps.min(n.steps));
                }
            }
            if verdict == Verdict::Regression
                && m == Metric::PeakBytes
                && b.device == "cpu"
                && b.threads.max(n.threads) > 1
                && matches!((bv, nv), (Some(x), Some(y)) if x.max(y) < SMALL_PEAK_BYTES)
            {
                small_peaks += 1;
            }
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
    if small_peaks > 0 {
        c.warnings.push(format!(
            "{small_peaks} peak_bytes regression(s) are on CPU rows under 1 MiB measured at more \
             than one thread: such a peak varies between runs of one binary by the per-thread \
             scratch of the threads that took part (tens of KB; docs/measuring.md, \"Comparing \
             runs\"); measure them at --threads 1, or gate on larger configurations"
        ));
    }
    if !few_steps.is_empty() {
        let (lo, hi) = (
            few_steps.iter().min().copied().unwrap_or(0),
            few_steps.iter().max().copied().unwrap_or(0),
        );
        let steps = if lo == hi {
            format!("{lo}")
        } else {
            format!("{lo}–{hi}")
        };
        c.warnings.push(format!(
            "{} of the {time_regressions} time regression(s) are on rows timed over fewer than \
             {STEADY_STEPS} steps ({steps} on the fewer side: the `steps` column): one binary's \
             step times differ by tens of percent between back-to-back runs on a shared machine \
             (docs/measuring.md, \"Comparing runs\"); gate on peak_bytes, or measure with \
             --steps {STEADY_STEPS} or more before gating on time",
            few_steps.len()
        ));
    }
    for (k, n) in &ni {
        if !bi.contains_key(k) {
            c.only_new.push(Listed::new(k, n));
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
            (k.math.clone(), k.execution.clone(), k.device.clone()),
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
    // a cell is one line: a line break (a device description or note edited in a spreadsheet)
    // would end the table row there, its other cells spilling out of the table
    let esc = |s: &str| {
        s.replace('|', "\\|")
            .replace("\r\n", " ")
            .replace(['\n', '\r'], " ")
    };
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
    gate: Gate,
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
        let thr = match gate.max_regression {
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
                        .map(|r| ratio_text(r, l.verdict))
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
    let list = |title: &str, items: &[Listed], out: &mut String| {
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
    out.push_str(&summary(c, gate));
    out.push('\n');
    out
}

/// The verdict line: `FAIL:` with every reason (and nothing that reads as a pass) when the
/// comparison fails, else `ok:` with what was judged and what was accepted.
pub fn summary(c: &Comparison, gate: Gate) -> String {
    let unjudged = "no --max-regression given: metrics not judged";
    let failures = c.failures(gate);
    if !failures.is_empty() {
        let note = match gate.max_regression {
            Some(_) => String::new(),
            // NaN and infinite values fail without a threshold: the rest were not judged.
            None if c.non_finite() > 0 => {
                "; no --max-regression given: finite metrics not judged".to_string()
            }
            None => format!("; {unjudged}"),
        };
        return format!(
            "FAIL: {}{note} (exit {EXIT_REGRESSION})",
            failures.join("; ")
        );
    }
    let mut ok = match gate.max_regression {
        Some(p) => format!("ok: no regression beyond {p}% and no row that stopped working"),
        None => format!("ok: no row that stopped working; {unjudged}"),
    };
    if !c.only_base.is_empty() {
        ok.push_str(&format!(
            "; {} row(s) of BASE missing from NEW accepted (--allow-missing)",
            c.only_base.len()
        ));
    }
    ok
}

/// Why a comparison that paired no row of NEW with one of BASE is no comparison, naming what
/// each side holds; `None` when a row matched. Such a run judges nothing and must not pass,
/// whatever the flags: the caller refuses it as unusable input.
pub fn nothing_matched(c: &Comparison, base: &Path, new: &Path) -> Option<String> {
    if c.matched > 0 {
        return None;
    }
    // Each side's rows (for BASE, peer rows NEW did not run included), by config and depth.
    let holds = |side: &str, path: &Path, items: &[&Listed]| {
        if items.is_empty() {
            return format!("{side} {} has no rows (a header only)", path.display());
        }
        let configs: BTreeSet<String> = items
            .iter()
            .map(|l| format!("{} L={}", l.config, l.key.depth))
            .collect();
        let shown: Vec<&str> = configs.iter().take(3).map(String::as_str).collect();
        let more = match configs.len().saturating_sub(shown.len()) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        format!(
            "{side} {} has {} row(s) of {}{more}",
            path.display(),
            items.len(),
            shown.join(", ")
        )
    };
    let base_rows: Vec<&Listed> = c.only_base.iter().chain(&c.peers_not_run).collect();
    let new_rows: Vec<&Listed> = c.only_new.iter().collect();
    let within = match c.split.fields().as_slice() {
        [] => String::new(),
        [one] => format!(", and by {one} (a side holds rows of several)"),
        [more @ .., last] => format!(
            ", and by {} and {last} (a side holds rows of several)",
            more.join(", ")
        ),
    };
    Some(format!(
        "no row of NEW matches a row of BASE: {}; {}. Rows pair by variant and every config \
         field (family, N, C0, k, bn, size, activation, dtype, seed, depth){within}: compare two \
         result CSVs of the same sweep (the same configurations and variants)",
        holds("BASE", base, &base_rows),
        holds("NEW", new, &new_rows)
    ))
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
    // Listed rows fill the same identifying columns; a changed row says what its status was
    // on each side in `base` and `new`, under the metric `status`.
    for (items, verdict) in [
        (&c.only_base, "only-base"),
        (&c.only_new, "only-new"),
        (&c.peers_not_run, "peer-not-run"),
        (&c.broke, "broke"),
        (&c.fixed, "fixed"),
    ] {
        for l in items {
            let (metric, base, new) = match &l.change {
                Some((b, n)) => ("status", b.clone(), n.clone()),
                None => ("", String::new(), String::new()),
            };
            w.write_record([
                l.key.family.clone(),
                l.config.clone(),
                l.key.depth.to_string(),
                l.key.variant.clone(),
                metric.to_string(),
                base,
                new,
                String::new(),
                verdict.to_string(),
            ])?;
        }
    }
    w.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{ratio_text, Verdict};

    /// A flagged change never reads as `1.000`; an unflagged ratio keeps its 3 decimals.
    #[test]
    fn a_flagged_ratio_shows_its_change() {
        assert_eq!(ratio_text(1.0004, Verdict::Regression), "1.0004");
        assert_eq!(ratio_text(0.99996, Verdict::Improvement), "0.99996");
        assert_eq!(ratio_text(1.0004, Verdict::Same), "1.000");
        assert_eq!(ratio_text(1.25, Verdict::Regression), "1.250");
        assert_eq!(ratio_text(0.9996, Verdict::Improvement), "0.9996");
        // beyond 9 decimals: the exponent form, still not `1.000`
        assert_ne!(ratio_text(1.0 + 1e-12, Verdict::Regression), "1.000");
    }
}
