//! The hidden `child` subcommand: one measurement (or one reference step) in a fresh process,
//! spawned by `run`, `bench-all` and `max-depth`. Its arguments and protocol live with the
//! parent's side in [`crate::measure::child`], so the two cannot drift apart.

use anyhow::Result;
use std::process::ExitCode;

pub use crate::measure::child::Args;

/// The child's entry point.
pub fn run(a: Args) -> Result<ExitCode> {
    crate::measure::child::child(a)
}
