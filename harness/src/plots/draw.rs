//! Drawing the six figures with plotters, generic over the backend (SVG or PNG): a shared frame
//! (title, subtitle, legend panel on the right, footer notes) and one function per figure.

use super::data::{
    self, fmt_num, mib, ms, pareto_front, variant_exponent, variant_rgb, Group, NAIVE,
};
use crate::row::Row;
use anyhow::{Context, Result};
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Canvas size in pixels, the same for every figure and both formats.
pub const SIZE: (u32, u32) = (1280, 800);
/// Width of the legend panel at the right of every figure.
const LEGEND_W: u32 = 360;
/// Height of the title block (title and subtitle).
const HEAD_H: u32 = 76;
/// Height of one footer line.
const FOOT_LINE_H: u32 = 20;
/// At most this many footer lines, then "… and n more".
const FOOT_MAX: usize = 4;
/// Height of one legend entry.
const LEGEND_ROW_H: i32 = 26;
const FONT: &str = "sans-serif";
const TITLE_PT: f64 = 24.0;
const SUBTITLE_PT: f64 = 16.0;
const LABEL_PT: f64 = 15.0;
const AXIS_PT: f64 = 17.0;
const LEGEND_PT: f64 = 15.0;
const NOTE_PT: f64 = 14.0;
const GREY: RGBColor = RGBColor(90, 90, 90);
const LIGHT: RGBColor = RGBColor(150, 150, 150);

fn font(pt: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, pt).into_font())
}

/// An axis tick label: whole numbers without decimals, others with `fmt_num`'s precision.
fn tick(v: &f64) -> String {
    if v.abs() >= 1.0 && (v - v.round()).abs() < 1e-9 * v.abs() {
        return format!("{v:.0}");
    }
    let s = fmt_num(*v);
    if s.contains('.') && !s.contains('e') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

fn rgb(variant: &str) -> RGBColor {
    let (r, g, b) = variant_rgb(variant);
    RGBColor(r, g, b)
}

/// Marker shapes: squares for autograd, triangles for in-place ReLU, circles for the rest.
#[derive(Clone, Copy)]
enum Shape {
    Circle,
    Triangle,
    Square,
    Cross,
}

fn shape_of(variant: &str) -> Shape {
    if variant == "autograd" {
        Shape::Square
    } else if variant.ends_with("-inplace") {
        Shape::Triangle
    } else {
        Shape::Circle
    }
}

/// One legend row: a line and/or a marker in the variant's colour, then the label.
struct Entry {
    label: String,
    color: RGBColor,
    shape: Option<Shape>,
    line: bool,
}

impl Entry {
    fn variant(v: &str, label: String, line: bool) -> Self {
        Self {
            label,
            color: rgb(v),
            shape: Some(shape_of(v)),
            line,
        }
    }
}

/// The drawing areas of one figure's frame.
struct Frame<DB: DrawingBackend> {
    plot: DrawingArea<DB, Shift>,
    legend: DrawingArea<DB, Shift>,
}

/// Fills the canvas, writes the title and subtitle, the footer notes at the bottom, and splits
/// the rest into the plot (left) and the legend panel (right).
fn frame<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
    footer: &[String],
) -> Result<Frame<DB>>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE)?;
    let (w, h) = root.dim_in_pixel();
    let (head, body) = root.split_vertically(HEAD_H);
    let centre = Pos::new(HPos::Center, VPos::Top);
    head.draw_text(title, &font(TITLE_PT).pos(centre), (w as i32 / 2, 12))?;
    head.draw_text(
        subtitle,
        &font(SUBTITLE_PT).color(&GREY).pos(centre),
        (w as i32 / 2, 46),
    )?;
    let mut lines: Vec<String> = footer.iter().take(FOOT_MAX).cloned().collect();
    if footer.len() > FOOT_MAX {
        lines.push(format!("… and {} more", footer.len() - FOOT_MAX));
    }
    let foot_h = if lines.is_empty() {
        0
    } else {
        lines.len() as u32 * FOOT_LINE_H + 12
    };
    let (body, foot) = body.split_vertically(h - HEAD_H - foot_h);
    let left = Pos::new(HPos::Left, VPos::Top);
    for (i, line) in lines.iter().enumerate() {
        foot.draw_text(
            line,
            &font(NOTE_PT).color(&GREY).pos(left),
            (24, 4 + (i as u32 * FOOT_LINE_H) as i32),
        )?;
    }
    let (plot, legend) = body.split_horizontally(w - LEGEND_W);
    Ok(Frame { plot, legend })
}

/// Draws the legend entries from the top of the panel, then the notes below them.
fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[Entry],
    notes: &[String],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let mid = Pos::new(HPos::Left, VPos::Center);
    let mut y = 30;
    for e in entries {
        if e.line {
            area.draw(&PathElement::new(
                vec![(8, y), (40, y)],
                e.color.stroke_width(2),
            ))?;
        }
        if let Some(shape) = e.shape {
            pixel_marker(area, (24, y), shape, e.color, 5)?;
        }
        area.draw_text(&e.label, &font(LEGEND_PT).pos(mid), (50, y))?;
        y += LEGEND_ROW_H;
    }
    y += 8;
    for n in notes {
        area.draw_text(n, &font(NOTE_PT).color(&GREY).pos(mid), (8, y))?;
        y += LEGEND_ROW_H - 6;
    }
    Ok(())
}

/// One marker at a pixel position of a plain drawing area (the legend).
fn pixel_marker<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    at: (i32, i32),
    shape: Shape,
    color: RGBColor,
    size: i32,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    match shape {
        Shape::Circle => area.draw(&Circle::new(at, size, color.filled()))?,
        Shape::Triangle => area.draw(&TriangleMarker::new(at, size + 1, color.filled()))?,
        Shape::Square => area.draw(&Rectangle::new(
            [(at.0 - size, at.1 - size), (at.0 + size, at.1 + size)],
            color.filled(),
        ))?,
        Shape::Cross => area.draw(&Cross::new(at, size, color.stroke_width(2)))?,
    }
    Ok(())
}

type Chart<'a, DB, X, Y> = ChartContext<'a, DB, Cartesian2d<X, Y>>;

/// Markers of one shape at data positions.
fn markers<DB, X, Y>(
    chart: &mut Chart<'_, DB, X, Y>,
    pts: &[(f64, f64)],
    shape: Shape,
    color: RGBColor,
    size: i32,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let style = color.filled();
    match shape {
        Shape::Circle => {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, size, style)))?;
        }
        Shape::Triangle => {
            chart.draw_series(pts.iter().map(|&p| TriangleMarker::new(p, size + 1, style)))?;
        }
        Shape::Square => {
            chart.draw_series(pts.iter().map(|&p| {
                EmptyElement::at(p) + Rectangle::new([(-size, -size), (size, size)], style)
            }))?;
        }
        Shape::Cross => {
            chart.draw_series(
                pts.iter()
                    .map(|&p| Cross::new(p, size + 1, color.stroke_width(3))),
            )?;
        }
    }
    Ok(())
}

/// A linear f64 axis with its ticks exactly at given values (e.g. the measured depths).
/// plotters' `with_key_points` on a plain f64 range loses the ability to format labels, so this
/// is the few lines it takes to do it directly.
struct Ticked {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
}

impl Ranged for Ticked {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let (lo, hi) = (self.range.start, self.range.end);
        let frac = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
        limit.0 + (f64::from(limit.1 - limit.0) * frac).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            Vec::new()
        } else {
            self.ticks.clone()
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }
}

/// A linear range around `lo..hi` with `pad` of its width on each side (never empty).
fn padded(lo: f64, hi: f64, pad: f64) -> std::ops::Range<f64> {
    let w = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    (lo - w * pad)..(hi + w * pad)
}

/// A range from zero (or below, for negative values) to just above the maximum.
fn from_zero(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let hi = if hi > 0.0 { hi } else { 1.0 };
    let lo = lo.min(0.0);
    (lo - (hi - lo) * 0.02)..(hi + (hi - lo) * 0.08)
}

fn skipped_footer(notes: Vec<String>) -> Vec<String> {
    if notes.is_empty() {
        return notes;
    }
    let mut out = vec![format!(
        "Not plotted ({} row(s) with status other than ok):",
        notes.len()
    )];
    out.extend(notes.into_iter().map(|n| format!("  {n}")));
    out
}

/// Tick positions for a log axis: 1, 2 and 5 times each power of ten inside `lo..hi` (only
/// the powers of ten when that gives more than a dozen, every integer multiple when it gives
/// fewer than three).
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = |mults: &[f64]| -> Vec<f64> {
        let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (e0..=e1)
            .flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect()
    };
    let t = decades(&[1.0, 2.0, 5.0]);
    if t.len() > 12 {
        decades(&[1.0])
    } else if t.len() < 3 {
        decades(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    } else {
        t
    }
}

/// Figure 1: peak memory against depth, one line per variant, with the fitted growth exponent;
/// linear axes on the left (Pleiss et al.'s figure), log–log on the right, where the slope is
/// the exponent and dashed guides show slope 2 and slope 1.
pub fn memory_vs_depth<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, g: &Group) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let f = frame(
        root,
        &format!("Peak memory vs depth — {}", g.label),
        &format!(
            "{} · one training step, allocator peak above baseline",
            g.device_label
        ),
        &skipped_footer(g.skipped_notes()),
    )?;
    let depths = g.depths();
    let ticks: Vec<f64> = depths.iter().map(|&d| d as f64).collect();
    let dmin = depths.first().copied().unwrap_or(1) as f64;
    let dmax = depths.last().copied().unwrap_or(1) as f64;
    let peaks: Vec<f64> = g.ok.iter().filter_map(|r| r.peak_bytes).map(mib).collect();
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
            let end = (dmax, y0 * (dmax / x0).powf(slope));
            // Dashes cut in log space: plotters' dashed series interpolates in data space,
            // which bends a power law on log axes.
            let at = |t: f64| {
                let x = x0 * (dmax / x0).powf(t);
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
            log.draw_series(std::iter::once(
                EmptyElement::at(end)
                    + Text::new(
                        label,
                        (6, 0),
                        font(LABEL_PT)
                            .color(&GREY)
                            .pos(Pos::new(HPos::Left, VPos::Center)),
                    ),
            ))?;
        }
    }
    let entries: Vec<Entry> = series
        .iter()
        .map(|(v, _)| {
            let label = match variant_exponent(g, v) {
                Some(p) => format!("{v}  p = {p:.2}"),
                None => v.clone(),
            };
            Entry::variant(v, label, true)
        })
        .collect();
    legend(
        &f.legend,
        &entries,
        &[
            "p: fitted growth exponent, peak ∝ L^p".to_string(),
            "(least squares on log peak vs log L)".to_string(),
            "quadratic ≈ 2, linear ≈ 1".to_string(),
            "dashed guides: slope 2 and slope 1".to_string(),
        ],
    )
}

/// Segments of a guide line on log axes (every other one drawn).
const GUIDE_DASHES: usize = 31;

/// Figure 2: median step time against depth with min–max whiskers; the time axis on a log
/// scale when the times spread over more than [`LOG_SPREAD`]×.
pub fn time_vs_depth<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, g: &Group) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let steps = g.ok.first().map(|r| r.steps).unwrap_or(0);
    let f = frame(
        root,
        &format!("Step time vs depth — {}", g.label),
        &format!(
            "{} · forward + backward, {steps} timed steps",
            g.device_label
        ),
        &skipped_footer(g.skipped_notes()),
    )?;
    let depths = g.depths();
    let dmin = depths.first().copied().unwrap_or(1) as f64;
    let dmax = depths.last().copied().unwrap_or(1) as f64;
    let times: Vec<f64> =
        g.ok.iter()
            .flat_map(|r| [r.min_ns, r.median_ns, r.max_ns])
            .flatten()
            .filter(|&t| t > 0)
            .map(ms)
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
    } else {
        let mut chart = builder().build_cartesian_2d(x(), from_zero(0.0, ymax))?;
        time_series(&mut chart, g, "step time (ms)")?;
    }
    // Legend: each variant's time relative to naive at the deepest depth both have.
    let entries: Vec<Entry> = g
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
    legend(
        &f.legend,
        &entries,
        &[
            "points: median step time".to_string(),
            "whiskers: min–max over the timed steps".to_string(),
            format!("×: median time relative to {NAIVE}"),
            "(variants nudged sideways to stay apart)".to_string(),
        ],
    )
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

/// Above this max/min spread an axis of the memory/time figure is drawn on a log scale, so an
/// outlier (typically `autograd`) does not squeeze every other variant into one corner.
const LOG_SPREAD: f64 = 4.0;

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
    let rows: Vec<&Row> = g
        .at_depth(depth)
        .into_iter()
        .filter(|r| matches!((r.peak_bytes, r.median_ns), (Some(p), Some(t)) if p > 0 && t > 0))
        .collect();
    let pts: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (ms(r.median_ns.unwrap_or(0)), mib(r.peak_bytes.unwrap_or(0))))
        .collect();
    let front = pareto_front(&pts);
    let skipped: Vec<String> = g
        .skipped
        .iter()
        .filter(|r| r.depth == depth)
        .map(data::skipped_note)
        .collect();
    let f = frame(
        root,
        &format!("Memory vs time — {} L={depth}", g.label),
        &format!(
            "{} · each variant one point; lower-left is better",
            g.device_label
        ),
        &skipped_footer(skipped),
    )?;
    let span = |sel: fn(&(f64, f64)) -> f64| {
        let lo = pts.iter().map(sel).fold(f64::INFINITY, f64::min);
        let hi = pts.iter().map(sel).fold(0.0, f64::max);
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
    let naive = rows.iter().find(|r| r.variant == NAIVE);
    let mut entries = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        let mut label = r.variant.clone();
        if let (Some(n), Some(p), Some(t)) = (naive, r.peak_bytes, r.median_ns) {
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
        entries.push(Entry::variant(&r.variant, label, false));
    }
    legend(
        &f.legend,
        &entries,
        &[
            format!("ratios: peak / time vs {NAIVE}"),
            "* ringed, dashed: Pareto front".to_string(),
            "(no other variant is both faster".to_string(),
            " and smaller)".to_string(),
        ],
    )
}

/// The points, front and labels of the memory/time figure, drawn on linear or log axes.
struct Scatter<'a> {
    rows: &'a [&'a Row],
    pts: &'a [(f64, f64)],
    front: &'a [usize],
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
        chart.draw_series(DashedLineSeries::new(stair, 8, 5, BLACK.stroke_width(1)))?;
        for (i, r) in self.rows.iter().enumerate() {
            markers(chart, &pts[i..=i], shape_of(&r.variant), rgb(&r.variant), 7)?;
        }
        for (n, &i) in front.iter().enumerate() {
            let p = pts[i];
            chart.draw_series(std::iter::once(Circle::new(p, 12, BLACK.stroke_width(2))))?;
            // Labels right of the point, or left of it in the right third of the axis;
            // alternate above and below so neighbours on the front do not collide.
            let (dx, hpos) = if (self.xfrac)(p.0) > 0.66 {
                (-16, HPos::Right)
            } else {
                (16, HPos::Left)
            };
            let dy = if n % 2 == 0 { -16 } else { 16 };
            let style = font(LABEL_PT).pos(Pos::new(hpos, VPos::Center));
            chart.draw_series(std::iter::once(
                EmptyElement::at(p) + Text::new(self.rows[i].variant.clone(), (dx, dy), style),
            ))?;
        }
        Ok(())
    }
}

/// Figure 4: live bytes at each layer boundary of forward then backward, one line per variant.
pub fn timeline<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    g: &Group,
    depth: usize,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let mut series = Vec::new();
    for r in g.at_depth(depth) {
        let pts = r
            .timeline_points()
            .with_context(|| format!("timeline of {} {} L={depth}", r.variant, g.label))?;
        if !pts.is_empty() {
            series.push((r, pts));
        }
    }
    let labels: Vec<String> = series
        .iter()
        .max_by_key(|(_, p)| p.len())
        .map(|(_, p)| p.iter().map(|(l, _)| l.clone()).collect())
        .unwrap_or_default();
    let n = labels.len().max(1);
    let forward = labels.iter().filter(|l| l.starts_with('f')).count();
    let lo = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|&(_, b)| b as f64 / data::MIB))
        .fold(0.0, f64::min);
    let hi = series
        .iter()
        .flat_map(|(r, p)| {
            p.iter()
                .map(|&(_, b)| b as f64 / data::MIB)
                .chain(r.peak_bytes.map(mib))
        })
        .fold(0.0, f64::max);
    let f = frame(
        root,
        &format!("Memory timeline — {} L={depth}", g.label),
        &format!(
            "{} · live bytes above baseline at each layer boundary",
            g.device_label
        ),
        &[],
    )?;
    let label_of = |v: &f64| {
        let i = v.round();
        if (v - i).abs() > 1e-6 || i < 0.0 {
            return String::new();
        }
        labels.get(i as usize).cloned().unwrap_or_default()
    };
    let mut chart = ChartBuilder::on(&f.plot)
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(85)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), from_zero(lo, hi))?;
    chart
        .configure_mesh()
        .x_desc("layer boundary: fN after layer N's forward, bN after layer N's backward")
        .y_desc("live memory (MiB)")
        .axis_desc_style(font(AXIS_PT))
        .label_style(font(LABEL_PT))
        .x_labels(n.min(24))
        .x_label_formatter(&label_of)
        .y_label_formatter(&tick)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    if forward > 0 && forward < n {
        let x = forward as f64 - 0.5;
        let yr = from_zero(lo, hi);
        let top = yr.end;
        chart.draw_series(DashedLineSeries::new(
            vec![(x, yr.start), (x, top)],
            6,
            4,
            LIGHT.stroke_width(1),
        ))?;
        chart.draw_series([
            Text::new(
                "forward ",
                (x, top),
                font(LABEL_PT)
                    .color(&GREY)
                    .pos(Pos::new(HPos::Right, VPos::Top)),
            ),
            Text::new(
                " backward",
                (x, top),
                font(LABEL_PT)
                    .color(&GREY)
                    .pos(Pos::new(HPos::Left, VPos::Top)),
            ),
        ])?;
    }
    let mut entries = Vec::new();
    for (r, p) in &series {
        let c = rgb(&r.variant);
        // Place each point at its label's position, so a timeline with fewer boundaries (e.g.
        // autograd's, forward only) still lines up with the others.
        let pts: Vec<(f64, f64)> = p
            .iter()
            .filter_map(|(l, b)| {
                let x = labels.iter().position(|m| m == l)?;
                Some((x as f64, *b as f64 / data::MIB))
            })
            .collect();
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
        markers(&mut chart, &pts, shape_of(&r.variant), c, 3)?;
        let label = match r.peak_bytes {
            Some(pk) => format!("{}  peak {} MiB", r.variant, fmt_num(mib(pk))),
            None => r.variant.clone(),
        };
        entries.push(Entry::variant(&r.variant, label, true));
    }
    legend(
        &f.legend,
        &entries,
        &[
            "peak: the step's allocator peak, which".to_string(),
            "falls inside a layer, above the".to_string(),
            "boundary values drawn here".to_string(),
        ],
    )
}

/// Devices of a set of rows, for a family-level subtitle.
fn devices_of(rows: &[&Row]) -> String {
    let mut d: Vec<String> = rows.iter().map(|r| data::device_label(r)).collect();
    d.sort();
    d.dedup();
    match d.len() {
        0 => String::new(),
        1 => d.remove(0),
        n => format!("{n} devices"),
    }
}

/// Figure 5: measured peak against the analytic prediction, log–log, with y = x and ±5%.
pub fn measured_vs_predicted<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    family: &str,
    rows: &[&Row],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let rows: Vec<&Row> = rows
        .iter()
        .copied()
        .filter(|r| {
            matches!((r.peak_bytes, r.predicted_peak_bytes), (Some(m), Some(p)) if m > 0 && p > 0)
        })
        .collect();
    let vals: Vec<f64> = rows
        .iter()
        .flat_map(|r| [r.peak_bytes, r.predicted_peak_bytes])
        .flatten()
        .map(mib)
        .collect();
    let lo = vals.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = vals.iter().copied().fold(0.0, f64::max);
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo / 1.5, hi * 1.5)
    } else {
        (0.1, 10.0)
    };
    let within = rows
        .iter()
        .filter(|r| {
            let ratio =
                r.peak_bytes.unwrap_or(0) as f64 / r.predicted_peak_bytes.unwrap_or(1) as f64;
            (ratio - 1.0).abs() <= 0.05
        })
        .count();
    let f = frame(
        root,
        &format!("Measured vs predicted peak memory — {family}"),
        &format!(
            "{} · {within} of {} rows within ±5% of the prediction",
            devices_of(&rows),
            rows.len()
        ),
        &[],
    )?;
    let mut chart = ChartBuilder::on(&f.plot)
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(85)
        .build_cartesian_2d(
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
            (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
        )?;
    chart
        .configure_mesh()
        .x_desc("predicted peak (MiB, log scale)")
        .y_desc("measured peak (MiB, log scale)")
        .axis_desc_style(font(AXIS_PT))
        .label_style(font(LABEL_PT))
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart.draw_series(LineSeries::new(
        vec![(lo, lo), (hi, hi)],
        BLACK.stroke_width(1),
    ))?;
    for k in [0.95, 1.05] {
        chart.draw_series(DashedLineSeries::new(
            vec![(lo, lo * k), (hi, hi * k)],
            4,
            4,
            LIGHT.stroke_width(1),
        ))?;
    }
    let order = data::variant_order(rows.iter().map(|r| r.variant.as_str()));
    let mut entries = Vec::new();
    for v in &order {
        let vr: Vec<&&Row> = rows.iter().filter(|r| &r.variant == v).collect();
        let pts: Vec<(f64, f64)> = vr
            .iter()
            .map(|r| {
                (
                    mib(r.predicted_peak_bytes.unwrap_or(0)),
                    mib(r.peak_bytes.unwrap_or(0)),
                )
            })
            .collect();
        markers(&mut chart, &pts, shape_of(v), rgb(v), 5)?;
        let ratios: Vec<f64> = pts.iter().map(|p| p.1 / p.0).collect();
        let rlo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let rhi = ratios.iter().copied().fold(0.0, f64::max);
        let label = if (rhi - rlo).abs() < 0.005 {
            format!("{v}  {rlo:.2}")
        } else {
            format!("{v}  {rlo:.2}–{rhi:.2}")
        };
        entries.push(Entry::variant(v, label, false));
    }
    legend(
        &f.legend,
        &entries,
        &[
            "numbers: measured / predicted".to_string(),
            "solid: y = x; dashed: ±5%".to_string(),
            "one point per config and depth".to_string(),
        ],
    )
}

/// Figure 6: the worst relative gradient error of each row, per variant, log scale; exact
/// zeros drawn at a floor one decade below the smallest non-zero error.
pub fn grad_error<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    family: &str,
    rows: &[&Row],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let checked: Vec<&Row> = rows
        .iter()
        .copied()
        .filter(|r| r.max_rel_err.is_some())
        .collect();
    let min_pos = checked
        .iter()
        .filter_map(|r| r.max_rel_err)
        .filter(|&e| e > 0.0)
        .fold(f64::INFINITY, f64::min);
    // Exact zeros have no logarithm: draw them one decade below the smallest non-zero error (or
    // at 1e-9, below any f32 rounding error, when every error is zero).
    let floor = if min_pos.is_finite() {
        10f64.powf(min_pos.log10().floor() - 1.0)
    } else {
        1e-9
    };
    let max_err = checked
        .iter()
        .filter_map(|r| r.max_rel_err)
        .fold(floor * 10.0, f64::max);
    let bad = checked.iter().filter(|r| r.grad_ok == Some(false)).count();
    let bitwise = checked
        .iter()
        .filter(|r| r.max_rel_err == Some(0.0) || r.bitwise_equal == Some(true))
        .count();
    let mut references: Vec<&str> = checked.iter().map(|r| r.reference.as_str()).collect();
    references.sort_unstable();
    references.dedup();
    let reference = if references.is_empty() {
        "the reference".to_string()
    } else {
        references.join(", ")
    };
    let unchecked = rows.len() - checked.len();
    let mut footer = Vec::new();
    if unchecked > 0 {
        footer.push(format!(
            "{unchecked} ok row(s) have no gradient check (empty max_rel_err) and are not drawn"
        ));
    }
    let f = frame(
        root,
        &format!("Gradient error vs {reference} — {family}"),
        &format!(
            "{} · {} rows checked: {} within tolerance, {bitwise} bitwise equal",
            devices_of(rows),
            checked.len(),
            checked.len() - bad
        ),
        &footer,
    )?;
    let order = data::variant_order(checked.iter().map(|r| r.variant.as_str()));
    let n = order.len().max(1);
    let names = order.clone();
    let label_of = move |v: &f64| {
        let i = v.round();
        if (v - i).abs() > 1e-6 || i < 0.0 {
            return String::new();
        }
        // Row 0 at the top: the variant order reads downwards as in the legend.
        let idx = names.len() as f64 - 1.0 - i;
        if idx < 0.0 {
            return String::new();
        }
        names.get(idx as usize).cloned().unwrap_or_default()
    };
    let x_label = move |v: &f64| {
        if *v <= floor * 1.001 {
            "0".to_string()
        } else {
            format!("{v:.0e}")
        }
    };
    let mut chart = ChartBuilder::on(&f.plot)
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(200)
        .build_cartesian_2d(
            ((floor / 2.0)..(max_err * 3.0))
                .log_scale()
                .with_key_points(log_ticks(floor, max_err * 3.0)),
            -0.5..(n as f64 - 0.5),
        )?;
    chart
        .configure_mesh()
        .x_desc("max relative error (log scale; 0 = bitwise equal)")
        .y_desc("")
        .axis_desc_style(font(AXIS_PT))
        .label_style(font(LABEL_PT))
        .y_labels(n + 1)
        .y_label_formatter(&label_of)
        .x_label_formatter(&x_label)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    chart.draw_series(DashedLineSeries::new(
        vec![(floor, -0.5), (floor, n as f64 - 0.5)],
        4,
        4,
        LIGHT.stroke_width(1),
    ))?;
    let mut entries = Vec::new();
    for (yi, v) in order.iter().enumerate() {
        let vr: Vec<&&Row> = checked.iter().filter(|r| &r.variant == v).collect();
        // Spread a variant's rows vertically (deterministically) so coincident errors stay
        // visible as separate points.
        let row_y = (n - 1 - yi) as f64;
        let step = (0.6 / vr.len().max(1) as f64).min(0.08);
        let spread = |i: usize| row_y + (i as f64 - (vr.len() as f64 - 1.0) / 2.0) * step;
        let good: Vec<(f64, f64)> = vr
            .iter()
            .enumerate()
            .filter(|(_, r)| r.grad_ok != Some(false))
            .map(|(i, r)| (r.max_rel_err.unwrap_or(0.0).max(floor), spread(i)))
            .collect();
        let fail: Vec<(f64, f64)> = vr
            .iter()
            .enumerate()
            .filter(|(_, r)| r.grad_ok == Some(false))
            .map(|(i, r)| (r.max_rel_err.unwrap_or(0.0).max(floor), spread(i)))
            .collect();
        markers(&mut chart, &good, shape_of(v), rgb(v), 5)?;
        markers(&mut chart, &fail, Shape::Cross, RED, 6)?;
        let worst = vr.iter().filter_map(|r| r.max_rel_err).fold(0.0, f64::max);
        let label = if worst == 0.0 {
            format!("{v}  0 (bitwise equal)")
        } else {
            format!("{v}  ≤ {worst:.1e}")
        };
        entries.push(Entry::variant(v, label, false));
    }
    if bad > 0 {
        entries.push(Entry {
            label: "outside tolerance (grad_ok false)".to_string(),
            color: RED,
            shape: Some(Shape::Cross),
            line: false,
        });
    }
    legend(
        &f.legend,
        &entries,
        &[
            "one point per config and depth;".to_string(),
            "worst over output, input grad,".to_string(),
            "parameter grads, running stats".to_string(),
            format!("0 (bitwise equal) drawn at {floor:.0e}"),
        ],
    )
}
