//! BatchNorm's CPU passes on one feature map `[C, M]` (bc's BN1 at its widest: C = 204,
//! M = 65536): statistics, apply, the backward's reduction and its input gradient added into a
//! gradient buffer, best of REPS at the rayon pool's thread count. A benchmark for choosing the
//! BN kernels, not a test:
//! `RAYON_NUM_THREADS=1 cargo run --release -p densebench-impls --example bn_shapes -- 204 65536 10 bf16`.

use candle_core::{DType, Device, Tensor};
use impls::ops::{bn, bn_backward};
mod common;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: usize| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(d);
    let (c, m, reps) = (arg(1, 204), arg(2, 65536), arg(3, 10));
    let dtype = match args.get(4).map(String::as_str) {
        Some("bf16") | None => DType::BF16,
        Some("f32") => DType::F32,
        Some(other) => return Err(format!("dtype `{other}`: f32 or bf16").into()),
    };
    let dev = Device::Cpu;
    let x = Tensor::randn(0.5f32, 1.0, (c, m), &dev)?.to_dtype(dtype)?;
    let g = Tensor::randn(0f32, 1.0, (c, m), &dev)?.to_dtype(dtype)?;
    let d = Tensor::randn(0f32, 1.0, (c, m), &dev)?.to_dtype(dtype)?;
    let gamma = Tensor::randn(1f32, 0.1, c, &dev)?;
    let beta = Tensor::randn(0f32, 0.1, c, &dev)?;
    let (rm, rv) = (
        Tensor::zeros(c, DType::F32, &dev)?,
        Tensor::ones(c, DType::F32, &dev)?,
    );
    let (table, _) = bn::bn_stats_prepare(&x, &gamma, &beta, &rm, &rv)?;
    let st = table.narrow(0, 0, 2)?.contiguous()?;
    let coef_all = bn_backward::bn_bwd_reduce(&g, &x, &st, &gamma)?;
    let coef = coef_all.narrow(0, 2, 3)?.contiguous()?;
    let affine = table.narrow(0, 2, 2)?.contiguous()?;
    let bytes = (c * m * dtype.size_in_bytes()) as f64;
    let threads = rayon::current_num_threads();
    let time =
        |name: &str, streams: f64, f: &mut dyn FnMut() -> impls::Result<()>| match common::best_of(
            reps, f,
        ) {
            Err(e) => println!("{name}: {e}"),
            Ok(best) => println!(
                "{name:<22} {:8.2} ms {:6.1} GB/s  ({threads} thr, [{c}, {m}] {dtype:?})",
                best * 1e3,
                streams * bytes / best / 1e9
            ),
        };
    time("stats+prepare", 2.0, &mut || {
        bn::bn_stats_prepare(&x, &gamma, &beta, &rm, &rv).map(drop)
    });
    time("apply", 2.0, &mut || bn::affine_rows(&x, &affine).map(drop));
    time("bwd reduce", 2.0, &mut || {
        bn_backward::bn_bwd_reduce(&g, &x, &st, &gamma).map(drop)
    });
    time("bwd reduce relu", 2.0, &mut || {
        bn_backward::bn_bwd_reduce_relu(&g, &x, &table, &gamma).map(drop)
    });
    time("bwd dx", 3.0, &mut || {
        bn_backward::bn_bwd_dx(&g, &x, &coef).map(drop)
    });
    time("bwd dx accumulate", 4.0, &mut || {
        bn_backward::bn_bwd_dx_accumulate(&d, &g, &x, &coef)
    });
    Ok(())
}
