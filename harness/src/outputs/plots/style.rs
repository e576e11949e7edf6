//! What every figure shares, written once: canvas size, fonts, colours and marker shapes per
//! variant (and the PyTorch peer's dashed style), the frame (title, subtitle, legend panel on the right, footer notes), tick and range
//! helpers. Each figure is its own file beside this one, generic over the backend (SVG or PNG).

use super::data::{self, fmt_num, peer_label, variant_rgb};
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Canvas size in pixels, the same for every figure and both formats.
pub const SIZE: (u32, u32) = (1280, 800);
/// Width of the legend panel at the right of every figure.
pub(super) const LEGEND_W: u32 = 360;
/// Height of the title block (title and subtitle).
pub(super) const HEAD_H: u32 = 76;
/// Height of one footer line.
pub(super) const FOOT_LINE_H: u32 = 20;
/// At most this many footer lines, then "… and n more".
pub(super) const FOOT_MAX: usize = 4;
/// Height of one legend entry.
pub(super) const LEGEND_ROW_H: i32 = 26;
pub(super) const FONT: &str = "sans-serif";
pub(super) const TITLE_PT: f64 = 24.0;
pub(super) const SUBTITLE_PT: f64 = 16.0;
pub(super) const LABEL_PT: f64 = 15.0;
pub(super) const AXIS_PT: f64 = 17.0;
pub(super) const LEGEND_PT: f64 = 15.0;
pub(super) const NOTE_PT: f64 = 14.0;
pub(super) const GREY: RGBColor = RGBColor(90, 90, 90);
pub(super) const LIGHT: RGBColor = RGBColor(150, 150, 150);

pub(super) fn font(pt: f64) -> TextStyle<'static> {
    TextStyle::from((FONT, pt).into_font())
}

/// An axis tick label: whole numbers without decimals, others with `fmt_num`'s precision.
pub(super) fn tick(v: &f64) -> String {
    // a computed grid value at zero is a rounding residue (8.67e-19), not a number to print
    if v.abs() < 1e-12 {
        return "0".to_string();
    }
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

pub(super) fn rgb(variant: &str) -> RGBColor {
    let (r, g, b) = variant_rgb(variant);
    RGBColor(r, g, b)
}

/// Marker shapes: squares for autograd, triangles for in-place ReLU, diamonds for the PyTorch
/// peer, circles for the rest.
#[derive(Clone, Copy)]
pub(super) enum Shape {
    Circle,
    Triangle,
    Square,
    Cross,
    Diamond,
}

/// Dash and gap, in pixels, of the PyTorch peer's series (densebench's are solid).
pub(super) const PEER_DASH: (u32, u32) = (10, 6);
/// Dash and gap, in pixels, of a bf16 series drawn beside f32 on one figure (memory vs depth):
/// short dashes, with hollow markers, in the variant's colour.
pub(super) const BF16_DASH: (u32, u32) = (3, 4);

pub(super) fn shape_of(variant: &str) -> Shape {
    if variant.starts_with("pytorch-") {
        Shape::Diamond
    } else if variant == "autograd" {
        Shape::Square
    } else if variant.ends_with("-inplace") {
        Shape::Triangle
    } else {
        Shape::Circle
    }
}

/// One legend row: a line (solid or dashed) and/or a marker in the variant's colour, then the
/// label.
pub(super) struct Entry {
    pub(super) label: String,
    pub(super) color: RGBColor,
    pub(super) shape: Option<Shape>,
    pub(super) line: bool,
    pub(super) dashed: bool,
    /// The bf16 style of a figure that draws bf16 beside f32: short dashes ([`BF16_DASH`]) and
    /// a hollow marker.
    pub(super) bf16: bool,
}

impl Entry {
    pub(super) fn variant(v: &str, label: String, line: bool) -> Self {
        Self {
            label,
            color: rgb(v),
            shape: Some(shape_of(v)),
            line,
            dashed: false,
            bf16: false,
        }
    }

    /// This entry in the bf16 style ([`Entry::bf16`]).
    pub(super) fn in_bf16_style(self) -> Self {
        Self { bf16: true, ..self }
    }

    /// A PyTorch peer's entry: its dashed line (always, so the style reads in the legend of a
    /// scatter too), its diamond, and `PyTorch …` before `extra`; marked `†` when any of its
    /// drawn `rows` has gradients outside tolerance or unchecked (see [`peer_notes`]).
    pub(super) fn peer(v: &str, extra: &str, rows: &[&Row]) -> Self {
        let flagged = rows
            .iter()
            .any(|r| r.variant == v && r.grad_ok != Some(true));
        Self {
            label: format!(
                "{}{extra}{}",
                peer_label(v),
                if flagged { "  †" } else { "" }
            ),
            color: rgb(v),
            shape: Some(shape_of(v)),
            line: true,
            dashed: true,
            bf16: false,
        }
    }
}

/// The legend notes of the drawn peer rows: what the dashed style means and, when an entry is
/// marked `†`, why (its numbers are drawn, but its gradients are not PyTorch's correct ones or
/// were not checked; the report's "Versus PyTorch" section says which tensor).
pub(super) fn peer_notes(rows: &[&Row], style: &str) -> Vec<String> {
    if rows.is_empty() {
        return Vec::new();
    }
    let mut notes = vec![format!("{style}: PyTorch peer")];
    if rows.iter().any(|r| r.variant.contains("channels-last")) {
        notes.push(super::data::CHANNELS_LAST_NOTE.to_string());
    }
    if rows.iter().any(|r| r.grad_ok != Some(true)) {
        notes.push("†: gradients out of tolerance or".to_string());
        notes.push("  unchecked (see the report)".to_string());
    }
    notes
}

/// A PyTorch peer's series: a dashed line through the points (cut in pixel space, so it stays
/// straight on log axes) and a diamond at each.
pub(super) fn peer_series<DB, X, Y>(
    chart: &mut Chart<'_, DB, X, Y>,
    variant: &str,
    pts: &[(f64, f64)],
    size: i32,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let c = rgb(variant);
    if pts.len() > 1 {
        chart.draw_series(DashedLineSeries::new(
            pts.to_vec(),
            PEER_DASH.0,
            PEER_DASH.1,
            c.stroke_width(2),
        ))?;
    }
    markers(chart, pts, Shape::Diamond, c, size)
}

/// A series in the bf16 style of a figure that draws bf16 beside f32: short dashes
/// ([`BF16_DASH`], cut in pixel space) and hollow markers of the variant's shape; `peer` keeps
/// the peer's longer dashes and its diamonds, hollow.
pub(super) fn bf16_series<DB, X, Y>(
    chart: &mut Chart<'_, DB, X, Y>,
    variant: &str,
    pts: &[(f64, f64)],
    size: i32,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let c = rgb(variant);
    let dash = if variant.starts_with("pytorch-") {
        PEER_DASH
    } else {
        BF16_DASH
    };
    if pts.len() > 1 {
        chart.draw_series(DashedLineSeries::new(
            pts.to_vec(),
            dash.0,
            dash.1,
            c.stroke_width(2),
        ))?;
    }
    markers(chart, pts, shape_of(variant), c, size)?;
    markers(
        chart,
        pts,
        shape_of(variant),
        WHITE,
        hollow_inner(shape_of(variant), size),
    )
}

/// The size of the white marker drawn inside a coloured one to make it hollow (a border of
/// about 2 px; a triangle's inradius is half its circumradius, so it needs one more).
fn hollow_inner(shape: Shape, size: i32) -> i32 {
    match shape {
        Shape::Triangle => (size - 3).max(1),
        _ => (size - 2).max(1),
    }
}

/// The drawing areas of one figure's frame.
pub(super) struct Frame<DB: DrawingBackend> {
    pub(super) plot: DrawingArea<DB, Shift>,
    pub(super) legend: DrawingArea<DB, Shift>,
}

/// Fills the canvas, writes the title and subtitle, the footer notes at the bottom, and splits
/// the rest into the plot (left) and the legend panel (right).
pub(super) fn frame<DB: DrawingBackend>(
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
    let lines = shown_footer(footer);
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

/// The font size of a legend label: [`LEGEND_PT`], or smaller (down to [`LEGEND_MIN_PT`]) where
/// the label would run past the panel's right edge (a long peer name such as `PyTorch
/// compiled-memory-efficient CL bf16  p = 1.02`). [`legend`] draws every label of a legend at
/// the smallest of its labels' sizes.
fn legend_pt<DB: DrawingBackend>(area: &DrawingArea<DB, Shift>, label: &str) -> Result<f64>
where
    DB::ErrorType: 'static,
{
    let room = area.dim_in_pixel().0.saturating_sub(50 + 6).max(1);
    let (w, _) = area
        .estimate_text_size(label, &font(LEGEND_PT))
        .map_err(|e| anyhow::anyhow!("measuring a legend label: {e:?}"))?;
    Ok(if w <= room {
        LEGEND_PT
    } else {
        (LEGEND_PT * room as f64 / w as f64).max(LEGEND_MIN_PT)
    })
}

/// The smallest font a legend label is shrunk to ([`legend_pt`]).
const LEGEND_MIN_PT: f64 = 11.0;

/// Draws the legend entries from the top of the panel, then the notes below them.
pub(super) fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[Entry],
    notes: &[String],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let mid = Pos::new(HPos::Left, VPos::Center);
    let row_h = legend_row_h(entries.len(), notes.len(), area.dim_in_pixel().1);
    // one size for every label: a legend whose long labels alone were shrunk read as two lists
    let mut pt = LEGEND_PT;
    for e in entries {
        pt = pt.min(legend_pt(area, &e.label)?);
    }
    let mut y = 30;
    for e in entries {
        if e.line && e.bf16 && !e.dashed {
            // Short dashes, as the bf16 series.
            for x0 in (8..40).step_by((BF16_DASH.0 + BF16_DASH.1) as usize) {
                let x1 = (x0 + BF16_DASH.0 as i32).min(40);
                area.draw(&PathElement::new(
                    vec![(x0, y), (x1, y)],
                    e.color.stroke_width(2),
                ))?;
            }
        } else if e.line && e.dashed {
            // Two dashes and a gap: the sample reads as dashed at legend size.
            for (x0, x1) in [(8, 18), (24, 34), (38, 42)] {
                area.draw(&PathElement::new(
                    vec![(x0, y), (x1, y)],
                    e.color.stroke_width(2),
                ))?;
            }
        } else if e.line {
            area.draw(&PathElement::new(
                vec![(8, y), (40, y)],
                e.color.stroke_width(2),
            ))?;
        }
        if let Some(shape) = e.shape {
            pixel_marker(area, (24, y), shape, e.color, 5)?;
            if e.bf16 {
                pixel_marker(area, (24, y), shape, WHITE, hollow_inner(shape, 5))?;
            }
        }
        area.draw_text(&e.label, &font(pt).pos(mid), (50, y))?;
        y += row_h;
    }
    y += 8;
    for n in notes {
        area.draw_text(n, &font(NOTE_PT).color(&GREY).pos(mid), (8, y))?;
        y += row_h - 6;
    }
    Ok(())
}

/// Smallest legend row that still separates two lines of legend text.
const LEGEND_ROW_MIN_H: i32 = 19;

/// The height of one legend entry: [`LEGEND_ROW_H`], or less (down to [`LEGEND_ROW_MIN_H`])
/// where `entries` and `notes` would not fit a panel `height` px tall (a memory-vs-depth figure
/// with f32 and bf16 series has twice the entries).
pub(super) fn legend_row_h(entries: usize, notes: usize, height: u32) -> i32 {
    // 30 px above the first entry, 8 between entries and notes, a note row 6 px shorter
    let fixed = 30 + 8 - 6 * notes as i32;
    let rows = (entries + notes).max(1) as i32;
    ((height as i32 - fixed) / rows).clamp(LEGEND_ROW_MIN_H, LEGEND_ROW_H)
}

/// One marker at a pixel position of a plain drawing area (the legend).
pub(super) fn pixel_marker<DB: DrawingBackend>(
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
        Shape::Diamond => area.draw(&(EmptyElement::at(at) + diamond(size, color)))?,
    }
    Ok(())
}

/// A diamond of half-width `size + 1` around the origin, for composing at a point.
fn diamond(size: i32, color: RGBColor) -> Polygon<(i32, i32)> {
    let s = size + 1;
    Polygon::new(vec![(0, -s), (s, 0), (0, s), (-s, 0)], color.filled())
}

pub(super) type Chart<'a, DB, X, Y> = ChartContext<'a, DB, Cartesian2d<X, Y>>;

/// Markers of one shape at data positions.
/// Whether a row ran on a GPU (`cuda:N`): on a figure that draws CPU and GPU rows together, its
/// marker is hollow ([`device_markers`]).
pub(super) fn on_gpu(r: &Row) -> bool {
    r.device.starts_with("cuda")
}

/// Whether `rows` hold both CPU and GPU rows: a figure of them tells the two apart by marker
/// fill ([`device_markers`]) and says so in its legend ([`DEVICE_FILL_NOTE`]).
pub(super) fn mixes_cpu_and_gpu(rows: &[&Row]) -> bool {
    rows.iter().any(|r| on_gpu(r)) && rows.iter().any(|r| !on_gpu(r))
}

/// The legend's note of a figure whose points are filled on the CPU and hollow on a GPU.
pub(super) const DEVICE_FILL_NOTE: &str = "filled: CPU rows; hollow: GPU rows";

/// A variant's legend label with `summary` of its `items` (a range, a worst error): `v  S`, or
/// where the figure mixes CPU and GPU rows (`mixed`) each side's, `v  CPU S1, GPU S2` (a side
/// without items left out).
pub(super) fn device_label<T>(
    v: &str,
    items: &[T],
    gpu: impl Fn(&T) -> bool,
    mixed: bool,
    summary: impl Fn(&[&T]) -> String,
) -> String {
    if !mixed {
        return format!("{v}  {}", summary(&items.iter().collect::<Vec<_>>()));
    }
    let sides: Vec<String> = [(false, "CPU"), (true, "GPU")]
        .into_iter()
        .filter_map(|(side, name)| {
            let of: Vec<&T> = items.iter().filter(|t| gpu(t) == side).collect();
            (!of.is_empty()).then(|| format!("{name} {}", summary(&of)))
        })
        .collect();
    format!("{v}  {}", sides.join(", "))
}

/// [`markers`] of points `(x, y, on a GPU)`: where `mixed` (the figure draws CPU and GPU rows),
/// the GPU's hollow (the variant's colour round a white inside), the CPU's filled; otherwise
/// all filled.
pub(super) fn device_markers<DB, X, Y>(
    chart: &mut Chart<'_, DB, X, Y>,
    pts: &[(f64, f64, bool)],
    shape: Shape,
    color: RGBColor,
    size: i32,
    mixed: bool,
) -> Result<()>
where
    DB: DrawingBackend,
    DB::ErrorType: 'static,
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let all: Vec<(f64, f64)> = pts.iter().map(|&(x, y, _)| (x, y)).collect();
    markers(chart, &all, shape, color, size)?;
    if mixed {
        let gpu: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.2)
            .map(|&(x, y, _)| (x, y))
            .collect();
        markers(chart, &gpu, shape, WHITE, hollow_inner(shape, size))?;
    }
    Ok(())
}

pub(super) fn markers<DB, X, Y>(
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
        Shape::Diamond => {
            chart.draw_series(
                pts.iter()
                    .map(|&p| EmptyElement::at(p) + diamond(size, color)),
            )?;
        }
    }
    Ok(())
}

/// A linear f64 axis with its ticks exactly at given values (e.g. the measured depths).
/// plotters' `with_key_points` on a plain f64 range loses the ability to format labels, so this
/// is the few lines it takes to do it directly.
pub(super) struct Ticked {
    pub(super) range: std::ops::Range<f64>,
    pub(super) ticks: Vec<f64>,
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
pub(super) fn padded(lo: f64, hi: f64, pad: f64) -> std::ops::Range<f64> {
    let w = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    (lo - w * pad)..(hi + w * pad)
}

/// A range from zero (or below, for negative values) to just above the maximum.
pub(super) fn from_zero(lo: f64, hi: f64) -> std::ops::Range<f64> {
    let hi = if hi > 0.0 { hi } else { 1.0 };
    let lo = lo.min(0.0);
    (lo - (hi - lo) * 0.02)..(hi + (hi - lo) * 0.08)
}

/// The footer lines a frame draws: the first [`FOOT_MAX`] notes, then `… and n more`.
pub(super) fn shown_footer(footer: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = footer.iter().take(FOOT_MAX).cloned().collect();
    if footer.len() > FOOT_MAX {
        lines.push(format!("… and {} more", footer.len() - FOOT_MAX));
    }
    lines
}

/// The footer line of one skipped row's note (see [`skipped_footer`]).
pub(super) fn skipped_line(note: &str) -> String {
    format!("  {note}")
}

pub(super) fn skipped_footer(notes: Vec<String>) -> Vec<String> {
    if notes.is_empty() {
        return notes;
    }
    let mut out = vec![format!(
        "Not plotted ({} row(s) with status other than ok):",
        notes.len()
    )];
    out.extend(notes.iter().map(|n| skipped_line(n)));
    out
}

/// Tick positions for a log axis: 1, 2 and 5 times each power of ten inside `lo..hi` (only
/// the powers of ten when that gives more than a dozen, every integer multiple when it gives
/// fewer than three).
pub(super) fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    // A non-finite or non-positive bound has no decades (an infinite one once asked for 2^31
    // of them, and the process ran out of memory); nor does a span beyond any real data.
    if !(lo.is_finite() && hi.is_finite() && lo > 0.0 && hi >= lo) || hi / lo > 1e60 {
        return Vec::new();
    }
    let decades = |mults: &[f64]| -> Vec<f64> {
        let (e0, e1) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (e0..=e1)
            .flat_map(|e| mults.iter().map(move |m| m * 10f64.powi(e)))
            .filter(|v| *v >= lo && *v <= hi)
            .collect()
    };
    let t = decades(&[1.0, 2.0, 5.0]);
    if t.len() > 12 {
        return decades(&[1.0]);
    }
    if t.len() >= 5 {
        return t;
    }
    // about one decade: 1-2-5 leaves too few ticks to read values off (an axis 500–14,000 ms
    // had 1000, 2000, 5000, 10000, with most points left of the first)
    let t = decades(&[1.0, 2.0, 3.0, 5.0, 7.0]);
    if t.len() < 3 {
        decades(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
    } else {
        t
    }
}

/// Above this max/min spread an axis of the memory/time figure is drawn on a log scale, so an
/// outlier (typically `autograd`) does not squeeze every other variant into one corner.
pub(super) const LOG_SPREAD: f64 = 4.0;

/// The devices of the rows a family-level figure draws, for its subtitle: `cpu: AMD EPYC, 2
/// threads`; `cpu: AMD EPYC, 1 and 2 threads` (one device, rows at two thread counts, not two
/// devices); `2 devices: cpu (AMD EPYC), cuda:0 (NVIDIA H200)` (an H100's and an H200's
/// `cuda:0` are two). Pass the drawn rows only: a device whose rows all failed
/// is no device of the figure.
pub(super) fn devices_of(rows: &[&Row]) -> String {
    // a device is its name and its model: an H100's and an H200's `cuda:0` are two
    let mut devices: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.device.as_str(), data::device_model(&r.device_desc)))
        .collect();
    devices.sort_unstable();
    devices.dedup();
    if devices.len() > 1 {
        let named: Vec<String> = devices
            .iter()
            .map(|&(d, m)| {
                if m.is_empty() {
                    d.to_string()
                } else {
                    format!("{d} ({m})")
                }
            })
            .collect();
        return format!("{} devices: {}", devices.len(), named.join(", "));
    }
    let Some(&(device, _)) = devices.first() else {
        return String::new();
    };
    let mut descs: Vec<&str> = rows
        .iter()
        .map(|r| data::bare_desc(&r.device_desc))
        .filter(|d| !d.is_empty())
        .collect();
    descs.sort_unstable();
    descs.dedup();
    let mut s = match descs.as_slice() {
        [] => device.to_string(),
        [one] => format!("{device}: {one}"),
        many => format!("{device} ({} descriptions)", many.len()),
    };
    let mut threads: Vec<usize> = rows.iter().map(|r| r.threads).filter(|&t| t > 0).collect();
    threads.sort_unstable();
    threads.dedup();
    if let Some(&last) = threads.last() {
        let list: Vec<String> = threads.iter().map(ToString::to_string).collect();
        s.push_str(&format!(
            ", {} thread{}",
            list.join(" and "),
            if threads.len() == 1 && last == 1 {
                ""
            } else {
                "s"
            }
        ));
    }
    s
}

/// A label's box in pixels: left, top, right, bottom.
pub(super) type LabelBox = (i32, i32, i32, i32);

/// Where to write a label beside each point so that no two labels overlap: for each point
/// (pixels) and its label's size (width, height), an offset from the point and whether the
/// text extends to the left (anchored at its right end, `HPos::Right`). Greedy, in order: each label takes the first of its candidate places —
/// the preferred side (`left[i]`: to the left, for points in the right part of the axis), 16 px
/// above, then below, then further out, then the other side — whose box lies inside `area` (the
/// plot's pixels), meets no box already taken (`taken`: other labels, e.g. the peer's, and the
/// markers) and is crossed by none of `lines`; failing that, the first inside and clear of
/// boxes; where none is, the first candidate.
pub(super) fn place_labels(
    points: &[(i32, i32)],
    sizes: &[(i32, i32)],
    left: &[bool],
    taken: &[LabelBox],
    lines: &[Segment],
    area: LabelBox,
) -> Vec<((i32, i32), bool)> {
    const GAP: i32 = 16;
    let mut boxes: Vec<LabelBox> = taken.to_vec();
    let mut out = Vec::with_capacity(points.len());
    for (i, (&(px, py), &(w, h))) in points.iter().zip(sizes).enumerate() {
        let sides = if left[i] {
            [true, false]
        } else {
            [false, true]
        };
        let mut candidates = Vec::new();
        for to_left in sides {
            for dy in [-GAP, GAP, -2 * GAP, 2 * GAP, 0, -3 * GAP, 3 * GAP] {
                candidates.push((to_left, dy));
            }
        }
        let box_of = |(to_left, dy): (bool, i32)| -> LabelBox {
            let (x0, x1) = if to_left {
                (px - GAP - w, px - GAP)
            } else {
                (px + GAP, px + GAP + w)
            };
            // 2 px of air above and below: text estimated to the pixel still touched
            (x0, py + dy - h / 2 - 2, x1, py + dy + h / 2 + 2)
        };
        let meets = |a: LabelBox, b: LabelBox| a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3;
        let inside = |b: LabelBox| b.0 >= area.0 && b.1 >= area.1 && b.2 <= area.2 && b.3 <= area.3;
        let clear = |c: (bool, i32)| {
            let b = box_of(c);
            inside(b) && boxes.iter().all(|&o| !meets(b, o))
        };
        // inside the plot, clear of labels, markers and lines; else of labels and markers;
        // else the first
        let chosen = candidates
            .iter()
            .copied()
            .find(|&c| clear(c) && lines.iter().all(|&l| !crosses(l, box_of(c))))
            .or_else(|| candidates.iter().copied().find(|&c| clear(c)))
            .unwrap_or(candidates[0]);
        boxes.push(box_of(chosen));
        let (to_left, dy) = chosen;
        out.push(((if to_left { -GAP } else { GAP }, dy), to_left));
    }
    out
}

/// A straight line drawn between two points (pixels), which a label should not be written over.
pub(super) type Segment = ((i32, i32), (i32, i32));

/// Whether segment `l` passes through box `b` (Liang–Barsky clipping against the box).
pub(super) fn crosses(((x0, y0), (x1, y1)): Segment, b: LabelBox) -> bool {
    let (x0, y0, dx, dy) = (
        f64::from(x0),
        f64::from(y0),
        f64::from(x1 - x0),
        f64::from(y1 - y0),
    );
    let (mut t0, mut t1) = (0.0f64, 1.0f64);
    for (p, q) in [
        (-dx, x0 - f64::from(b.0)),
        (dx, f64::from(b.2) - x0),
        (-dy, y0 - f64::from(b.1)),
        (dy, f64::from(b.3) - y0),
    ] {
        if p == 0.0 {
            if q < 0.0 {
                return false;
            }
        } else {
            let t = q / p;
            if p < 0.0 {
                t0 = t0.max(t);
            } else {
                t1 = t1.min(t);
            }
            if t0 > t1 {
                return false;
            }
        }
    }
    true
}

/// The box a marker drawn at `point` (pixels) covers, ring included (markers are 7–8 px, a
/// front's ring 12 px in radius) and a margin, for [`place_labels`] to keep labels off it.
pub(super) fn marker_box((x, y): (i32, i32)) -> LabelBox {
    // beyond the ring by a little: a label touching another point's marker reads as its label
    const R: i32 = 13;
    (x - R, y - R, x + R, y + R)
}

/// The box of a label written at `point` + `offset`, extending to the left (`to_left`) or the
/// right of there, `size` big.
pub(super) fn label_box(
    point: (i32, i32),
    offset: (i32, i32),
    to_left: bool,
    (w, h): (i32, i32),
) -> LabelBox {
    let (x, y) = (point.0 + offset.0, point.1 + offset.1);
    if to_left {
        (x - w, y - h / 2, x, y + h / 2)
    } else {
        (x, y - h / 2, x + w, y + h / 2)
    }
}

#[cfg(test)]
mod tests {
    use super::{crosses, devices_of, label_box, log_ticks, place_labels, shown_footer, tick};

    /// Two front points 20 px apart (the audit's overlapping `cat-recompute-inplace` and
    /// `buffer-recompute-inplace`): their labels get boxes that do not meet; a label keeps its
    /// preferred place when it is free; a taken box (the peer's label) is avoided too.
    #[test]
    fn front_labels_never_overlap() {
        let points = [(100, 100), (110, 120), (112, 118)];
        let sizes = [(150, 14), (170, 14), (160, 14)];
        let peer = label_box((300, 300), (16, 0), false, (120, 14));
        let placed = place_labels(&points, &sizes, &[false, false, false], &[peer], &[], AREA);
        // the first takes the first candidate: right of its point, 16 px above
        assert_eq!(placed[0], ((16, -16), false));
        let boxes: Vec<_> = placed
            .iter()
            .zip(points.iter().zip(sizes))
            .map(|(&(off, h), (&p, sz))| label_box(p, off, h, sz))
            .collect();
        for (i, a) in boxes.iter().enumerate() {
            for b in boxes[i + 1..].iter().chain([&peer]) {
                let meet = a.0 < b.2 && b.0 < a.2 && a.1 < b.3 && b.1 < a.3;
                assert!(!meet, "{a:?} meets {b:?}: {placed:?}");
            }
        }
        // the right-third side is honoured where free
        let placed = place_labels(&[(500, 100)], &[(100, 14)], &[true], &[], &[], AREA);
        assert_eq!(placed[0], ((-16, -16), true));
        // a line through the first place (a front's staircase, right of the point and 16 px up)
        // moves the label to the next free one
        let stair = ((90, 84), (400, 84));
        let placed = place_labels(&[(100, 100)], &[(100, 14)], &[false], &[], &[stair], AREA);
        assert_eq!(placed[0], ((16, 16), false));
        let b = label_box((100, 100), placed[0].0, false, (100, 14));
        assert!(!crosses(stair, b));
    }

    /// Defect: a legend drew only its labels too long for the panel smaller (`grad-error-bc`:
    /// four of nine entries at 10.4 px among 12.1 px ones), which read as two lists. Now every
    /// label of a legend has one size, the smallest any of them needs.
    #[test]
    fn legend_labels_share_one_size() {
        use super::{legend, Entry, LEGEND_W};
        use plotters::prelude::*;
        super::super::register_font().expect("the embedded font");
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (LEGEND_W, 400)).into_drawing_area();
            let entries: Vec<Entry> = [
                "cat-store-copy  CPU ≤ 8.4e-2",
                "buffer-recompute-inplace  CPU ≤ 8.4e-2, GPU ≤ 4.8e-2",
            ]
            .iter()
            .map(|l| Entry::variant("cat-store-copy", l.to_string(), false))
            .collect();
            legend(&root, &entries, &[]).unwrap();
            root.present().unwrap();
        }
        let sizes: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| t.split("font-size=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(sizes.len(), 2, "{svg}");
        assert_eq!(sizes[0], sizes[1], "{svg}");
        // the long label was shrunk to fit: the short one with it
        assert!(
            sizes[0].parse::<f64>().unwrap() < 15.0 / 1.24 - 0.1,
            "{svg}"
        );
    }

    /// The plot area of the tests: large enough for every first choice.
    const AREA: (i32, i32, i32, i32) = (0, 0, 1000, 1000);

    /// A label never leaves the plot area where a place inside is free: a point near the top
    /// whose upper places are outside gets a lower one.
    #[test]
    fn labels_stay_inside_the_plot() {
        let placed = place_labels(
            &[(100, 20)],
            &[(100, 14)],
            &[false],
            &[],
            &[],
            (0, 10, 500, 500),
        );
        let b = label_box((100, 20), placed[0].0, false, (100, 14));
        assert!(b.1 >= 10, "{b:?}");
    }

    /// Segments through, beside, into and along a box.
    #[test]
    fn crosses_tells_segments_through_a_box() {
        let b = (10, 10, 20, 20);
        assert!(crosses(((0, 15), (30, 15)), b), "straight through");
        assert!(crosses(((0, 0), (30, 30)), b), "diagonal through");
        assert!(crosses(((15, 15), (40, 40)), b), "from inside");
        assert!(!crosses(((0, 0), (30, 5)), b), "beside");
        assert!(!crosses(((0, 25), (5, 40)), b), "apart");
        assert!(!crosses(((21, 0), (21, 30)), b), "along the edge, outside");
    }
    use crate::results::row::Row;

    fn row(device: &str, desc: &str, threads: usize) -> Row {
        Row {
            device: device.to_string(),
            device_desc: desc.to_string(),
            threads,
            ..Row::default()
        }
    }

    /// One device at two thread counts is one device; two devices are named.
    #[test]
    fn devices_of_counts_devices_not_thread_counts() {
        let a = row("cpu", "AMD EPYC (1 threads)", 1);
        let b = row("cpu", "AMD EPYC (2 threads)", 2);
        assert_eq!(devices_of(&[&a, &b]), "cpu: AMD EPYC, 1 and 2 threads");
        assert_eq!(devices_of(&[&a]), "cpu: AMD EPYC, 1 thread");
        let gpu = row("cuda:0", "NVIDIA H100", 0);
        assert_eq!(devices_of(&[&gpu]), "cuda:0: NVIDIA H100");
        assert_eq!(
            devices_of(&[&a, &gpu]),
            "2 devices: cpu (AMD EPYC), cuda:0 (NVIDIA H100)"
        );
        let other = row("cuda:0", "NVIDIA H200 (sm_90, 139.8 GiB)", 0);
        assert_eq!(
            devices_of(&[&gpu, &other, &gpu]),
            "2 devices: cuda:0 (NVIDIA H100), cuda:0 (NVIDIA H200)"
        );
        assert_eq!(devices_of(&[]), "");
    }

    /// A frame draws four footer lines, then says how many more there are.
    #[test]
    fn footer_cut_after_four_lines() {
        let lines: Vec<String> = (0..6).map(|i| i.to_string()).collect();
        assert_eq!(shown_footer(&lines), ["0", "1", "2", "3", "… and 2 more"]);
        assert_eq!(shown_footer(&lines[..4]), ["0", "1", "2", "3"]);
    }

    /// A grid value at zero computed with a rounding residue prints as 0, not 8.67e-19.
    #[test]
    fn ticks_at_zero_print_zero() {
        assert_eq!(tick(&8.67e-19), "0");
        assert_eq!(tick(&-3e-17), "0");
        assert_eq!(tick(&0.0), "0");
        assert_eq!(tick(&250.0), "250");
    }

    /// Bounds that are not finite, not positive or absurdly far apart give no ticks (an
    /// infinite one used to ask for 2^31 decades and exhaust memory); ordinary ones do.
    #[test]
    fn log_ticks_refuse_bounds_without_decades() {
        for (lo, hi) in [
            (1e-9, f64::INFINITY),
            (f64::NAN, 1.0),
            (0.0, 1.0),
            (-1.0, 1.0),
            (2.0, 1.0),
            (1e-200, 1e200),
        ] {
            assert!(log_ticks(lo, hi).is_empty(), "{lo}..{hi}");
        }
        assert_eq!(
            log_ticks(1.0, 100.0),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0]
        );
        // about a decade: 1-2-3-5-7 (the CPU memory-vs-time axis 501–14,000 ms had four ticks)
        assert_eq!(
            log_ticks(501.0, 14_000.0),
            [700.0, 1000.0, 2000.0, 3000.0, 5000.0, 7000.0, 10_000.0]
        );
        assert_eq!(log_ticks(1.3, 5.9), [2.0, 3.0, 5.0]);
    }
}
