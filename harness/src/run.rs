//! `densebench run`: one configuration of one variant, measured in an isolated child process,
//! printed as one result row. [`measure_row`] is the whole pipeline for one row (reference,
//! measuring child, classification, analytic columns) and is shared with `bench-all`.

use crate::child::{self, Outcome};
use crate::device::DeviceSpec;
use crate::estimates;
use crate::job::{self, ConfigArgs, Settings};
use crate::reference::{self, Cache};
use crate::row::Row;
use anyhow::{anyhow, Context, Result};
use clap::ValueEnum;
use impls::{Config, Variant};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// How `run` prints its row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A CSV header and one row (the results/README.md schema).
    Csv,
    /// One JSON object with the same fields.
    Json,
}

/// `densebench run` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Variant name, e.g. `cat-store-copy`, `buffer-recompute-inplace`, `autograd`.
    #[arg(long)]
    pub variant: String,
    /// Measured steps: time columns are median, min and max over them.
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Unmeasured warm-up steps before them (settle the allocator and gemm scratch).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Compute threads of the child (0: candle's default, the physical cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    pub format: Format,
    /// Memory limit of the child in bytes (suffixes K, M, G, KiB, MiB, GiB); default 75% of RAM.
    #[arg(long, value_parser = job::parse_bytes)]
    pub mem_limit: Option<u64>,
    /// Time limit of each child process in seconds.
    #[arg(long, default_value_t = job::DEFAULT_TIMEOUT_SECS)]
    pub timeout: u64,
    /// Reference cache directory (default: `densebench-cache` next to the executable, or
    /// $DENSEBENCH_CACHE_DIR).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
}

/// Measures `variant` on `cfg` under `s` and returns its complete row, whatever happens to the
/// child: failures become the row's status. Errs only when no child can be started at all.
pub fn measure_row(variant: Variant, cfg: &Config, s: &Settings, refs: &mut Cache) -> Result<Row> {
    let mut row = job::identity_row(variant, cfg, s);
    row.declared_saved_bytes = estimates::declared_saved_bytes(variant, cfg);
    row.predicted_peak_bytes = estimates::predicted_peak_bytes(variant, cfg);
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
    let reference = refs.get(cfg, s);
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
        Outcome::Oom(m) => m.clone(),
        Outcome::Timeout(t) => format!("killed after the {} s time limit", t.as_secs()),
        Outcome::Error(m) => m.clone(),
    };
    // One line per cell: a message with newlines would still be valid CSV, but not greppable.
    row.error = row.error.replace(['\n', '\r'], " | ");
    Ok(row)
}

/// Copies the child's measurement into the row; returns the gradient tolerance applied.
fn fill(row: &mut Row, stdout: &str) -> Result<Option<f64>> {
    let m = child::parse_measurement(stdout)?;
    row.threads = m.threads;
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
    Ok(tolerance)
}

/// Writes one row as CSV (with header) or JSON.
pub fn print_row(row: &Row, format: Format, out: &mut impl Write) -> Result<()> {
    match format {
        Format::Csv => {
            let mut w = csv::Writer::from_writer(out);
            w.serialize(row).context("writing the CSV row")?;
            w.flush().context("writing the CSV row")?;
        }
        Format::Json => {
            serde_json::to_writer(&mut *out, row).context("writing the JSON row")?;
            writeln!(out).context("writing the JSON row")?;
        }
    }
    Ok(())
}

/// `densebench run`. Exit status 0 when the row is `ok` with gradients within tolerance, 1
/// otherwise (the row is printed either way).
pub fn run(a: Args) -> Result<ExitCode> {
    let cfg = a.config.to_config()?;
    let variant = Variant::parse(&a.variant).map_err(|e| anyhow!("--variant: {e}"))?;
    variant.check(&cfg).map_err(|e| anyhow!("--variant: {e}"))?;
    let device: DeviceSpec = a.device.parse().context("--device")?;
    device.check_available()?;
    anyhow::ensure!(a.steps >= 1, "--steps must be at least 1, got 0");
    let s = Settings {
        device,
        threads: child::resolve_threads(a.threads),
        steps: a.steps,
        warmup: a.warmup,
        mem_limit: a.mem_limit.or_else(job::default_mem_limit),
        timeout: Duration::from_secs(a.timeout),
    };
    let mut refs = Cache::new(&reference::default_dir(a.cache_dir.as_deref())?)?;
    let row = measure_row(variant, &cfg, &s, &mut refs)?;
    print_row(&row, a.format, &mut std::io::stdout().lock())?;
    if !row.is_ok() || row.grad_ok != Some(true) {
        eprintln!(
            "densebench: {}: {} {}",
            row.key,
            row.status,
            if row.error.is_empty() {
                "(no checked reference)"
            } else {
                &row.error
            }
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
