//! One training step of a variant on DenseNet-BC-100's block (N=64, C0=24, k=12, 32×32, L=16)
//! or the forum's mlp (N=4096, C0=256, k=64, L=32), repeated in one process: process CPU seconds
//! (user + system, /proc/self/stat) and wall seconds per step, for profiling and quick A/B
//! checks without the harness's child process and reference; or (`conv3x3 REPS`) the bc layer's
//! 3×3 convolution alone, direct kernel against the tap stack. A benchmark, not a test:
//! `RAYON_NUM_THREADS=1 cargo run --release -p densebench-impls --example step_timing -- bc cat-store-copy 3`
//! (a fourth argument is the dtype, `f32` by default: `-- mlp cat-store-copy 3 bf16`)
//! (or `-- conv3x3 5`, or `-- passes 5` for each pass of the direct 3×3 kernel alone, or
//! `-- cat-parts 3` for the mlp forward's products and concatenations timed apart, or
//! `-- front VARIANT REPS [L]` for a variant's step with the bc layer's front split, as the
//! schedule runs it where it pays, and whole — and, for a recomputing variant, whole with ReLU1's
//! output remade for dW1 (`memory::Schedule::defer_r`) — alternately, side by side, with the
//! model's peak of each (`defer` is the same)).
//!
//! The harness runs its children with glibc tunables that keep freed memory for reuse
//! (`harness/src/measure/child.rs`); for timings comparable with its rows, run this with them:
//! `GLIBC_TUNABLES=glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184`.
//! Without them every large tensor comes back as fresh pages the kernel zeroes, which
//! penalises whole `[C_i, M]` tensors: the split front measured 15–25% faster than the whole
//! one that way, and 3–11% slower with them while it took Conv1×1's weight gradient a channel
//! block at a time (×0.97–1.00 with them since that gradient is summed in column chunks).

use candle_core::Device;
use candle_core::Tensor;
use impls::layer;
use impls::{step, Case, Config, Event, Family, Probe, Variant};
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

/// Wall seconds from the step's start to the end of its forward pass.
struct ForwardClock(Instant, Option<f64>);
impl Probe for ForwardClock {
    fn event(&mut self, e: Event<'_>) {
        if let Event::ForwardEnd { .. } = e {
            self.1 = Some(self.0.elapsed().as_secs_f64());
        }
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let family = args.get(1).map(String::as_str).unwrap_or("bc");
    if family == "passes" {
        return Ok(passes(
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5),
        )?);
    }
    if family == "cat-parts" {
        return Ok(cat_parts(
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(3),
        )?);
    }
    if family == "front" || family == "defer" {
        let variant = Variant::parse(
            args.get(2)
                .map(String::as_str)
                .unwrap_or("buffer-recompute-inplace"),
        )?;
        let reps = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(3).max(1);
        let depth = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(16);
        return Ok(front(variant, reps, depth)?);
    }
    if family == "conv3x3" {
        return Ok(conv3x3(
            args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5),
        )?);
    }
    let variant = Variant::parse(args.get(2).map(String::as_str).unwrap_or("cat-store-copy"))?;
    let steps: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(3);
    let dtype = impls::config::parse_dtype(args.get(4).map(String::as_str).unwrap_or("f32"))?;
    let cfg = match family {
        "mlp" => Config {
            family: Family::Mlp,
            batch: 4096,
            channels: 256,
            growth: 64,
            depth: 32,
            bn_size: 1,
            size: 1.into(),
            activation: true,
            dtype,
            ..Config::bc100_block()
        },
        _ => Config {
            batch: 64,
            size: 32.into(),
            dtype,
            ..Config::bc100_block()
        },
    };
    let case = Case::random(&cfg, &Device::Cpu)?;
    for i in 0..=steps {
        let (c0, t0) = (cpu_seconds(), Instant::now());
        let mut forward = ForwardClock(t0, None);
        let r = step(
            variant,
            &cfg,
            &case.params,
            &case.input,
            &case.grad_output,
            &mut forward,
        )?;
        drop(r);
        let what = if i == 0 { "warm-up" } else { "step" };
        let wall = t0.elapsed().as_secs_f64();
        let fwd = forward.1.unwrap_or(wall);
        println!(
            "{what} cpu {:.2} s wall {wall:.2} s (forward {fwd:.3} s, backward {:.3} s)",
            cpu_seconds() - c0,
            wall - fwd
        );
    }
    Ok(())
}

/// A hand-written variant on DenseNet-BC-100's block at depth `depth`: its step with the
/// layer front split (the CPU's path), whole with r kept for dW1, and (recomputing variants)
/// whole with r remade (`block::step_manual`'s `defer_r`), alternately after one unmeasured
/// step of each: wall seconds per step, the ratios of the medians to the split's, and the
/// model's peak of each (bitwise the same results, which the tests check).
fn front(variant: Variant, reps: usize, depth: usize) -> impls::error::Result<()> {
    let Variant::Manual(strategy) = variant else {
        println!("front: a hand-written variant, not {variant}");
        return Ok(());
    };
    let cfg = Config {
        batch: 64,
        size: 32.into(),
        depth,
        ..Config::bc100_block()
    };
    let case = Case::random(&cfg, &Device::Cpu)?;
    let recompute = strategy.intermediates == impls::Intermediates::Recompute;
    // (name, whole front, defer_r)
    let mut arms = vec![("split", false, false), ("whole, r kept", true, false)];
    if recompute {
        arms.push(("whole, r remade", true, true));
    }
    let mut times = vec![Vec::new(); arms.len()];
    for rep in 0..=reps {
        for (slot, &(_, whole, defer_r)) in arms.iter().enumerate() {
            let run = || case.step_manual(strategy, defer_r);
            let t = Instant::now();
            let r = if whole {
                layer::with_whole_front(run)?
            } else {
                run()?
            };
            drop(r);
            if rep > 0 {
                times[slot].push(t.elapsed().as_secs_f64());
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = times.iter_mut().map(median).collect();
    let mib = |b: Option<u64>| b.unwrap_or(0) as f64 / (1u64 << 20) as f64;
    let split_peak = mib(impls::model::predict_peak_bytes(variant, &cfg));
    let whole_peak = mib(layer::with_whole_front(|| {
        impls::model::predict_peak_bytes(variant, &cfg)
    }));
    println!(
        "{variant} on {} (median of {reps} steps; model peaks: split {split_peak:.1} MiB, whole \
         {whole_peak:.1} MiB with the model's choice of keeping r)",
        cfg.describe()
    );
    for ((name, _, _), t) in arms.iter().zip(&medians) {
        println!("  {name:>16}: {t:.3} s  x{:.3} of split", t / medians[0]);
    }
    Ok(())
}

/// The forum mlp's forward as `cat-store-copy` runs it (product + bias, ReLU, concatenation, 32
/// layers, every input kept as the backward would), each kind of work timed on its own and summed
/// over the layers: wall seconds, REPS times after one unmeasured pass.
fn cat_parts(reps: usize) -> impls::error::Result<()> {
    let dev = Device::Cpu;
    let (m, c0, k, depth) = (4096usize, 256usize, 64usize, 32usize);
    let mut params = Vec::with_capacity(depth);
    for i in 0..depth {
        let w = Tensor::randn(0f32, 0.05, (k, c0 + i * k), &dev)?;
        let b = Tensor::randn(0f32, 0.05, k, &dev)?;
        params.push((w, b));
    }
    for rep in 0..=reps {
        let mut x = Tensor::randn(0f32, 1.0, (c0, m), &dev)?;
        let mut kept = Vec::with_capacity(depth);
        let mut secs = [0f64; 3];
        for (w, b) in &params {
            let t = Instant::now();
            let y = layer::dense_fwd(w, Some(b), &x)?;
            secs[0] += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let y = layer::relu_fwd(y, impls::Relu::Copy)?;
            secs[1] += t.elapsed().as_secs_f64();
            let t = Instant::now();
            let next = impls::ops::elementwise::cat_rows(&[&x, &y])?;
            secs[2] += t.elapsed().as_secs_f64();
            kept.push(std::mem::replace(&mut x, next));
        }
        if rep > 0 {
            println!(
                "products {:6.1} ms  relu {:5.1} ms  concatenations {:6.1} ms",
                secs[0] * 1e3,
                secs[1] * 1e3,
                secs[2] * 1e3
            );
        }
    }
    Ok(())
}

/// DenseNet-BC-100's block config (N=64, 32×32) and random operands of its 3×3 convolution:
/// the layer input `s [B, M]`, the upstream gradient `gy [k, M]`, the weight `[k, B, 3, 3]`.
fn conv3x3_operands() -> impls::error::Result<(Config, Tensor, Tensor, Tensor)> {
    let cfg = Config {
        batch: 64,
        size: 32.into(),
        ..Config::bc100_block()
    };
    let (b, k, m) = (cfg.bottleneck(), cfg.growth, cfg.m());
    let dev = Device::Cpu;
    let s = Tensor::randn(0f32, 1.0, (b, m), &dev)?;
    let gy = Tensor::randn(0f32, 1.0, (k, m), &dev)?;
    let w = Tensor::randn(0f32, 0.1, (k, b, 3, 3), &dev)?;
    Ok((cfg, s, gy, w))
}

/// The bc layer's 3×3 convolution (forward + both gradients) on DenseNet-BC-100's shapes
/// (N=64, 32×32, B=48, k=12): the CPU's direct kernel against the tap-stack path, alternated
/// A B A B so a loaded machine slows both alike.
fn conv3x3(reps: usize) -> impls::error::Result<()> {
    let (cfg, s, gy, w) = conv3x3_operands()?;
    type Pass = fn(&Config, &Tensor, &Tensor, &Tensor) -> impls::error::Result<()>;
    let direct: Pass = |c, s, gy, w| {
        layer::conv3x3_fwd(c, s, w)?;
        layer::conv3x3_bwd(c, gy, s, w)?;
        Ok(())
    };
    let stack: Pass = |c, s, gy, w| {
        layer::conv3x3_fwd_tap_stack(c, s, w)?;
        layer::conv3x3_bwd_tap_stack(c, gy, s, w)?;
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

/// The bc layer's 3×3 convolution passes one at a time (forward, backward-data,
/// backward-weight) on DenseNet-BC-100's shapes: best wall time of REPS and GFLOP/s.
fn passes(reps: usize) -> impls::error::Result<()> {
    use impls::ops::conv3x3;
    let (cfg, s, gy, w) = conv3x3_operands()?;
    let (b, k, m) = (cfg.bottleneck(), cfg.growth, cfg.m());
    let g = layer::grid(&cfg);
    let flop = 2.0 * (9 * b * k * m) as f64;
    type Run<'a> = Box<dyn Fn() -> impls::error::Result<Tensor> + 'a>;
    let runs: Vec<(&str, Run)> = vec![
        ("forward", Box::new(|| conv3x3::forward(&s, &w, g))),
        (
            "backward-data",
            Box::new(|| conv3x3::backward_data(&gy, &w, g)),
        ),
        (
            "backward-weight",
            Box::new(|| conv3x3::backward_weight(&gy, &s, g)),
        ),
    ];
    for (name, f) in runs {
        let mut best = f64::INFINITY;
        for _ in 0..=reps {
            let t0 = Instant::now();
            drop(f()?);
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{} threads conv3x3 {name:16} {:7.2} ms {:6.1} GFLOP/s",
            rayon::current_num_threads(),
            best * 1e3,
            flop / best / 1e9
        );
    }
    Ok(())
}
