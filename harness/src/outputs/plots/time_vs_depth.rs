//! Figure 2, `time-vs-depth-<config>`: median step time against depth with min–max whiskers;
//! the PyTorch peer's comparable rows as dashed series of their own (medians).

use super::data::{incomparable, ms, Group, NAIVE};
use super::memory_vs_depth::peer_points;
use super::style::*;
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Figure 2: median step time against depth with min–max whiskers; the time axis on a log
/// scale when the times spread over more than [`LOG_SPREAD`]×.
pub fn time_vs_depth<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, g: &Group) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let steps = g.ok.first().map(|r| r.steps).unwrap_or(0);
    let (peers, left_out) = g.drawable_peers();
    let mut footer = skipped_footer(g.skipped_notes());
    footer.extend(left_out.into_iter().map(|(_, n)| n));
    let f = frame(
        root,
        &format!("Step time vs depth — {}", g.label),
        &format!(
            "{} · forward + backward, {steps} timed steps",
            g.device_label
        ),
        &footer,
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
    // Legend: each variant's time relative to naive at the deepest depth both have.
    let mut entries: Vec<Entry> = g
        .variants()
        .iter()
        .filter(|v| g.variant_rows(v).iter().any(|r| r.median_ns.is_some()))
        .map(|v| {
            let rel = depths.iter().rev().find_map(|&d| {
                let t = g.row(v, d)?.median_ns? as f64;
                let n = g.row(NAIVE, d)?.median_ns? as f64;
                (n > 0.0).then(|| (t / n, d))
            });
            let label = match rel {
                Some((r, d)) if v != NAIVE => format!("{v}  {r:.2}× at L={d}"),
                _ => v.clone(),
            };
            Entry::variant(v, label, true)
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
    let mut notes = vec![
        "points: median step time".to_string(),
        "whiskers: min–max over the timed steps".to_string(),
        format!("×: median time relative to {NAIVE}"),
        "(variants nudged sideways to stay apart)".to_string(),
    ];
    notes.extend(peer_notes(&peers, "dashed with diamonds"));
    legend(&f.legend, &entries, &notes)
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
        for r in &rows {
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
