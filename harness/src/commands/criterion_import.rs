//! `densebench criterion-import`: criterion's estimates (`target/criterion`, from `cargo bench`)
//! into the companion CSV `results/criterion.csv` ([`crate::results::criterion`]).

use crate::results::criterion::{default_dir, import, write_csv};
use anyhow::Result;
use std::path::PathBuf;
use std::process::ExitCode;

/// `densebench criterion-import` arguments.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Criterion's output folder (default: $CARGO_TARGET_DIR/criterion, else target/criterion).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The CSV to write; it is rewritten on every import (it is derived from DIR).
    #[arg(long, value_name = "FILE", default_value = "results/criterion.csv")]
    pub out: PathBuf,
}

/// Runs the subcommand: import `--dir`, write `--out`, say how many rows went where.
pub fn run(a: Args) -> Result<ExitCode> {
    let dir = a.dir.unwrap_or_else(default_dir);
    let rows = import(&dir)?;
    write_csv(&rows, &a.out)?;
    crate::say!(
        "densebench criterion-import: {} benchmark(s) from {} → {}",
        rows.len(),
        dir.display(),
        a.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
