//! PLACEHOLDER (being written): compare subcommand.
use anyhow::Result;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_a: Args) -> Result<ExitCode> {
    anyhow::bail!("compare: not implemented yet")
}
