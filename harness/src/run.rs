//! PLACEHOLDER (being written): one isolated measurement.
use anyhow::Result;
use std::process::ExitCode;
#[derive(clap::Args)]
pub struct Args {}
#[derive(clap::Args)]
pub struct ChildArgs {}
pub fn run(_a: Args) -> Result<ExitCode> {
    anyhow::bail!("run: not implemented yet")
}
pub fn child(_a: ChildArgs) -> Result<ExitCode> {
    anyhow::bail!("child: not implemented yet")
}
