//! Figure 1, `memory-vs-depth-<config>`: peak memory against depth, one line per variant, with
//! the fitted growth exponent and slope guides (Pleiss et al.'s quadratic-vs-linear figure); the
//! PyTorch peer's rows, when the CSV has comparable ones, as dashed series of their own. A
//! configuration's bf16 rows are drawn beside its f32 rows on one figure: each variant in its
//! colour, bf16 in short dashes with hollow markers, every legend entry naming its dtype.

use super::data::{self, growth_exponent, mib, peer_label, variant_exponent, Group};
use super::style::*;
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// A peer's line: the index in the figure's groups of the group it is drawn beside, its
/// variant, its points.
type PeerLine = (usize, String, Vec<(f64, f64)>);

/// One line of the figure: a variant of one of its groups.
struct Series<'a> {
    variant: String,
    group: &'a Group,
    /// Drawn in the bf16 style (the second dtype of a figure that draws two).
    alt: bool,
    pts: Vec<(f64, f64)>,
}

/// Figure 1: peak memory against depth, one line per variant (and dtype, when `gs` holds an
/// f32 group and its bf16 twin, f32's first), with the fitted growth exponent; linear axes on
/// the left (Pleiss et al.'s figure), log–log on the right, where the slope is the exponent and
/// dashed guides show slope 2 and slope 1.
pub fn memory_vs_depth<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    gs: &[&Group],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let Some(lead) = gs.first() else {
        anyhow::bail!("a memory-vs-depth figure with no configuration");
    };
    let dtyped = gs.len() > 1;
    let dtype_of = |g: &Group| {
        if dtyped {
            format!(" {}", g.key.dtype)
        } else {
            String::new()
        }
    };
    let peers: Vec<Vec<&Row>> = gs.iter().map(|g| g.drawable_peers().0).collect();
    let title_label = if dtyped {
        let dtypes: Vec<&str> = gs.iter().map(|g| g.key.dtype.as_str()).collect();
        data::label_with_dtypes(&lead.label, &lead.key.dtype, &dtypes)
    } else {
        lead.label.clone()
    };
    let f = frame(
        root,
        &format!("Peak memory vs depth — {title_label}"),
        &format!(
            "{} · one training step, allocator peak above baseline",
            lead.device_label
        ),
        &footer(gs),
    )?;
    let mut depths: Vec<usize> = gs
        .iter()
        .zip(&peers)
        .flat_map(|(g, p)| g.depths_with(p))
        .collect();
    depths.sort_unstable();
    depths.dedup();
    let ticks: Vec<f64> = depths.iter().map(|&d| d as f64).collect();
    let dmin = depths.first().copied().unwrap_or(1) as f64;
    let dmax = depths.last().copied().unwrap_or(1) as f64;
    let peaks: Vec<f64> = gs
        .iter()
        .zip(&peers)
        .flat_map(|(g, p)| g.ok.iter().chain(p.iter().copied()))
        .filter_map(|r| r.peak_bytes)
        .map(mib)
        .collect();
    let ymax = peaks.iter().copied().fold(0.0, f64::max);
    let ymin_pos = peaks
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::INFINITY, f64::min);
    // In the stable variant order, each variant's f32 line then its bf16 line.
    let all_variants = data::variant_order(
        gs.iter()
            .flat_map(|g| g.ok.iter().map(|r| r.variant.as_str())),
    );
    let series: Vec<Series> = all_variants
        .iter()
        .flat_map(|v| {
            gs.iter().enumerate().map(move |(i, g)| Series {
                variant: v.clone(),
                group: g,
                alt: i > 0,
                pts: g
                    .variant_rows(v)
                    .iter()
                    .filter_map(|r| r.peak_bytes.map(|p| (r.depth as f64, mib(p))))
                    .collect(),
            })
        })
        .filter(|s| !s.pts.is_empty())
        .collect();
    // the peer's series of each group: (the group's index in `gs`, variant, points); those of
    // any group but the first in the bf16 style
    let peer_series_pts: Vec<PeerLine> = gs
        .iter()
        .zip(&peers)
        .enumerate()
        .flat_map(|(i, (g, p))| {
            peer_points(g, p, |r| r.peak_bytes.map(mib))
                .into_iter()
                .map(move |(v, pts)| (i, v, pts))
        })
        .collect();
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
    for s in &series {
        line(&mut chart, &s.variant, &s.pts, s.alt, 5)?;
    }
    for (i, v, pts) in &peer_series_pts {
        if *i > 0 {
            bf16_series(&mut chart, v, pts, 5)?;
        } else {
            peer_series(&mut chart, v, pts, 5)?;
        }
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
        for s in &series {
            line(&mut log, &s.variant, &s.pts, s.alt, 4)?;
        }
        for (i, v, pts) in &peer_series_pts {
            if *i > 0 {
                bf16_series(&mut log, v, pts, 4)?;
            } else {
                peer_series(&mut log, v, pts, 4)?;
            }
        }
        // Guides through the first point of the largest and of the smallest series: slope 2
        // (quadratic) above, slope 1 (linear) below.
        let first = |pick: fn(f64, f64) -> bool| {
            series
                .iter()
                .filter_map(|s| s.pts.first().copied())
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
            let (offset, pos) = guide_label_at(x1 < dmax);
            log.draw_series(std::iter::once(
                EmptyElement::at(end)
                    + Text::new(label, offset, font(LABEL_PT).color(&GREY).pos(pos)),
            ))?;
        }
    }
    let mut entries: Vec<Entry> = series
        .iter()
        .map(|s| {
            let name = format!("{}{}", s.variant, dtype_of(s.group));
            let label = match variant_exponent(s.group, &s.variant) {
                Some(p) => format!("{name}  p = {p:.2}"),
                None => name,
            };
            let e = Entry::variant(
                &s.variant,
                data::marked(label, &s.group.variant_rows(&s.variant)),
                true,
            );
            if s.alt {
                e.in_bf16_style()
            } else {
                e
            }
        })
        .collect();
    entries.extend(peer_series_pts.iter().map(|(i, v, pts)| {
        let p = growth_exponent(pts).map_or(String::new(), |p| format!("  p = {p:.2}"));
        let e = Entry::peer(v, &format!("{}{p}", dtype_of(gs[*i])), &peers[*i]);
        if *i > 0 {
            e.in_bf16_style()
        } else {
            e
        }
    }));
    let mut notes = vec![
        "p: fitted growth exponent, peak ∝ L^p".to_string(),
        "(least squares on log peak vs log L)".to_string(),
        "quadratic ≈ 2, linear ≈ 1".to_string(),
        "dashed guides: slope 2 and slope 1".to_string(),
    ];
    if dtyped {
        notes.push(format!(
            "short dashes, hollow: {} (mixed precision)",
            gs[1..]
                .iter()
                .map(|g| g.key.dtype.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let drawn: Vec<&Row> = series
        .iter()
        .flat_map(|s| s.group.variant_rows(&s.variant))
        .collect();
    notes.extend(data::untrusted_notes(&drawn));
    let all_peers: Vec<&Row> = peers.iter().flatten().copied().collect();
    notes.extend(peer_notes(&all_peers, "dashed with diamonds"));
    legend(&f.legend, &entries, &notes)
}

/// One densebench series: solid with filled markers, or in the bf16 style (`alt`).
fn line<DB, X, Y>(
    chart: &mut Chart<'_, DB, X, Y>,
    variant: &str,
    pts: &[(f64, f64)],
    alt: bool,
    size: i32,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    if alt {
        return bf16_series(chart, variant, pts, size);
    }
    let c = rgb(variant);
    chart.draw_series(LineSeries::new(pts.to_vec(), c.stroke_width(2)))?;
    markers(chart, pts, shape_of(variant), c, size)
}

/// The footer of the memory-vs-depth figure: its groups' rows not ok (each naming its dtype
/// when the figure draws two), then the peer rows not drawn and why.
pub(super) fn footer(gs: &[&Group]) -> Vec<String> {
    let dtyped = gs.len() > 1;
    let notes: Vec<String> = gs
        .iter()
        .flat_map(|g| g.skipped.iter())
        .map(|r| {
            if dtyped {
                data::skipped_note_dtyped(r)
            } else {
                data::skipped_note(r)
            }
        })
        .collect();
    let mut footer = skipped_footer(notes);
    for g in gs {
        for (p, n) in g.drawable_peers().1 {
            footer.push(if dtyped {
                let name = peer_label(&p.variant);
                n.replacen(&name, &format!("{name} {}", p.dtype), 1)
            } else {
                n
            });
        }
    }
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

/// Where a slope guide's label is written, from the guide's end (pixels), and its anchor: right
/// of the end, centred on it; or, where the panel's top cut the guide (`cut`), right of the end
/// and just below the top. The guide rises to its end from the lower left, so either place is
/// clear of it (below-left of a cut end, the guide ran through the label's `²`).
fn guide_label_at(cut: bool) -> ((i32, i32), Pos) {
    if cut {
        ((6, 2), Pos::new(HPos::Left, VPos::Top))
    } else {
        ((6, 0), Pos::new(HPos::Left, VPos::Center))
    }
}

#[cfg(test)]
mod tests {
    use super::guide_label_at;
    use crate::outputs::plots::style::crosses;
    use plotters::style::text_anchor::{HPos, VPos};

    /// Defect: the `∝ L²` label of a guide cut by the log panel's top was written below-left of
    /// the guide's end, where the guide itself runs: the dashes crossed the label. Now no guide
    /// rising to its end, at any steepness, passes through its label's box.
    #[test]
    fn guide_labels_stay_off_their_guides() {
        let end = (500, 100);
        let (w, h) = (36, 15);
        for cut in [true, false] {
            let ((dx, dy), pos) = guide_label_at(cut);
            let (x, y) = (end.0 + dx, end.1 + dy);
            let (x0, x1) = match pos.h_pos {
                HPos::Left => (x, x + w),
                HPos::Right => (x - w, x),
                HPos::Center => (x - w / 2, x + w / 2),
            };
            let (y0, y1) = match pos.v_pos {
                VPos::Top => (y, y + h),
                VPos::Bottom => (y - h, y),
                VPos::Center => (y - h / 2, y + h / 2),
            };
            // pixel slopes of a slope-1 or slope-2 guide on panels of any aspect
            for slope in [0.3, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0] {
                let start = (end.0 - 300, end.1 + (300.0 * slope) as i32);
                assert!(
                    !crosses((start, end), (x0, y0, x1, y1)),
                    "cut {cut}, slope {slope}: the guide crosses its label"
                );
            }
        }
    }
}
