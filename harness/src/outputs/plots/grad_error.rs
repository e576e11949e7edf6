//! Figure 6, `grad-error-<family>`: the worst relative gradient error of each row, log scale.

use super::data::{self};
use super::style::*;
use super::FamilyKey;
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Figure 6: the worst relative gradient error of each row, per variant, log scale; exact
/// zeros drawn at a floor one decade below the smallest non-zero error. `rows` are of one
/// family, dtype and math mode (`fam`), which the title and subtitle name: an f32 error and an
/// f64 one are never one series.
pub fn grad_error<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    fam: &FamilyKey,
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
        .filter(|&e| e > 0.0 && e.is_finite())
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
        .filter(|e| e.is_finite())
        .fold(floor * 10.0, f64::max);
    // A NaN or infinite error has no place on the axis: such rows are drawn at its right edge,
    // as the failures they are (never at the floor, where "bitwise equal" is).
    let off_scale = max_err * 2.0;
    let x_of = |r: &Row| match r.max_rel_err {
        Some(e) if e.is_finite() => e.max(floor),
        _ => off_scale,
    };
    let non_finite = checked
        .iter()
        .filter(|r| r.max_rel_err.is_some_and(|e| !e.is_finite()))
        .count();
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
    if non_finite > 0 {
        footer.push(format!(
            "{non_finite} row(s) with a NaN or infinite error: drawn at the right edge, as failures"
        ));
    }
    if unchecked > 0 {
        footer.push(format!(
            "{unchecked} ok row(s) have no gradient check (empty max_rel_err) and are not drawn"
        ));
    }
    let f = frame(
        root,
        &format!("Gradient error vs {reference} — {}", fam.label()),
        &format!(
            "{} rows · {} · {} rows checked: {} within tolerance, {bitwise} bitwise equal",
            fam.dtype,
            devices_of(&checked),
            checked.len(),
            checked.len() - bad
        ),
        &footer,
    )?;
    let order = data::variant_order(checked.iter().map(|r| r.variant.as_str()));
    // CPU and GPU rows on one figure: the GPU's points hollow, each side's worst in the legend
    let mixed = mixes_cpu_and_gpu(&checked);
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
    let x_label = move |v: &f64| err_tick(*v, floor);
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
        let good: Vec<(f64, f64, bool)> = vr
            .iter()
            .enumerate()
            .filter(|(_, r)| r.grad_ok != Some(false))
            .map(|(i, r)| (x_of(r), spread(i), on_gpu(r)))
            .collect();
        let fail: Vec<(f64, f64)> = vr
            .iter()
            .enumerate()
            .filter(|(_, r)| r.grad_ok == Some(false))
            .map(|(i, r)| (x_of(r), spread(i)))
            .collect();
        device_markers(&mut chart, &good, shape_of(v), rgb(v), 5, mixed)?;
        markers(&mut chart, &fail, Shape::Cross, RED, 6)?;
        let label = device_label(v, &vr, |r| on_gpu(r), mixed, worst_of);
        entries.push(Entry::variant(v, label, false));
    }
    if bad > 0 {
        entries.push(Entry {
            label: "outside tolerance (grad_ok false)".to_string(),
            color: RED,
            shape: Some(Shape::Cross),
            line: false,
            dashed: false,
            bf16: false,
        });
    }
    let mut notes = vec![
        "one point per row (config, depth,".to_string(),
        " device, threads);".to_string(),
        "worst over output, input grad,".to_string(),
        "parameter grads, running stats".to_string(),
        format!("0 (bitwise equal) drawn at {floor:.0e}"),
    ];
    if mixed {
        notes.push(DEVICE_FILL_NOTE.to_string());
    }
    legend(&f.legend, &entries, &notes)
}

/// A tick label of the error axis: `0` at the floor (bitwise equal), `2e-3`, `5e-1`, and from
/// 1 on a plain number (`1`, `2`, not `1e0`, `2e0`).
fn err_tick(v: f64, floor: f64) -> String {
    if v <= floor * 1.001 {
        "0".to_string()
    } else if v >= 1.0 {
        tick(&v)
    } else {
        format!("{v:.0e}")
    }
}

/// The worst error of `rows` for the legend: `≤ 4.8e-2`, `0 (bitwise equal)`, or `NaN or inf`.
fn worst_of(rows: &[&&&Row]) -> String {
    if rows
        .iter()
        .any(|r| r.max_rel_err.is_some_and(|e| !e.is_finite()))
    {
        return "NaN or inf".to_string();
    }
    let worst = rows
        .iter()
        .filter_map(|r| r.max_rel_err)
        .fold(0.0, f64::max);
    if worst == 0.0 {
        "0 (bitwise equal)".to_string()
    } else {
        format!("≤ {worst:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::err_tick;

    /// Defect: errors of 1 and above were labelled `1e0`, `2e0` on the bf16 figure's axis
    /// (`grad-error-bc-bf16`); now `1`, `2`, beside `5e-1` and the floor's `0`.
    #[test]
    fn error_ticks_read_as_numbers() {
        assert_eq!(err_tick(1e-2, 1e-2), "0");
        assert_eq!(err_tick(2e-2, 1e-2), "2e-2");
        assert_eq!(err_tick(0.5, 1e-2), "5e-1");
        assert_eq!(err_tick(1.0, 1e-2), "1");
        assert_eq!(err_tick(2.0, 1e-2), "2");
        assert_eq!(err_tick(10.0, 1e-2), "10");
    }
}
