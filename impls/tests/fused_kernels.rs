//! The fused CPU kernels against the same maths composed from candle ops (the path other
//! devices take), in f64 on odd shapes so every border of the shifted views is exercised.

use candle_core::{Device, Tensor};
use impls::fused::{self, Grid, TAPS};

/// f64 results of two summation orders of the same sums of O(1) terms: ~1e-15 apart.
const TOL: f64 = 1e-12;

fn close(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let d = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    assert!(d <= TOL, "{what}: max |fused − generic| = {d:e}");
}

fn rand(shape: (usize, usize), seed: u64) -> Tensor {
    let n = shape.0 * shape.1;
    Tensor::from_vec(
        impls::params::uniform(seed, "t", n, -2.0, 2.0),
        shape,
        &Device::Cpu,
    )
    .unwrap()
}

#[test]
fn fused_kernels_match_generic_candle_ops() {
    let (c, grid) = (5, Grid { n: 2, h: 3, w: 4 });
    let m = grid.n * grid.h * grid.w;
    let x = rand((c, m), 1);
    let gy = rand((c, m), 2);
    let (mean, var) = fused::bn_stats(&x).unwrap();
    let (gm, gv) = fused::generic_bn_stats(&x).unwrap();
    close(&mean, &gm, "bn mean");
    close(&var, &gv, "bn var");
    let (scale, shift) = (rand((c, 1), 3), rand((c, 1), 4));
    close(
        &fused::affine_rows(&x, &scale, &shift).unwrap(),
        &fused::generic_affine_rows(&x, &scale, &shift).unwrap(),
        "bn apply",
    );
    let invstd = (var + 1e-5).unwrap().sqrt().unwrap().recip().unwrap();
    let (a1, b1) = fused::bn_bwd_reduce(&gy, &x, &mean, &invstd).unwrap();
    let (a2, b2) = fused::generic_bn_bwd_reduce(&gy, &x, &mean, &invstd).unwrap();
    close(&a1, &a2, "Σgy");
    close(&b1, &b2, "Σgy·x̂");
    let (ca, cb, cc) = (rand((c, 1), 5), rand((c, 1), 6), rand((c, 1), 7));
    close(
        &fused::bn_bwd_dx(&gy, &x, &ca, &cb, &cc).unwrap(),
        &fused::generic_bn_bwd_dx(&gy, &x, &ca, &cb, &cc).unwrap(),
        "bn dx",
    );
    // In-place accumulation: dst + (A·gy + B·x + C), against the two-step path bit for bit.
    let dst = rand((c, m), 9);
    let expected = (&dst + fused::bn_bwd_dx(&gy, &x, &ca, &cb, &cc).unwrap()).unwrap();
    fused::bn_bwd_dx_accumulate(&dst, &gy, &x, &ca, &cb, &cc).unwrap();
    assert_eq!(
        dst.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
        expected.flatten_all().unwrap().to_vec1::<f64>().unwrap(),
        "fused accumulate differs from dx then add"
    );
    for sign in [1isize, -1] {
        let offsets = TAPS.map(|(dy, dx)| (sign * (dy as isize - 1), sign * (dx as isize - 1)));
        close(
            &fused::shift_stack(&x, grid, offsets).unwrap(),
            &fused::generic_shift_stack(&x, grid, offsets).unwrap(),
            "shift stack",
        );
        let p = rand((9 * c, m), 8);
        close(
            &fused::shift_sum(&p, grid, offsets).unwrap(),
            &fused::generic_shift_sum(&p, grid, offsets).unwrap(),
            "shift sum",
        );
    }
    // A hand-checked value: shifting by (+1, 0) moves row y+1 up to row y and zeroes the last.
    let t = Tensor::arange(0f64, 12.0, &Device::Cpu)
        .unwrap()
        .reshape((1, 12))
        .unwrap();
    let g = Grid { n: 1, h: 3, w: 4 };
    let mut offs = [(0isize, 0isize); 9];
    offs[0] = (1, 0);
    let s = fused::shift_stack(&t, g, offs)
        .unwrap()
        .narrow(0, 0, 1)
        .unwrap();
    let v = s.flatten_all().unwrap().to_vec1::<f64>().unwrap();
    assert_eq!(v, [4., 5., 6., 7., 8., 9., 10., 11., 0., 0., 0., 0.]);
}

/// The fused BN apply + ReLU (what `inplace` strategies run) is bitwise BN apply followed by the
/// in-place ReLU kernel, including NaN → 0, and matches the candle-op oracle.
#[test]
fn fused_affine_relu_is_affine_then_inplace_relu_bitwise() {
    let x = rand((4, 37), 21);
    // Row 1 has a NaN scale: every value of it is NaN before the ReLU, 0 after.
    let scale = Tensor::new(&[[1.0f64], [f64::NAN], [-0.5], [0.0]], &Device::Cpu).unwrap();
    let shift = rand((4, 1), 22);
    let fused_out = fused::affine_rows_relu(&x, &scale, &shift).unwrap();
    let two_step =
        impls::kernels::relu_inplace(fused::affine_rows(&x, &scale, &shift).unwrap()).unwrap();
    let bits = |t: &Tensor| -> Vec<u64> {
        let v = t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        v.into_iter().map(f64::to_bits).collect()
    };
    assert_eq!(bits(&fused_out), bits(&two_step));
    let row1 = fused_out.narrow(0, 1, 1).unwrap().flatten_all().unwrap();
    assert!(row1.to_vec1::<f64>().unwrap().iter().all(|v| *v == 0.0));
    // Rows without NaN against the candle-op oracle (relu of the composed affine).
    let rows = [0usize, 2, 3];
    for r in rows {
        close(
            &fused_out.narrow(0, r, 1).unwrap(),
            &fused::generic_affine_rows_relu(
                &x.narrow(0, r, 1).unwrap(),
                &scale.narrow(0, r, 1).unwrap(),
                &shift.narrow(0, r, 1).unwrap(),
            )
            .unwrap(),
            "bn apply relu",
        );
    }
    // Half the outputs of a random affine are clipped: the ReLU ran.
    let zeros = fused_out
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
        .iter()
        .filter(|v| **v == 0.0)
        .count();
    assert!(zeros > 37 + 10, "only {zeros} zeros");
}
