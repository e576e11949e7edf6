//! Figure 5, `measured-vs-predicted-<family>`: measured against the model's predicted peak.

use super::data::{self, mib};
use super::style::*;
use super::FamilyKey;
use crate::results::row::Row;
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;

/// Figure 5: measured peak against the analytic prediction, log–log, with y = x and ±5%; `rows`
/// are of one family, dtype and math mode (`fam`), which the title and subtitle name.
pub fn measured_vs_predicted<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    fam: &FamilyKey,
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
    // Rows below the model's scale are drawn but not counted (impls::model::MODEL_MIN_PEAK_BYTES).
    let min = impls::model::MODEL_MIN_PEAK_BYTES;
    let (counted, small): (Vec<&Row>, Vec<&Row>) = rows
        .iter()
        .copied()
        .partition(|r| r.peak_bytes.unwrap_or(0) >= min);
    let within = counted
        .iter()
        .filter(|r| {
            let ratio =
                r.peak_bytes.unwrap_or(0) as f64 / r.predicted_peak_bytes.unwrap_or(1) as f64;
            (ratio - 1.0).abs() <= 0.05
        })
        .count();
    let small_note = if small.is_empty() {
        String::new()
    } else {
        format!(
            " ({} rows with peaks under {} MiB not counted: below the model's scale)",
            small.len(),
            min >> 20
        )
    };
    let f = frame(
        root,
        &format!("Measured vs predicted peak memory — {}", fam.label()),
        &format!(
            "{} rows · {} · {within} of {} rows within ±5% of the prediction{small_note}",
            fam.dtype,
            devices_of(&rows),
            counted.len()
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
            band_line(lo, hi, k).to_vec(),
            4,
            4,
            LIGHT.stroke_width(1),
        ))?;
    }
    let order = data::variant_order(rows.iter().map(|r| r.variant.as_str()));
    // CPU and GPU rows on one figure: the GPU's points hollow, each side's range in the legend
    let mixed = mixes_cpu_and_gpu(&rows);
    let mut entries = Vec::new();
    for v in &order {
        let vr: Vec<&&Row> = rows.iter().filter(|r| &r.variant == v).collect();
        let pts: Vec<(f64, f64, bool)> = vr
            .iter()
            .map(|r| {
                (
                    mib(r.predicted_peak_bytes.unwrap_or(0)),
                    mib(r.peak_bytes.unwrap_or(0)),
                    on_gpu(r),
                )
            })
            .collect();
        device_markers(&mut chart, &pts, shape_of(v), rgb(v), 5, mixed)?;
        let label = device_label(
            v,
            &pts,
            |p| p.2,
            mixed,
            |of| ratio_range(&of.iter().map(|p| (p.0, p.1)).collect::<Vec<_>>()),
        );
        entries.push(Entry::variant(v, label, false));
    }
    let mut notes = vec![
        "numbers: measured / predicted".to_string(),
        "solid: y = x; dashed: ±5%".to_string(),
        "one point per row (config, depth,".to_string(),
        " device, threads)".to_string(),
    ];
    if mixed {
        notes.push(DEVICE_FILL_NOTE.to_string());
    }
    legend(&f.legend, &entries, &notes)
}

/// The range of measured / predicted over `(predicted, measured)` points, two decimals: `1.00`,
/// or `0.98–1.03`.
fn ratio_range(pts: &[(f64, f64)]) -> String {
    let ratios: Vec<f64> = pts.iter().map(|p| p.1 / p.0).collect();
    let rlo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let rhi = ratios.iter().copied().fold(0.0, f64::max);
    if (rhi - rlo).abs() < 0.005 {
        format!("{rlo:.2}")
    } else {
        format!("{rlo:.2}–{rhi:.2}")
    }
}

/// The ±5% guide `y = k·x` cut to the square `[lo, hi]²` (both axes log): its ends on the
/// square's edge. Ends outside it were pinned to the edge by the backend, which bent the line
/// onto `y = x` at one end (a point 4% under the model read as outside −5%).
fn band_line(lo: f64, hi: f64, k: f64) -> [(f64, f64); 2] {
    let x0 = if k < 1.0 { lo / k } else { lo };
    let x1 = if k > 1.0 { hi / k } else { hi };
    [(x0, x0 * k), (x1, x1 * k)]
}

#[cfg(test)]
mod tests {
    use super::{band_line, ratio_range};

    /// CPU and GPU rows on one family figure are told apart: the GPU's points hollow (a white
    /// marker inside the coloured one), each side's range or worst error in the legend, and a
    /// note saying which is which; one device alone draws as before.
    #[test]
    fn family_figures_tell_cpu_rows_from_gpu_rows() {
        use crate::results::row::Row;
        use plotters::prelude::*;
        let row = |device: &str, measured: u64, err: f64| Row {
            variant: "cat-store-copy".into(),
            family: "bc".into(),
            dtype: "f32".into(),
            math: "ieee".into(),
            status: "ok".into(),
            device: device.into(),
            peak_bytes: Some(measured),
            predicted_peak_bytes: Some(100 << 20),
            max_rel_err: Some(err),
            grad_ok: Some(true),
            reference: "autograd/f64".into(),
            ..Row::default()
        };
        super::super::register_font().expect("the embedded font");
        let (cpu, gpu) = (row("cpu", 98 << 20, 3e-2), row("cuda:0", 100 << 20, 5e-2));
        let fam = super::super::FamilyKey {
            family: "bc".into(),
            dtype: "f32".into(),
            math: "ieee".into(),
            execution: "eager".into(),
        };
        let draw = |rows: &[&Row]| {
            let mut svgs = Vec::new();
            for grad in [false, true] {
                let mut svg = String::new();
                {
                    let root = SVGBackend::with_string(&mut svg, (1280, 800)).into_drawing_area();
                    if grad {
                        super::super::grad_error::grad_error(&root, &fam, rows).unwrap();
                    } else {
                        super::measured_vs_predicted(&root, &fam, rows).unwrap();
                    }
                    root.present().unwrap();
                }
                svgs.push(svg);
            }
            svgs
        };
        let mixed = draw(&[&cpu, &gpu]);
        assert!(
            mixed[0].contains("cat-store-copy  CPU 0.98, GPU 1.00"),
            "{}",
            mixed[0]
        );
        assert!(mixed[1].contains("cat-store-copy  CPU ≤ 3.0e-2, GPU ≤ 5.0e-2"));
        let white = |svg: &str| svg.matches("fill=\"#FFFFFF\"").count();
        for (one, both) in draw(&[&cpu]).iter().zip(&mixed) {
            assert!(both.contains(super::super::style::DEVICE_FILL_NOTE));
            assert!(!one.contains(super::super::style::DEVICE_FILL_NOTE));
            // the GPU point's white inside
            assert!(
                white(both) > white(one),
                "{} vs {}",
                white(both),
                white(one)
            );
        }
    }

    #[test]
    fn ratio_ranges_read_as_the_legend_says() {
        assert_eq!(ratio_range(&[(100.0, 100.0), (10.0, 10.001)]), "1.00");
        assert_eq!(ratio_range(&[(100.0, 98.0), (10.0, 10.3)]), "0.98–1.03");
    }

    /// Both ends of each guide lie inside the square and on `y = k·x`: parallel to `y = x` on log
    /// axes, never pinned to a corner.
    #[test]
    fn band_lines_stay_parallel_inside_the_square() {
        let (lo, hi) = (10.0, 10_000.0);
        for k in [0.95, 1.05] {
            for (x, y) in band_line(lo, hi, k) {
                assert!(
                    (lo..=hi).contains(&x) && (lo..=hi).contains(&y),
                    "{k}: ({x}, {y})"
                );
                assert!((y / x - k).abs() < 1e-12, "{k}: ({x}, {y})");
            }
        }
        assert_eq!(band_line(lo, hi, 0.95)[1], (hi, hi * 0.95));
        assert_eq!(band_line(lo, hi, 1.05)[0], (lo, lo * 1.05));
    }
}
