//! The CPU's TF32 emulation (`layer::with_tf32_emulation_on_cpu`, what `examples/tf32_error.rs`
//! derives the tf32 tolerance with): the rounding of single values in both modes, that every
//! matrix product of a step sees rounded operands, and that it refuses what it cannot emulate.

use candle_core::{DType, Device, Tensor};
use impls::layer::{self, with_tf32_emulation_on_cpu, Tf32Rounding};
use impls::ops::elementwise::round_tf32;
use impls::{Case, Config, Family, Variant};

fn round(x: f32, r: Tf32Rounding) -> f32 {
    let t = Tensor::new(&[x], &Device::Cpu).unwrap();
    round_tf32(&t, r).unwrap().to_vec1::<f32>().unwrap()[0]
}

#[test]
fn tf32_rounding_keeps_ten_mantissa_bits_ties_away_or_truncated() {
    use Tf32Rounding::{Nearest, Truncate};
    let ulp = 2f32.powi(-10); // TF32's ulp at 1
                              // Representable values are unchanged, in both modes.
    for x in [0.0, -0.0, 1.0, -3.5, 1.0 + ulp, 2f32.powi(-126), 65024.0] {
        assert_eq!(round(x, Nearest).to_bits(), x.to_bits(), "{x}");
        assert_eq!(round(x, Truncate).to_bits(), x.to_bits(), "{x}");
    }
    // Below half an ulp: down in both; exactly half: away from zero (nearest) or down.
    assert_eq!(round(1.0 + ulp / 4.0, Nearest), 1.0);
    assert_eq!(round(1.0 + ulp / 2.0, Nearest), 1.0 + ulp);
    assert_eq!(round(-(1.0 + ulp / 2.0), Nearest), -(1.0 + ulp));
    assert_eq!(round(1.0 + ulp / 2.0, Truncate), 1.0);
    assert_eq!(round(1.0 + 0.75 * ulp, Nearest), 1.0 + ulp);
    assert_eq!(round(1.0 + 0.75 * ulp, Truncate), 1.0);
    assert_eq!(round(-(1.0 + 0.75 * ulp), Truncate), -1.0);
    // A carry into the exponent, and past the largest finite value.
    assert_eq!(round(2.0 - ulp / 4.0, Nearest), 2.0);
    assert_eq!(round(f32::MAX, Nearest), f32::INFINITY);
    assert_eq!(round(f32::MIN, Nearest), f32::NEG_INFINITY);
    assert_eq!(round(f32::MAX, Truncate), f32::from_bits(0x7F7F_E000));
    // Non-finite values pass through.
    assert!(round(f32::NAN, Nearest).is_nan());
    assert_eq!(round(f32::INFINITY, Truncate), f32::INFINITY);
    // Relative error of nearest at most half a TF32 ulp, of truncation under one.
    for i in 0..10_000 {
        let x = 1.0 + i as f32 * 1.37e-4;
        let (n, t) = (round(x, Nearest), round(x, Truncate));
        assert!(((n - x) / x).abs() <= 2f32.powi(-11), "{x}");
        assert!(((x - t) / x).abs() < 2f32.powi(-10) && t <= x, "{x}");
    }
}

#[test]
fn every_product_of_an_emulated_step_sees_tf32_operands() {
    let dev = Device::Cpu;
    // A product inside the emulation equals candle's product of the rounded operands, bit for
    // bit, and differs from the f32 product.
    let w = Tensor::randn(0f32, 1.0, (7, 33), &dev).unwrap();
    let x = Tensor::randn(0f32, 1.0, (33, 50), &dev).unwrap();
    let r = Tf32Rounding::Nearest;
    let emulated = with_tf32_emulation_on_cpu(r, || layer::dense_fwd(&w, None, &x)).unwrap();
    let by_hand = round_tf32(&w, r)
        .unwrap()
        .matmul(&round_tf32(&x, r).unwrap())
        .unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(bits(&emulated), bits(&by_hand));
    assert_ne!(bits(&emulated), bits(&w.matmul(&x).unwrap()));
    // Outside the closure the switch is off again.
    assert_eq!(
        bits(&layer::dense_fwd(&w, None, &x).unwrap()),
        bits(&impls::ops::dense::product(&w, &x).unwrap())
    );

    // The products that add into their destination (Linear's, into its bias; the mlp input
    // gradient, into the gradient buffer) see rounded operands too, the transposed Wᵀ included.
    let bias = Tensor::randn(0f32, 1.0, 7, &dev).unwrap();
    let emulated = with_tf32_emulation_on_cpu(r, || layer::dense_fwd(&w, Some(&bias), &x)).unwrap();
    let accumulated = |w: &Tensor, x: &Tensor| {
        let y = impls::ops::elementwise::repeat_rows(&bias, 50).unwrap();
        impls::ops::dense::accumulate(&y, w, x).unwrap();
        y
    };
    let by_hand = accumulated(&round_tf32(&w, r).unwrap(), &round_tf32(&x, r).unwrap());
    assert_eq!(bits(&emulated), bits(&by_hand));
    assert_ne!(bits(&emulated), bits(&accumulated(&w, &x)));
    let gy = Tensor::randn(0f32, 1.0, (7, 50), &dev).unwrap();
    let into = |round: bool| {
        let dst = Tensor::ones((33, 50), DType::F32, &dev).unwrap();
        let add = || layer::dense_bwd_input_accumulate(&w, &gy, &dst).unwrap();
        if round {
            with_tf32_emulation_on_cpu(r, add)
        } else {
            add()
        }
        bits(&dst)
    };
    let by_hand = Tensor::ones((33, 50), DType::F32, &dev).unwrap();
    let wt = w.t().unwrap();
    impls::ops::dense::accumulate(
        &by_hand,
        &round_tf32(&wt, r).unwrap(),
        &round_tf32(&gy, r).unwrap(),
    )
    .unwrap();
    assert_eq!(into(true), bits(&by_hand));
    assert_ne!(into(true), into(false));

    // A whole step of each family (bc: the Conv1×1 and tap-stack products; mlp: Linear's
    // product added into its bias and the input gradient added into the gradient buffer): the
    // emulated gradients move away from f64 by about TF32's precision, far more than the f32
    // step's own error.
    for family in [Family::Bc, Family::Mlp] {
        let cfg = Config {
            depth: 2,
            dtype: DType::F32,
            ..Config::tiny(family)
        };
        let case = Case::random(&cfg, &dev).unwrap();
        let reference = case.reference().unwrap();
        let run = || case.step(Variant::NAIVE).unwrap();
        let err = |r: impls::StepResult| {
            impls::check::compare::compare(&r.to_dtype(DType::F64).unwrap(), &reference)
                .unwrap()
                .overall
                .max_rel
        };
        let f32_err = err(layer::with_tap_stack_on_cpu(run));
        let tf32_err = err(with_tf32_emulation_on_cpu(r, run));
        println!("tiny {family:?} L=2: f32 {f32_err:.2e}, tf32 {tf32_err:.2e}");
        assert!(
            tf32_err > 30.0 * f32_err,
            "{family:?}: f32 {f32_err:e}, tf32 {tf32_err:e}"
        );
        assert!(
            tf32_err > 1e-5 && tf32_err < 1e-1,
            "{family:?}: tf32 {tf32_err:e}"
        );
    }
}

#[test]
fn tf32_emulation_refuses_f64_operands() {
    let cfg = Config {
        dtype: DType::F64,
        ..Config::tiny(Family::Mlp)
    };
    let case = Case::random(&cfg, &Device::Cpu).unwrap();
    let e = with_tf32_emulation_on_cpu(Tf32Rounding::Truncate, || case.step(Variant::NAIVE))
        .expect_err("an f64 step cannot be emulated in TF32");
    assert!(e.to_string().contains("TF32 emulation"), "{e}");
}
