//! The markdown report of one result set: the machine and versions, per configuration tables
//! of peak memory and median step time per variant and depth with ratios to the naive
//! `cat-store-copy`, the gradient check of every variant, links to the figures, the measured
//! ratios beside the published ones with the caveats of comparing a CPU allocator peak of one
//! block to GPU numbers of whole networks, the ratios to PyTorch (`versus.rs`), and bf16 (mixed
//! precision) set against f32 where a result set has both: peaks, times and, from `max-depth`
//! CSVs, how deep each variant fits a budget.

use crate::measure::capacity::Answer;
use crate::outputs::compare::markdown_table;
use crate::outputs::plots;
use crate::outputs::plots::data::{
    self, fmt_err, fmt_num, headline, is_linear_memory, mib, ms, variant_exponent, Group, NAIVE,
};
use crate::outputs::versus;
use crate::plan::input::{self, MAX_JSON_BYTES};
use crate::results::row::Row;
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

/// `p` made absolute against the current directory, with `.` and `..` resolved lexically.
fn normalized(p: &Path) -> Result<PathBuf> {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .context("reading the current directory")?
            .join(p)
    };
    let mut out = PathBuf::new();
    for c in abs.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other.as_os_str()),
        }
    }
    Ok(out)
}

/// The path of `to` relative to the folder `from_dir`, with `/` separators (for markdown links).
pub fn relative_path(from_dir: &Path, to: &Path) -> Result<String> {
    let (f, t) = (normalized(from_dir)?, normalized(to)?);
    let fc: Vec<Component> = f.components().collect();
    let tc: Vec<Component> = t.components().collect();
    let common = fc.iter().zip(&tc).take_while(|(a, b)| a == b).count();
    let mut parts: Vec<String> = vec!["..".to_string(); fc.len() - common];
    parts.extend(
        tc[common..]
            .iter()
            .map(|c| c.as_os_str().to_string_lossy().into_owned()),
    );
    Ok(if parts.is_empty() {
        ".".to_string()
    } else {
        parts.join("/")
    })
}

fn distinct(rows: &[Row], f: impl Fn(&Row) -> String) -> Vec<String> {
    let mut v: Vec<String> = rows.iter().map(f).filter(|s| !s.is_empty()).collect();
    v.sort();
    v.dedup();
    v
}

fn ratio(a: Option<u64>, b: Option<u64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0 => Some(a as f64 / b as f64),
        _ => None,
    }
}

/// A row's median step time, `None` for 0 ns: no step takes no time, so a 0 is no measurement
/// (an edited cell), never a 0.00× ratio or the fastest variant (`compare` says "missing").
fn measured_ns(r: &Row) -> Option<u64> {
    r.median_ns.filter(|&t| t > 0)
}

/// `+14%` / `−3%` / `±0%` from a time ratio (rounded to a whole percent first: −0.4% is no
/// saving to print as `−0%`).
fn overhead(r: f64) -> String {
    let pct = ((r - 1.0) * 100.0).round();
    if pct > 0.0 {
        format!("+{pct:.0}%")
    } else if pct < 0.0 {
        format!("−{:.0}%", -pct)
    } else {
        "±0%".to_string()
    }
}

/// A table of one metric: a row per variant, a column per depth, each cell the value and its
/// ratio to the naive variant at that depth.
fn depth_table(
    g: &Group,
    value: impl Fn(&Row) -> Option<u64>,
    to_unit: fn(u64) -> f64,
    with_exponent: bool,
) -> String {
    let depths = g.depths();
    let mut headers: Vec<String> = vec!["variant".to_string()];
    headers.extend(depths.iter().map(|d| format!("L={d}")));
    if with_exponent {
        headers.push("growth p".to_string());
    }
    let rows: Vec<Vec<String>> = g
        .variants()
        .iter()
        .map(|v| {
            let mut cells = vec![format!("`{v}`")];
            for &d in &depths {
                let row = g.row(v, d);
                let val = row.and_then(&value);
                let naive = g.row(NAIVE, d).and_then(&value);
                let cell = match (val, ratio(val, naive)) {
                    (Some(x), Some(r)) if v != NAIVE => {
                        format!("{} ({r:.2}×)", fmt_num(to_unit(x)))
                    }
                    (Some(x), _) => fmt_num(to_unit(x)),
                    (None, _) => "–".to_string(),
                };
                // a measured row whose gradients are not within tolerance: said in the cell
                cells.push(match row {
                    Some(r) if val.is_some() && !data::trusted(r) => {
                        format!("{cell} {}", data::UNTRUSTED)
                    }
                    _ => cell,
                });
            }
            if with_exponent {
                cells.push(
                    variant_exponent(g, v)
                        .map(|p| format!("{p:.2}"))
                        .unwrap_or_else(|| "–".to_string()),
                );
            }
            cells
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    markdown_table(&h, &rows, &[0])
}

/// Measured over predicted peak per variant and depth.
fn prediction_table(g: &Group) -> String {
    let depths = g.depths();
    let mut headers: Vec<String> = vec!["variant".to_string()];
    headers.extend(depths.iter().map(|d| format!("L={d}")));
    let rows: Vec<Vec<String>> = g
        .variants()
        .iter()
        .map(|v| {
            let mut cells = vec![format!("`{v}`")];
            for &d in &depths {
                let r = g.row(v, d);
                cells.push(
                    r.and_then(|r| ratio(r.peak_bytes, r.predicted_peak_bytes))
                        .map(|x| format!("{x:.3}"))
                        .unwrap_or_else(|| "–".to_string()),
                );
            }
            cells
        })
        .collect();
    let h: Vec<&str> = headers.iter().map(String::as_str).collect();
    markdown_table(&h, &rows, &[0])
}

fn machine_section(rows: &[Row], out: &mut String) {
    let _ = writeln!(out, "## Machine and versions\n");
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "(not recorded)".to_string()
        } else {
            v.join("; ")
        }
    };
    let devices = distinct(rows, |r| {
        if r.device_desc.is_empty() {
            r.device.clone()
        } else {
            format!("{} ({})", r.device, r.device_desc.trim())
        }
    });
    let mut ts: Vec<&str> = rows
        .iter()
        .map(|r| r.timestamp.as_str())
        .filter(|t| !t.is_empty())
        .collect();
    // RFC 3339 timestamps in UTC sort lexically in time order.
    ts.sort_unstable();
    let _ = writeln!(out, "- device: {}", list(devices));
    let _ = writeln!(
        out,
        "- threads: {}",
        list(distinct(rows, |r| r.threads.to_string()))
    );
    let _ = writeln!(
        out,
        "- densebench version: {}",
        list(distinct(rows, |r| r.densebench_version.clone()))
    );
    let _ = writeln!(
        out,
        "- git revision: {}",
        list(distinct(rows, |r| r.git_rev.clone()))
    );
    let _ = writeln!(
        out,
        "- measured: {}",
        match (ts.first(), ts.last()) {
            (Some(a), Some(b)) if a != b => format!("{a} to {b}"),
            (Some(a), _) => a.to_string(),
            _ => "(no timestamps)".to_string(),
        }
    );
    let _ = writeln!(
        out,
        "- dtype: {}; timed steps per row: {}; warm-up steps: {}",
        list(distinct(rows, |r| r.dtype.clone())),
        list(distinct(rows, |r| r.steps.to_string())),
        list(distinct(rows, |r| r.warmup.to_string()))
    );
    let _ = writeln!(out);
}

fn family_sections(groups: &[Group], out: &mut String) {
    let mut families: Vec<&str> = groups.iter().map(|g| g.key.family.as_str()).collect();
    families.dedup();
    for fam in families {
        let _ = writeln!(out, "## Results: `{fam}`\n");
        for g in groups.iter().filter(|g| g.key.family == fam) {
            let _ = writeln!(out, "### {}\n", g.label);
            let _ = writeln!(
                out,
                "{} · seed {} · ratios in parentheses are to `{NAIVE}` at the same depth.\n",
                g.device_label, g.key.seed
            );
            if g.ok.is_empty() && !g.peers.is_empty() {
                let _ = writeln!(
                    out,
                    "No densebench row of this configuration has status ok; its PyTorch rows \
                     are under Versus PyTorch.\n"
                );
            } else if g.ok.is_empty() {
                let _ = writeln!(out, "No row of this configuration has status ok.\n");
            } else {
                let _ = writeln!(
                    out,
                    "Peak memory above baseline (MiB) for one training step; growth p is the \
                     least-squares exponent of peak ∝ L^p:\n"
                );
                out.push_str(&depth_table(g, |r| r.peak_bytes, mib, true));
                let _ = writeln!(out, "\nMedian step time, forward + backward (ms):\n");
                out.push_str(&depth_table(g, measured_ns, ms, false));
                if g.ok.iter().any(|r| !data::trusted(r)) {
                    let _ = writeln!(
                        out,
                        "\n{} gradients out of tolerance or not checked (\"Gradient check\" \
                         below): measured, but not a result; never picked as the best in \
                         \"Measured beside the published numbers\".",
                        data::UNTRUSTED
                    );
                }
                if g.ok.iter().any(|r| r.predicted_peak_bytes.is_some()) {
                    let _ = writeln!(out, "\nMeasured / predicted peak:\n");
                    out.push_str(&prediction_table(g));
                    let min = impls::model::MODEL_MIN_PEAK_BYTES;
                    if g.ok.iter().any(|r| r.peak_bytes.is_some_and(|p| p < min)) {
                        let _ = writeln!(
                            out,
                            "\nPeaks under {} MiB are below the model's scale: a few KiB it does \
                             not follow (tensor headers, small gemm and kernel buffers) are a \
                             visible fraction there, so ±5% is not expected \
                             (docs/memory-model.md).",
                            min >> 20
                        );
                    }
                }
                let _ = writeln!(out);
            }
            if !g.skipped.is_empty() {
                let _ = writeln!(out, "Rows not measured (status not ok):\n");
                for n in g.skipped_notes() {
                    let _ = writeln!(out, "- {n}");
                }
                let _ = writeln!(out);
            }
        }
    }
}

/// A `max-depth --out` CSV's answers, for the report's bf16-against-f32 depths: read bounded,
/// refused (bad input, exit status 2) when it is not one — a result CSV named as such — and
/// each row that is not one named by its line and column. A CSV written before the `dtype`
/// column is f32's (results/README.md); one written before the `block` column gets the block
/// `<family>, block not recorded (<file>)`, so its answers pair only with each other.
pub fn read_max_depth(path: &Path) -> Result<Vec<Answer>> {
    let (limit, from) = input::csv_limit()?;
    let bytes = input::read_bounded(path, "max-depth CSV", limit, &from)?;
    let body = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&bytes);
    let header = crate::results::replace::csv_header(body).unwrap_or_default();
    if !crate::results::replace::is_max_depth_header(&header) {
        let what = if body.iter().all(u8::is_ascii_whitespace) {
            "is empty".to_string()
        } else if crate::results::row::is_result_header(&header) {
            "is a result CSV (of `run` or `bench-all`): give it as a CSV argument of `report`, \
             and a CSV of `max-depth --out` to --max-depth"
                .to_string()
        } else {
            format!(
                "is not a CSV of `max-depth --out`: its header is not `{}`",
                crate::results::row::csv_columns::<Answer>().join(",")
            )
        };
        return Err(crate::plan::bounds::bad_input(anyhow::anyhow!(
            "--max-depth {} {what}",
            path.display()
        )));
    }
    let mut rdr = csv::Reader::from_reader(body);
    let mut answers = Vec::new();
    for r in rdr.deserialize::<Answer>() {
        let mut a = r.map_err(|e| {
            // counted in the file (CRLF, LF or both), and past the BOM stripped above
            let bom = (bytes.len() - body.len()) as u64;
            let line = e
                .position()
                .map(|p| crate::results::row::line_in(&bytes, p.byte() + bom));
            crate::plan::bounds::bad_input(
                crate::results::row::csv_error_at(path, &header, &e, line)
                    .context("not a row of a `max-depth --out` CSV"),
            )
        })?;
        if a.dtype.is_empty() {
            a.dtype = "f32".to_string();
        }
        if a.block.is_empty() {
            a.block = format!(
                "{}, block not recorded ({})",
                a.family,
                path.file_name()
                    .unwrap_or(path.as_os_str())
                    .to_string_lossy()
            );
        }
        answers.push(a);
    }
    Ok(answers)
}

/// Whether answer `a` of `answers` has a partner in the other dtype of the bf16-against-f32
/// depths (f32 and bf16, same variant, family, budget and block): what `report` sets side by
/// side.
pub fn max_depth_paired(answers: &[Answer], a: &Answer) -> bool {
    let other = match a.dtype.as_str() {
        "f32" => data::BESIDE_F32,
        d if d == data::BESIDE_F32 => "f32",
        _ => return false,
    };
    answers
        .iter()
        .any(|x| same_search(x, a) && x.dtype == other)
}

/// Whether two max-depth answers are of one search: variant, family, budget and block.
pub fn same_search(x: &Answer, a: &Answer) -> bool {
    x.variant == a.variant
        && x.family == a.family
        && x.budget_bytes == a.budget_bytes
        && x.block == a.block
}

/// A markdown table's body: its rows' cells.
type Cells = Vec<Vec<String>>;

/// `a` over `b` where both exist and `b` is not 0, as `0.53×`; else `–`.
fn times(a: Option<u64>, b: Option<u64>) -> String {
    ratio(a, b).map_or_else(|| "–".to_string(), |r| format!("{r:.2}×"))
}

/// `## bf16 against f32`, when some configuration has ok rows in both for one variant and depth
/// (or `max_depth` holds answers in both for one variant, family and budget): per family, per
/// configuration, each variant and depth's f32 and bf16 peak and time and their ratios; then
/// how deep each variant fits a budget in either dtype. Ratios only between rows of the same
/// device, threads, math and execution, the dtype aside (else `–`, and why, under the table).
fn bf16_section(groups: &[Group], max_depth: &[Answer], out: &mut String) {
    // (f32 group, bf16 group) pairs: the two groups of a memory-vs-depth figure
    let pairs: Vec<(&Group, &Group)> = (0..groups.len())
        .filter_map(|gi| data::memory_figure_set(groups, gi))
        .filter_map(|set| match set.as_slice() {
            [a, b] if groups[*a].key.dtype == "f32" && groups[*b].key.dtype == data::BESIDE_F32 => {
                Some((&groups[*a], &groups[*b]))
            }
            _ => None,
        })
        .collect();
    // per pair: its table's rows, and the notes of the pairs not compared
    let mut tables: Vec<(&Group, Cells, Vec<String>)> = Vec::new();
    for (f, b) in &pairs {
        let mut rows = Vec::new();
        let mut notes = Vec::new();
        for v in f.variants() {
            for d in f.depths() {
                let (Some(rf), Some(rb)) = (f.row(&v, d), b.row(&v, d)) else {
                    continue;
                };
                // compared as the same rows would be in one dtype
                let as_f32 = Row {
                    dtype: rf.dtype.clone(),
                    ..rb.clone()
                };
                let why = data::incomparable(rf, &as_f32);
                let mark = if data::trusted(rf) && data::trusted(rb) {
                    ""
                } else {
                    data::UNTRUSTED
                };
                let mib_cell =
                    |r: &Row| r.peak_bytes.map_or("–".to_string(), |p| fmt_num(mib(p)));
                let ms_cell =
                    |r: &Row| measured_ns(r).map_or("–".to_string(), |t| fmt_num(ms(t)));
                let (peak_ratio, time_ratio) = match &why {
                    None => (
                        times(rb.peak_bytes, rf.peak_bytes),
                        times(measured_ns(rb), measured_ns(rf)),
                    ),
                    Some(w) => {
                        notes.push(format!("`{v}` L={d}: f32 and bf16 rows not compared ({w})"));
                        ("–".to_string(), "–".to_string())
                    }
                };
                rows.push(vec![
                    format!(
                        "`{v}`{}",
                        if mark.is_empty() {
                            String::new()
                        } else {
                            format!(" {mark}")
                        }
                    ),
                    d.to_string(),
                    mib_cell(rf),
                    mib_cell(rb),
                    peak_ratio,
                    ms_cell(rf),
                    ms_cell(rb),
                    time_ratio,
                ]);
            }
        }
        if !rows.is_empty() {
            tables.push((f, rows, notes));
        }
    }
    let depths = max_depth_pairs(max_depth);
    if tables.is_empty() && depths.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "## bf16 against f32
"
    );
    let _ = writeln!(
        out,
        "bf16 is mixed precision with PyTorch autocast's semantics (bf16 features, f32 \
         parameters, statistics and parameter gradients; results/README.md). Each ratio is the \
         bf16 row's over the f32 row's of the same configuration, variant and depth.\n"
    );
    let mut families: Vec<&str> = tables
        .iter()
        .map(|(g, _, _)| g.key.family.as_str())
        .collect();
    families.dedup();
    for fam in families {
        let _ = writeln!(out, "### `{fam}`\n");
        for (g, rows, notes) in tables.iter().filter(|(g, _, _)| g.key.family == fam) {
            let label = data::label_with_dtypes(&g.label, "f32", &["f32", data::BESIDE_F32]);
            let _ = writeln!(out, "{label}; {}:\n", g.device_label);
            out.push_str(&markdown_table(
                &[
                    "variant",
                    "L",
                    "f32 peak (MiB)",
                    "bf16 peak (MiB)",
                    "bf16 / f32 peak",
                    "f32 time (ms)",
                    "bf16 time (ms)",
                    "bf16 / f32 time",
                ],
                rows,
                &[0],
            ));
            for n in notes {
                let _ = writeln!(out, "\n- {n}");
            }
            if rows.iter().any(|r| r[0].ends_with(data::UNTRUSTED)) {
                let _ = writeln!(
                    out,
                    "\n{}: a row of the pair has gradients out of tolerance or unchecked.",
                    data::UNTRUSTED
                );
            }
            let _ = writeln!(out);
        }
    }
    if !depths.is_empty() {
        let _ = writeln!(
            out,
            "### Max depth within a budget\n\nFrom the `max-depth` CSVs given with \
             `--max-depth` (each answer the memory model's, confirmed by measured runs where \
             its `method` says `measured`): the deepest block of each variant that fits the \
             budget, in f32 and in bf16.\n"
        );
        for ((block, budget), rows) in depths {
            let _ = writeln!(
                out,
                "`{block}` within {}:\n",
                crate::progress::human_bytes(Some(budget))
            );
            out.push_str(&markdown_table(
                &["variant", "f32 max L", "bf16 max L", "bf16 / f32 depth"],
                &rows,
                &[0],
            ));
            let _ = writeln!(out);
        }
    }
}

/// The max-depth answers in f32 and in bf16 for the same variant, family, budget and block
/// ([`Answer::block`]: never an f32 answer beside a bf16 one of another block), as table rows
/// per (block, budget): variant, f32 depth, bf16 depth, their ratio (`≥` where an answer
/// reached the search bound: its note says so). The last answer of a (variant, family, dtype,
/// budget, block) wins, as the last result row does (`report` warns of contradicting ones).
fn max_depth_pairs(answers: &[Answer]) -> Vec<((String, u64), Cells)> {
    let find = |a: &Answer, dtype: &str| {
        answers
            .iter()
            .rev()
            .find(|x| same_search(x, a) && x.dtype == dtype)
    };
    let bound = |x: &Answer| x.note.contains(crate::measure::capacity::BOUND_NOTE);
    let mut out: Vec<((String, u64), Cells)> = Vec::new();
    let mut seen: Vec<(&str, &str, u64, &str)> = Vec::new();
    let order = data::variant_order(answers.iter().map(|a| a.variant.as_str()));
    for v in &order {
        for a in answers
            .iter()
            .filter(|a| &a.variant == v && a.dtype == "f32")
        {
            let id = (
                a.variant.as_str(),
                a.family.as_str(),
                a.budget_bytes,
                a.block.as_str(),
            );
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
            let (Some(f), Some(b)) = (find(a, "f32"), find(a, data::BESIDE_F32)) else {
                continue;
            };
            let depth = |x: &Answer| {
                if bound(x) {
                    format!("≥{}", x.max_depth)
                } else {
                    x.max_depth.to_string()
                }
            };
            let r = if f.max_depth == 0 || bound(f) {
                "–".to_string()
            } else {
                let r = b.max_depth as f64 / f.max_depth as f64;
                format!("{}{r:.2}×", if bound(b) { "≥" } else { "" })
            };
            let block = if a.block.is_empty() {
                a.family.clone()
            } else {
                a.block.clone()
            };
            let key = (block, a.budget_bytes);
            let row = vec![format!("`{}`", a.variant), depth(f), depth(b), r];
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some((_, rows)) => rows.push(row),
                None => out.push((key, vec![row])),
            }
        }
    }
    out
}

fn gradient_section(groups: &[Group], out: &mut String) {
    let _ = writeln!(out, "## Gradient check\n");
    let ok: Vec<&Row> = groups.iter().flat_map(|g| g.ok.iter()).collect();
    let checked: Vec<&&Row> = ok.iter().filter(|r| r.max_rel_err.is_some()).collect();
    let failed: Vec<&&Row> = checked
        .iter()
        .copied()
        .filter(|r| r.grad_ok == Some(false))
        .collect();
    let mut refs: Vec<&str> = checked.iter().map(|r| r.reference.as_str()).collect();
    refs.sort_unstable();
    refs.dedup();
    let refs = if refs.is_empty() {
        "the reference".to_string()
    } else {
        refs.iter()
            .map(|r| format!("`{r}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let verdict = if checked.len() == ok.len() && failed.is_empty() {
        format!(
            "All {} ok rows were checked against {refs} (output, input gradient, every parameter \
             gradient, BN running stats) and all are within tolerance.",
            ok.len()
        )
    } else {
        format!(
            "{} of {} ok rows were checked against {refs}; {} {} outside tolerance{}.",
            checked.len(),
            ok.len(),
            failed.len(),
            if failed.len() == 1 { "is" } else { "are" },
            if checked.len() < ok.len() {
                format!("; {} carry no check", ok.len() - checked.len())
            } else {
                String::new()
            }
        )
    };
    let _ = writeln!(out, "{verdict}\n");
    for f in &failed {
        let _ = writeln!(
            out,
            "- outside tolerance: {} L={} `{}`: max rel err {}",
            f.config_label(),
            f.depth,
            f.variant,
            f.max_rel_err.map(fmt_err).unwrap_or_default()
        );
    }
    if !failed.is_empty() {
        let _ = writeln!(out);
    }
    // One table per family, dtype and math (an f64 or tf32 row's error is not an f32 one's: a
    // worst over both would hide one in the other), in order of first appearance.
    let mut families: Vec<plots::FamilyKey> = Vec::new();
    for g in groups {
        let k = plots::FamilyKey::of(&g.key);
        if !families.contains(&k) {
            families.push(k);
        }
    }
    let several = families.len()
        > groups
            .iter()
            .map(|g| &g.key.family)
            .collect::<std::collections::BTreeSet<_>>()
            .len();
    for fam in &families {
        let fam_rows: Vec<&Row> = groups
            .iter()
            .filter(|g| plots::FamilyKey::of(&g.key) == *fam)
            .flat_map(|g| g.ok.iter())
            .collect();
        let order = data::variant_order(fam_rows.iter().map(|r| r.variant.as_str()));
        let rows: Vec<Vec<String>> = order
            .iter()
            .map(|v| {
                let vr: Vec<&&Row> = fam_rows.iter().filter(|r| &r.variant == v).collect();
                let n_checked = vr.iter().filter(|r| r.max_rel_err.is_some()).count();
                // the worst error; a NaN is the worst of all (f64::max would skip it)
                let max = |f: fn(&Row) -> Option<f64>| {
                    vr.iter()
                        .filter_map(|r| f(r))
                        .reduce(|a, b| {
                            if a.is_nan() || b.is_nan() {
                                f64::NAN
                            } else {
                                a.max(b)
                            }
                        })
                        .map(fmt_err)
                        .unwrap_or_else(|| "–".to_string())
                };
                vec![
                    format!("`{v}`"),
                    format!("{n_checked} / {}", vr.len()),
                    max(|r| r.max_abs_err),
                    max(|r| r.max_rel_err),
                    format!(
                        "{} / {n_checked}",
                        vr.iter().filter(|r| r.bitwise_equal == Some(true)).count()
                    ),
                    format!(
                        "{} / {n_checked}",
                        vr.iter().filter(|r| r.grad_ok == Some(true)).count()
                    ),
                ]
            })
            .collect();
        // the family alone where it has one dtype and math, as before; else each named
        let name = if several {
            format!(
                "`{}`, {}{}",
                fam.family,
                fam.dtype,
                if fam.math == "ieee" {
                    String::new()
                } else {
                    format!(", {}", fam.math)
                }
            )
        } else {
            format!("`{}`", fam.family)
        };
        let _ = writeln!(out, "{name} (worst over every configuration and depth):\n");
        out.push_str(&markdown_table(
            &[
                "variant",
                "rows checked",
                "max abs err",
                "max rel err",
                "bitwise equal",
                "within tolerance",
            ],
            &rows,
            &[0],
        ));
        let _ = writeln!(out);
    }
}

fn figures_section(
    groups: &[Group],
    csvs: &[PathBuf],
    report: &Path,
    plots_dir: &Path,
    out: &mut String,
) -> Result<()> {
    let _ = writeln!(out, "## Figures\n");
    let figs = plots::plan(groups);
    if figs.is_empty() {
        let _ = writeln!(out, "This CSV yields no figures.\n");
        return Ok(());
    }
    let report_dir = match report.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let rel = relative_path(&report_dir, plots_dir)?;
    // Figures of another CSV are not this report's: name it and link none of them.
    let source = plots_dir.join(plots::SOURCE_FILE);
    let record = input::read_bounded(&source, "figure record", MAX_JSON_BYTES, "MAX_JSON_BYTES");
    if let Ok(text) = record.map(|b| String::from_utf8_lossy(&b).into_owned()) {
        let bytes = plots::csv_bytes(csvs)?;
        if let Err(from) = plots::drawn_from(&text, &bytes) {
            let _ = writeln!(
                out,
                "The figures in `{}` were drawn from another CSV (`{from}`), not from this one: \
                 run `densebench plots {} --out DIR` and `densebench report {} --plots DIR` to \
                 link this CSV's figures.\n",
                plots_dir.display(),
                plots::shown(csvs),
                plots::shown(csvs)
            );
            return Ok(());
        }
    }
    let missing = figs
        .iter()
        .filter(|f| !plots_dir.join(format!("{}.png", f.stem)).exists())
        .count();
    if missing > 0 {
        let _ = writeln!(
            out,
            "{missing} of {} figures are not in `{}` yet: run `densebench plots {} --out {}`.\n",
            figs.len(),
            plots_dir.display(),
            plots::shown(csvs),
            plots_dir.display()
        );
    }
    let _ = writeln!(
        out,
        "The key figures (PNG; each links its SVG), then every figure. Memory-vs-time figures \
         mark the Pareto front (no other variant both faster and smaller); timelines show live \
         bytes at each layer boundary of forward and backward (the PyTorch peer's, dashed: \
         forward only).\n"
    );
    for f in figs.iter().filter(|f| f.key) {
        let _ = writeln!(
            out,
            "![{t}]({rel}/{s}.png)\n\n*{t}* ([SVG]({rel}/{s}.svg))\n",
            t = f.title,
            s = f.stem
        );
    }
    let _ = writeln!(out, "All figures:\n");
    for f in &figs {
        let _ = writeln!(
            out,
            "- {t}: [PNG]({rel}/{s}.png), [SVG]({rel}/{s}.svg)",
            t = f.title,
            s = f.stem
        );
    }
    let _ = writeln!(out);
    Ok(())
}

/// The published numbers: (source, setting, naive, efficient, memory ratio, time).
const PUBLISHED: [[&str; 6]; 4] = [
    [
        "LuaTorch DenseNet, optMemory 0 → 4",
        "DenseNet-BC-100, k=12, CIFAR, batch 64; GPU; whole network",
        "5453 MB",
        "1655 MB",
        "0.30×",
        "+14% (0.153 → 0.175 s)",
    ],
    [
        "efficient_densenet_pytorch",
        "DenseNet-BC-100, batch 64; GPU; whole network",
        "2.863 GB",
        "1.605 GB",
        "0.56×",
        "+25%",
    ],
    [
        "torchvision `memory_efficient=True`",
        "DenseNet, batch 8, 224×224; GPU; whole network",
        "1668 MB",
        "1115 MB",
        "0.67×",
        "+40%",
    ],
    [
        "Pleiss et al. 2017",
        "feature-map memory quadratic → linear in depth",
        "",
        "",
        "",
        "+15–20%",
    ],
];

fn published_section(groups: &[Group], out: &mut String) {
    let _ = writeln!(out, "## Measured beside the published numbers\n");
    let mut rows: Vec<Vec<String>> = PUBLISHED
        .iter()
        .map(|r| r.iter().map(|s| s.to_string()).collect())
        .collect();
    let mut exponents = Vec::new();
    for (gi, depth) in headline(groups) {
        let g = &groups[gi];
        let setting = format!("{} L={depth}; {}; one block", g.label, g.device_label);
        let Some(naive) = g.row(NAIVE, depth) else {
            rows.push(vec![
                format!("densebench (`{}`)", g.key.family),
                setting,
                format!("no `{NAIVE}` row"),
                String::new(),
                String::new(),
                String::new(),
            ]);
            continue;
        };
        let at = g.at_depth(depth);
        // another variant than naive itself (a naive-only CSV has no "most frugal")
        // and only among rows whose gradients are within tolerance (a wrong row is no option)
        let frugal = at
            .iter()
            .filter(|r| r.peak_bytes.is_some() && r.variant != NAIVE && data::trusted(r))
            .min_by_key(|r| r.peak_bytes);
        let fastest_linear = at
            .iter()
            .filter(|r| {
                is_linear_memory(&r.variant, &r.family)
                    && measured_ns(r).is_some()
                    && data::trusted(r)
            })
            .min_by_key(|r| measured_ns(r));
        let mut picks: Vec<(&str, &Row)> = Vec::new();
        if let Some(f) = frugal {
            picks.push(("most frugal", f));
        }
        if let Some(f) = fastest_linear {
            if frugal.map(|x| x.variant != f.variant).unwrap_or(true) {
                picks.push(("fastest linear-memory", f));
            }
        }
        for (what, r) in picks {
            rows.push(vec![
                format!("densebench {what}: `{}`", r.variant),
                setting.clone(),
                naive
                    .peak_bytes
                    .map(|b| format!("{} MiB", fmt_num(mib(b))))
                    .unwrap_or_else(|| "–".into()),
                r.peak_bytes
                    .map(|b| format!("{} MiB", fmt_num(mib(b))))
                    .unwrap_or_else(|| "–".into()),
                ratio(r.peak_bytes, naive.peak_bytes)
                    .map(|x| format!("{x:.2}×"))
                    .unwrap_or_else(|| "–".into()),
                ratio(measured_ns(r), measured_ns(naive))
                    .map(overhead)
                    .unwrap_or_else(|| "–".into()),
            ]);
        }
        if let (Some(pn), Some(f)) = (variant_exponent(g, NAIVE), frugal) {
            if let Some(pf) = variant_exponent(g, &f.variant) {
                // the depths each fit used: those with a measured peak (an oom row has none)
                let fitted = |v: &str| {
                    g.variant_rows(v)
                        .iter()
                        .filter(|r| r.peak_bytes.is_some())
                        .map(|r| r.depth.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                let (dn, df) = (fitted(NAIVE), fitted(&f.variant));
                let over = if dn == df {
                    format!("over L = {dn}")
                } else {
                    format!("over L = {dn} and L = {df}")
                };
                exponents.push(format!(
                    "- {}: peak ∝ L^p with p = {pn:.2} for `{NAIVE}` and p = {pf:.2} for `{}` \
                     {over} (Pleiss et al.: quadratic vs linear).",
                    g.label, f.variant,
                ));
            }
        }
    }
    out.push_str(&markdown_table(
        &[
            "source",
            "setting",
            "naive memory",
            "efficient memory",
            "memory ratio",
            "time",
        ],
        &rows,
        &[0, 1],
    ));
    let _ = writeln!(out);
    if !exponents.is_empty() {
        let _ = writeln!(out, "Growth with depth:\n");
        for e in exponents {
            let _ = writeln!(out, "{e}");
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "Read the ratios with these caveats:\n\n\
         - **Allocator peak vs GPU usage.** densebench's CPU peak is the exact high-water mark of \
         live bytes seen by a counting global allocator (on GPU, the memory pool's used-memory \
         high-water mark). The published numbers are GPU memory through a caching allocator, \
         which rounds blocks up and keeps freed blocks reserved, so they include fragmentation \
         and cache that an exact live-byte count has none of.\n\
         - **Workspaces.** cuDNN convolutions take workspaces whose size depends on the chosen \
         algorithm, and GPU kernels differ from candle's CPU ones (CPU `conv2d` copies its input \
         to NHWC, a transient the size of the input). Neither side's transients exist on the \
         other.\n\
         - **One block vs a whole network.** The published figures are for whole networks (three \
         dense blocks, transitions, classifier, parameters, optimizer state, framework context); \
         densebench measures one dense block's training step above a baseline that already \
         holds parameters, input and upstream gradient. Memory common to both strategies dilutes \
         a whole-network ratio, so a block's ratio is expected to be smaller (more savings).\n\
         - **candle's autograd keeps more than PyTorch's.** candle keeps every op's inputs alive \
         until the graph is dropped, while PyTorch frees what no backward needs; the `autograd` \
         variant therefore shows candle's memory, not PyTorch's. Ratios here are taken against \
         `{NAIVE}`, the hand-written naive block that saves what PyTorch's would.\n\
         - **Time.** CPU time with a few threads weighs recomputation differently from a GPU, \
         where BN and ReLU are memory-bound and cheap to recompute; the time overheads are \
         indicative of this machine only.\n"
    );
}

/// The report's first line, by which `report --out` knows an earlier report it may replace.
pub const TITLE: &str = "# densebench report";

/// Whether a file is a report [`render`] wrote, from its first bytes: its first line is
/// [`TITLE`]. (The length is unused; the signature is `results::replace::Kind`'s.)
pub fn is_report(start: &[u8], _len: u64) -> bool {
    let line = start.split(|&b| b == b'\n').next().unwrap_or_default();
    line.strip_suffix(b"\r").unwrap_or(line) == TITLE.as_bytes()
}

/// The whole report as markdown. `csvs` (the rows' files) are named in the text; `report` is
/// where it will be written (figure links are relative to its folder); `plots_dir` holds the
/// figures; `max_depth` the answers of `max-depth` CSVs (bf16 against f32), if any.
pub fn render(
    rows: &[Row],
    csvs: &[PathBuf],
    report: &Path,
    plots_dir: &Path,
    max_depth: &[Answer],
) -> Result<String> {
    let (groups, replaced) = data::group_rows(rows);
    let ok = rows.iter().filter(|r| r.is_ok()).count();
    let mut out = String::new();
    let _ = writeln!(out, "{TITLE}\n");
    let _ = writeln!(
        out,
        "Generated by `densebench report {}` from {} rows ({ok} ok, {} not ok). Memory is the \
         peak of one training step above the baseline, in MiB; time is the median step \
         (forward + backward), in ms; every ratio is to the naive `{NAIVE}` at the same \
         configuration and depth.\n",
        plots::shown(csvs),
        rows.len(),
        rows.len() - ok
    );
    if rows.iter().any(Row::is_peer) {
        let _ = writeln!(
            out,
            "PyTorch peer rows are kept apart: they are in Versus PyTorch (and drawn dashed in \
             the figures), never in densebench's tables, gradient check or fits.\n"
        );
    }
    if replaced > 0 {
        let _ = writeln!(
            out,
            "{replaced} row(s) repeat an earlier (configuration, depth, variant); the last one \
             is used.\n"
        );
    }
    machine_section(rows, &mut out);
    published_section(&groups, &mut out);
    versus::section(&groups, &mut out);
    versus::graph_section(&groups, &mut out);
    family_sections(&groups, &mut out);
    bf16_section(&groups, max_depth, &mut out);
    gradient_section(&groups, &mut out);
    figures_section(&groups, csvs, report, plots_dir, &mut out)?;
    let skipped: Vec<&Row> = rows.iter().filter(|r| !r.is_ok()).collect();
    if !skipped.is_empty() {
        let _ = writeln!(out, "## Rows not measured\n");
        for r in skipped {
            let _ = writeln!(out, "- {} {}", r.config_label(), data::skipped_note(r));
        }
        let _ = writeln!(out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{bf16_section, gradient_section, overhead};
    use crate::measure::capacity::Answer;
    use crate::outputs::plots::data::{group_rows, MIB};
    use crate::results::row::Row;

    /// An ok bc row (N=16, C0=24, k=12, 8×8, 2 threads) of `variant` in `dtype` at `depth`,
    /// its gradients within tolerance.
    fn bc(dtype: &str, variant: &str, depth: usize, peak_mib: u64, ms: u64) -> Row {
        Row {
            variant: variant.to_string(),
            framework: "densebench".to_string(),
            family: "bc".to_string(),
            batch: 16,
            channels: 24,
            growth: 12,
            bn_size: 4,
            size: impls::Spatial::square(8),
            activation: true,
            dtype: dtype.to_string(),
            device: "cpu".to_string(),
            math: "ieee".to_string(),
            status: "ok".to_string(),
            depth,
            threads: 2,
            peak_bytes: Some(peak_mib * MIB as u64),
            median_ns: Some(ms * 1_000_000),
            max_abs_err: Some(1e-6),
            max_rel_err: Some(1e-6),
            grad_ok: Some(true),
            ..Row::default()
        }
    }

    /// bf16 rows get a gradient table of their own, beside f32's: a bf16 error (×10⁵ an f32
    /// one, bf16 keeping 8 bits of mantissa) is never the worst of the f32 table.
    #[test]
    fn bf16_errors_have_their_own_gradient_table() {
        let mut b = bc("bf16", "cat-store-copy", 4, 10, 10);
        b.max_rel_err = Some(0.25);
        let rows = [bc("f32", "cat-store-copy", 4, 20, 5), b];
        let (groups, _) = group_rows(&rows);
        let mut md = String::new();
        gradient_section(&groups, &mut md);
        let f32_at = md.find("`bc`, f32 (worst").expect(&md);
        let bf16_at = md.find("`bc`, bf16 (worst").expect(&md);
        let err_at = md.find("| 2.5e-1 |").expect(&md);
        // groups are in key order (bf16 before f32): the bf16 error sits in the bf16 table
        assert!(bf16_at < err_at && err_at < f32_at, "{md}");
        assert_eq!(md.matches("| 2.5e-1 |").count(), 1, "{md}");
    }

    /// With f32 and bf16 rows of one configuration, variant and depth, "bf16 against f32" sets
    /// their peaks and times side by side as ratios; a depth measured in one dtype only, and
    /// an f64 row, are not in it; max-depth answers in both dtypes give their depth ratio.
    #[test]
    fn bf16_against_f32_pairs_rows_and_depths() {
        let rows = [
            bc("f32", "cat-store-copy", 4, 100, 10),
            bc("bf16", "cat-store-copy", 4, 53, 40),
            bc("f32", "buffer-recompute-inplace", 4, 20, 12),
            bc("bf16", "buffer-recompute-inplace", 4, 15, 30),
            bc("bf16", "buffer-recompute-inplace", 8, 25, 60),
            bc("f64", "cat-store-copy", 4, 200, 20),
        ];
        let (groups, _) = group_rows(&rows);
        let answer = |variant: &str, dtype: &str, depth: usize| Answer {
            variant: variant.to_string(),
            family: "bc".to_string(),
            dtype: dtype.to_string(),
            budget_bytes: 1 << 30,
            max_depth: depth,
            method: "model".to_string(),
            ..Answer::default()
        };
        let answers = [
            answer("cat-store-copy", "f32", 12),
            answer("cat-store-copy", "bf16", 19),
            answer("buffer-recompute-inplace", "f32", 103),
        ];
        let mut md = String::new();
        bf16_section(&groups, &answers, &mut md);
        assert!(md.starts_with("## bf16 against f32\n"), "{md}");
        assert!(
            md.contains("bc N=16 C0=24 k=12 bn=4 8x8 f32 and bf16; "),
            "{md}"
        );
        // 53 / 100 MiB and 40 / 10 ms
        assert!(
            md.contains("| `cat-store-copy` | 4 | 100 | 53.0 | 0.53× | 10.0 | 40.0 | 4.00× |"),
            "{md}"
        );
        assert!(
            md.contains(
                "| `buffer-recompute-inplace` | 4 | 20.0 | 15.0 | 0.75× | 12.0 | 30.0 | 2.50× |"
            ),
            "{md}"
        );
        assert!(!md.contains("| 8 |"), "bf16 alone at L=8: {md}");
        assert!(!md.contains("200"), "the f64 row: {md}");
        // 19 / 12; buffer-recompute-inplace has no bf16 answer
        assert!(md.contains("`bc` within 1.00 GiB"), "{md}");
        assert!(
            md.contains("| `cat-store-copy` | 12 | 19 | 1.58× |"),
            "{md}"
        );
        assert!(!md.contains("| `buffer-recompute-inplace` | 103"), "{md}");
        // one dtype only: no section
        let (f32_only, _) = group_rows(&rows[..1]);
        let mut none = String::new();
        bf16_section(&f32_only, &answers[..1], &mut none);
        assert_eq!(none, "");
    }

    /// Rows at different thread counts are not compared (a time at 1 thread against one at
    /// 2 is no bf16 effect); the table says why.
    #[test]
    fn bf16_against_f32_compares_like_with_like() {
        let mut b = bc("bf16", "cat-store-copy", 4, 53, 40);
        b.threads = 1;
        let rows = [bc("f32", "cat-store-copy", 4, 100, 10), b];
        let (groups, _) = group_rows(&rows);
        let mut md = String::new();
        bf16_section(&groups, &[], &mut md);
        assert!(
            md.contains("| `cat-store-copy` | 4 | 100 | 53.0 | – | 10.0 | 40.0 | – |"),
            "{md}"
        );
        assert!(md.contains("not compared (2 vs 1 threads)"), "{md}");
    }

    /// A time ratio within half a percent of 1 is no change, never `−0%` or `+0%`.
    #[test]
    fn overhead_rounds_before_it_takes_a_sign() {
        assert_eq!(overhead(1.14), "+14%");
        assert_eq!(overhead(0.97), "−3%");
        assert_eq!(overhead(0.996), "±0%");
        assert_eq!(overhead(1.004), "±0%");
        assert_eq!(overhead(0.994), "−1%");
    }
}
