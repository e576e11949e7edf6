//! Mixed precision (bf16, PyTorch autocast's rule) through the whole step: every hand-written
//! variant of both families in bf16 against the f64 reference of the same case (its bf16 inputs
//! and f32 parameters widened exactly, `Case::to_dtype`), bitwise against the naive bf16
//! variant, with autocast's dtypes on every result tensor; a perturbed gradient fails the same
//! bound; `autograd` is refused in bf16; a bf16 case is the f32 case's draws rounded once.

use candle_core::{DType, Device, Tensor};
use impls::check::compare::{compare, compare_updates};
use impls::{Case, Config, Error, Family, Spatial, StepResult, Variant};

/// Norm-wise relative bound (max |a − b| / max |ref|, `check::compare`) of a bf16 step against
/// the f64 reference on these tiny configs. bf16 keeps 8 significant bits (unit roundoff
/// u = 2⁻⁸ = 3.9e-3): every feature the step stores (BN outputs, products, the layer outputs,
/// the input gradient) is rounded once to bf16, and those roundings pass through the layers,
/// so a result is a small multiple of u off (measured here: see `bf16_error_is_reported`,
/// ≤ 2.3e-2 on these configs; the PyTorch peer under autocast on the quick sweep's cases:
/// 4.5e-2 bc, 7.2e-3 mlp). 1e-1 is 25·u, above every honest error measured, and below the
/// O(1) error of a wrong gradient (the perturbation test's ×1.5 tensor is 3.3e-1 off).
const BF16_REL_TOL: f64 = 1e-1;

/// The bound of the wide `bc` config (M = N·H·W = 8464 positions a BN channel): measured 1.9e-1
/// (`grad.input`; every other tensor ≤ 6.4e-2, its f32 step 1.1e-7). A pre-activation within
/// bf16 rounding of zero lands on the other side of a ReLU than in the f64 reference, which
/// moves that position's whole gradient (the f32 harness's `F32_RELU_FLIP_FLOOR` effect, 2⁻⁸
/// instead of 2⁻²⁴ wide, so at this M some thousand-fold likelier); 0.5 still fails a gradient
/// off by its own size.
const BF16_WIDE_REL_TOL: f64 = 5e-1;

/// Where a config's ReLUs see enough positions that bf16 flips are expected (the wide config).
fn bound(cfg: &Config) -> f64 {
    if cfg.batch * cfg.size.height * cfg.size.width > 1000 {
        BF16_WIDE_REL_TOL
    } else {
        BF16_REL_TOL
    }
}

/// Scale of the perturbed tensor in [`a_perturbed_gradient_fails`]: 1.5× a tensor is a
/// norm-wise relative error of 0.5/1.5 = 3.3e-1 against it, the size of a wrong term.
const PERTURB: f64 = 1.5;

fn configs() -> Vec<Config> {
    let mut out = Vec::new();
    for (batch, channels, growth, depth, activation) in
        [(6, 7, 4, 3, true), (4, 3, 2, 5, false), (1, 5, 3, 4, true)]
    {
        out.push(Config {
            family: Family::Mlp,
            batch,
            channels,
            growth,
            depth,
            bn_size: 1,
            size: Spatial::square(1),
            activation,
            dtype: DType::BF16,
            seed: 11,
        });
    }
    for (batch, channels, growth, depth, bn_size, (h, w)) in [
        (2, 3, 2, 3, 2, (4, 4)),
        (2, 3, 2, 3, 2, (3, 5)),
        (3, 4, 2, 4, 3, (2, 2)),
        // wide enough for the CPU's split front (column chunks, dW1 groups, channel blocks)
        (1, 170, 2, 2, 2, (92, 92)),
    ] {
        out.push(Config {
            family: Family::Bc,
            batch,
            channels,
            growth,
            depth,
            bn_size,
            size: Spatial::new(h, w),
            activation: true,
            dtype: DType::BF16,
            seed: 5,
        });
    }
    out
}

/// The dtypes autocast gives each result tensor: the features (output, input gradient) bf16;
/// parameter gradients and BN running statistics f32.
fn assert_autocast_dtypes(r: &StepResult, what: &str) {
    assert_eq!(r.output.dtype(), DType::BF16, "{what}: output");
    assert_eq!(r.grad_input.dtype(), DType::BF16, "{what}: grad_input");
    for (name, t) in r.grads.iter().chain(r.running.iter()) {
        assert_eq!(t.dtype(), DType::F32, "{what}: {name}");
    }
}

/// The norm-wise relative error of `r` (bf16 step) against the f64 reference of its case,
/// running statistics judged by their update.
fn error_vs_f64(r: &StepResult, case: &Case, reference: &StepResult) -> impls::Result<f64> {
    let wide = case.to_dtype(DType::F64)?;
    let c = compare_updates(&r.to_dtype(DType::F64)?, reference, &wide.params.tensors)?;
    Ok(c.overall.max_rel)
}

#[test]
fn every_hand_written_variant_in_bf16_matches_f64_and_naive() -> impls::Result<()> {
    for cfg in configs() {
        let case = Case::random(&cfg, &Device::Cpu)?;
        let reference = case.reference()?;
        let naive = case.step(Variant::NAIVE)?;
        let variants = Variant::for_config(&cfg);
        assert!(!variants.contains(&Variant::Autograd), "autograd in bf16");
        for v in variants {
            let r = case.step(v)?;
            assert_autocast_dtypes(&r, &format!("{v} on {}", cfg.describe()));
            let err = error_vs_f64(&r, &case, &reference)?;
            let bound = bound(&cfg);
            assert!(
                err <= bound,
                "{v} bf16 vs f64 on {}: max_rel {err} > {bound}",
                cfg.describe()
            );
            // bf16 rounds every stored feature: a step at all this close is not bf16 run as f32
            assert!(
                err > 1e-6,
                "{v} on {}: {err} is f32's error, not bf16's",
                cfg.describe()
            );
            assert_eq!(r.grads.len(), reference.grads.len(), "{v}: gradient count");
            assert_eq!(r.running.len(), reference.running.len(), "{v}: running");
            // the same ops in the same order as the naive variant: the same bits
            let vs_naive = compare(&r, &naive)?;
            assert!(
                vs_naive.overall.bitwise,
                "{v} is not bitwise cat-store-copy in bf16 on {}: {:?}",
                cfg.describe(),
                vs_naive.per_tensor.iter().find(|(_, e)| !e.bitwise)
            );
        }
    }
    Ok(())
}

/// The GPU's path in bf16, run on the CPU ([`impls::layer::with_tap_stack_on_cpu`]: the 3×3
/// convolution through the tap stack with f32 tap products, the dense products into new
/// tensors, weight and bias gradients as products into f32): every hand-written variant within
/// the bf16 bound of the f64 reference, bitwise the path's naive variant, with autocast's
/// dtypes, and its bc variants with the front split too (issue 38); and not bitwise the CPU kernels' step (another summation order: the path is not the
/// CPU's run twice). A GPU runs these ops in these dtypes (cuBLAS with f32 compute, the bf16
/// kernels `cuda_emulated.rs` checks), so its bf16 rows are this arithmetic up to summation order.
#[test]
fn the_gpu_path_in_bf16_matches_f64_and_its_naive_variant() -> impls::Result<()> {
    let mut differs_from_cpu_kernels = false;
    for cfg in configs() {
        let case = Case::random(&cfg, &Device::Cpu)?;
        let reference = case.reference()?;
        let cpu_naive = case.step(Variant::NAIVE)?;
        impls::layer::with_tap_stack_on_cpu(|| -> impls::Result<()> {
            let naive = case.step(Variant::NAIVE)?;
            differs_from_cpu_kernels |= !compare(&naive, &cpu_naive)?.overall.bitwise;
            for v in Variant::for_config(&cfg) {
                let what = format!("{v} on {}, the GPU's path", cfg.describe());
                let r = case.step(v)?;
                assert_autocast_dtypes(&r, &what);
                let err = error_vs_f64(&r, &case, &reference)?;
                let bound = bound(&cfg);
                assert!(err <= bound, "{what}: bf16 vs f64 max_rel {err} > {bound}");
                assert!(err > 1e-6, "{what}: {err} is f32's error, not bf16's");
                let vs_naive = compare(&r, &naive)?;
                assert!(
                    vs_naive.overall.bitwise,
                    "{what}: not bitwise its naive variant: {:?}",
                    vs_naive.per_tensor.iter().find(|(_, e)| !e.bitwise)
                );
                // the split front on this path (issue 38), whatever the schedule picks here
                if let (Variant::Manual(st), Family::Bc) = (v, cfg.family) {
                    let split = case.step_manual(st, false)?;
                    assert_autocast_dtypes(&split, &format!("{what}, front split"));
                    let err = error_vs_f64(&split, &case, &reference)?;
                    assert!(err <= bound, "{what}, front split: max_rel {err} > {bound}");
                }
            }
            Ok(())
        })?;
    }
    assert!(
        differs_from_cpu_kernels,
        "the GPU's path gave the CPU kernels' bits on every config: it did not run"
    );
    Ok(())
}

#[test]
fn a_perturbed_gradient_fails_the_bf16_bound() -> impls::Result<()> {
    for cfg in [configs()[0].clone(), configs()[4].clone()] {
        let case = Case::random(&cfg, &Device::Cpu)?;
        let reference = case.reference()?;
        let mut r = case.step(Variant::NAIVE)?;
        assert!(error_vs_f64(&r, &case, &reference)? <= BF16_REL_TOL);
        let name = r.grads.keys().next().cloned().expect("a gradient");
        let g = r.grads[&name].affine(PERTURB, 0.0)?;
        r.grads.insert(name.clone(), g);
        let err = error_vs_f64(&r, &case, &reference)?;
        assert!(
            err > BF16_REL_TOL,
            "grad.{name} ×{PERTURB} on {} passes: {err} ≤ {BF16_REL_TOL}",
            cfg.describe()
        );
    }
    Ok(())
}

#[test]
fn autograd_is_refused_in_bf16_with_a_reason() -> impls::Result<()> {
    let cfg = configs()[0].clone();
    let case = Case::random(&cfg, &Device::Cpu)?;
    match case.step(Variant::Autograd) {
        Err(e @ Error::DTypeNotSupported { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("autograd") && msg.contains("bf16"), "{msg}");
        }
        other => panic!("autograd in bf16: expected DTypeNotSupported, got {other:?}"),
    }
    Ok(())
}

fn values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn a_bf16_case_is_the_f32_case_rounded_once() -> impls::Result<()> {
    for cfg in [configs()[0].clone(), configs()[1].clone()] {
        let f32_cfg = Config {
            dtype: DType::F32,
            ..cfg.clone()
        };
        let b = Case::random(&cfg, &Device::Cpu)?;
        let f = Case::random(&f32_cfg, &Device::Cpu)?;
        assert_eq!(b.input.dtype(), DType::BF16);
        assert_eq!(b.grad_output.dtype(), DType::BF16);
        for (x, y) in [(&b.input, &f.input), (&b.grad_output, &f.grad_output)] {
            let want: Vec<f32> = values(y)
                .into_iter()
                .map(|v| half::bf16::from_f32(v).to_f32())
                .collect();
            assert_eq!(values(x), want, "features: the f32 draws rounded to bf16");
        }
        for (name, t) in &b.params.tensors {
            assert_eq!(t.dtype(), DType::F32, "{name}");
            assert_eq!(values(t), values(&f.params.tensors[name]), "{name}");
        }
    }
    Ok(())
}

#[test]
fn a_bf16_case_and_result_file_round_trip() -> impls::Result<()> {
    let dir = tempfile::tempdir().unwrap();
    for cfg in [configs()[0].clone(), configs()[3].clone()] {
        let case = Case::random(&cfg, &Device::Cpu)?;
        let path = dir.path().join("case.safetensors");
        case.save(&path)?;
        let back = Case::load(&path, None, &Device::Cpu)?;
        // a case file holds no seed
        let want = Config {
            seed: back.cfg.seed,
            ..cfg.clone()
        };
        assert_eq!(back.cfg, want, "the config inferred from a bf16 file");
        assert_eq!(back.input.dtype(), DType::BF16);
        assert_eq!(values(&back.input), values(&case.input));
        let r = case.step(Variant::NAIVE)?;
        let rpath = dir.path().join("result.safetensors");
        impls::case::save_result(&r, &rpath)?;
        let rb = impls::case::load_result(&cfg, &rpath, &Device::Cpu)?;
        assert_autocast_dtypes(&rb, "result file");
        assert!(compare(&rb, &r)?.overall.bitwise, "result file round trip");
    }
    Ok(())
}

/// Prints each hand-written variant's bf16 error against f64 on one small config of each
/// family (`cargo test -p densebench-impls --test bf16_steps -- --nocapture`), and holds the
/// errors to the bound.
#[test]
fn bf16_error_is_reported() -> impls::Result<()> {
    for cfg in [
        configs()[0].clone(),
        configs()[2].clone(),
        configs()[4].clone(),
    ] {
        let case = Case::random(&cfg, &Device::Cpu)?;
        let reference = case.reference()?;
        for v in Variant::for_config(&cfg) {
            let err = error_vs_f64(&case.step(v)?, &case, &reference)?;
            println!("{} {v}: bf16 vs f64 max_rel {err:.3e}", cfg.describe());
            assert!(err <= BF16_REL_TOL);
        }
    }
    Ok(())
}
