//! PLACEHOLDER (being written): sweeps.
use anyhow::Result;
use std::process::ExitCode;
#[derive(clap::Args)]
pub struct Args {}
impl Args {
    pub fn default_sweep() -> Self {
        Args {}
    }
}
pub fn run(_a: Args) -> Result<ExitCode> {
    anyhow::bail!("bench-all: not implemented yet")
}
