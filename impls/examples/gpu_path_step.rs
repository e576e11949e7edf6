//! One training step of a case file on the GPU's path, run on the CPU
//! (`layer::with_tap_stack_on_cpu`: the GPU's ops, dtypes, tap-stacked 3×3 convolution and
//! allocations, the CPU's products in place of cuBLAS), its results written as `densebench step`
//! writes them. What a GPU row's gradient error is likely to be, before a GPU is lent:
//!
//! `cargo run --release -p densebench-impls --example gpu_path_step -- CASE VARIANT OUT`
//!
//! then `python3 scripts/tensor_errors.py REFERENCE OUT [OTHER]` against the f64 reference of the
//! case (results/README.md, "Tolerance", bf16 rows).

use std::path::Path;

use impls::layer::with_tap_stack_on_cpu;
use impls::{Case, Variant};

fn main() -> impls::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [case, variant, out] = args.as_slice() else {
        eprintln!("usage: gpu_path_step CASE VARIANT OUT");
        std::process::exit(2);
    };
    let case = Case::load(Path::new(case), None, &candle_core::Device::Cpu)?;
    let variant = Variant::parse(variant)?;
    let t0 = std::time::Instant::now();
    let result = with_tap_stack_on_cpu(|| case.step(variant))?;
    impls::case::save_result(&result, Path::new(out))?;
    eprintln!(
        "{variant} on {}, the GPU's path on the CPU: {:.1} s → {out}",
        case.cfg.describe(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
