//! The gradient error of `--math tf32` rows, derived on the CPU: each variant's f32 step on the
//! GPU's path (`layer::with_tap_stack_on_cpu`), then the same step with every matrix product's
//! operands rounded to TF32 (`layer::with_tf32_emulation_on_cpu`, both roundings), each against
//! the f64 reference of the case (norm-wise relative error, `impls::check::compare`, as the harness
//! judges rows). What the tf32 tolerance (`harness::measure::step::TF32_REL_BOUND`) is derived
//! from; docs/gpu.md ("Math mode") has the table.
//!
//! `cargo run --release -p densebench-impls --example tf32_error -- PRESET DEPTH [BATCH]`
//! with PRESET one of `bc100` (N=64, C0=24, k=12, 32×32), `torchvision` (N=32, C0=64, k=32,
//! 56×56), `mlp` (N=4096, C0=256, k=64): the GPU sweep's groups (`harness/sweeps/gpu.toml`);
//! BATCH overrides N (smaller runs faster).

use candle_core::DType;
use impls::check::compare::{compare, Comparison};
use impls::layer::{with_tap_stack_on_cpu, with_tf32_emulation_on_cpu, Tf32Rounding};
use impls::{Case, Config, Family, Spatial, StepResult, Variant};

/// One way of running the step.
type Step<'a> = Box<dyn Fn() -> impls::Result<StepResult> + 'a>;

fn config(preset: &str, depth: usize, batch: Option<usize>) -> Config {
    let base = match preset {
        "bc100" => Config::bc100_block(),
        "torchvision" => Config {
            batch: 32,
            channels: 64,
            growth: 32,
            size: Spatial::square(56),
            ..Config::bc100_block()
        },
        "mlp" => Config {
            family: Family::Mlp,
            batch: 4096,
            channels: 256,
            growth: 64,
            bn_size: 1,
            size: Spatial::square(1),
            activation: true,
            ..Config::bc100_block()
        },
        other => panic!("unknown preset `{other}`: bc100, torchvision or mlp"),
    };
    Config {
        depth,
        dtype: DType::F32,
        batch: batch.unwrap_or(base.batch),
        ..base
    }
}

fn main() -> impls::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(preset), Some(depth)) = (args.first(), args.get(1)) else {
        eprintln!("usage: tf32_error PRESET DEPTH [BATCH]   (PRESET: bc100, torchvision, mlp)");
        std::process::exit(2);
    };
    let depth: usize = depth.parse().expect("DEPTH is a number");
    let batch = args.get(2).map(|b| b.parse().expect("BATCH is a number"));
    let cfg = config(preset, depth, batch);
    cfg.validate()?;
    let dev = candle_core::Device::Cpu;
    let case = Case::random(&cfg, &dev)?;
    let t0 = std::time::Instant::now();
    let reference = case.reference()?;
    eprintln!(
        "{}: f64 reference in {:.1} s",
        cfg.describe(),
        t0.elapsed().as_secs_f64()
    );
    println!("{}", cfg.describe());
    println!(
        "{:<26} {:<14} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "variant", "math", "overall", "output", "grad_in", "grad_par", "running"
    );
    // The naive variant and the leanest one (the pair of the time targets).
    let lean = match cfg.family {
        Family::Bc => "buffer-recompute-inplace",
        Family::Mlp => "buffer-store-inplace",
    };
    for v in [Variant::NAIVE, Variant::parse(lean)?] {
        let run = || case.step(v);
        let rows: [(&str, Step); 3] = [
            ("f32 (ieee)", Box::new(|| with_tap_stack_on_cpu(run))),
            (
                "tf32 nearest",
                Box::new(|| with_tf32_emulation_on_cpu(Tf32Rounding::Nearest, run)),
            ),
            (
                "tf32 truncate",
                Box::new(|| with_tf32_emulation_on_cpu(Tf32Rounding::Truncate, run)),
            ),
        ];
        for (math, f) in rows {
            let c: Comparison = compare(&f()?.to_dtype(DType::F64)?, &reference)?;
            println!(
                "{:<26} {:<14} {:>10.2e} {:>10.2e} {:>10.2e} {:>10.2e} {:>10.2e}",
                v.name(),
                math,
                c.overall.max_rel,
                c.output.max_rel,
                c.grad_input.max_rel,
                c.grad_params.max_rel,
                c.running.max_rel
            );
        }
    }
    Ok(())
}
