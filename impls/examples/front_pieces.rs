//! The split front's pieces the memory model picks on a GPU's paths (tap stack, cuDNN with
//! 0-byte workspaces) for BC-100's block, with the predicted peaks (f32): how many column
//! chunks and channel blocks a GPU step runs, and on the tap stack the chunks its 3×3
//! convolution then takes, beside the whole front's (`cargo run --release -p densebench-impls
//! --example front_pieces -- [DEPTH ...]`, default 16 32 48; `DENSEBENCH_FRONT_SLACK` applies).

use impls::layer::{with_front_pieces, with_whole_front, FrontPieces};
use impls::model::predict_peak_bytes_with;
use impls::model::schedule::schedule_for;
use impls::model::trace::{ConvWorkspaces, Kernels};
use impls::{Config, Variant};

fn main() -> impls::Result<()> {
    let depths: Vec<usize> = std::env::args()
        .skip(1)
        .map(|d| d.parse().unwrap_or(16))
        .collect();
    let depths = if depths.is_empty() {
        vec![16, 32, 48]
    } else {
        depths
    };
    let paths = [
        ("tap stack", Kernels::TapStack),
        ("cuDNN", Kernels::Cudnn(ConvWorkspaces::default())),
    ];
    for depth in depths {
        let cfg = Config {
            depth,
            ..Config::bc100_block()
        };
        for (name, path) in paths {
            for v in Variant::all() {
                if v == Variant::Autograd {
                    continue;
                }
                let s = schedule_for(v, &cfg, path)?;
                if !s.split_front {
                    continue;
                }
                let p = s.front_pieces.unwrap_or(FrontPieces::CPU);
                let chunks = with_front_pieces(p, || impls::layer::front_chunks(cfg.m()).len());
                let mib = |b: Option<u64>| b.map_or(f64::NAN, |b| b as f64 / (1 << 20) as f64);
                let picked = mib(predict_peak_bytes_with(v, &cfg, path));
                // the tap stack's chunks (images per chunk of the 3×3 convolution), split and whole
                let taps = |columns: usize| match columns {
                    0 => "taps whole".to_string(),
                    c => format!("taps in {} chunks", cfg.m().div_ceil(c)),
                };
                let whole = with_whole_front(|| schedule_for(v, &cfg, path))?;
                let whole_peak = mib(with_whole_front(|| predict_peak_bytes_with(v, &cfg, path)));
                let tap_note = match path {
                    Kernels::TapStack => format!(
                        "; {} (whole front: {}, {whole_peak:.1} MiB)",
                        taps(s.tap_chunk_columns),
                        taps(whole.tap_chunk_columns)
                    ),
                    _ => format!(" (whole front: {whole_peak:.1} MiB)"),
                };
                println!(
                    "L={depth:>2} {name:<9} {v:<26} {chunks:>2} chunks of {:>6} columns, blocks of {:>3} rows: {picked:.1} MiB{tap_note}",
                    p.columns, p.rows
                );
            }
        }
    }
    Ok(())
}
