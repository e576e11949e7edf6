//! `densebench criterion-import`: criterion's estimates (`target/criterion`, from `cargo bench`)
//! into the companion CSV `results/criterion.csv` ([`crate::results::criterion`]).

use crate::plan::bounds::ResultExt;
use crate::results::criterion::{default_dir, import, is_criterion_csv, write_csv};
use crate::results::replace::{refuse_foreign, Kind};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// `densebench criterion-import` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Criterion's output folder (default: $CARGO_TARGET_DIR/criterion, else target/criterion).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The CSV to write; it is rewritten on every import (it is derived from DIR). An existing
    /// file is replaced only when it is an earlier import (or empty), unless --force.
    #[arg(long, value_name = "FILE", default_value = "results/criterion.csv")]
    pub out: PathBuf,
    /// Replace --out even when it is not an earlier import (e.g. a result CSV).
    #[arg(long)]
    pub force: bool,
}

/// Runs the subcommand: import `--dir`, write `--out`, say how many rows went where.
pub fn run(a: Args) -> Result<ExitCode> {
    let kind = Kind {
        name: "a criterion companion CSV",
        recognise: is_criterion_csv,
    };
    refuse_foreign(&a.out, "--out", &kind, a.force)?;
    let dir = a.dir.unwrap_or_else(default_dir);
    // A folder that is missing, empty or unreadable is the input's fault: exit 2, as a missing
    // CSV is for compare, plots and report.
    let rows = import(&dir).bad_input()?;
    write_csv(&rows, &a.out)?;
    crate::say!(
        "densebench criterion-import: {} benchmark(s) from {} → {}",
        rows.len(),
        dir.display(),
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
