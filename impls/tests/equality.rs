//! Proof of equality: every variant against `autograd` (independent: candle's own autograd, no
//! shared backward code) and against the explicit naive variant `cat-store-copy`, for both
//! families, f32 and f64, several depths and batch sizes.
//!
//! The autograd reference always runs in f64 on the case widened to f64 (exact), so f32 variants
//! are measured against exact arithmetic (and `autograd` in f32 is within the hand-written
//! variants' tolerance of it: `autograd_f32_is_as_accurate_as_the_hand_written_backward`).

use candle_core::{DType, Device};
use impls::check::compare::{compare, compare_updates};
use impls::{step, Case, Concat, Config, Family, NoProbe, Spatial, Variant};

mod blocks;
use blocks::split_front_block;

/// Norm-wise relative tolerance (max |a − b| / max |ref|) against `autograd` in f64. The two
/// implementations sum in different orders (candle's conv/matmul backward vs ours), so they
/// agree to rounding: observed ≤ 1e-14 on these configs; 1e-11 leaves three orders of margin
/// yet would catch any real bug (a wrong term is O(1) relative).
const F64_REL_TOL: f64 = 1e-11;
/// f32 variants against the f64 reference: observed ≤ ~1.2e-6 (BN statistics and long
/// reductions over N·H·W in f32); 1e-4 is ~100× that and still four orders below an error in
/// the maths.
const F32_REL_TOL: f64 = 1e-4;

fn tol(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        F64_REL_TOL
    } else {
        F32_REL_TOL
    }
}

fn configs() -> Vec<Config> {
    let mut out = Vec::new();
    for dtype in [DType::F32, DType::F64] {
        // mlp: N=1 (a row vector), a non-square channel count, activation on and off.
        for (batch, channels, growth, depth, activation) in [
            (1, 5, 3, 4, true),
            (6, 7, 4, 3, true),
            (4, 3, 2, 5, false),
            (3, 2, 5, 1, true),
        ] {
            out.push(Config {
                family: Family::Mlp,
                batch,
                channels,
                growth,
                depth,
                bn_size: 1,
                size: Spatial::square(1),
                activation,
                dtype,
                seed: 11,
            });
        }
        // bc: several depths, batches and spatial sizes, non-square channel counts, and
        // non-square feature maps both ways round (3x5 and 5x3: H and W swapped anywhere — the
        // shift kernels' grid, the canonical shape, the memory layout — gives other values
        // than candle's conv2d in the autograd reference).
        for (batch, channels, growth, depth, bn_size, (height, width)) in [
            (2, 3, 2, 3, 2, (4, 4)),
            (1, 5, 3, 2, 1, (3, 3)),
            (3, 4, 2, 4, 3, (2, 2)),
            (2, 6, 3, 1, 2, (5, 5)),
            (2, 3, 2, 3, 2, (3, 5)),
            (2, 3, 2, 3, 2, (5, 3)),
            (1, 2, 3, 2, 2, (1, 4)),
            // wide and large enough for the CPU's split front: ReLU1's output made in three
            // column chunks (M = 8464, `layer::front_chunks`), remade in three column groups
            // for dW1 (`layer::dw_groups`) and its backward in three channel blocks (C_i =
            // 170, 172, `layer::grad_blocks`)
            (1, 170, 2, 2, 2, (92, 92)),
        ] {
            out.push(Config {
                family: Family::Bc,
                batch,
                channels,
                growth,
                depth,
                bn_size,
                size: Spatial::new(height, width),
                activation: true,
                dtype,
                seed: 5,
            });
        }
    }
    out
}

#[test]
fn every_variant_matches_autograd_and_naive() -> impls::Result<()> {
    let dev = Device::Cpu;
    for cfg in configs() {
        let case = Case::random(&cfg, &dev)?;
        let run = |v: Variant| {
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
            // running statistics judged by their update (a stale one is a tenth off by value)
            let vs_auto =
                compare_updates(&r.to_dtype(DType::F64)?, &reference, &case.params.tensors)?;
            assert!(
                vs_auto.overall.max_rel <= tol(cfg.dtype),
                "{v} vs autograd on {}: max_rel {} > {} ({:?})",
                cfg.describe(),
                vs_auto.overall.max_rel,
                tol(cfg.dtype),
                vs_auto
                    .per_tensor
                    .iter()
                    .max_by(|a, b| a.1.max_rel.total_cmp(&b.1.max_rel))
            );
            // The autograd comparison covers every parameter gradient and running stat: the
            // sets of names must be complete.
            assert_eq!(r.grads.len(), reference.grads.len(), "{v}: gradient count");
            assert_eq!(
                r.running.len(),
                reference.running.len(),
                "{v}: running stat count"
            );
            if let Variant::Manual(_) = v {
                // Every hand-written variant runs the same ops in the same order as the naive
                // one (the buffer only changes where values live, recompute reruns the same ops
                // with the saved statistics, in-place ReLU computes the same values), so they
                // must match it bit for bit.
                let vs_naive = compare(&r, &naive)?;
                assert!(
                    vs_naive.overall.bitwise,
                    "{v} is not bitwise equal to cat-store-copy on {}: {:?}",
                    cfg.describe(),
                    vs_naive.per_tensor.iter().find(|(_, e)| !e.bitwise)
                );
            }
        }
    }
    Ok(())
}

#[test]
fn inputs_are_never_written() -> impls::Result<()> {
    // In-place kernels write into the features, the gradient buffer and ReLU temporaries; never
    // into the caller's input or upstream gradient (N = 1 makes the channel-major transpose of
    // an mlp input contiguous, the case where a lazy copy would alias it).
    let dev = Device::Cpu;
    for family in Family::ALL {
        let mut cfg = Config::tiny(family);
        if family == Family::Mlp {
            cfg.batch = 1;
        }
        let case = Case::random(&cfg, &dev)?;
        let before_in = case.input.flatten_all()?.to_vec1::<f64>()?;
        let before_g = case.grad_output.flatten_all()?.to_vec1::<f64>()?;
        for v in Variant::for_config(&cfg) {
            step(
                v,
                &cfg,
                &case.params,
                &case.input,
                &case.grad_output,
                &mut NoProbe,
            )?;
            assert_eq!(
                case.input.flatten_all()?.to_vec1::<f64>()?,
                before_in,
                "{v} wrote its input"
            );
            assert_eq!(
                case.grad_output.flatten_all()?.to_vec1::<f64>()?,
                before_g,
                "{v} wrote grad_output"
            );
        }
    }
    Ok(())
}

#[test]
fn variant_list_is_complete_and_names_round_trip() {
    let mlp = Config::tiny(Family::Mlp);
    let bc = Config::tiny(Family::Bc);
    // bc: all 2×2×2 hand-written points plus autograd; mlp: buffer-recompute means nothing.
    assert_eq!(Variant::for_config(&bc).len(), 9);
    assert_eq!(Variant::for_config(&mlp).len(), 7);
    let mut off = mlp.clone();
    off.activation = false;
    // Without a ReLU, in-place ReLU means nothing: autograd + cat-store, cat-recompute, buffer-store.
    assert_eq!(Variant::for_config(&off).len(), 4);
    for v in Variant::all() {
        assert_eq!(Variant::parse(&v.name()).ok(), Some(v));
    }
    assert!(Variant::parse("buffer").is_err());
    // Linear memory: recompute everywhere; buffer-store only for mlp (a bc layer still keeps its
    // ReLU1 output [C_i, M], which grows with i).
    let buffer_store = Variant::parse("buffer-store-copy").unwrap();
    assert!(buffer_store.is_linear_memory(Family::Mlp));
    assert!(!buffer_store.is_linear_memory(Family::Bc));
    assert!(Variant::parse("cat-recompute-inplace")
        .unwrap()
        .is_linear_memory(Family::Bc));
    assert!(!Variant::NAIVE.is_linear_memory(Family::Mlp));
    assert!(Variant::for_config(&bc)
        .iter()
        .any(|v| matches!(v, Variant::Manual(s) if s.concat == Concat::Buffer)));
}

#[test]
fn autograd_f32_is_as_accurate_as_the_hand_written_backward() -> impls::Result<()> {
    // BatchNorm over M = N·H·W = 65 536 values per channel (16 images of 64×64, narrow so that
    // it stays quick): `autograd` in f32 within the hand-written variants' tolerance of exact
    // arithmetic (measured 3.2e-6 against their 6.7e-7). Its BN sums H·W, then N, a candle
    // reduction per dimension; when it summed over (N, H, W) in one call (candle's CPU adds the
    // values one after another) this case was 2.7e-1 from f64 (BC-100's block at L=2: 8.4e-2),
    // an f32 `autograd` row's check said nothing, and its step took twice as long.
    let cfg = Config {
        batch: 16,
        size: Spatial::square(64),
        depth: 1,
        channels: 4,
        growth: 4,
        bn_size: 1,
        dtype: DType::F32,
        ..Config::bc100_block()
    };
    let case = Case::random(&cfg, &Device::Cpu)?;
    let truth = case.reference()?;
    let error = |v: Variant| -> impls::Result<f64> {
        Ok(compare(&case.step(v)?.to_dtype(DType::F64)?, &truth)?
            .overall
            .max_rel)
    };
    let ours = error(Variant::NAIVE)?;
    let theirs = error(Variant::Autograd)?;
    assert!(ours <= F32_REL_TOL, "hand-written f32 error {ours}");
    assert!(theirs <= F32_REL_TOL, "autograd f32 error {theirs}");
    Ok(())
}

#[test]
fn the_split_front_is_bitwise_the_whole_one() -> impls::Result<()> {
    // A bc layer's front split (ReLU1's output in column chunks, its backward in column
    // groups, then channel blocks) and whole: both orders of the same maths on the CPU's
    // kernels, every hand-written variant, bit for bit the same step (a GPU's path: the next
    // test).
    for dtype in [DType::F32, DType::F64] {
        let cfg = split_front_block(dtype, 5);
        assert!(impls::layer::front_chunks(cfg.m()).len() > 2);
        assert!(impls::layer::dw_groups(cfg.m()).len() > 2);
        assert!(impls::layer::grad_blocks(cfg.channels).len() > 2);
        let case = Case::random(&cfg, &Device::Cpu)?;
        for v in Variant::for_config(&cfg) {
            if v == Variant::Autograd {
                continue;
            }
            let Variant::Manual(strategy) = v else {
                continue;
            };
            // the step itself, not `step()`, which splits only where the model says it pays
            let run = || case.step_manual(strategy, false);
            let split = run()?;
            let whole = impls::layer::with_whole_front(run)?;
            let c = compare(&split, &whole)?;
            assert!(
                c.overall.bitwise,
                "{v} on {}: the split front differs from the whole: {:?}",
                cfg.describe(),
                c.per_tensor.iter().find(|(_, e)| !e.bitwise)
            );
        }
    }
    Ok(())
}

/// The split front on a GPU's path (issue 38 item 3), run on the CPU
/// ([`impls::layer::with_tap_stack_on_cpu`]): ReLU1's output in column chunks written into z's
/// columns, dW1 summed group by group into one `[B, C]`, the channel blocks' dx added into the
/// copied prefix (`cat`) or the buffer. Every hand-written variant, f32 and f64, split (the
/// CPU's pieces and a GPU's coarser, uneven ones) and whole: all within the tolerance of the
/// f64 reference, and of each other (on a GPU the split sums in cuBLAS's order, so no bitwise
/// claim is made there).
#[test]
fn the_gpu_paths_split_front_matches_f64_and_its_whole_front() -> impls::Result<()> {
    for dtype in [DType::F32, DType::F64] {
        let cfg = split_front_block(dtype, 7);
        let case = Case::random(&cfg, &Device::Cpu)?;
        let reference = case.reference()?;
        let wide = case.to_dtype(DType::F64)?;
        for v in Variant::for_config(&cfg) {
            let Variant::Manual(strategy) = v else {
                continue;
            };
            impls::layer::with_tap_stack_on_cpu(|| -> impls::Result<()> {
                let run = || case.step_manual(strategy, false);
                let split = run()?;
                let whole = impls::layer::with_whole_front(run)?;
                // a GPU's coarser cut (the model's `Schedule::front_pieces`), uneven pieces:
                // 2 column chunks, 2 channel blocks
                let pieces = impls::layer::FrontPieces {
                    columns: 5000,
                    rows: 100,
                };
                let coarse = impls::layer::with_front_pieces(pieces, run)?;
                impls::layer::with_front_pieces(pieces, || {
                    assert_eq!(impls::layer::front_chunks(cfg.m()).len(), 2);
                    assert_eq!(impls::layer::grad_blocks(cfg.c_in(cfg.depth - 1)).len(), 2);
                });
                for (what, r) in [("split", &split), ("whole", &whole), ("coarse", &coarse)] {
                    let c = compare_updates(
                        &r.to_dtype(DType::F64)?,
                        &reference,
                        &wide.params.tensors,
                    )?;
                    assert!(
                        c.overall.max_rel <= tol(dtype),
                        "{v} {what} on the GPU's path, {}: {} > {}",
                        cfg.describe(),
                        c.overall.max_rel,
                        tol(dtype)
                    );
                }
                for (what, r) in [("split", &split), ("coarse", &coarse)] {
                    let c = compare(r, &whole)?;
                    assert!(
                        c.overall.max_rel <= tol(dtype),
                        "{v} on the GPU's path, {}: {what} vs whole {}",
                        cfg.describe(),
                        c.overall.max_rel
                    );
                }
                Ok(())
            })?;
        }
    }
    Ok(())
}
