//! The bc layer's 3×3 convolution (forward + both gradients) on DenseNet-BC-100's shapes
//! (N=64, 32×32, B=48, k=12): the CPU's direct kernel against the tap-stack path, alternated
//! A B A B so a loaded machine slows both alike. Prints process CPU seconds (user + system, from
//! /proc/self/stat) and wall seconds per repetition. A benchmark, not a test:
//! `RAYON_NUM_THREADS=1 cargo run --release -p densebench-impls --example conv3x3_timing [REPS]`.

use candle_core::{Device, Tensor};
use impls::{maths, Config};
use std::time::Instant;

/// utime + stime of this process in seconds (fields 14 and 15 of /proc/self/stat, in ticks of
/// 1/100 s on Linux).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn main() -> impls::error::Result<()> {
    let reps: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(5);
    let cfg = Config {
        batch: 64,
        size: 32,
        ..Config::bc100_block()
    };
    let (b, k, m) = (cfg.bottleneck(), cfg.growth, cfg.m());
    let dev = Device::Cpu;
    let s = Tensor::randn(0f32, 1.0, (b, m), &dev)?;
    let gy = Tensor::randn(0f32, 1.0, (k, m), &dev)?;
    let w = Tensor::randn(0f32, 0.1, (k, b, 3, 3), &dev)?;
    type Pass = fn(&Config, &Tensor, &Tensor, &Tensor) -> impls::error::Result<()>;
    let direct: Pass = |c, s, gy, w| {
        maths::conv3x3_fwd(c, s, w)?;
        maths::conv3x3_bwd(c, gy, s, w)?;
        Ok(())
    };
    let stack: Pass = |c, s, gy, w| {
        maths::conv3x3_fwd_tap_stack(c, s, w)?;
        maths::conv3x3_bwd_tap_stack(c, gy, s, w)?;
        Ok(())
    };
    let mut rows: Vec<(&str, Vec<(f64, f64)>)> = vec![("direct", vec![]), ("tap-stack", vec![])];
    for rep in 0..=reps {
        for (name, f) in [("direct", direct), ("tap-stack", stack)] {
            let (c0, t0) = (cpu_seconds(), Instant::now());
            f(&cfg, &s, &gy, &w)?;
            let (cpu, wall) = (cpu_seconds() - c0, t0.elapsed().as_secs_f64());
            if rep > 0 {
                let row = rows.iter_mut().find(|r| r.0 == name);
                if let Some(r) = row {
                    r.1.push((cpu, wall));
                }
            }
        }
    }
    for (name, mut v) in rows {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        let cpu: Vec<String> = v.iter().map(|x| format!("{:.3}", x.0)).collect();
        let mut wall: Vec<f64> = v.iter().map(|x| x.1).collect();
        wall.sort_by(f64::total_cmp);
        println!(
            "{name:10} cpu s sorted {:?}  median wall {:.3} s",
            cpu,
            wall[wall.len() / 2]
        );
    }
    Ok(())
}
