//! PLACEHOLDER (being written): step subcommand.
use anyhow::Result;
use std::process::ExitCode;
#[derive(clap::Args)]
pub struct Args {}
pub fn run(_a: Args) -> Result<ExitCode> {
    anyhow::bail!("step: not implemented yet")
}
