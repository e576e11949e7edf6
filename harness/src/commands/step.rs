//! `densebench step`: one training step of one variant on a safetensors case file (parameters
//! under PyTorch `state_dict` names, `input`, `grad_output`), its results written to a
//! safetensors result file (`output`, `grad.input`, `grad.<param>`, updated running stats), so
//! a block saved from PyTorch can be run here and its gradients compared there.

use crate::measure::device::{DeviceOps, DeviceSpec};
use crate::measure::estimates;
use crate::plan::bounds::{self, ResultExt};
use crate::plan::job::{self, Math, OnOff};
use crate::plan::target::Execution;
use crate::results::replace::{is_safetensors, refuse_foreign, Kind};
use crate::results::store::{refuse_input_as_output, write_atomic};
use anyhow::{anyhow, Context, Result};
use impls::{Case, NoProbe, Variant};
use std::path::PathBuf;
use std::process::ExitCode;

/// `densebench step` arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Case file: the block's parameters, `input` and `grad_output` (family and sizes are read
    /// from the tensors).
    #[arg(long)]
    pub case: PathBuf,
    /// Variant to run, e.g. `buffer-recompute-inplace` or `autograd`.
    #[arg(long)]
    pub variant: String,
    /// Result file to write (safetensors). An existing file is replaced (atomically) only when
    /// it is safetensors (or empty), unless --force.
    #[arg(long)]
    pub out: PathBuf,
    /// Replace --out even when it is not safetensors (e.g. a result CSV).
    #[arg(long)]
    pub force: bool,
    /// ReLU after each Linear (mlp only; the tensors cannot show it): a case file written by
    /// `densebench case` records it, and this must then agree with it; default: the file's, else
    /// on.
    #[arg(long, value_enum)]
    pub activation: Option<OnOff>,
    /// `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Memory limit in bytes (suffixes K, M, G, KiB, MiB, GiB), as for `run`; default 75% of
    /// RAM. The case file is checked from its header against it before its data are read.
    #[arg(long, value_parser = job::parse_bytes)]
    pub mem_limit: Option<u64>,
    /// Time N steps in a bare loop in this process (after --warmup unmeasured ones) and print
    /// one JSON line of their times (`median_ns`, `min_ns`, `max_ns`, `step_ns`): each step
    /// timed alone, the device synchronised before the clock stops, nothing else in the loop.
    /// The fidelity check (scripts/peer_fidelity.py) sets it against `run`'s row of the same
    /// step. The last step's results are written to --out. 1 to 10000, as `run --steps`.
    #[arg(long, value_name = "N", value_parser = bounds::flags::steps)]
    pub bare_loop: Option<usize>,
    /// Unmeasured steps before --bare-loop's (at most 10000, as `run --warmup`).
    #[arg(long, default_value_t = 1, requires = "bare_loop", value_parser = bounds::flags::warmup)]
    pub warmup: usize,
    /// f32 math of matmuls and convolutions, as `run --math`: `ieee`, or `tf32` (a GPU device
    /// and f32 only).
    #[arg(long, value_enum, default_value_t = Math::Ieee)]
    pub math: Math,
    /// How --bare-loop's steps run, as `run --execution`: `eager`, or `graph` (cuda:N only:
    /// one step captured as a CUDA graph, each timed step one replay of it).
    #[arg(long, value_enum, default_value_t = Execution::Eager, requires = "bare_loop")]
    pub execution: Execution,
}

pub fn run(a: Args) -> Result<ExitCode> {
    // Every error before the step is the user's input (exit status 2).
    refuse_input_as_output(&a.out, "--out", &[&a.case]).bad_input()?;
    let kind = Kind {
        name: "a step result file (safetensors)",
        recognise: is_safetensors,
    };
    refuse_foreign(&a.out, "--out", &kind, a.force)?;
    let variant = Variant::parse(&a.variant)
        .map_err(|e| anyhow!("--variant: {e}"))
        .bad_input()?;
    let spec: DeviceSpec = a.device.parse().context("--device").bad_input()?;
    a.execution
        .check_densebench(spec)
        .context("--execution")
        .bad_input()?;
    let device = spec.open().bad_input()?;
    let limit = a.mem_limit.or_else(job::default_mem_limit);
    let case = Case::load_with_limit(&a.case, a.activation.map(OnOff::is_on), &device, limit)
        .map_err(|e| anyhow!("{e}"))
        .bad_input()?;
    if case.cfg.family == impls::Family::Bc && a.activation == Some(OnOff::Off) {
        return Err(anyhow!(
            "--activation off applies to mlp cases only: {} is a bc block, whose layers always \
             have their BN → ReLU; leave the flag out",
            a.case.display()
        ))
        .bad_input();
    }
    variant
        .check(&case.cfg)
        .map_err(|e| anyhow!("--variant: {e}"))
        .bad_input()?;
    a.math
        .check(spec, case.cfg.dtype)
        .context("--math")
        .bad_input()?;
    crate::measure::device::set_math(a.math);
    // The case fit (checked from its header); the step's gradients must fit beside it.
    if spec == DeviceSpec::Cpu {
        estimates::check_fits(
            &case.cfg,
            estimates::min_step_bytes(&case.cfg),
            estimates::STEP_BYTES,
            limit,
            "the memory limit (--mem-limit, default 75% of RAM)",
        )
        .bad_input()?;
    }
    let step = || {
        impls::step(
            variant,
            &case.cfg,
            &case.params,
            &case.input,
            &case.grad_output,
            &mut NoProbe,
        )
        .map_err(|e| anyhow!("{variant} on {}: {e}", case.cfg.describe()))
    };
    let (result, bare) = match a.bare_loop {
        None => (step()?, None),
        Some(n) if a.execution == Execution::Graph => {
            for _ in 0..a.warmup {
                drop(step()?);
            }
            let (times, result) = graph_loop(variant, &case, &device, n)?;
            (result, Some(times))
        }
        Some(n) => {
            for _ in 0..a.warmup {
                drop(step()?);
            }
            let mut times = Vec::with_capacity(n);
            let mut last = None;
            for _ in 0..n {
                // The previous step's results are dropped before the clock starts, as the
                // harness's measured steps do.
                drop(last.take());
                crate::measure::device::synchronize(&device)?;
                let start = std::time::Instant::now();
                let r = step()?;
                crate::measure::device::synchronize(&device)?;
                times.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
                last = Some(r);
            }
            let result = last.context("no step ran")?;
            (result, Some(times))
        }
    };
    write_atomic(&a.out, |tmp| {
        impls::case::save_result(&result, tmp)
            .map_err(|e| anyhow!("writing {}: {e}", a.out.display()))
    })?;
    // A case file holds tensors, not the seed that drew them: the config's seed is a
    // placeholder, not to be printed as if it were the file's.
    let described = case.cfg.describe();
    let described = described
        .rsplit_once(" seed=")
        .map_or(described.as_str(), |(d, _)| d);
    crate::say!(
        "densebench step: {variant} on {described} → {}",
        a.out.display()
    );
    if let Some(times) = bare {
        let stats = crate::measure::step::Stats::of(&times);
        let line = serde_json::json!({
            "variant": variant.name(),
            "device": spec.to_string(),
            "math": a.math.name(),
            "execution": a.execution.name(),
            "threads": crate::measure::device::default_threads(),
            "warmup": a.warmup,
            "steps": times.len(),
            "median_ns": stats.median_ns,
            "min_ns": stats.min_ns,
            "max_ns": stats.max_ns,
            "step_ns": times,
        });
        crate::tell!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--bare-loop N --execution graph`: one step captured as a CUDA graph and replayed N times,
/// each replay timed alone (`measure::graph::replay`, what `run --execution graph` times), and
/// the last replay's results.
#[cfg(feature = "cuda")]
fn graph_loop(
    variant: Variant,
    case: &Case,
    device: &candle_core::Device,
    n: usize,
) -> Result<(Vec<u64>, impls::StepResult)> {
    let (times, replayed) = crate::measure::graph::replay(variant, case, device, n)?;
    // The results are copied out before the graph (which owns their memory) is destroyed.
    let result = replayed
        .result
        .map(candle_core::Tensor::copy, candle_core::Tensor::copy)
        .map_err(|e| anyhow!("copying the replayed results: {e}"))?;
    drop(replayed);
    Ok((times, result))
}

#[cfg(not(feature = "cuda"))]
fn graph_loop(
    _variant: Variant,
    _case: &Case,
    _device: &candle_core::Device,
    _n: usize,
) -> Result<(Vec<u64>, impls::StepResult)> {
    // `check_densebench` refused `graph` off CUDA, and only a CUDA build opens a cuda:N device.
    Err(anyhow!("--execution graph: this build has no CUDA support"))
}
