//! The bf16 CPU kernels (mixed precision, PyTorch autocast's rule: bf16 features, f32 tables
//! and parameter gradients, f32 accumulation) against their f32 twins run on the same values
//! widened (exact), and f32 results against an f64 reference of the same values.
//!
//! Every input is drawn in f32 and rounded to bf16 first, so both sides see the same values.
//! The bounds, each asserted by one helper:
//! - [`bitwise`]: data movement and selection (ReLU, its backward, shift stack, cat, copy,
//!   repeat, channel-major) moves stored bits, and the element-wise ops whose bf16 kernel
//!   computes in f32 exactly the f32 twin's value and rounds it once (BN apply, the ReLU mask
//!   from BN's input, `add_assign`, the shift sum, whose nine taps are added in the same order)
//!   equal `bf16(f32 twin)` bit for bit — stronger than 1 ulp. BN's dx and its accumulation
//!   evaluate `((A·gy) + (B·x)) + C` in f32 arithmetic (autocast's) where the f32 twin takes
//!   f64: bit for bit this test's own f32 evaluation rounded to bf16, and [`within_one_ulp`] of
//!   the twin with the f32 evaluation's error as slack.
//! - [`within_one_ulp`]: the products (dense, 3×3 convolution) accumulate in f32 in another
//!   blocking than the f32 twin's (dense products on both of their kernels: AVX-512 BF16 dot
//!   products, whose pairs are exact like any bf16 product, and the widened f32 `gemm`), so `|bf16 result − bf16(f32 twin)| ≤ 1 bf16 ulp`; where the
//!   two f32 sums may differ by more than a bf16 rounding can absorb (a result near zero after
//!   cancellation) the bound is `|result − twin| ≤ ulp_bf16(twin) + 2·γ_K·Σ|a·b|` (each f32 sum
//!   of K terms is within `γ_K·Σ|a·b|` of the exact one, `γ_K = K·u/(1 − K·u)`, `u = 2⁻²⁴`;
//!   products of two bf16 values are exact in f32).
//! - [`within_relative`]: f32 outputs of bf16 operands. Statistics accumulate in f64 and round
//!   once to f32: `|f32 − f64 ref| ≤ 2⁻²⁴·|ref|` (+ `M·2⁻⁵³` of the f64 sum, negligible at these
//!   shapes, taken as another `2⁻²⁴·|ref|`). BN backward's sums take f32 terms (three roundings
//!   each) folded in f32 blocks (four additions) before f64 (autocast's arithmetic): that plus
//!   `2·7·2⁻²⁴·Σ|terms|`, and bit for bit the blocked order restated ([`block_order_sum`]). Weight gradients accumulate
//!   K terms in f32: `|f32 − f64 ref| ≤ γ_K·Σ|a·b|` (the f64 reference's own error, `K·2⁻⁵³·Σ`,
//!   is below one more f32 ulp, added).

use candle_core::{DType, Device, Tensor};
use half::bf16;
use impls::ops::cpu::bf16_dot::{self, Isa};
use impls::ops::layout::grid::{Grid, TAPS};
use impls::ops::{bn, bn_backward, conv3x3, dense, elementwise, shift};

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// `γ_K = K·u / (1 − K·u)` with `u = 2⁻²⁴`: the relative bound of an f32 sum of K terms.
fn gamma(k: usize) -> f64 {
    let ku = k as f64 * U;
    ku / (1.0 - ku)
}

/// A `shape` tensor of bf16 values (drawn uniform in [−2, 2] in f64, rounded to bf16 once)
/// and the same values in f32 and f64 (exact widenings).
fn draw(shape: &[usize], seed: u64) -> (Tensor, Tensor, Tensor) {
    let n = shape.iter().product();
    let v = impls::config::params::uniform(seed, "bf16", n, -2.0, 2.0);
    let v: Vec<bf16> = v.into_iter().map(|x| bf16::from_f32(x as f32)).collect();
    let b = Tensor::from_vec(v, shape, &Device::Cpu).unwrap();
    let f = b.to_dtype(DType::F32).unwrap();
    let d = b.to_dtype(DType::F64).unwrap();
    (b, f, d)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

fn bf16s(t: &Tensor) -> Vec<bf16> {
    assert_eq!(t.dtype(), DType::BF16, "a bf16 result");
    t.flatten_all().unwrap().to_vec1::<bf16>().unwrap()
}

/// `t`'s f32 values rounded once to bf16 (round to nearest even).
fn rounded(t: &Tensor) -> Vec<bf16> {
    assert_eq!(t.dtype(), DType::F32, "an f32 twin");
    f32s(t).into_iter().map(bf16::from_f32).collect()
}

/// The bf16 values in order of magnitude as integers (−0 and +0 both 0): two finite values
/// are `|a − b|` ulps apart.
fn ordinal(v: bf16) -> i32 {
    let b = v.to_bits();
    if b & 0x8000 != 0 {
        -i32::from(b & 0x7fff)
    } else {
        i32::from(b)
    }
}

/// One bf16 ulp at `v`'s magnitude (the spacing above |v| rounded to bf16).
fn ulp_at(v: f32) -> f64 {
    let b = bf16::from_f32(v.abs());
    f64::from(bf16::from_bits(b.to_bits() + 1).to_f32() - b.to_f32())
}

/// `got` and `want` bit for bit (NaNs included), or the first difference.
fn bitwise(what: &str, got: &[bf16], want: &[bf16]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    match got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {} want {}",
            got[i], want[i]
        )),
    }
}

/// Each `got` within one bf16 ulp of `bf16(twin)`, or (see the module) within
/// `ulp_bf16(twin) + slack[i]` of the f32 twin. Returns the largest ulp distance seen.
fn within_one_ulp(what: &str, got: &[bf16], twin: &[f32], slack: &[f64]) -> Result<i32, String> {
    assert_eq!(got.len(), twin.len(), "{what}: lengths");
    assert_eq!(got.len(), slack.len(), "{what}: lengths");
    let mut worst = 0;
    for (i, ((&g, &t), &s)) in got.iter().zip(twin).zip(slack).enumerate() {
        let d = (ordinal(g) - ordinal(bf16::from_f32(t))).abs();
        worst = worst.max(d);
        let near = (f64::from(g.to_f32()) - f64::from(t)).abs() <= ulp_at(t) + s;
        if d > 1 && !near {
            return Err(format!(
                "{what}: element {i} is {g}, {d} ulps from bf16({t}) (slack {s:e})"
            ));
        }
    }
    Ok(worst)
}

/// Each `|got − reference| ≤ bound[i]`.
fn within_relative(
    what: &str,
    got: &[f32],
    reference: &[f64],
    bound: &[f64],
) -> Result<(), String> {
    assert_eq!(got.len(), reference.len(), "{what}: lengths");
    for (i, ((&g, &r), &b)) in got.iter().zip(reference).zip(bound).enumerate() {
        // (NaN fails too)
        let ok = (f64::from(g) - r).abs() <= b;
        if !ok {
            return Err(format!(
                "{what}: element {i} is {g}, reference {r}, bound {b:e}"
            ));
        }
    }
    Ok(())
}

/// `2·2⁻²⁴·|ref|` per element: one f32 rounding of an f64 sum (and the sum's own error).
fn one_rounding(reference: &[f64]) -> Vec<f64> {
    reference.iter().map(|r| 2.0 * U * r.abs()).collect()
}

/// The blocked order of bf16 features' BN sums (`block_sums` in `impls::ops::cpu::shared`),
/// restated: blocks of 256 f32 terms (the last padded with +0), each folded in f32 by halves
/// (`t[i] += t[i + 128]`, then 64, 32, 16), the 16 values added in f64 to 16 lane sums, the
/// lanes added pairwise (8 + 8, 4 + 4, …).
fn block_order_sum(terms: &[f32]) -> f64 {
    let mut lanes = [0f64; 16];
    for block in terms.chunks(256) {
        let mut t = [0f32; 256];
        t[..block.len()].copy_from_slice(block);
        let mut w = 256;
        while w > 16 {
            w /= 2;
            for i in 0..w {
                t[i] += t[i + w];
            }
        }
        for (l, v) in lanes.iter_mut().zip(&t) {
            *l += f64::from(*v);
        }
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for l in 0..w {
            lanes[l] += lanes[l + w];
        }
    }
    lanes[0]
}

fn expect_err<T: std::fmt::Debug>(r: impls::Result<T>, op: &str) {
    let e = r
        .expect_err("an unsupported dtype mix must be an error")
        .to_string();
    assert!(e.contains(op), "the error names {op}: {e}");
}

#[test]
fn bn_forward_takes_bf16_features_and_f32_tables() {
    let (c, m) = (5, 300);
    let (xb, xf, xd) = draw(&[c, m], 1);
    // statistics: f32 from bf16, the f32 twin's bits (same f64 sums), one rounding of f64's
    let mv = bn::bn_stats(&xb).unwrap();
    assert_eq!(mv.dtype(), DType::F32);
    assert_eq!(
        f32s(&mv),
        f32s(&bn::bn_stats(&xf).unwrap()),
        "bn stats twin"
    );
    let reference = f64s(&bn::bn_stats(&xd).unwrap());
    within_relative(
        "bn stats",
        &f32s(&mv),
        &reference,
        &one_rounding(&reference),
    )
    .unwrap();
    // the per-channel step stays f32 and takes the f32 statistics
    let (_, gamma, _) = draw(&[c], 2);
    let (_, beta, _) = draw(&[c], 3);
    let (rm, rv) = (
        Tensor::zeros(c, DType::F32, &Device::Cpu).unwrap(),
        Tensor::ones(c, DType::F32, &Device::Cpu).unwrap(),
    );
    let (table, _) = bn::bn_prepare(&mv, &gamma, &beta, &rm, &rv, m).unwrap();
    let coef = table.narrow(0, 2, 2).unwrap().contiguous().unwrap();
    // apply, with and without ReLU: bf16(f32 twin) bit for bit
    let y = bn::affine_rows(&xb, &coef).unwrap();
    let twin = bn::affine_rows(&xf, &coef).unwrap();
    bitwise("bn apply", &bf16s(&y), &rounded(&twin)).unwrap();
    let yr = bn::affine_rows_relu(&xb, &coef).unwrap();
    let twin_r = bn::affine_rows_relu(&xf, &coef).unwrap();
    bitwise("bn apply relu", &bf16s(&yr), &rounded(&twin_r)).unwrap();
    // the fused ReLU is the ReLU of the bf16 apply (the same select on the rounded value)
    bitwise(
        "bn apply relu = relu(apply)",
        &bf16s(&yr),
        &bf16s(&elementwise::relu(&y).unwrap()),
    )
    .unwrap();
    // a column range of a wider map (rows of unit column stride) takes the kernel too
    let view = xb.narrow(1, 7, 100).unwrap();
    let twin_v = bn::affine_rows(&xf.narrow(1, 7, 100).unwrap(), &coef).unwrap();
    bitwise(
        "bn apply view",
        &bf16s(&bn::affine_rows(&view, &coef).unwrap()),
        &rounded(&twin_v),
    )
    .unwrap();
}

#[test]
fn bn_backward_takes_bf16_features_and_f32_tables() {
    let (c, m) = (4, 257);
    let (xb, xf, xd) = draw(&[c, m], 11);
    let (gb, gf, gd) = draw(&[c, m], 12);
    let (_, coef2, _) = draw(&[2, c], 13);
    // the ReLU gradient masked from BN's input: bf16(f32 twin), and relu_bwd of the bf16 apply
    let r = bn_backward::relu_bwd_affine(&gb, &xb, &coef2).unwrap();
    let twin = bn_backward::relu_bwd_affine(&gf, &xf, &coef2).unwrap();
    bitwise("relu bwd affine", &bf16s(&r), &rounded(&twin)).unwrap();
    let via_out = elementwise::relu_bwd(&gb, &bn::affine_rows_relu(&xb, &coef2).unwrap()).unwrap();
    bitwise(
        "relu bwd affine = relu_bwd(g, apply relu)",
        &bf16s(&r),
        &bf16s(&via_out),
    )
    .unwrap();
    let inplace = bn_backward::relu_bwd_affine_inplace(gb.copy().unwrap(), &xb, &coef2).unwrap();
    bitwise("relu bwd affine inplace", &bf16s(&inplace), &bf16s(&r)).unwrap();
    // the reduction: an f32 table; its sums Σgy and Σgy·x̂ from f32 terms (autocast's) in the
    // documented blocked order (`block_sums`, restated below: bit for bit), within the f32
    // evaluation's bound of the f64 reference; A, B, C bit for bit the coefficient maths of
    // those sums
    let (_, mean, _) = draw(&[c], 14);
    let invstd = (draw(&[c], 15).1.abs().unwrap() + 0.5).unwrap();
    let st = Tensor::stack(&[&mean, &invstd], 0).unwrap();
    let (_, gamma, _) = draw(&[c], 16);
    let red = bn_backward::bn_bwd_reduce(&gb, &xb, &st, &gamma).unwrap();
    assert_eq!(red.dtype(), DType::F32);
    let (mu, is) = (f32s(&mean), f32s(&invstd));
    let (gv, xv) = (f32s(&gf), f32s(&xf));
    let mut own = vec![0f32; 2 * c];
    let mut scale = vec![0f64; 2 * c];
    for r in 0..c {
        let row = r * m..(r + 1) * m;
        let sgx_terms: Vec<f32> = row
            .clone()
            .map(|i| gv[i] * (xv[i] - mu[r]) * is[r])
            .collect();
        own[r] = block_order_sum(&gv[row.clone()]) as f32;
        own[c + r] = block_order_sum(&sgx_terms) as f32;
        scale[r] = gv[row.clone()].iter().map(|v| f64::from(v.abs())).sum();
        scale[c + r] = row
            .map(|i| {
                (f64::from(gv[i]) * (f64::from(xv[i]) - f64::from(mu[r])) * f64::from(is[r])).abs()
            })
            .sum();
    }
    assert_eq!(
        f32s(&red.narrow(0, 0, 2).unwrap()),
        own,
        "bn bwd reduce sums in the blocked f32 order"
    );
    let coef = bn_backward::generic_bn_bwd_coef(
        &red.narrow(0, 0, 1).unwrap().reshape((c, 1)).unwrap(),
        &red.narrow(0, 1, 1).unwrap().reshape((c, 1)).unwrap(),
        &st,
        &gamma,
        m,
    )
    .unwrap();
    for (q, want) in coef.iter().enumerate() {
        let got = f32s(&red.narrow(0, 2 + q, 1).unwrap());
        assert_eq!(got, f32s(want), "bn bwd reduce coefficient {q} of its sums");
    }
    let f64_of = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
    let reference = bn_backward::bn_bwd_reduce(&gd, &xd, &f64_of(&st), &f64_of(&gamma)).unwrap();
    let sums = f64s(&reference.narrow(0, 0, 2).unwrap());
    // one rounding to f32, the terms' three f32 roundings and the blocks' four f32 additions
    let bound: Vec<f64> = (one_rounding(&sums).iter().zip(&scale))
        .map(|(b, s)| b + 2.0 * 7.0 * U * s)
        .collect();
    within_relative(
        "bn bwd sums",
        &f32s(&red.narrow(0, 0, 2).unwrap()),
        &sums,
        &bound,
    )
    .unwrap();
    // dx and its accumulation into a bf16 gradient buffer: `((A·gy) + (B·x)) + C` in f32
    // arithmetic (autocast's; the f32 twin evaluates it in f64), rounded once to bf16
    let coef3 = red.narrow(0, 2, 3).unwrap().contiguous().unwrap();
    let k = f32s(&coef3);
    let (g, x) = (f32s(&gf), f32s(&xf));
    // this test's own f32 evaluation of element i (row i / m), and the scale of its rounding
    let f32_dx = |i: usize| {
        let r = i / m;
        let (a, b, cc) = (k[r], k[c + r], k[2 * c + r]);
        let scale = (a * g[i]).abs() + (b * x[i]).abs() + cc.abs();
        (a * g[i] + b * x[i] + cc, f64::from(scale))
    };
    let (want, scale): (Vec<f32>, Vec<f64>) = (0..c * m).map(f32_dx).unzip();
    let dx = bn_backward::bn_bwd_dx(&gb, &xb, &coef3).unwrap();
    let own: Vec<bf16> = want.iter().map(|&v| bf16::from_f32(v)).collect();
    bitwise("bn bwd dx = bf16(f32 arithmetic)", &bf16s(&dx), &own).unwrap();
    // and the f32 twin within one bf16 ulp, or that plus the f32 evaluation's error (three
    // roundings of terms up to `scale`: 3·2⁻²⁴·scale, doubled) where it straddles a rounding
    let twin = bn_backward::bn_bwd_dx(&gf, &xf, &coef3).unwrap();
    let slack: Vec<f64> = scale.iter().map(|s| 6.0 * U * s).collect();
    within_one_ulp("bn bwd dx ~ f32 twin", &bf16s(&dx), &f32s(&twin), &slack).unwrap();
    let (db, df, _) = draw(&[c, m], 17);
    let before = f32s(&df);
    bn_backward::bn_bwd_dx_accumulate(&db, &gb, &xb, &coef3).unwrap();
    let own: Vec<bf16> = (before.iter().zip(&want))
        .map(|(&d, &v)| bf16::from_f32(d + v))
        .collect();
    bitwise(
        "bn bwd dx accumulate = bf16(dst + f32 dx)",
        &bf16s(&db),
        &own,
    )
    .unwrap();
    bn_backward::bn_bwd_dx_accumulate(&df, &gf, &xf, &coef3).unwrap();
    let slack: Vec<f64> = (scale.iter().zip(&before))
        .map(|(s, d)| 8.0 * U * (s + f64::from(d.abs())))
        .collect();
    within_one_ulp(
        "bn bwd dx accumulate ~ f32 twin",
        &bf16s(&db),
        &f32s(&df),
        &slack,
    )
    .unwrap();

    // One element where f32 arithmetic and an f64 evaluation round apart (random draws rarely
    // meet one): A = 1, B = 2⁻⁸ + 2⁻¹⁶ + 2⁻³⁰, C = −1, gy = x = 1. In f32, 1 + B rounds to
    // 1 + 2⁻⁸ + 2⁻¹⁶, so the result is 2⁻⁸·(1 + 2⁻⁸), a bf16 tie, which goes to even: 2⁻⁸. In
    // f64 it stays above the tie (2⁻³⁰ more) and rounds up to 2⁻⁸ + 2⁻¹⁵.
    let b = 2f32.powi(-8) + 2f32.powi(-16) + 2f32.powi(-30);
    assert_eq!(
        f64::from(b),
        2f64.powi(-8) + 2f64.powi(-16) + 2f64.powi(-30)
    );
    let coef = Tensor::new(&[[1f32], [b], [-1f32]], &Device::Cpu).unwrap();
    let one = Tensor::new(&[[bf16::ONE]], &Device::Cpu).unwrap();
    let dx = bn_backward::bn_bwd_dx(&one, &one, &coef).unwrap();
    assert_eq!(
        bf16s(&dx),
        [bf16::from_f32(2f32.powi(-8))],
        "bn bwd dx in f32"
    );
    let dst = Tensor::new(&[[bf16::ZERO]], &Device::Cpu).unwrap();
    bn_backward::bn_bwd_dx_accumulate(&dst, &one, &one, &coef).unwrap();
    assert_eq!(
        bf16s(&dst),
        [bf16::from_f32(2f32.powi(-8))],
        "bn bwd dx accumulate in f32"
    );
}

#[test]
fn elementwise_ops_take_bf16() {
    let (c, m) = (6, 70);
    let (xb, xf, _) = draw(&[c, m], 21);
    let (gb, gf, _) = draw(&[c, m], 22);
    // selection: exact, NaN and signed zeros included
    let odd = Tensor::new(
        &[f32::NAN, -0.0, 0.0, -1.5, 2.5, f32::INFINITY],
        &Device::Cpu,
    )
    .unwrap()
    .to_dtype(DType::BF16)
    .unwrap();
    for x in [&xb, &odd] {
        let y = elementwise::relu(x).unwrap();
        let twin = elementwise::relu(&x.to_dtype(DType::F32).unwrap()).unwrap();
        bitwise("relu", &bf16s(&y), &rounded(&twin)).unwrap();
        let inplace = elementwise::relu_inplace(x.copy().unwrap()).unwrap();
        bitwise("relu inplace", &bf16s(&inplace), &bf16s(&y)).unwrap();
    }
    let out = elementwise::relu(&xb).unwrap();
    let r = elementwise::relu_bwd(&gb, &out).unwrap();
    let twin = elementwise::relu_bwd(&gf, &elementwise::relu(&xf).unwrap()).unwrap();
    bitwise("relu bwd", &bf16s(&r), &rounded(&twin)).unwrap();
    let ri = elementwise::relu_bwd_inplace(gb.copy().unwrap(), &out).unwrap();
    bitwise("relu bwd inplace", &bf16s(&ri), &bf16s(&r)).unwrap();
    // add: bf16(f32(a) + f32(b))
    let acc = xb.copy().unwrap();
    elementwise::add_assign(&acc, &gb).unwrap();
    bitwise("add assign", &bf16s(&acc), &rounded(&(&xf + &gf).unwrap())).unwrap();
    // data movement: the stored bits
    let cat = elementwise::cat_rows(&[&xb, &gb, &xb.narrow(0, 1, 2).unwrap()]).unwrap();
    let want = Tensor::cat(&[&xb, &gb, &xb.narrow(0, 1, 2).unwrap()], 0).unwrap();
    bitwise("cat rows", &bf16s(&cat), &bf16s(&want)).unwrap();
    let copy = elementwise::copy_rows(&xb).unwrap();
    bitwise("copy rows", &bf16s(&copy), &bf16s(&xb)).unwrap();
    let row = xb.narrow(0, 2, 1).unwrap().flatten_all().unwrap();
    let rep = elementwise::repeat_rows(&row, 9).unwrap();
    let want = row.reshape((m, 1)).unwrap().broadcast_as((m, 9)).unwrap();
    bitwise(
        "repeat rows",
        &bf16s(&rep),
        &bf16s(&want.contiguous().unwrap()),
    )
    .unwrap();
    let (nb, _, _) = draw(&[3, 5, 2, 7], 23);
    let cm = elementwise::to_channel_major(&nb).unwrap().unwrap();
    let want = nb
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((5, 42))
        .unwrap();
    bitwise("to channel major", &bf16s(&cm), &bf16s(&want)).unwrap();
}

#[test]
fn shift_stack_and_sum_take_bf16() {
    let (c, grid) = (3, Grid { n: 2, h: 3, w: 5 });
    let m = grid.n * grid.h * grid.w;
    let (xb, xf, _) = draw(&[c, m], 31);
    let (pb, pf, _) = draw(&[9 * c, m], 32);
    for sign in [1isize, -1] {
        let offsets = TAPS.map(|(dy, dx)| (sign * (dy as isize - 1), sign * (dx as isize - 1)));
        let st = shift::shift_stack(&xb, grid, offsets).unwrap();
        let twin = shift::shift_stack(&xf, grid, offsets).unwrap();
        bitwise("shift stack", &bf16s(&st), &rounded(&twin)).unwrap();
        // the nine taps summed in f32 in the twin's order, rounded once
        let sum = shift::shift_sum(&pb, grid, offsets).unwrap();
        let twin = shift::shift_sum(&pf, grid, offsets).unwrap();
        bitwise("shift sum", &bf16s(&sum), &rounded(&twin)).unwrap();
    }
}

/// The GPU path's bf16 convolution sums f32 tap products into bf16 features: bitwise the f32
/// shift sum of the same products rounded once (products that bf16 cannot hold, so a sum that
/// rounded them first would differ), into a whole map and into a column range of whole images
/// of a wider one (row-strided); a stack of f32 into bf16 is refused.
#[test]
fn shift_sum_of_f32_products_into_bf16_rounds_once() {
    let (c, grid) = (3, Grid { n: 2, h: 3, w: 5 });
    let m = grid.n * grid.h * grid.w;
    let plane = grid.h * grid.w;
    let (_, pf, pd) = draw(&[9 * c, m], 33);
    // f32 values with bits below bf16's precision: x·(1 + 2⁻¹²)
    let p32 = pd
        .affine(1.0 + 2f64.powi(-12), 0.0)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    assert_ne!(f32s(&p32), f32s(&pf), "the products hold more than bf16");
    for sign in [1isize, -1] {
        let offsets = TAPS.map(|(dy, dx)| (sign * (dy as isize - 1), sign * (dx as isize - 1)));
        let twin = rounded(&shift::shift_sum(&p32, grid, offsets).unwrap());
        let whole = Tensor::zeros((c, m), DType::BF16, &Device::Cpu).unwrap();
        shift::shift_sum_into(&whole, &p32, grid, offsets).unwrap();
        bitwise("f32 products into bf16", &bf16s(&whole), &twin).unwrap();
        let narrow = shift::shift_sum(&p32.to_dtype(DType::BF16).unwrap(), grid, offsets).unwrap();
        assert!(
            bitwise("products rounded first", &bf16s(&narrow), &twin).is_err(),
            "rounding the products first gave the same bits: the check cannot tell"
        );
        // the second image as columns of a wider map: row stride m + 4
        let wide = Tensor::zeros((c, m + 4), DType::BF16, &Device::Cpu).unwrap();
        let one = Grid { n: 1, ..grid };
        let part = p32.narrow(1, plane, plane).unwrap();
        shift::shift_sum_into(&wide.narrow(1, 2, plane).unwrap(), &part, one, offsets).unwrap();
        let want = rounded(&shift::shift_sum(&part.contiguous().unwrap(), one, offsets).unwrap());
        let got = wide.narrow(1, 2, plane).unwrap().contiguous().unwrap();
        bitwise("into a column range", &bf16s(&got), &want).unwrap();
    }
    let stack = Tensor::zeros((9 * c, m), DType::BF16, &Device::Cpu).unwrap();
    let x = Tensor::zeros((c, m), DType::F32, &Device::Cpu).unwrap();
    let e = shift::shift_stack_into(&stack, &x, grid, TAPS.map(|_| (0, 0)))
        .expect_err("a stack of f32 into bf16");
    assert!(format!("{e}").contains("stack"), "{e}");
}

/// `Σ_p |a[i, p]|·|b[p, j]|` in f64: the scale of the rounding errors of `a · b`.
fn abs_product(a: &Tensor, b: &Tensor) -> Vec<f64> {
    let (a, b) = (
        a.to_dtype(DType::F64).unwrap().abs().unwrap(),
        b.to_dtype(DType::F64).unwrap().abs().unwrap(),
    );
    f64s(&a.matmul(&b).unwrap())
}

/// Held by every test that runs bf16 products: the choice of the products' kernel is
/// process-wide ([`bf16_dot::force_isa`]), so a test that changes it must not run beside one
/// that compares two products bit for bit.
static PRODUCT_KERNEL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `check` with bf16 products on the dot-product kernel's instruction set `isa` (one this
/// CPU has) or, with `None`, widened to f32, other product tests held off meanwhile; the
/// default restored after.
fn with_kernel(isa: Option<Isa>, check: impl FnOnce()) {
    let _held = PRODUCT_KERNEL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        bf16_dot::force_isa(isa),
        "{isa:?}: not an instruction set of this CPU"
    );
    assert_eq!(
        bf16_dot::isa(),
        isa,
        "the products' kernel is the one asked for"
    );
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(check));
    bf16_dot::force_widened(false);
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

#[test]
fn dense_products_take_bf16_operands_with_f32_accumulation_on_the_dot_kernel() {
    // on every instruction set this CPU has (a CI machine with AVX-512 BF16 runs the AVX2 and
    // AVX-512F kernels too, as a Xeon without it would)
    let isas = bf16_dot::available();
    if isas.is_empty() {
        eprintln!("this CPU has neither AVX-512 BF16 nor AVX2 + FMA: the widened path runs (its own test)");
    }
    for isa in isas {
        eprintln!("on {isa:?}:");
        with_kernel(Some(isa), check_dense_products);
    }
}

#[test]
fn dense_products_take_bf16_operands_with_f32_accumulation_widened() {
    with_kernel(None, check_dense_products);
}

/// The dense products' bounds (module doc) on whichever kernel is in force.
fn check_dense_products() {
    // a Conv1×1 forward W·X, an input gradient Wᵀ·G, a weight gradient G·Xᵀ; inner lengths
    // over one widening block (256) and output tiles over one (128 × 256)
    for (out, c, m) in [(3, 5, 7), (48, 300, 520), (130, 40, 90)] {
        let (wb, wf, _) = draw(&[out, c], 41);
        let (xb, xf, xd) = draw(&[c, m], 42);
        let (gb, gf, gd) = draw(&[out, m], 43);
        let at = format!("{out}×{c}×{m}");
        // bf16 output: within one ulp of bf16(f32 twin) (slack: the two f32 orders)
        let y = dense::product(&wb, &xb).unwrap();
        let twin = dense::product(&wf, &xf).unwrap();
        let slack: Vec<f64> = abs_product(&wf, &xf)
            .iter()
            .map(|s| 2.0 * gamma(c) * s)
            .collect();
        let worst = within_one_ulp(&format!("W·X {at}"), &bf16s(&y), &f32s(&twin), &slack);
        eprintln!(
            "W·X {at}: at most {} ulp from bf16(f32 twin)",
            worst.unwrap()
        );
        // into a bf16 destination: bf16(f32(dst) + Σ)
        let (db, df, _) = draw(&[c, m], 44);
        let wt = (wb.t().unwrap(), wf.t().unwrap());
        dense::accumulate(&db, &wt.0, &gb).unwrap();
        dense::accumulate(&df, &wt.1, &gf).unwrap();
        let slack: Vec<f64> = abs_product(&wt.1, &gf)
            .iter()
            .map(|s| 2.0 * gamma(out + 1) * s)
            .collect();
        let worst = within_one_ulp(&format!("X + Wᵀ·G {at}"), &bf16s(&db), &f32s(&df), &slack);
        eprintln!("X + Wᵀ·G {at}: at most {} ulp", worst.unwrap());
        // f32 weight gradients of bf16 operands: γ_K·Σ|a·b| of the f64 reference
        let xt = (xb.t().unwrap(), xd.t().unwrap());
        let dw = dense::product_f32(&gb, &xt.0).unwrap();
        assert_eq!(dw.dtype(), DType::F32);
        let reference = f64s(&gd.matmul(&xt.1).unwrap());
        let scale = abs_product(&gf, &xf.t().unwrap());
        let bound: Vec<f64> = scale
            .iter()
            .zip(&reference)
            .map(|(s, r)| gamma(m) * s + U * r.abs())
            .collect();
        within_relative(&format!("G·Xᵀ f32 {at}"), &f32s(&dw), &reference, &bound).unwrap();
        let dwt = dense::product_transposed_f32(&xb, &gb.t().unwrap()).unwrap();
        assert_eq!(f32s(&dwt), f32s(&dw), "(X·Gᵀ)ᵀ f32 {at}");
        // accumulated into an f32 gradient: dW + G·Xᵀ in f32
        let (_, acc, accd) = draw(&[out, c], 45);
        dense::accumulate(&acc, &gb, &xt.0).unwrap();
        let reference = f64s(&(&accd + gd.matmul(&xt.1).unwrap()).unwrap());
        let bound: Vec<f64> = scale
            .iter()
            .zip(&reference)
            .map(|(s, r)| gamma(m + 1) * (s + r.abs()) + U * r.abs())
            .collect();
        within_relative(
            &format!("dW += G·Xᵀ f32 {at}"),
            &f32s(&acc),
            &reference,
            &bound,
        )
        .unwrap();
        // the tail form: rows[..c] += Wᵀ · rows[c..]
        let rows = Tensor::cat(&[&xb, &gb], 0).unwrap();
        dense::accumulate_tail(&rows, c, &wt.0).unwrap();
        let direct = xb.copy().unwrap();
        dense::accumulate(&direct, &wt.0, &gb).unwrap();
        bitwise(
            &format!("tail form {at}"),
            &bf16s(&rows.narrow(0, 0, c).unwrap()),
            &bf16s(&direct),
        )
        .unwrap();
        // product_into ignores the destination (NaN there does not propagate)
        let into = Tensor::full(bf16::NAN, (out, m), &Device::Cpu).unwrap();
        dense::product_into(&into, &wb, &xb).unwrap();
        bitwise(&format!("product into {at}"), &bf16s(&into), &bf16s(&y)).unwrap();
    }
}

#[test]
fn bf16_products_do_not_depend_on_the_thread_count() {
    let (wb, _, _) = draw(&[130, 300], 51);
    let (xb, _, _) = draw(&[300, 600], 52);
    let run = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| bf16s(&dense::product(&wb, &xb).unwrap()))
    };
    let kernels = bf16_dot::available().into_iter().map(Some).chain([None]);
    for isa in kernels {
        with_kernel(isa, || {
            let one = run(1);
            bitwise(
                &format!("1 vs 3 threads (dot kernel: {isa:?})"),
                &run(3),
                &one,
            )
            .unwrap();
        });
    }
}

#[test]
fn conv3x3_takes_bf16_operands_with_f32_accumulation_widened() {
    with_kernel(None, || {
        for (b, k, grid) in conv_blocks() {
            check_conv3x3(b, k, grid, false);
        }
    });
}

#[test]
fn conv3x3_takes_bf16_operands_with_f32_accumulation_on_the_dot_kernel() {
    // the 3×3 convolution takes the dot kernel on AVX-512 BF16 only (on AVX2 its widened
    // direct kernel is the faster: `conv3x3`'s op)
    let avx512 = bf16_dot::detected() == Some(Isa::Avx512Bf16);
    if !avx512 {
        eprintln!("this CPU has no AVX-512 BF16: the widened path runs (its own test)");
    }
    with_kernel(bf16_dot::detected(), || {
        for (b, k, grid) in conv_blocks() {
            check_conv3x3(b, k, grid, avx512);
        }
    });
}

/// `(B, k, grid)`: 50 rows of 7 (two tiles per image: 45 rows, then 5) on a tiny block, and
/// BC-100's layer (B = 48, k = 12) on 16×16 maps, whose packed blocks fit the widened path's
/// allocations (the dot kernel runs all three passes there).
fn conv_blocks() -> [(usize, usize, Grid); 2] {
    [
        (5, 4, Grid { n: 2, h: 50, w: 7 }),
        (48, 12, Grid { n: 2, h: 16, w: 16 }),
    ]
}

/// The 3×3 convolution's bounds on whichever kernel is in force: features within one bf16 ulp
/// of bf16(f32 twin) (slack: the two f32 orders), the weight gradient within the bound of one
/// f32 sum of its terms of the f64 reference — and on the widened path the f32 twin's own bits
/// (`widened_bits`), on the dot kernel other bits (it ran).
fn check_conv3x3(b: usize, k: usize, grid: Grid, dot: bool) {
    let m = grid.n * grid.h * grid.w;
    let (sb, sf, sd) = draw(&[b, m], 61);
    let (wb, wf, _) = draw(&[k, b, 3, 3], 62);
    let (gb, gf, gd) = draw(&[k, m], 63);
    let abs = |t: &Tensor| t.abs().unwrap();
    let at = format!("B={b} k={k} {grid:?}");
    // forward: 9·B terms per output
    let y = conv3x3::forward(&sb, &wb, grid).unwrap();
    let twin = conv3x3::forward(&sf, &wf, grid).unwrap();
    let scale = f64s(&conv3x3::forward(&abs(&sf), &abs(&wf), grid).unwrap());
    let slack: Vec<f64> = scale.iter().map(|s| 2.0 * gamma(9 * b) * s).collect();
    let worst = within_one_ulp(
        &format!("conv forward {at}"),
        &bf16s(&y),
        &f32s(&twin),
        &slack,
    )
    .unwrap();
    eprintln!("conv forward {at} (dot {dot}): at most {worst} ulp from bf16(f32 twin)");
    // data gradient: 9·k terms per output
    let ds = conv3x3::backward_data(&gb, &wb, grid).unwrap();
    let twin = conv3x3::backward_data(&gf, &wf, grid).unwrap();
    let scale = f64s(&conv3x3::backward_data(&abs(&gf), &abs(&wf), grid).unwrap());
    let slack: Vec<f64> = scale.iter().map(|s| 2.0 * gamma(9 * k) * s).collect();
    let worst = within_one_ulp(
        &format!("conv data {at}"),
        &bf16s(&ds),
        &f32s(&twin),
        &slack,
    )
    .unwrap();
    eprintln!("conv data {at} (dot {dot}): at most {worst} ulp from bf16(f32 twin)");
    // weight gradient: f32, M pixels per element (plus the 16 group partials added in order)
    let dw = conv3x3::backward_weight(&gb, &sb, grid).unwrap();
    assert_eq!(dw.dtype(), DType::F32);
    let twin = conv3x3::backward_weight(&gf, &sf, grid).unwrap();
    if dot {
        // the dot kernel's own sums (pairs in f32): not the widened path's bits
        assert_ne!(
            f32s(&dw),
            f32s(&twin),
            "conv weight {at}: the dot kernel did not run"
        );
    } else {
        // the widened operands run the f32 kernel's own sums: its twin's bits
        assert_eq!(f32s(&dw), f32s(&twin), "conv weight twin {at}");
    }
    let reference = f64s(&conv3x3::backward_weight(&gd, &sd, grid).unwrap());
    let scale = f64s(&conv3x3::backward_weight(&abs(&gf), &abs(&sf), grid).unwrap());
    let bound: Vec<f64> = scale
        .iter()
        .zip(&reference)
        .map(|(s, r)| gamma(m + conv3x3::WEIGHT_GROUPS) * s + U * r.abs())
        .collect();
    within_relative(
        &format!("conv weight f32 {at}"),
        &f32s(&dw),
        &reference,
        &bound,
    )
    .unwrap();
}

/// The 3×3 convolution in bf16 gives the same bits at 1 and 3 threads on either kernel (each
/// output summed by one tile; the weight gradient's groups fixed).
#[test]
fn bf16_convolutions_do_not_depend_on_the_thread_count() {
    let (b, k, grid) = conv_blocks()[1];
    let m = grid.n * grid.h * grid.w;
    let (sb, _, _) = draw(&[b, m], 64);
    let (wb, _, _) = draw(&[k, b, 3, 3], 65);
    let (gb, _, _) = draw(&[k, m], 66);
    let run = |threads| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| {
                let y = bf16s(&conv3x3::forward(&sb, &wb, grid).unwrap());
                let ds = bf16s(&conv3x3::backward_data(&gb, &wb, grid).unwrap());
                let dw = conv3x3::backward_weight(&gb, &sb, grid).unwrap();
                (y, ds, f32s(&dw))
            })
    };
    for isa in [bf16_dot::detected(), None] {
        with_kernel(isa, || {
            let (one, three) = (run(1), run(3));
            bitwise(&format!("forward, kernel {isa:?}"), &three.0, &one.0).unwrap();
            bitwise(&format!("data, kernel {isa:?}"), &three.1, &one.1).unwrap();
            assert_eq!(three.2, one.2, "weight, kernel {isa:?}");
        });
    }
}

/// Mixes that are not one of the supported combinations are errors naming the op.
#[test]
fn unsupported_dtype_mixes_are_errors_naming_the_op() {
    let (c, m) = (3, 20);
    let (xb, xf, xd) = draw(&[c, m], 71);
    let (_, c2f, c2d) = draw(&[2, c], 72);
    let c3d = draw(&[3, c], 73).2;
    let c2b = c2f.to_dtype(DType::BF16).unwrap();
    expect_err(bn::affine_rows(&xb, &c2d), "bn-apply");
    expect_err(bn::affine_rows_relu(&xb, &c2b), "bn-apply-relu");
    expect_err(bn::affine_rows(&xd, &c2f), "bn-apply");
    expect_err(
        bn_backward::relu_bwd_affine(&xb, &xf, &c2f),
        "relu-bwd-affine",
    );
    expect_err(
        bn_backward::relu_bwd_affine(&xb, &xb, &c2d),
        "relu-bwd-affine",
    );
    let st = c2d.clone();
    let gamma = xd.narrow(1, 0, 1).unwrap().flatten_all().unwrap();
    expect_err(
        bn_backward::bn_bwd_reduce(&xb, &xb, &st, &gamma),
        "bn-bwd-reduce",
    );
    expect_err(bn_backward::bn_bwd_dx(&xb, &xb, &c3d), "bn-bwd-dx");
    let dst = xb.copy().unwrap();
    expect_err(
        bn_backward::bn_bwd_dx_accumulate(&dst, &xf, &xf, &c3d.to_dtype(DType::F32).unwrap()),
        "bn-bwd-dx-accumulate",
    );
    expect_err(elementwise::add_assign(&dst, &xf), "add-assign");
    expect_err(elementwise::relu_bwd(&xb, &xf), "relu-bwd");
    let grid = Grid { n: 1, h: 4, w: 5 };
    let offsets = TAPS.map(|(dy, dx)| (dy as isize - 1, dx as isize - 1));
    let stack = Tensor::zeros((9 * c, m), DType::F32, &Device::Cpu).unwrap();
    expect_err(
        shift::shift_stack_into(&stack, &xb, grid, offsets),
        "shift-stack",
    );
    // (f32 tap products into bf16 is the GPU path's sum: allowed; f64 ones are not)
    let stack64 = stack.to_dtype(DType::F64).unwrap();
    expect_err(
        shift::shift_sum_into(&xb, &stack64, grid, offsets),
        "shift-sum",
    );
    expect_err(
        shift::shift_sum_into(&xf, &stack64, grid, offsets),
        "shift-sum",
    );
    let w = Tensor::zeros((4, c), DType::F32, &Device::Cpu).unwrap();
    expect_err(dense::product(&w, &xb), "dense-product");
    expect_err(dense::product_f32(&xd, &xd.t().unwrap()), "dense-product");
    let out = Tensor::zeros((4, m), DType::BF16, &Device::Cpu).unwrap();
    expect_err(dense::accumulate(&out, &w, &xf), "dense-accumulate");
    let out64 = Tensor::zeros((4, m), DType::F64, &Device::Cpu).unwrap();
    let wb = w.to_dtype(DType::BF16).unwrap();
    expect_err(dense::accumulate(&out64, &wb, &xb), "dense-accumulate");
    let cw = Tensor::zeros((2, c, 3, 3), DType::F32, &Device::Cpu).unwrap();
    expect_err(conv3x3::forward(&xb, &cw, grid), "conv3x3-forward");
}

/// The comparisons above can fail: one element moved by 4 ulps (or 4 f32 rounding bounds)
/// breaks each of them.
#[test]
fn a_perturbed_result_fails_each_comparison() {
    let (c, m) = (4, 64);
    let (xb, xf, xd) = draw(&[c, m], 81);
    let (_, coef, _) = draw(&[2, c], 82);
    let bump = |v: &mut bf16| *v = bf16::from_bits(v.to_bits() + 4);
    // bitwise: BN apply
    let mut y = bf16s(&bn::affine_rows(&xb, &coef).unwrap());
    let want = rounded(&bn::affine_rows(&xf, &coef).unwrap());
    bitwise("bn apply", &y, &want).unwrap();
    bump(&mut y[37]);
    assert!(bitwise("bn apply", &y, &want).is_err());
    // one ulp: a product, with its own slack
    let (wb, wf, _) = draw(&[5, c], 83);
    let mut p = bf16s(&dense::product(&wb, &xb).unwrap());
    let twin = f32s(&dense::product(&wf, &xf).unwrap());
    let slack: Vec<f64> = abs_product(&wf, &xf)
        .iter()
        .map(|s| 2.0 * gamma(c) * s)
        .collect();
    within_one_ulp("W·X", &p, &twin, &slack).unwrap();
    // an element far from zero, where 4 ulps are more than the slack
    let i = twin
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
        .unwrap()
        .0;
    bump(&mut p[i]);
    assert!(within_one_ulp("W·X", &p, &twin, &slack).is_err());
    // relative: statistics
    let mut mv = f32s(&bn::bn_stats(&xb).unwrap());
    let reference = f64s(&bn::bn_stats(&xd).unwrap());
    let bound = one_rounding(&reference);
    within_relative("bn stats", &mv, &reference, &bound).unwrap();
    mv[c + 1] += 4.0 * bound[c + 1] as f32;
    assert!(within_relative("bn stats", &mv, &reference, &bound).is_err());
}
