//! The three matrix products of an mlp dense layer (forward `W·X`, weight gradient `G·Xᵀ`,
//! input gradient `Wᵀ·G` added into `X`'s gradient) on the forum mlp's shapes (k = 64,
//! M = 4096, C = the layer's input channels): candle's matmul (`gemm` threading itself) against
//! `impls::ops::dense` (column panels, one single-threaded `gemm` each, accumulating in place), best
//! of REPS, at the rayon pool's thread count. A benchmark for choosing the mlp kernels, not a
//! test: `RAYON_NUM_THREADS=2 cargo run --release -p densebench-impls --example gemm_shapes -- 2304 5`
//! (`-- 204 5 48 65536` for a bc Conv1×1; a fifth argument `bf16` takes bf16 operands, the
//! weight gradient into f32 as the layers do: `-- 2304 5 64 4096 bf16`). The weight gradient
//! is timed as the mlp's Linear takes it (`dense_bwd_weight`) and as a bc Conv1×1 does
//! (`conv1_bwd_weight`: the columns in chunks of 512).

use candle_core::{Device, Tensor};
use impls::ops::dense;
mod common;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let c: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1280);
    let reps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    // optional: the layer's outputs k and M (bc's Conv1×1: 48 65536)
    let k: usize = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(64);
    let m: usize = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(4096);
    let dtype = match args.get(5).map(String::as_str) {
        Some("bf16") => candle_core::DType::BF16,
        None | Some("f32") => candle_core::DType::F32,
        Some(other) => return Err(format!("dtype `{other}`: f32 or bf16").into()),
    };
    let dev = Device::Cpu;
    let w = Tensor::randn(0f32, 1.0, (k, c), &dev)?.to_dtype(dtype)?;
    let x = Tensor::randn(0f32, 1.0, (c, m), &dev)?.to_dtype(dtype)?;
    let g = Tensor::randn(0f32, 1.0, (k, m), &dev)?.to_dtype(dtype)?;
    let dx = Tensor::zeros((c, m), dtype, &dev)?;
    let flop = 2.0 * (k * c * m) as f64;
    let threads = rayon::current_num_threads();
    let time =
        |name: &str, f: &mut dyn FnMut() -> candle_core::Result<()>| match common::best_of(reps, f)
        {
            Err(e) => println!("{name}: {e}"),
            Ok(best) => println!(
                "{threads} threads C={c:5} {name:36} {:7.2} ms {:6.1} GFLOP/s",
                best * 1e3,
                flop / best / 1e9
            ),
        };
    let (xt, wt) = (x.t()?, w.t()?);
    let d = |r: impls::Result<Tensor>| r.map(drop).map_err(candle_core::Error::wrap);
    time("fwd W·X      matmul", &mut || w.matmul(&x).map(drop));
    time("fwd W·X      dense::product", &mut || {
        d(dense::product(&w, &x))
    });
    // what the layer runs: the product added into the bias, broadcast beforehand
    let y = Tensor::zeros((k, m), dtype, &dev)?;
    time("fwd +W·X     dense::accumulate", &mut || {
        dense::accumulate(&y, &w, &x).map_err(candle_core::Error::wrap)
    });
    time("dW  G·Xᵀ     matmul", &mut || g.matmul(&xt).map(drop));
    time("dW  G·Xᵀ     dense::product", &mut || {
        d(dense::product(&g, &xt))
    });
    // what the layer runs: (X·Gᵀ)ᵀ (`dense::product_transposed`, into f32 for bf16 features)
    time("dW  (X·Gᵀ)ᵀ  layer::dense_bwd_weight", &mut || {
        d(impls::layer::dense_bwd_weight(&g, &x))
    });
    // a bc Conv1×1's: X's columns in chunks of 512, each chunk's rows times Gᵀ's
    time("dW  chunked  layer::conv1_bwd_weight", &mut || {
        d(impls::layer::conv1_bwd_weight(&g, c, |s, n| {
            Ok(x.narrow(1, s, n)?)
        }))
    });
    time("dX  +Wᵀ·G    matmul, add", &mut || {
        let p = wt.matmul(&g)?;
        (&dx + &p).map(drop)
    });
    time("dX  +Wᵀ·G    dense::accumulate", &mut || {
        dense::accumulate(&dx, &wt, &g).map_err(candle_core::Error::wrap)
    });
    Ok(())
}
