//! Figure 4, `timeline-<config>-L<depth>`: live bytes through forward and backward, layer by
//! layer; the PyTorch peer's comparable rows beside them (dashed, diamonds), forward only.

use super::data::{self, fmt_num, mib, Group};
use super::style::*;
use crate::results::row::Row;
use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
    // The peer's rows measured like some densebench row of the group (threads, math), in the
    // peer order: their probe step's forward boundaries (its hooks sit on PyTorch's layers;
    // backward has none).
    let (drawable, _) = g.drawable_peers();
    let order = g.peer_variants();
    let mut peers = Vec::new();
    for r in drawable.into_iter().filter(|r| r.depth == depth) {
        let pts = r
            .timeline_points()
            .with_context(|| format!("timeline of {} {} L={depth}", r.variant, g.label))?;
        if !pts.is_empty() {
            peers.push((r, pts));
        }
    }
    peers.sort_by_key(|(r, _)| order.iter().position(|v| *v == r.variant));
    let n_own = series.len();
    series.extend(peers);
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
    let peer_rows: Vec<&Row> = series[n_own..].iter().map(|(r, _)| *r).collect();
    let mut entries = Vec::new();
    for (k, (r, p)) in series.iter().enumerate() {
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
        let peak = r
            .peak_bytes
            .map(|pk| format!("  peak {} MiB", fmt_num(mib(pk))))
            .unwrap_or_default();
        if k < n_own {
            chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
            markers(&mut chart, &pts, shape_of(&r.variant), c, 3)?;
            entries.push(Entry::variant(
                &r.variant,
                format!("{}{peak}", r.variant),
                true,
            ));
        } else {
            peer_series(&mut chart, &r.variant, &pts, 4)?;
            entries.push(Entry::peer(&r.variant, &peak, &peer_rows));
        }
    }
    let mut notes = vec![
        "peak: the step's allocator peak, which".to_string(),
        "falls inside a layer, above the".to_string(),
        "boundary values drawn here".to_string(),
    ];
    let forward_only: Vec<&str> = series[..n_own]
        .iter()
        .filter(|(_, p)| !p.iter().any(|(l, _)| l.starts_with('b')))
        .map(|(r, _)| r.variant.as_str())
        .collect();
    if !forward_only.is_empty() {
        notes.push(format!("{}: forward only (its", forward_only.join(", ")));
        notes.push(" backward is one autograd call,".to_string());
        notes.push(" no layer boundaries)".to_string());
    }
    notes.extend(peer_notes(&peer_rows, "dashed with diamonds"));
    if !peer_rows.is_empty() {
        notes.push("(forward only: its hooks are on".to_string());
        notes.push(" PyTorch's layers, backward has none)".to_string());
    }
    legend(&f.legend, &entries, &notes)
}
