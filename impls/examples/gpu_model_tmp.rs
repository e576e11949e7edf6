use impls::memory::{predict_peak_bytes_with, Kernels};
use impls::{Config, Family, Spatial, Variant};
fn main() {
    for (name, n, c0, k, s, depths) in [
        ("bc100", 64, 24, 12, 32, [16, 32, 48]),
        ("tv", 32, 64, 32, 56, [6, 12, 24]),
    ] {
        for d in depths {
            let cfg = Config {
                family: Family::Bc,
                batch: n,
                channels: c0,
                growth: k,
                depth: d,
                bn_size: 4,
                size: Spatial::square(s),
                activation: true,
                dtype: candle_core::DType::F32,
                seed: 0,
            };
            for v in &Variant::all() {
                if let Some(p) = predict_peak_bytes_with(*v, &cfg, Kernels::TapStack) {
                    println!("{name} L={d} {v}: {:.1} MiB", p as f64 / 1048576.0);
                }
            }
        }
    }
}
