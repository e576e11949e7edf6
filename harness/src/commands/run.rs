//! `densebench run`: one configuration of one variant, measured in an isolated child process
//! ([`crate::results::record::measure_row`]), printed as one result row. Exit status 0 for an
//! `ok` row within tolerance, 1 for any other row, 2 for bad input, 128 + the signal when a
//! SIGTERM, SIGINT or SIGHUP stopped it (the child is killed, no row is printed).

use crate::measure::device::{DeviceOps, DeviceSpec};
use crate::measure::estimates;
use crate::measure::interrupt;
use crate::measure::reference::{self, Cache};
use crate::plan::bounds::{self, ResultExt};
use crate::plan::job::{self, ConfigArgs, Execution, Math, Settings};
use crate::results::record::measure_row_retrying;
use crate::results::row::Row;
use anyhow::{anyhow, Context, Result};
use clap::ValueEnum;
use impls::Variant;
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
    /// Measured steps (1 to 10000): time columns are median, min and max over them.
    #[arg(long, default_value_t = 3, value_parser = bounds::flags::steps)]
    pub steps: usize,
    /// Unmeasured warm-up steps before them (settle the allocator and gemm scratch; at most
    /// 10000).
    #[arg(long, default_value_t = 1, value_parser = bounds::flags::warmup)]
    pub warmup: usize,
    /// Compute threads of the child (0: candle's default, the physical cores; at most 1024).
    #[arg(long, default_value_t = 0, value_parser = bounds::flags::threads)]
    pub threads: usize,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// f32 math of matmuls and convolutions: `ieee` (full f32) or `tf32` (TF32 tensor cores;
    /// a GPU device and f32 only). The row's `math` column; `tf32` keys end in `/tf32`.
    #[arg(long, value_enum, default_value_t = Math::Ieee)]
    pub math: Math,
    /// How the timed steps run: `eager`, or `graph` (cuda:N only: the whole step captured once
    /// as a CUDA graph and replayed; the row's `execution` column, its key ends in `/graph`).
    #[arg(long, value_enum, default_value_t = Execution::Eager)]
    pub execution: Execution,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Csv)]
    pub format: Format,
    /// Memory limit of the child in bytes (suffixes K, M, G, KiB, MiB, GiB); default 75% of RAM.
    /// At least 1 MiB.
    #[arg(long, value_parser = bounds::flags::mem_limit)]
    pub mem_limit: Option<u64>,
    /// Time limit of each child process in seconds (1 to 604800, one week).
    #[arg(long, default_value_t = job::DEFAULT_TIMEOUT_SECS, value_parser = bounds::flags::timeout)]
    pub timeout: u64,
    /// Rerun the child up to N times when it was killed by a signal densebench did not send or
    /// crashed (status `killed` or `crashed`; at most 100).
    #[arg(long, default_value_t = 0, value_name = "N", value_parser = bounds::flags::retries)]
    pub retries: usize,
    /// Reference cache directory (default: `densebench-cache` next to the executable, or
    /// $DENSEBENCH_CACHE_DIR).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
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
    interrupt::install()?;
    let cfg = a.config.to_config().bad_input()?;
    let variant = Variant::parse(&a.variant)
        .map_err(|e| anyhow!("--variant: {e}"))
        .bad_input()?;
    variant
        .check(&cfg)
        .map_err(|e| anyhow!("--variant: {e}"))
        .bad_input()?;
    let device: DeviceSpec = a.device.parse().context("--device").bad_input()?;
    device.check_available().bad_input()?;
    let math = a.math;
    math.check(device, cfg.dtype)
        .context("--math")
        .bad_input()?;
    a.execution
        .check_densebench(device)
        .context("--execution")
        .bad_input()?;
    let s = Settings {
        device,
        math,
        execution: a.execution,
        threads: job::resolve_threads(a.threads),
        steps: a.steps,
        warmup: a.warmup,
        mem_limit: a.mem_limit.or_else(job::default_mem_limit),
        timeout: Duration::from_secs(a.timeout),
    };
    // What cannot fit is refused before any child starts or anything big is allocated (on a GPU
    // the step's tensors are the device's, not under the host limit).
    if device == DeviceSpec::Cpu {
        estimates::check_fits(
            &cfg,
            estimates::min_step_bytes(&cfg),
            estimates::STEP_BYTES,
            s.mem_limit,
            "the memory limit (--mem-limit, default 75% of RAM)",
        )
        .bad_input()?;
    }
    // A cache that cannot be made or written is bad input (exit 2), as for bench-all.
    let mut refs = Cache::new(&reference::default_dir(a.cache_dir.as_deref())?).bad_input()?;
    // The wait before the row's child, said up front as bench-all says it: a reference not yet
    // cached is a child of its own first (on BC-100's block an f64 `autograd` step, ~40 s on 2
    // cores), and the row is printed only at the end.
    if let Some(v) = refs.to_compute(&cfg, &s) {
        crate::say!(
            "densebench run: computing the f64 reference of {} first ({v}; cached in {} for \
             later runs)",
            cfg.describe(),
            refs.dir().display()
        );
    }
    let mut on_retry = |failed: &Row, n: usize| {
        crate::say!(
            "densebench run: {}: {}; retrying ({n} of {})",
            failed.key,
            failed.error,
            a.retries
        );
    };
    let row = match measure_row_retrying(
        variant.into(),
        &cfg,
        &s,
        None,
        &mut refs,
        a.retries,
        &mut on_retry,
    ) {
        Ok(row) => row,
        Err(e) => match interrupt::interrupted(&e) {
            Some(stop) => {
                crate::say!("densebench run: {stop}: the child was killed; no row was printed");
                return Ok(ExitCode::from(stop.exit_status()));
            }
            None => return Err(e),
        },
    };
    print_row(&row, a.format, &mut std::io::stdout().lock())?;
    if !row.is_ok() || row.grad_ok != Some(true) {
        crate::say!(
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
