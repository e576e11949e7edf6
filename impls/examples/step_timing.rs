//! One training step of a variant on DenseNet-BC-100's block (N=64, C0=24, k=12, 32×32, L=16)
//! or the forum's mlp (N=4096, C0=256, k=64, L=32), repeated in one process: process CPU seconds
//! (user + system, /proc/self/stat) and wall seconds per step, for profiling and quick A/B
//! checks without the harness's child process and reference. A benchmark, not a test:
//! `RAYON_NUM_THREADS=1 cargo run --release -p densebench-impls --example step_timing -- bc cat-store-copy 3`.

use candle_core::Device;
use impls::{step, Case, Config, Family, NoProbe, Variant};
use std::time::Instant;

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let family = args.get(1).map(String::as_str).unwrap_or("bc");
    let variant = Variant::parse(args.get(2).map(String::as_str).unwrap_or("cat-store-copy"))?;
    let steps: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(3);
    let cfg = match family {
        "mlp" => Config {
            family: Family::Mlp,
            batch: 4096,
            channels: 256,
            growth: 64,
            depth: 32,
            bn_size: 1,
            size: 1,
            activation: true,
            ..Config::bc100_block()
        },
        _ => Config {
            batch: 64,
            size: 32,
            ..Config::bc100_block()
        },
    };
    let case = Case::random(&cfg, &Device::Cpu)?;
    for i in 0..=steps {
        let (c0, t0) = (cpu_seconds(), Instant::now());
        let r = step(
            variant,
            &cfg,
            &case.params,
            &case.input,
            &case.grad_output,
            &mut NoProbe,
        )?;
        drop(r);
        let what = if i == 0 { "warm-up" } else { "step" };
        println!(
            "{what} cpu {:.2} s wall {:.2} s",
            cpu_seconds() - c0,
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
