//! Figure 2, `time-vs-depth-<config>`: median step time against depth with min–max whiskers;
//! the PyTorch peer's comparable rows as dashed series of their own (medians).

use super::data::{self, incomparable, ms, Group, NAIVE};
use super::memory_vs_depth::peer_points;
use super::style::*;
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// Figure 2: median step time against depth with min–max whiskers; the time axis on a log
/// scale when the times spread over more than [`LOG_SPREAD`]×.
pub fn time_vs_depth<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, g: &Group) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (peers, _) = g.drawable_peers();
    // the rows drawn: densebench's with a median, and the peer's drawn beside them
    let drawn: Vec<&Row> =
        g.ok.iter()
            .chain(peers.iter().copied())
            .filter(|r| r.median_ns.is_some_and(|t| t > 0))
            .collect();
    let f = frame(
        root,
        &format!("Step time vs depth — {}", g.label),
        &format!(
            "{} · forward + backward, {}",
            g.device_label,
            steps_text(&drawn)
        ),
        &footer(g),
    )?;
    let depths = g.depths_with(&peers);
    let dmin = depths.first().copied().unwrap_or(1) as f64;
    let dmax = depths.last().copied().unwrap_or(1) as f64;
    let peer_pts = peer_points(g, &peers, |r| r.median_ns.filter(|&t| t > 0).map(ms));
    let times: Vec<f64> =
        g.ok.iter()
            .flat_map(|r| [r.min_ns, r.median_ns, r.max_ns])
            .flatten()
            .filter(|&t| t > 0)
            .map(ms)
            .chain(peer_pts.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)))
            .collect();
    let ymax = times.iter().copied().fold(0.0, f64::max);
    let ymin = times.iter().copied().fold(f64::INFINITY, f64::min);
    let x = || Ticked {
        range: padded(dmin, dmax, 0.05),
        ticks: depths.iter().map(|&d| d as f64).collect(),
    };
    let builder = || {
        let mut b = ChartBuilder::on(&f.plot);
        b.margin(20).x_label_area_size(55).y_label_area_size(85);
        b
    };
    if ymin.is_finite() && ymax / ymin > LOG_SPREAD {
        let (lo, hi) = (ymin / 1.2, ymax * 1.2);
        let y = (lo..hi).log_scale().with_key_points(log_ticks(lo, hi));
        let mut chart = builder().build_cartesian_2d(x(), y)?;
        time_series(&mut chart, g, "step time (ms, log scale)")?;
        for (v, pts) in &peer_pts {
            peer_series(&mut chart, v, pts, 5)?;
        }
    } else {
        let mut chart = builder().build_cartesian_2d(x(), from_zero(0.0, ymax))?;
        time_series(&mut chart, g, "step time (ms)")?;
        for (v, pts) in &peer_pts {
            peer_series(&mut chart, v, pts, 5)?;
        }
    }
    // Legend: each variant's time relative to naive at the deepest depth both have, measured
    // alike (a row at 2 threads is never set against one at 1); with rows at several thread
    // counts, each ratio names its own.
    let mut threads: Vec<usize> = g.ok.iter().map(|r| r.threads).collect();
    threads.sort_unstable();
    threads.dedup();
    let mixed = threads.len() > 1;
    let mut entries: Vec<Entry> = g
        .variants()
        .iter()
        .filter(|v| g.variant_rows(v).iter().any(|r| r.median_ns.is_some()))
        .map(|v| {
            let rel = depths.iter().rev().find_map(|&d| {
                let (row, naive) = (g.row(v, d)?, g.row(NAIVE, d)?);
                if incomparable(row, naive).is_some() {
                    return None;
                }
                let t = row.median_ns? as f64;
                let n = naive.median_ns? as f64;
                (n > 0.0).then(|| (t / n, d, row.threads))
            });
            // a variant beside naive at some depth, but never measured alike
            let apart = depths
                .iter()
                .filter_map(|&d| Some((g.row(v, d)?, g.row(NAIVE, d)?)))
                .filter(|(row, naive)| incomparable(row, naive).is_some())
                .map(|(row, _)| row.threads)
                .next_back();
            let label = match (rel, apart) {
                _ if v == NAIVE => v.clone(),
                (Some((r, d, t)), _) if mixed => format!("{v}  {r:.2}× L={d}, {t} thr."),
                (Some((r, d, _)), _) => format!("{v}  {r:.2}× at L={d}"),
                (None, Some(t)) => format!("{v}  (no ratio: {t} thr.)"),
                (None, None) => v.clone(),
            };
            Entry::variant(v, data::marked(label, &g.variant_rows(v)), true)
        })
        .collect();
    for (v, pts) in &peer_pts {
        // Only against a naive row it may be set against (same threads and math).
        let rel = pts.iter().rev().find_map(|&(d, t)| {
            let naive = g.row(NAIVE, d as usize)?;
            let peer = peers
                .iter()
                .find(|r| &r.variant == v && r.depth == d as usize)?;
            if incomparable(naive, peer).is_some() {
                return None;
            }
            let n = ms(naive.median_ns?);
            (n > 0.0).then(|| (t / n, d))
        });
        entries.push(match rel {
            Some((r, d)) => Entry::peer(v, &format!("  {r:.2}× at L={d:.0}"), &peers),
            None => Entry::peer(v, "", &peers),
        });
    }
    let mut notes = vec!["points: median step time".to_string()];
    // the peer's series have no whiskers: only densebench's rows say where there are none
    let whiskered: Vec<&Row> = drawn.iter().copied().filter(|r| !r.is_peer()).collect();
    notes.extend(whisker_notes(&whiskered));
    notes.push(format!("×: median time relative to {NAIVE}"));
    if mixed {
        notes.push("  at the same thread count (thr.)".to_string());
    }
    notes.push("(variants nudged sideways to stay apart)".to_string());
    notes.extend(data::untrusted_notes(&whiskered));
    notes.extend(peer_notes(&peers, "dashed with diamonds"));
    legend(&f.legend, &entries, &notes)
}

/// The footer of the time-vs-depth figure: the group's rows not ok, then the peer rows not
/// drawn and why.
pub(super) fn footer(g: &Group) -> Vec<String> {
    let (_, left_out) = g.drawable_peers();
    let mut footer = skipped_footer(g.skipped_notes());
    footer.extend(left_out.into_iter().map(|(_, n)| n));
    footer
}

/// Whether a row's min and max are a spread worth a whisker: not with one timed step (min =
/// median = max). A row that does not say (`steps` 0) keeps its whisker.
fn has_whisker(r: &Row) -> bool {
    r.steps != 1
}

/// `L=32, 48` (at most [`MAX_DEPTHS`], then `…`).
fn depth_list(depths: &BTreeSet<usize>) -> String {
    let mut list: Vec<String> = depths
        .iter()
        .take(MAX_DEPTHS)
        .map(ToString::to_string)
        .collect();
    if depths.len() > MAX_DEPTHS {
        list.push("…".to_string());
    }
    format!("L={}", list.join(", "))
}

/// Depths listed in a subtitle or note before `…`.
const MAX_DEPTHS: usize = 4;

/// The timed steps of the drawn rows, for the subtitle: `3 timed steps` when every row has the
/// same count, else the range and how many rows have the counts other than the commonest, and
/// where: `1–3 timed steps (3 for 2 rows, at L=8, 16)` (not "3 at L=16", which read as every
/// row there).
fn steps_text(rows: &[&Row]) -> String {
    // per step count: its rows and their depths (0 = not recorded)
    let mut by_steps: BTreeMap<usize, (usize, BTreeSet<usize>)> = BTreeMap::new();
    for r in rows {
        let e = by_steps.entry(r.steps).or_default();
        e.0 += 1;
        e.1.insert(r.depth);
    }
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let (lo, hi) = match (by_steps.keys().next(), by_steps.keys().last()) {
        (Some(&lo), Some(&hi)) => (lo, hi),
        _ => return "no timed steps".to_string(),
    };
    if lo == hi {
        return format!("{lo} timed step{}", plural(lo));
    }
    // the commonest count goes without saying (the larger on a tie); the others say where
    let common = by_steps
        .iter()
        .max_by_key(|(s, (n, _))| (*n, **s))
        .map(|(s, _)| *s)
        .unwrap_or(hi);
    let others: Vec<String> = by_steps
        .iter()
        .filter(|(s, _)| **s != common)
        .map(|(s, (n, depths))| format!("{s} for {n} row{}, at {}", plural(*n), depth_list(depths)))
        .collect();
    format!("{lo}–{hi} timed steps ({})", others.join("; "))
}

/// The legend's whisker notes: min–max over the timed steps, and which points have none (one
/// timed step: no spread to show).
fn whisker_notes(rows: &[&Row]) -> Vec<String> {
    let single: BTreeSet<usize> = rows
        .iter()
        .filter(|r| !has_whisker(r))
        .map(|r| r.depth)
        .collect();
    if single.is_empty() {
        vec!["whiskers: min–max over the timed steps".to_string()]
    } else if rows.iter().all(|r| !has_whisker(r)) {
        vec!["no whiskers: one timed step per point".to_string()]
    } else {
        vec![
            "whiskers: min–max over the timed steps;".to_string(),
            format!("  none at one step ({})", depth_list(&single)),
        ]
    }
}

/// The mesh, lines, whiskers and markers of the time-vs-depth figure on a linear or log axis.
fn time_series<DB, Y>(chart: &mut Chart<'_, DB, Ticked, Y>, g: &Group, y_desc: &str) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc("depth L (layers in the block)")
        .y_desc(y_desc)
        .axis_desc_style(font(AXIS_PT))
        .label_style(font(LABEL_PT))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&tick)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let depths = g.depths();
    let dmin = depths.first().copied().unwrap_or(1) as f64;
    let dmax = depths.last().copied().unwrap_or(1) as f64;
    let variants = g.variants();
    // Dodge: spread the variants' whiskers a little around each depth so they do not overlap.
    let dodge = if dmax > dmin {
        (dmax - dmin) * 0.006
    } else {
        0.1
    };
    for (i, v) in variants.iter().enumerate() {
        let off = (i as f64 - (variants.len() as f64 - 1.0) / 2.0) * dodge;
        let rows: Vec<&Row> = g
            .variant_rows(v)
            .into_iter()
            .filter(|r| r.median_ns.is_some_and(|t| t > 0))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let c = rgb(v);
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter_map(|r| r.median_ns.map(|m| (r.depth as f64 + off, ms(m))))
            .collect();
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
        for r in rows.iter().filter(|r| has_whisker(r)) {
            if let (Some(lo), Some(hi)) = (r.min_ns, r.max_ns) {
                let x = r.depth as f64 + off;
                let (lo, hi) = (ms(lo.max(1)), ms(hi.max(1)));
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(x, lo), (x, hi)],
                    c.stroke_width(1),
                )))?;
                for y in [lo, hi] {
                    chart.draw_series(std::iter::once(
                        EmptyElement::at((x, y))
                            + PathElement::new(vec![(-4, 0), (4, 0)], c.stroke_width(1)),
                    ))?;
                }
            }
        }
        markers(chart, &pts, shape_of(v), c, 5)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{steps_text, whisker_notes};
    use crate::results::row::Row;

    fn row(depth: usize, steps: usize) -> Row {
        Row {
            depth,
            steps,
            ..Row::default()
        }
    }

    /// The subtitle states every step count, never the first row's for all.
    #[test]
    fn steps_text_names_every_count() {
        let same = [row(8, 3), row(16, 3)];
        assert_eq!(
            steps_text(&same.iter().collect::<Vec<_>>()),
            "3 timed steps"
        );
        let one = [row(8, 1)];
        assert_eq!(steps_text(&one.iter().collect::<Vec<_>>()), "1 timed step");
        let mixed = [row(8, 3), row(16, 3), row(32, 1), row(48, 1), row(48, 1)];
        let mixed: Vec<&Row> = mixed.iter().collect();
        assert_eq!(
            steps_text(&mixed),
            "1–3 timed steps (3 for 2 rows, at L=8, 16)"
        );
        assert_eq!(
            whisker_notes(&mixed),
            [
                "whiskers: min–max over the timed steps;",
                "  none at one step (L=32, 48)"
            ]
        );
        let many: Vec<Row> = (1..=6).map(|d| row(d, 1)).chain([row(9, 2)]).collect();
        assert_eq!(
            steps_text(&many.iter().collect::<Vec<_>>()),
            "1–2 timed steps (2 for 1 row, at L=9)"
        );
        let spread: Vec<Row> = (1..=6).map(|d| row(d, 2)).chain([row(9, 2)]).collect();
        assert_eq!(
            whisker_notes(&spread.iter().collect::<Vec<_>>()),
            ["whiskers: min–max over the timed steps"]
        );
    }
}
