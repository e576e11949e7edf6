//! Figure 3, `memory-vs-time-<config>-L<depth>`: each variant a point (time, peak memory), the
//! Pareto front of densebench's variants marked; the PyTorch peer's comparable rows as diamonds
//! joined by dashed lines (in each configuration, eager or compiled, contiguous or `channels_last`,
//! its naive block to its memory-saving one), outside the front; labels kept off each other and
//! off the markers.
//! Ratios and the front are taken only among rows at one thread count (naive's, else the
//! commonest): a row at another is drawn, named in the footer, and set against none. A row
//! whose gradients are out of tolerance or unchecked is drawn, marked `†`, and never on the
//! front.

use super::data::{self, incomparable, mib, ms, pareto_front, peer_label, Group, NAIVE};
use super::style::*;
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::collections::BTreeMap;

/// Figure 3: peak memory against median time at one depth; the Pareto front ringed, joined
/// and labelled.
pub fn memory_vs_time<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    g: &Group,
    depth: usize,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let rows = drawn_rows(g, depth);
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (ms(r.median_ns.unwrap_or(0)), mib(r.peak_bytes.unwrap_or(0))))
        .collect();
    // The front among the rows at the base thread count only (indices into `rows`).
    let base = base_threads(g, depth, &rows);
    // ... and only among rows whose gradients are within tolerance: a wrong row is no option
    let compared: Vec<usize> = (0..rows.len())
        .filter(|&i| Some(rows[i].threads) == base && data::trusted(rows[i]))
        .collect();
    let cpts: Vec<(f64, f64)> = compared.iter().map(|&i| pts[i]).collect();
    let front: Vec<usize> = pareto_front(&cpts)
        .into_iter()
        .map(|i| compared[i])
        .collect();
    let (drawable, _) = g.drawable_peers();
    let mut peer_rows: Vec<&Row> = drawable
        .into_iter()
        .filter(|r| r.depth == depth)
        .filter(|r| matches!((r.peak_bytes, r.median_ns), (Some(p), Some(t)) if p > 0 && t > 0))
        .collect();
    let order = g.peer_variants();
    peer_rows.sort_by_key(|r| order.iter().position(|v| *v == r.variant));
    let peer_pts: Vec<(f64, f64)> = peer_rows
        .iter()
        .map(|r| (ms(r.median_ns.unwrap_or(0)), mib(r.peak_bytes.unwrap_or(0))))
        .collect();
    let f = frame(
        root,
        &format!("Memory vs time — {} L={depth}", g.label),
        &format!(
            "{} · each variant one point; lower-left is better",
            g.device_label
        ),
        &footer(g, depth),
    )?;
    let span = |sel: fn(&(f64, f64)) -> f64| {
        let all = || pts.iter().chain(peer_pts.iter());
        let lo = all().map(sel).fold(f64::INFINITY, f64::min);
        let hi = all().map(sel).fold(0.0, f64::max);
        if lo.is_finite() && lo > 0.0 {
            (lo, hi)
        } else {
            (1.0, 1.0)
        }
    };
    let (xmin, xmax) = span(|p| p.0);
    let (ymin, ymax) = span(|p| p.1);
    let (log_x, log_y) = (xmax / xmin > LOG_SPREAD, ymax / ymin > LOG_SPREAD);
    // Linear time is zoomed to the data (the differences are what matter); linear memory starts
    // at zero so its ratios read off the axis.
    let x_lin = padded(xmin, xmax, 0.12);
    let (x_lo, x_hi) = (xmin / 1.3, xmax * 1.3);
    let y_lin = from_zero(0.0, ymax * 1.05);
    let (y_lo, y_hi) = (ymin / 1.3, ymax * 1.3);
    let x_desc = if log_x {
        "median step time (ms, log scale)"
    } else {
        "median step time (ms)"
    };
    let y_desc = if log_y {
        "peak memory (MiB, log scale)"
    } else {
        "peak memory (MiB)"
    };
    // Where a point sits along the x axis (0 left, 1 right), for placing its label.
    let xfrac = move |x: f64| {
        if log_x {
            (x / x_lo).ln() / (x_hi / x_lo).ln()
        } else {
            (x - x_lin.start) / (x_lin.end - x_lin.start)
        }
    };
    let body = Scatter {
        rows: &rows,
        pts: &pts,
        front: &front,
        peers: &peer_rows,
        peer_pts: &peer_pts,
        x_desc,
        y_desc,
        xfrac: &xfrac,
    };
    let builder = || {
        let mut b = ChartBuilder::on(&f.plot);
        b.margin(20).x_label_area_size(55).y_label_area_size(85);
        b
    };
    let x_log = || {
        (x_lo..x_hi)
            .log_scale()
            .with_key_points(log_ticks(x_lo, x_hi))
    };
    let y_log = || {
        (y_lo..y_hi)
            .log_scale()
            .with_key_points(log_ticks(y_lo, y_hi))
    };
    match (log_x, log_y) {
        (false, false) => body.draw(&mut builder().build_cartesian_2d(x_lin.clone(), y_lin)?)?,
        (true, false) => body.draw(&mut builder().build_cartesian_2d(x_log(), y_lin)?)?,
        (false, true) => body.draw(&mut builder().build_cartesian_2d(x_lin.clone(), y_log())?)?,
        (true, true) => body.draw(&mut builder().build_cartesian_2d(x_log(), y_log())?)?,
    }
    let naive = rows
        .iter()
        .find(|r| r.variant == NAIVE && Some(r.threads) == base);
    let mut entries = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let mut label = r.variant.clone();
        if Some(r.threads) != base {
            label = format!("{label}  ({} thr.)", r.threads);
        } else if let (Some(n), Some(p), Some(t)) = (naive, r.peak_bytes, r.median_ns) {
            if let (Some(np), Some(nt)) = (n.peak_bytes, n.median_ns) {
                if np > 0 && nt > 0 {
                    label = format!(
                        "{label}  {:.2}× / {:.2}×",
                        p as f64 / np as f64,
                        t as f64 / nt as f64
                    );
                }
            }
        }
        if front.contains(&i) {
            label.push_str("  *");
        }
        let label = data::marked(label, &[r]);
        entries.push(Entry::variant(&r.variant, label, false));
    }
    let line_heads: Vec<&str> = data::peer_lines(peer_rows.iter().map(|r| r.variant.as_str()))
        .into_iter()
        .filter(|l| l.len() > 1)
        .map(|l| peer_rows[l[0]].variant.as_str())
        .collect();
    for p in &peer_rows {
        let extra = match (naive, p.peak_bytes, p.median_ns) {
            (Some(n), Some(pp), Some(pt)) if incomparable(n, p).is_none() => {
                match (n.peak_bytes, n.median_ns) {
                    (Some(np), Some(nt)) if np > 0 && nt > 0 => format!(
                        "  {:.2}× / {:.2}×",
                        pp as f64 / np as f64,
                        pt as f64 / nt as f64
                    ),
                    _ => String::new(),
                }
            }
            _ => String::new(),
        };
        let mut e = Entry::peer(&p.variant, &extra, &peer_rows);
        // the line is drawn in its naive block's colour: only that entry shows it
        e.line = line_heads.contains(&p.variant.as_str());
        entries.push(e);
    }
    let mut notes = vec![
        format!("ratios: peak / time vs {NAIVE}"),
        "* ringed, dashed: Pareto front".to_string(),
        "(no other variant is both faster".to_string(),
        " and smaller)".to_string(),
    ];
    if rows.iter().any(|r| Some(r.threads) != base) {
        notes.push("(n thr.): at another thread count:".to_string());
        notes.push("  no ratios, not on the front".to_string());
    }
    let untrusted = data::untrusted_notes(&rows);
    if !untrusted.is_empty() {
        notes.extend(untrusted);
        notes.push("  and not on the front".to_string());
    }
    notes.extend(peer_notes(&peer_rows, "diamonds, dashed"));
    if !line_heads.is_empty() {
        notes.push("(dashed: its naive block to its".to_string());
        notes.push(" memory-saving one, per layout)".to_string());
    }
    if !peer_rows.is_empty() {
        notes.push("(PyTorch is not on the front)".to_string());
    }
    legend(&f.legend, &entries, &notes)
}

/// densebench's rows with a point at `depth` (a peak and a time), in variant order.
fn drawn_rows(g: &Group, depth: usize) -> Vec<&Row> {
    g.at_depth(depth)
        .into_iter()
        .filter(|r| matches!((r.peak_bytes, r.median_ns), (Some(p), Some(t)) if p > 0 && t > 0))
        .collect()
}

/// The thread count the front and the ratios are taken at: that of the naive row at `depth`
/// (every ratio is to it), else the one of the most drawn `rows` (the fewer threads on a tie).
fn base_threads(g: &Group, depth: usize, rows: &[&Row]) -> Option<usize> {
    if let Some(n) = g.row(NAIVE, depth) {
        return Some(n.threads);
    }
    let mut counts: BTreeMap<usize, usize> = BTreeMap::new();
    for r in rows {
        *counts.entry(r.threads).or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(t, n)| (n, std::cmp::Reverse(t)))
        .map(|(t, _)| t)
}

/// The footer of the memory-vs-time figure at `depth`: its rows not ok, the peer rows not drawn,
/// the ok rows without a point, and the rows at another thread count than the base, which are
/// drawn but set against nothing.
pub(super) fn footer(g: &Group, depth: usize) -> Vec<String> {
    let (_, left_out) = g.drawable_peers();
    let skipped: Vec<String> = g
        .skipped
        .iter()
        .filter(|r| r.depth == depth)
        .map(data::skipped_note)
        .collect();
    let mut footer = skipped_footer(skipped);
    footer.extend(
        left_out
            .into_iter()
            .filter(|(r, _)| r.depth == depth)
            .map(|(_, n)| n),
    );
    // ok rows that have no point (no time or no peak): said, not silently absent
    let unplotted: Vec<String> = g
        .at_depth(depth)
        .into_iter()
        .filter(|r| !matches!((r.peak_bytes, r.median_ns), (Some(p), Some(t)) if p > 0 && t > 0))
        .map(|r| format!("`{}`", r.variant))
        .collect();
    if !unplotted.is_empty() {
        footer.push(format!(
            "not drawn: {} (ok, but no measured time or peak){}",
            unplotted.join(", "),
            if unplotted.iter().any(|v| v == &format!("`{NAIVE}`")) {
                "; no ratios to it"
            } else {
                ""
            }
        ));
    }
    let rows = drawn_rows(g, depth);
    if let Some(base) = base_threads(g, depth, &rows) {
        let others: Vec<String> = rows
            .iter()
            .filter(|r| r.threads != base)
            .map(|r| format!("`{}` ({} threads)", r.variant, r.threads))
            .collect();
        if !others.is_empty() {
            let whose = if g.row(NAIVE, depth).is_some() {
                format!("`{NAIVE}`'s")
            } else {
                "most rows'".to_string()
            };
            footer.push(format!(
                "not compared: {} (not at {whose} {base} thread{}): drawn, but no ratios, not on \
                 the Pareto front",
                others.join(", "),
                if base == 1 { "" } else { "s" }
            ));
        }
    }
    footer
}

/// The points, front and labels of the memory/time figure, drawn on linear or log axes.
struct Scatter<'a> {
    rows: &'a [&'a Row],
    pts: &'a [(f64, f64)],
    front: &'a [usize],
    /// The PyTorch peer's rows at this depth, in the peer order, and their points.
    peers: &'a [&'a Row],
    peer_pts: &'a [(f64, f64)],
    x_desc: &'a str,
    y_desc: &'a str,
    xfrac: &'a dyn Fn(f64) -> f64,
}

impl Scatter<'_> {
    fn draw<DB, X, Y>(&self, chart: &mut Chart<'_, DB, X, Y>) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
        X: Ranged<ValueType = f64> + ValueFormatter<f64>,
        Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
    {
        chart
            .configure_mesh()
            .x_desc(self.x_desc)
            .y_desc(self.y_desc)
            .axis_desc_style(font(AXIS_PT))
            .label_style(font(LABEL_PT))
            .x_label_formatter(&tick)
            .y_label_formatter(&tick)
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        let (pts, front) = (self.pts, self.front);
        // The front as a staircase: each step holds memory until the next, cheaper point.
        let mut stair = Vec::new();
        for (n, &i) in front.iter().enumerate() {
            if n > 0 {
                stair.push((pts[i].0, pts[front[n - 1]].1));
            }
            stair.push(pts[i]);
        }
        chart.draw_series(DashedLineSeries::new(
            stair.clone(),
            8,
            5,
            BLACK.stroke_width(1),
        ))?;
        for (i, r) in self.rows.iter().enumerate() {
            markers(chart, &pts[i..=i], shape_of(&r.variant), rgb(&r.variant), 7)?;
        }
        // PyTorch's own trade-offs: in each of its configurations (eager or compiled,
        // contiguous or channels_last), its naive block to its memory-saving one; never a line
        // from one configuration to another.
        let peer_lines = data::peer_lines(self.peers.iter().map(|r| r.variant.as_str()));
        for line in &peer_lines {
            if line.len() > 1 {
                chart.draw_series(DashedLineSeries::new(
                    line.iter().map(|&i| self.peer_pts[i]).collect::<Vec<_>>(),
                    PEER_DASH.0,
                    PEER_DASH.1,
                    rgb(&self.peers[line[0]].variant).stroke_width(2),
                ))?;
            }
        }
        // Labels right of their point, or left of it in the right third of the axis, placed
        // so that none overlaps another or a marker (style::place_labels): the peer's first,
        // then the front's.
        let area = chart.plotting_area().strip_coord_spec();
        let size_of = |text: &str, style: &TextStyle| -> (i32, i32) {
            area.estimate_text_size(text, style)
                .map(|(w, h)| (w as i32, h as i32))
                .unwrap_or((8 * text.len() as i32, 14))
        };
        let label_style = |hpos: HPos| font(LABEL_PT).pos(Pos::new(hpos, VPos::Center));
        let mut taken: Vec<LabelBox> = pts
            .iter()
            .chain(self.peer_pts)
            .map(|p| marker_box(chart.backend_coord(p)))
            .collect();
        let (xr, yr) = chart.plotting_area().get_pixel_range();
        let plot: LabelBox = (xr.start, yr.start, xr.end, yr.end);
        // the drawn lines, which no label should be written over: the front's staircase and
        // the peer's lines
        let px = |p: &(f64, f64)| chart.backend_coord(p);
        let mut lines: Vec<Segment> = stair.windows(2).map(|w| (px(&w[0]), px(&w[1]))).collect();
        for line in &peer_lines {
            lines.extend(
                line.windows(2)
                    .map(|w| (px(&self.peer_pts[w[0]]), px(&self.peer_pts[w[1]]))),
            );
        }
        let peer_anchors: Vec<(i32, i32)> = self
            .peer_pts
            .iter()
            .map(|p| chart.backend_coord(p))
            .collect();
        let peer_texts: Vec<String> = self.peers.iter().map(|p| peer_label(&p.variant)).collect();
        let peer_sizes: Vec<(i32, i32)> = peer_texts
            .iter()
            .map(|t| size_of(t, &label_style(HPos::Left)))
            .collect();
        let peer_left: Vec<bool> = self
            .peer_pts
            .iter()
            .map(|p| (self.xfrac)(p.0) > 0.66)
            .collect();
        let peer_places =
            place_labels(&peer_anchors, &peer_sizes, &peer_left, &taken, &lines, plot);
        for (k, (p, &pt)) in self.peers.iter().zip(self.peer_pts).enumerate() {
            markers(chart, &[pt], shape_of(&p.variant), rgb(&p.variant), 8)?;
            let (offset, to_left) = peer_places[k];
            let hpos = if to_left { HPos::Right } else { HPos::Left };
            let color = rgb(&p.variant);
            taken.push(label_box(peer_anchors[k], offset, to_left, peer_sizes[k]));
            chart.draw_series(std::iter::once(
                EmptyElement::at(pt)
                    + Text::new(
                        peer_texts[k].clone(),
                        offset,
                        label_style(hpos).color(&color),
                    ),
            ))?;
        }
        let anchors: Vec<(i32, i32)> = front
            .iter()
            .map(|&i| chart.backend_coord(&pts[i]))
            .collect();
        let sizes: Vec<(i32, i32)> = front
            .iter()
            .map(|&i| size_of(&self.rows[i].variant, &label_style(HPos::Left)))
            .collect();
        let left: Vec<bool> = front
            .iter()
            .map(|&i| (self.xfrac)(pts[i].0) > 0.66)
            .collect();
        let places = place_labels(&anchors, &sizes, &left, &taken, &lines, plot);
        for (&i, &(offset, to_left)) in front.iter().zip(&places) {
            let hpos = if to_left { HPos::Right } else { HPos::Left };
            let p = pts[i];
            chart.draw_series(std::iter::once(Circle::new(p, 12, BLACK.stroke_width(2))))?;
            chart.draw_series(std::iter::once(
                EmptyElement::at(p)
                    + Text::new(self.rows[i].variant.clone(), offset, label_style(hpos)),
            ))?;
        }
        Ok(())
    }
}
