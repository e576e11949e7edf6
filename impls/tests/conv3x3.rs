//! The direct 3×3 convolution (`impls::ops::conv3x3`) against candle's own `conv2d` and its autograd
//! (an independent implementation), in f64 on non-square grids whose heights cut the image into
//! several tiles with a short last one, and bit for bit across thread counts.

use candle_core::{DType, Device, Tensor, Var};
use impls::ops::conv3x3;
use impls::ops::layout::grid::Grid;

/// f64 sums of at most 9·B = 63 products of O(1) terms in two different orders: ~1e-14 apart.
const TOL: f64 = 1e-11;

fn rand(shape: &[usize], seed: u64) -> Tensor {
    let n = shape.iter().product();
    Tensor::from_vec(
        impls::config::params::uniform(seed, "t", n, -1.0, 1.0),
        shape,
        &Device::Cpu,
    )
    .unwrap()
}

fn max_diff(a: &Tensor, b: &Tensor, what: &str) -> f64 {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap()
}

/// `[C, N·H·W]` ↔ `[N, C, H, W]`.
fn to_nchw(t: &Tensor, g: Grid) -> Tensor {
    let c = t.dims()[0];
    t.reshape((c, g.n, g.h, g.w))
        .unwrap()
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap()
}

fn to_cm(t: &Tensor) -> Tensor {
    let c = t.dims()[1];
    t.transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((c, ()))
        .unwrap()
}

/// Forward, both gradients, against `conv2d(padding 1)` and candle's backward of it, with the
/// loss Σ y·gy so that ∂/∂y = gy.
fn check(g: Grid, b: usize, k: usize, seed: u64) {
    let m = g.n * g.h * g.w;
    let s = rand(&[b, m], seed);
    let w = rand(&[k, b, 3, 3], seed + 1);
    let gy = rand(&[k, m], seed + 2);
    let what = format!("grid {}×{}×{}, B={b}, k={k}", g.n, g.h, g.w);

    let sv = Var::from_tensor(&to_nchw(&s, g)).unwrap();
    let wv = Var::from_tensor(&w).unwrap();
    let y_ref = sv.conv2d(&wv, 1, 1, 1, 1).unwrap();
    let loss = (&y_ref * to_nchw(&gy, g)).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap();
    let ds_ref = to_cm(grads.get(&sv).unwrap());
    let dw_ref = grads.get(&wv).unwrap().clone();

    let y = conv3x3::forward(&s, &w, g).unwrap();
    let ds = conv3x3::backward_data(&gy, &w, g).unwrap();
    let dw = conv3x3::backward_weight(&gy, &s, g).unwrap();
    for (a, r, name) in [
        (&y, &to_cm(&y_ref), "y"),
        (&ds, &ds_ref, "ds"),
        (&dw, &dw_ref, "dW"),
    ] {
        let d = max_diff(a, r, name);
        assert!(d <= TOL, "{what}: {name}: max |direct − conv2d| = {d:e}");
    }
}

#[test]
fn direct_conv_matches_candle_conv2d_on_non_square_grids() {
    // Heights above the tile's row count (512 padded columns: 128 rows at w = 2) give several
    // tiles per image and a 1-row or 2-row last tile; w = 1 and h = 1 are the thinnest borders.
    for (g, b, k) in [
        (Grid { n: 2, h: 3, w: 5 }, 7, 4),
        (Grid { n: 1, h: 5, w: 2 }, 3, 2),
        (Grid { n: 2, h: 130, w: 2 }, 4, 3),
        (Grid { n: 1, h: 129, w: 2 }, 2, 5),
        (Grid { n: 3, h: 1, w: 6 }, 5, 3),
        (Grid { n: 2, h: 4, w: 1 }, 3, 3),
        (Grid { n: 1, h: 40, w: 17 }, 6, 2),
    ] {
        check(g, b, k, (g.h * 100 + g.w) as u64);
    }
}

#[test]
fn direct_conv_is_bitwise_the_same_at_any_thread_count() {
    // More tiles than weight-gradient groups, so the groups hold several tiles each.
    let g = Grid { n: 5, h: 70, w: 9 };
    let (b, k, m) = (6, 3, 5 * 70 * 9);
    let s = rand(&[b, m], 1).to_dtype(DType::F32).unwrap();
    let w = rand(&[k, b, 3, 3], 2).to_dtype(DType::F32).unwrap();
    let gy = rand(&[k, m], 3).to_dtype(DType::F32).unwrap();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            [
                conv3x3::forward(&s, &w, g).unwrap(),
                conv3x3::backward_data(&gy, &w, g).unwrap(),
                conv3x3::backward_weight(&gy, &s, g).unwrap(),
            ]
            .map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        })
    };
    let one = run(1);
    for threads in [2, 3] {
        let many = run(threads);
        for (name, (a, b)) in ["y", "ds", "dW"].iter().zip(one.iter().zip(&many)) {
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{name}: 1 thread and {threads} threads differ");
        }
    }
}

/// The GPU path's convolution (the tap stack, `layer::conv3x3_*_tap_stack`, run here by the
/// CPU) a range of whole images at a time: one chunk, chunks of one image, and chunks of two
/// with a shorter last one all agree with the direct kernel, in f64, forward and both
/// gradients (the weight gradient then sums the chunks' products in chunk order).
#[test]
fn tap_stack_conv_in_chunks_matches_the_direct_one() {
    use impls::layer::{self, tap_chunk_images, with_tap_chunk_columns};
    use impls::{Config, Family, Spatial};
    let (g, b, k) = (Grid { n: 5, h: 4, w: 3 }, 6, 3);
    let cfg = Config {
        batch: g.n,
        size: Spatial::new(g.h, g.w),
        ..Config::tiny(Family::Bc)
    };
    let m = g.n * g.h * g.w;
    let s = rand(&[b, m], 11);
    let w = rand(&[k, b, 3, 3], 12);
    let gy = rand(&[k, m], 13);
    let direct = [
        conv3x3::forward(&s, &w, g).unwrap(),
        conv3x3::backward_data(&gy, &w, g).unwrap(),
        conv3x3::backward_weight(&gy, &s, g).unwrap(),
    ];
    let plane = g.h * g.w;
    // (columns per chunk, images per chunk): 0 is the whole batch; a count of columns that is
    // not a whole number of images rounds up to whole images
    for (columns, images) in [(0, 5), (1, 1), (plane, 1), (plane + 1, 2), (2 * plane, 2)] {
        assert_eq!(tap_chunk_images(g, columns), images, "{columns} columns");
        let got = with_tap_chunk_columns(columns, || {
            let y = layer::conv3x3_fwd_tap_stack(&cfg, &s, &w).unwrap();
            let (ds, dw) = layer::conv3x3_bwd_tap_stack(&cfg, &gy, &s, &w).unwrap();
            [y, ds, dw]
        });
        for ((a, r), name) in got.iter().zip(&direct).zip(["y", "ds", "dW"]) {
            let d = max_diff(a, r, name);
            assert!(
                d <= TOL,
                "chunks of {images} images: {name}: max |tap stack − direct| = {d:e}"
            );
        }
    }
}
