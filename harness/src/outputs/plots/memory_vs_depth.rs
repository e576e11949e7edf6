//! Figure 1, `memory-vs-depth-<config>`: peak memory against depth, one line per variant, with
//! the fitted growth exponent and slope guides (Pleiss et al.'s quadratic-vs-linear figure); the
//! PyTorch peer's rows, when the CSV has comparable ones, as dashed series of their own.

use super::data::{self, growth_exponent, mib, variant_exponent, Group};
use super::style::*;
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Figure 1: peak memory against depth, one line per variant, with the fitted growth exponent;
/// linear axes on the left (Pleiss et al.'s figure), log–log on the right, where the slope is
/// the exponent and dashed guides show slope 2 and slope 1.
pub fn memory_vs_depth<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, g: &Group) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let (peers, _) = g.drawable_peers();
    let f = frame(
        root,
        &format!("Peak memory vs depth — {}", g.label),
        &format!(
            "{} · one training step, allocator peak above baseline",
            g.device_label
        ),
        &footer(g),
    )?;
    let depths = g.depths_with(&peers);
    let ticks: Vec<f64> = depths.iter().map(|&d| d as f64).collect();
    let dmin = depths.first().copied().unwrap_or(1) as f64;
    let dmax = depths.last().copied().unwrap_or(1) as f64;
    let peaks: Vec<f64> =
        g.ok.iter()
            .chain(peers.iter().copied())
            .filter_map(|r| r.peak_bytes)
            .map(mib)
            .collect();
    let ymax = peaks.iter().copied().fold(0.0, f64::max);
    let ymin_pos = peaks
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    let series: Vec<(String, Vec<(f64, f64)>)> = g
        .variants()
        .into_iter()
        .map(|v| {
            let pts = g
                .variant_rows(&v)
                .iter()
                .filter_map(|r| r.peak_bytes.map(|p| (r.depth as f64, mib(p))))
                .collect();
            (v, pts)
        })
        .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
        .collect();
    let peer_series_pts = peer_points(g, &peers, |r| r.peak_bytes.map(mib));
    let (w, _) = f.plot.dim_in_pixel();
    let (left, right) = f.plot.split_horizontally(w * 55 / 100);
    let mut chart = ChartBuilder::on(&left)
        .margin(20)
        .caption("linear axes", font(LABEL_PT).color(&GREY))
        .x_label_area_size(55)
        .y_label_area_size(85)
        .build_cartesian_2d(
            Ticked {
                range: padded(dmin, dmax, 0.05),
                ticks: ticks.clone(),
            },
            from_zero(0.0, ymax),
        )?;
    chart
        .configure_mesh()
        .x_desc("depth L (layers in the block)")
        .y_desc("peak memory (MiB)")
        .axis_desc_style(font(AXIS_PT))
        .label_style(font(LABEL_PT))
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&tick)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (v, pts) in &series {
        let c = rgb(v);
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
        markers(&mut chart, pts, shape_of(v), c, 5)?;
    }
    for (v, pts) in &peer_series_pts {
        peer_series(&mut chart, v, pts, 5)?;
    }
    if ymin_pos.is_finite() && dmax > dmin {
        let (lo, hi) = (ymin_pos / 1.3, ymax * 1.3);
        let xr = (dmin / 1.08)..(dmax * 1.08);
        let mut log = ChartBuilder::on(&right)
            .margin(20)
            .caption(
                "log–log axes: slope = growth exponent",
                font(LABEL_PT).color(&GREY),
            )
            .x_label_area_size(55)
            .y_label_area_size(70)
            .build_cartesian_2d(
                xr.log_scale().with_key_points(ticks),
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            )?;
        log.configure_mesh()
            .x_desc("depth L (log)")
            .y_desc("peak memory (MiB, log)")
            .axis_desc_style(font(AXIS_PT))
            .label_style(font(LABEL_PT))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&tick)
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        for (v, pts) in &series {
            let c = rgb(v);
            log.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
            markers(&mut log, pts, shape_of(v), c, 4)?;
        }
        for (v, pts) in &peer_series_pts {
            peer_series(&mut log, v, pts, 4)?;
        }
        // Guides through the first point of the largest and of the smallest series: slope 2
        // (quadratic) above, slope 1 (linear) below.
        let first = |pick: fn(f64, f64) -> bool| {
            series
                .iter()
                .filter_map(|(_, p)| p.first().copied())
                .reduce(|a, b| if pick(a.1, b.1) { a } else { b })
        };
        for (start, slope, label) in [
            (first(|a, b| a > b), 2.0, "∝ L²"),
            (first(|a, b| a < b), 1.0, "∝ L"),
        ] {
            let Some((x0, y0)) = start else { continue };
            // The guide ends where it leaves the panel (its top, `hi`): drawn further, plotters
            // would clamp it into a flat dashed line along the top edge that looks like data.
            let x1 = dmax.min(x0 * (hi / y0).powf(1.0 / slope));
            if x1 <= x0 * 1.01 {
                continue;
            }
            let end = (x1, y0 * (x1 / x0).powf(slope));
            // Dashes cut in log space: plotters' dashed series interpolates in data space,
            // which bends a power law on log axes.
            let at = |t: f64| {
                let x = x0 * (x1 / x0).powf(t);
                (x, y0 * (x / x0).powf(slope))
            };
            for dash in (0..GUIDE_DASHES).step_by(2) {
                let (t0, t1) = (
                    dash as f64 / GUIDE_DASHES as f64,
                    (dash + 1) as f64 / GUIDE_DASHES as f64,
                );
                log.draw_series(LineSeries::new(
                    vec![at(t0), at(t1)],
                    BLACK.mix(0.45).stroke_width(1),
                ))?;
            }
            // at the right of its end, or, where the panel's top cut it, below-left of it (clear
            // of the panel's caption)
            let (offset, pos) = if x1 < dmax {
                ((-6, 6), Pos::new(HPos::Right, VPos::Top))
            } else {
                ((6, 0), Pos::new(HPos::Left, VPos::Center))
            };
            log.draw_series(std::iter::once(
                EmptyElement::at(end)
                    + Text::new(label, offset, font(LABEL_PT).color(&GREY).pos(pos)),
            ))?;
        }
    }
    let mut entries: Vec<Entry> = series
        .iter()
        .map(|(v, _)| {
            let label = match variant_exponent(g, v) {
                Some(p) => format!("{v}  p = {p:.2}"),
                None => v.clone(),
            };
            Entry::variant(v, data::marked(label, &g.variant_rows(v)), true)
        })
        .collect();
    entries.extend(
        peer_series_pts
            .iter()
            .map(|(v, pts)| match growth_exponent(pts) {
                Some(p) => Entry::peer(v, &format!("  p = {p:.2}"), &peers),
                None => Entry::peer(v, "", &peers),
            }),
    );
    let mut notes = vec![
        "p: fitted growth exponent, peak ∝ L^p".to_string(),
        "(least squares on log peak vs log L)".to_string(),
        "quadratic ≈ 2, linear ≈ 1".to_string(),
        "dashed guides: slope 2 and slope 1".to_string(),
    ];
    let drawn: Vec<&Row> = series.iter().flat_map(|(v, _)| g.variant_rows(v)).collect();
    notes.extend(data::untrusted_notes(&drawn));
    notes.extend(peer_notes(&peers, "dashed with diamonds"));
    legend(&f.legend, &entries, &notes)
}

/// The footer of the memory-vs-depth figure: the group's rows not ok, then the peer rows not
/// drawn and why.
pub(super) fn footer(g: &Group) -> Vec<String> {
    let (_, left_out) = g.drawable_peers();
    let mut footer = skipped_footer(g.skipped_notes());
    footer.extend(left_out.into_iter().map(|(_, n)| n));
    footer
}

/// The drawable peer rows as one series per peer variant (in the peer order): (depth, value)
/// by ascending depth, rows without the value left out.
pub(super) fn peer_points(
    g: &Group,
    peers: &[&Row],
    value: impl Fn(&Row) -> Option<f64>,
) -> Vec<(String, Vec<(f64, f64)>)> {
    g.peer_variants()
        .into_iter()
        .map(|v| {
            let mut rows: Vec<&&Row> = peers.iter().filter(|r| r.variant == v).collect();
            rows.sort_by_key(|r| r.depth);
            let pts = rows
                .iter()
                .filter_map(|r| value(r).map(|y| (r.depth as f64, y)))
                .collect();
            (v, pts)
        })
        .filter(|(_, p): &(String, Vec<(f64, f64)>)| !p.is_empty())
        .collect()
}

/// Segments of a guide line on log axes (every other one drawn).
const GUIDE_DASHES: usize = 31;
