//! `densebench case`: writes the case file of a config — the exact parameters, BN state, input
//! and upstream gradient a measured row of that config runs on (built from its seed) — under
//! PyTorch `state_dict` names, so another framework (the PyTorch peer,
//! `harness/peer/pytorch_peer.py`) or `densebench step` can run the same step.

use crate::measure::estimates;
use crate::plan::bounds::ResultExt;
use crate::plan::job::{self, ConfigArgs};
use crate::results::replace::{is_safetensors, refuse_foreign, Kind};
use crate::results::store::write_atomic;
use anyhow::{anyhow, Result};
use candle_core::Device;
use impls::Case;
use std::path::PathBuf;
use std::process::ExitCode;

/// `densebench case` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// The case file to write (safetensors). An existing file is replaced (atomically) only
    /// when it is safetensors (or empty), unless --force.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out even when it is not safetensors (e.g. a result CSV).
    #[arg(long)]
    pub force: bool,
}

/// `densebench case`.
pub fn run(a: Args) -> Result<ExitCode> {
    let cfg = a.config.to_config().bad_input()?;
    let kind = Kind {
        name: "a case file (safetensors)",
        recognise: is_safetensors,
    };
    refuse_foreign(&a.out, "--out", &kind, a.force)?;
    // The case is half of a step's least footprint (its tensors, not yet their gradients).
    estimates::check_fits(
        &cfg,
        estimates::min_step_bytes(&cfg) / 2,
        estimates::CASE_BYTES,
        job::default_mem_limit(),
        "75% of this machine's RAM",
    )
    .bad_input()?;
    let case = Case::random(&cfg, &Device::Cpu)
        .map_err(|e| anyhow!("building the case of {}: {e}", cfg.describe()))?;
    write_atomic(&a.out, |tmp| {
        case.save(tmp)
            .map_err(|e| anyhow!("writing {}: {e}", a.out.display()))
    })?;
    crate::say!("densebench case: {} → {}", cfg.describe(), a.out.display());
    Ok(ExitCode::SUCCESS)
}
