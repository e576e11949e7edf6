//! Prints every variant's max abs / rel error against the reference — `autograd` run in f64 on
//! the same case — and whether it is bitwise equal to `cat-store-copy`, for one mlp and one bc
//! config (small enough to run in seconds).
//!
//! `cargo run --release -p densebench-impls --example errors [f32|f64]`

use candle_core::Device;
use impls::check::compare::compare;
use impls::{step, Case, Config, Family, NoProbe, Spatial, Variant};

fn main() -> impls::Result<()> {
    let dtype =
        impls::config::parse_dtype(&std::env::args().nth(1).unwrap_or_else(|| "f32".into()))?;
    let mlp = Config {
        family: Family::Mlp,
        batch: 64,
        channels: 32,
        growth: 16,
        depth: 8,
        bn_size: 1,
        size: Spatial::square(1),
        activation: true,
        dtype,
        seed: 0,
    };
    let bc = Config {
        batch: 8,
        size: Spatial::square(16),
        depth: 8,
        dtype,
        ..Config::bc100_block()
    };
    let dev = Device::Cpu;
    for cfg in [mlp, bc] {
        println!("{}", cfg.describe());
        println!(
            "{:<26} {:>12} {:>12} {:>22}",
            "variant", "max_abs", "max_rel", "bitwise=cat-store-copy"
        );
        let case = Case::random(&cfg, &dev)?;
        let run = |v| {
            step(
                v,
                &cfg,
                &case.params,
                &case.input,
                &case.grad_output,
                &mut NoProbe,
            )
        };
        let reference = case.reference()?;
        let naive = run(Variant::NAIVE)?;
        for v in Variant::for_config(&cfg) {
            let r = run(v)?;
            let e = compare(&r.to_dtype(candle_core::DType::F64)?, &reference)?.overall;
            let b = compare(&r, &naive)?.overall.bitwise;
            println!(
                "{:<26} {:>12.3e} {:>12.3e} {:>22}",
                v.name(),
                e.max_abs,
                e.max_rel,
                b
            );
        }
        println!();
    }
    Ok(())
}
