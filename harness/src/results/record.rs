//! One result row: its identity columns from the job, the analytic columns from the model and
//! the measured ones from the isolated child ([`measure_row`], the whole pipeline of one row,
//! shared by `run`, `bench-all` and the sweep runner), rerun when the child was killed or
//! crashed and the user asked for retries ([`measure_row_retrying`]).

use crate::measure::child::{self, Outcome};
use crate::measure::device::{DeviceOps, DeviceSpec};
use crate::measure::estimates;
use crate::measure::reference::Cache;
use crate::plan::job::{git_rev, key, Settings, VERSION};
use crate::results::row::{Row, DENSEBENCH, SCHEMA_VERSION};
use anyhow::Result;
use impls::{Config, Variant};

/// The row of `variant` on `cfg` with every identity column filled and no measurement yet
/// (status `error`, "not measured", until the measurement fills it in).
pub fn identity_row(variant: Variant, cfg: &Config, s: &Settings) -> Row {
    Row {
        schema: SCHEMA_VERSION,
        key: key(variant, cfg, s.device),
        variant: variant.name(),
        family: cfg.family.name().to_string(),
        batch: cfg.batch,
        channels: cfg.channels,
        growth: cfg.growth,
        depth: cfg.depth,
        bn_size: cfg.bn_size,
        size: cfg.size,
        activation: cfg.activation,
        dtype: cfg.dtype.as_str().to_string(),
        seed: cfg.seed,
        device: s.device.to_string(),
        device_desc: s.device.describe(s.threads),
        threads: if s.device == DeviceSpec::Cpu {
            s.threads
        } else {
            0
        },
        densebench_version: VERSION.to_string(),
        git_rev: git_rev().to_string(),
        timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        status: "error".to_string(),
        error: "not measured".to_string(),
        steps: s.steps,
        warmup: s.warmup,
        framework: DENSEBENCH.to_string(),
        framework_version: VERSION.to_string(),
        math: "ieee".to_string(),
        ..Row::default()
    }
}

/// Measures `variant` on `cfg` under `s` and returns its complete row, whatever happens to the
/// child: failures become the row's status. Errs only when no child can be started at all.
pub fn measure_row(variant: Variant, cfg: &Config, s: &Settings, refs: &mut Cache) -> Result<Row> {
    let mut row = identity_row(variant, cfg, s);
    row.declared_saved_bytes = estimates::declared_saved_bytes(variant, cfg);
    row.predicted_peak_bytes =
        estimates::predicted_peak_bytes(variant, cfg, s.device == DeviceSpec::Cpu);
    row.flops = estimates::flops(cfg);
    row.machine_gflops = if s.device == DeviceSpec::Cpu {
        estimates::machine_gflops(cfg.dtype)
    } else {
        None
    };
    if let Err(e) = s.device.check_available() {
        row.error = e.to_string();
        return Ok(row);
    }
    let reference = refs.get(cfg, s)?;
    let mut args = child::flags(variant, cfg, s);
    if let Ok(r) = &reference {
        args.extend([
            "--reference".to_string(),
            r.path.display().to_string(),
            "--reference-variant".to_string(),
            r.variant.name(),
        ]);
    }
    let outcome = child::spawn(&args, s)?;
    row.status = outcome.status().to_string();
    row.error = match &outcome {
        Outcome::Ok(stdout) => {
            let tolerance = fill(&mut row, stdout)?;
            match (&reference, row.grad_ok) {
                (Err(why), _) => {
                    row.status = "error".to_string();
                    format!("measured, but unchecked: {why}")
                }
                (Ok(_), Some(false)) => format!(
                    "gradients differ from {}: max_rel_err {:e} > tolerance {:e}",
                    row.reference,
                    row.max_rel_err.unwrap_or(f64::NAN),
                    tolerance.unwrap_or(f64::NAN)
                ),
                _ => String::new(),
            }
        }
        Outcome::Oom(m) | Outcome::Killed(m) | Outcome::Crashed(m) => m.clone(),
        Outcome::Timeout(t) => format!("killed after the {} s time limit", t.as_secs()),
        Outcome::Error(m) => m.clone(),
    };
    // A NaN or infinite error is never within tolerance, whatever the child concluded.
    if row.has_non_finite_error() {
        row.grad_ok = Some(false);
    }
    // One line per cell: a message with newlines would still be valid CSV, but not greppable.
    row.error = row.error.replace(['\n', '\r'], " | ");
    Ok(row)
}

/// [`measure_row`], rerun up to `retries` times while its status is one of
/// [`child::RETRIED_STATUSES`] (`killed`, `crashed`: the next run may well end otherwise).
/// `on_retry(row, n)` is told before rerun `n` (from 1) with the row that failed. A row that
/// still fails says how many times it ran.
pub fn measure_row_retrying(
    variant: Variant,
    cfg: &Config,
    s: &Settings,
    refs: &mut Cache,
    retries: usize,
    on_retry: &mut dyn FnMut(&Row, usize),
) -> Result<Row> {
    let mut attempt = 0;
    loop {
        let mut row = measure_row(variant, cfg, s, refs)?;
        if !child::RETRIED_STATUSES.contains(&row.status.as_str()) {
            return Ok(row);
        }
        if attempt == retries {
            if retries > 0 {
                row.error = format!("{} (ran {} times)", row.error, retries + 1);
            }
            return Ok(row);
        }
        attempt += 1;
        on_retry(&row, attempt);
    }
}

/// Copies the child's measurement into the row; returns the gradient tolerance applied.
fn fill(row: &mut Row, stdout: &str) -> Result<Option<f64>> {
    let m = child::parse_measurement(stdout)?;
    // CPU threads are what a CPU row ran with; a GPU row's compute is the GPU's (0, documented).
    row.threads = if row.device == DeviceSpec::Cpu.to_string() {
        m.threads
    } else {
        0
    };
    row.baseline_bytes = Some(m.baseline_bytes);
    row.peak_bytes = Some(m.peak_bytes);
    row.saved_bytes = Some(m.saved_bytes);
    row.peak_rss_bytes = m.peak_rss_bytes;
    row.fwd_median_ns = Some(m.forward.median_ns);
    row.fwd_min_ns = Some(m.forward.min_ns);
    row.fwd_max_ns = Some(m.forward.max_ns);
    row.bwd_median_ns = Some(m.backward.median_ns);
    row.bwd_min_ns = Some(m.backward.min_ns);
    row.bwd_max_ns = Some(m.backward.max_ns);
    row.median_ns = Some(m.total.median_ns);
    row.min_ns = Some(m.total.min_ns);
    row.max_ns = Some(m.total.max_ns);
    row.gflops_per_s = estimates::gflops_per_s(row.flops, row.median_ns);
    row.timeline = m.timeline;
    if let Some(w) = m.warning {
        // No schema column for it: the device description carries it, next to the device.
        row.device_desc = format!("{} [warning: {w}]", row.device_desc);
    }
    let tolerance = m.errors.as_ref().map(|e| e.tolerance);
    if let Some(e) = m.errors {
        row.reference = e.reference;
        row.max_abs_err = Some(e.max_abs);
        row.max_rel_err = Some(e.max_rel);
        row.output_max_abs_err = Some(e.output_max_abs);
        row.grad_input_max_abs_err = Some(e.grad_input_max_abs);
        row.grad_params_max_abs_err = Some(e.grad_params_max_abs);
        row.running_max_abs_err = Some(e.running_max_abs);
        row.bitwise_equal = Some(e.bitwise_equal);
        row.grad_ok = Some(e.grad_ok);
    }
    row.tolerance = tolerance;
    Ok(tolerance)
}
