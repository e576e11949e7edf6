//! Hostile configs: products that would wrap, huge and zero fields. Each is refused before any
//! work with an error naming the field at fault, its value and the limit; a bounded proptest
//! run checks that validation never panics and accepts exactly the configs whose sizes fit.

use candle_core::DType;
use impls::config::{MAX_ELEMENTS, MAX_STEP_ELEMENTS};
use impls::{Config, Error, Family, Spatial, Variant};
use proptest::prelude::*;

/// The field an `InvalidConfig` error names, and its message.
fn refused(cfg: &Config) -> (&'static str, String) {
    match cfg.validate() {
        Err(e @ Error::InvalidConfig { field, .. }) => (field, e.to_string()),
        Err(e) => panic!("expected InvalidConfig for {cfg:?}, got {e}"),
        Ok(()) => panic!("expected {cfg:?} to be refused"),
    }
}

fn bc() -> Config {
    Config::tiny(Family::Bc)
}

fn mlp() -> Config {
    Config::tiny(Family::Mlp)
}

#[test]
fn size_whose_square_wraps_a_u64_names_size() {
    // (2^32 + 1)² = 2^64 + 2^33 + 1 wraps to 2^33 + 1 in u64 arithmetic: it used to pass.
    let cfg = Config {
        size: Spatial::square(4_294_967_297),
        ..bc()
    };
    let (field, e) = refused(&cfg);
    assert_eq!(field, "size", "{e}");
    assert!(e.contains("size = 4294967297"), "{e}");
    assert!(e.contains("MAX_ELEMENTS = 1099511627776"), "{e}");
}

#[test]
fn size_two_to_the_63_plus_one_is_refused_not_a_panic() {
    let cfg = Config {
        size: Spatial::square((1usize << 63) + 1),
        ..bc()
    };
    let (field, e) = refused(&cfg);
    assert_eq!(field, "size", "{e}");
    assert!(e.contains(&format!("size = {}", (1u64 << 63) + 1)), "{e}");
}

#[test]
fn a_huge_side_of_a_non_square_size_is_named_by_its_side() {
    // N·(C0 + L·k)·H·W = 2·9·2^36·3 ≈ 3.7e12 > MAX_ELEMENTS = 2^40 ≈ 1.1e12: the block output
    // is over the limit, and the side that makes it so is blamed, either way round.
    for (size, side) in [
        (Spatial::new(1 << 36, 3), "height"),
        (Spatial::new(3, 1 << 36), "width"),
    ] {
        let (field, e) = refused(&Config { size, ..bc() });
        assert_eq!(field, side, "{e}");
        assert!(
            e.contains(&format!("{side} = {}", 1u64 << 36))
                && e.contains("batch·(channels + depth·growth)·height·width"),
            "{e}"
        );
    }
}

#[test]
fn each_huge_field_is_named_itself_not_a_neighbour() {
    let huge = usize::MAX;
    let cases = [
        (
            "batch",
            Config {
                batch: huge,
                ..bc()
            },
        ),
        (
            "channels",
            Config {
                channels: huge,
                ..bc()
            },
        ),
        (
            "growth",
            Config {
                growth: huge,
                ..bc()
            },
        ),
        (
            "depth",
            Config {
                depth: huge / 2,
                ..bc()
            },
        ),
        (
            "bn_size",
            Config {
                bn_size: huge,
                ..bc()
            },
        ),
        (
            "channels",
            Config {
                channels: huge,
                ..mlp()
            },
        ),
        (
            "depth",
            Config {
                depth: huge,
                ..mlp()
            },
        ),
    ];
    for (want, cfg) in cases {
        let (field, e) = refused(&cfg);
        assert_eq!(field, want, "{e}");
        assert!(e.contains("MAX_ELEMENTS"), "the limit is named: {e}");
    }
}

#[test]
fn product_over_the_limit_names_the_largest_factor_and_shows_the_formula() {
    // mlp: N·(C0 + L·k) with C0 = 2, k = 2, L = 3 is 8·N; N = 2^37 gives exactly 2^40.
    let at_limit = Config {
        batch: 1 << 37,
        channels: 2,
        growth: 2,
        depth: 3,
        ..mlp()
    };
    at_limit
        .validate()
        .expect("exactly MAX_ELEMENTS is allowed");
    let over = Config {
        batch: (1 << 37) + 1,
        ..at_limit
    };
    let (field, e) = refused(&over);
    assert_eq!(field, "batch", "{e}");
    // 8·(2^37 + 1) = 2^40 + 8.
    assert!(
        e.contains("batch·(channels + depth·growth) = 137438953473·(2 + 3·2) = 1099511627784"),
        "{e}"
    );
}

#[test]
fn bottleneck_over_the_limit_names_bn_size() {
    // bn_size·k = 2^39·4 = 2^41 channels out of the 1×1 convolution.
    let cfg = Config {
        bn_size: 1 << 39,
        growth: 4,
        ..bc()
    };
    let (field, e) = refused(&cfg);
    assert_eq!(field, "bn_size", "{e}");
    assert!(e.contains("bn_size·growth"), "{e}");
}

#[test]
fn parameter_count_over_the_limit_names_depth() {
    // mlp with C0 = k = 1: Σ_i (C_i + 1) over L = 2^21 layers ≈ L²/2 = 2^41 parameters, while
    // every single tensor ([N, C0+L·k] = 2^21 elements, the last weight 2^21) is small.
    let cfg = Config {
        batch: 1,
        channels: 1,
        growth: 1,
        depth: 1 << 21,
        ..mlp()
    };
    let (field, e) = refused(&cfg);
    assert_eq!(field, "depth", "{e}");
    assert!(e.contains("the parameter count"), "{e}");
}

#[test]
fn flop_count_over_u64_is_refused() {
    // Every tensor, the parameters and the kept activations are within their limits, but one
    // step is 6·M·(B·Σ C_i + 9·B·k·L) ≈ 2.3 · 2^64 FLOPs (found by a search over powers of 2).
    let cfg = Config {
        family: Family::Bc,
        batch: 16,
        channels: 16384,
        growth: 64,
        depth: 256,
        bn_size: 1024,
        size: Spatial::square(1024),
        activation: true,
        dtype: DType::F32,
        seed: 0,
    };
    let (field, e) = refused(&cfg);
    assert!(e.contains("FLOP count") && e.contains("u64::MAX"), "{e}");
    // Σ_i C_i = L·C0 + k·L(L−1)/2 = 2^22 + 2 088 960 is the largest part, C0 its largest term.
    assert_eq!(field, "channels", "{e}");
}

#[test]
fn zero_fields_say_why_they_are_refused() {
    let cases = [
        (Config { batch: 0, ..bc() }, "batch", "at least one sample"),
        (
            Config {
                channels: 0,
                ..bc()
            },
            "channels",
            "at least one channel",
        ),
        (
            Config { growth: 0, ..mlp() },
            "growth",
            "append at least one",
        ),
        (Config { depth: 0, ..mlp() }, "depth", "at least one layer"),
        (Config { bn_size: 0, ..bc() }, "bn_size", "1×1 convolution"),
        (
            Config {
                size: Spatial::square(0),
                ..bc()
            },
            "size",
            "at least 1×1",
        ),
        // `size = "0x5"` / `"3x0"`: the zero side is named.
        (
            Config {
                size: Spatial::new(0, 5),
                ..bc()
            },
            "height",
            "at least 1×1",
        ),
        (
            Config {
                size: Spatial::new(3, 0),
                ..bc()
            },
            "width",
            "at least 1×1",
        ),
    ];
    for (cfg, want, why) in cases {
        let (field, e) = refused(&cfg);
        assert_eq!(field, want, "{e}");
        assert!(e.contains(&format!("{want} = 0")) && e.contains(why), "{e}");
    }
}

#[test]
fn fields_an_mlp_does_not_use_are_never_multiplied() {
    // bn_size and size mean nothing for mlp: any value is accepted and never enters a product
    // (the memory model would otherwise overflow on bn_size·k).
    let cfg = Config {
        bn_size: usize::MAX,
        size: Spatial::square(0),
        ..mlp()
    };
    cfg.validate().expect("mlp ignores bn_size and size");
    assert_eq!(cfg.bottleneck(), 0);
    for v in Variant::for_config(&cfg) {
        let _ = impls::model::predict_peak_bytes(v, &cfg);
        let _ = impls::model::declared_saved_bytes(v, &cfg);
    }
    assert!(impls::model::flops(&cfg) > 0);
}

// ---- bounded fuzz ----

/// The oracle: every bounded quantity of `Config::validate`'s documentation, computed here in
/// u128 with `None` for overflow. Returns whether the config should be accepted.
fn fits(c: &Config) -> bool {
    let u = |v: usize| v as u128;
    let (n, c0, k, l) = (u(c.batch), u(c.channels), u(c.growth), u(c.depth));
    if n == 0 || c0 == 0 || k == 0 || l == 0 {
        return false;
    }
    let le = |x: Option<u128>, limit: u128| x.is_some_and(|x| x <= limit);
    let ct = l.checked_mul(k).and_then(|x| x.checked_add(c0));
    let c_last = (l - 1).checked_mul(k).and_then(|x| x.checked_add(c0));
    // Σ_{i<L} C_i = L·C0 + k·L(L−1)/2.
    let tri = if l % 2 == 0 {
        (l / 2).checked_mul(l - 1)
    } else {
        l.checked_mul((l - 1) / 2)
    };
    let c_sum = tri
        .and_then(|t| t.checked_mul(k))
        .and_then(|t| t.checked_add(l.checked_mul(c0)?));
    let mul = |a: Option<u128>, b: Option<u128>| a?.checked_mul(b?);
    let add = |a: Option<u128>, b: Option<u128>| a?.checked_add(b?);
    let s = Some;
    match c.family {
        Family::Mlp => {
            let m = s(n);
            le(mul(ct, m), MAX_ELEMENTS)
                && le(mul(s(k), c_last), MAX_ELEMENTS)
                && le(add(mul(s(k), c_sum), s(l * k)), MAX_ELEMENTS)
                && le(mul(add(c_sum, mul(s(l), s(k))), m), MAX_STEP_ELEMENTS)
                && le(mul(mul(mul(s(6), s(k)), m), c_sum), u64::MAX as u128)
        }
        Family::Bc => {
            let (bn, h, w) = (u(c.bn_size), u(c.size.height), u(c.size.width));
            if bn == 0 || h == 0 || w == 0 {
                return false;
            }
            let b = mul(s(bn), s(k));
            let m = mul(s(n), mul(s(h), s(w)));
            let params = add(
                mul(add(s(4), b), c_sum),
                mul(s(l), add(mul(s(4), b), mul(mul(s(9), s(k)), b))),
            );
            let flops = mul(
                mul(s(6), m),
                add(mul(b, c_sum), mul(mul(mul(s(9), b), s(k)), s(l))),
            );
            le(mul(ct, m), MAX_ELEMENTS)
                && le(mul(b, c_last), MAX_ELEMENTS)
                && le(mul(b, m), MAX_ELEMENTS)
                && le(mul(mul(s(9), s(k)), m), MAX_ELEMENTS)
                && le(mul(mul(s(9), s(k)), b), MAX_ELEMENTS)
                && le(params, MAX_ELEMENTS)
                && le(
                    mul(mul(s(2), add(c_sum, mul(s(l), b))), m),
                    MAX_STEP_ELEMENTS,
                )
                && le(flops, u64::MAX as u128)
                && n * h * w >= 2
        }
    }
}

/// Field values that probe every regime: zero, small, around the limits' roots, huge.
fn field() -> impl Strategy<Value = usize> {
    prop_oneof![
        3 => 1usize..64,
        1 => Just(0usize),
        2 => (0u32..64, -2i64..=2).prop_map(|(p, d)| ((1u128 << p) as i128 + d as i128)
            .clamp(0, usize::MAX as i128) as usize),
        1 => any::<usize>(),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    (
        prop::bool::ANY,
        (field(), field(), field(), field(), field(), field()),
        // Half the sizes square (`size = 32`), half drawn side by side (`size = "HxW"`).
        prop::option::of(field()),
        prop::bool::ANY,
    )
        .prop_map(
            |(bc, (batch, channels, growth, depth, bn_size, height), width, f64)| Config {
                family: if bc { Family::Bc } else { Family::Mlp },
                batch,
                channels,
                growth,
                depth,
                bn_size,
                size: Spatial::new(height, width.unwrap_or(height)),
                activation: true,
                dtype: if f64 { DType::F64 } else { DType::F32 },
                seed: 0,
            },
        )
}

proptest! {
    // 4096 configs run in well under a second (validation is closed-form, no loop over layers).
    #![proptest_config(ProptestConfig { cases: 4096, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn validation_never_panics_and_accepts_exactly_the_configs_that_fit(cfg in config()) {
        let r = cfg.validate();
        prop_assert_eq!(r.is_ok(), fits(&cfg), "{:?}: {:?}", cfg, r);
        match r {
            Ok(()) => {
                // Accepted sizes are safe to multiply in usize everywhere.
                let _ = cfg.c_total() * cfg.m();
                if cfg.depth <= 64 {
                    // The memory model and FLOP count (loops over layers) must not overflow.
                    for v in Variant::for_config(&cfg) {
                        let _ = impls::model::predict_peak_bytes(v, &cfg);
                    }
                    let _ = impls::model::flops(&cfg);
                }
            }
            Err(Error::InvalidConfig { field, value, .. }) => {
                let known = [
                    "batch", "channels", "growth", "depth", "bn_size", "size", "height", "width",
                    "dtype",
                ];
                prop_assert!(known.contains(&field), "unknown field {}", field);
                // The value shown is the named field's own value.
                let own = match field {
                    "batch" => cfg.batch.to_string(),
                    "channels" => cfg.channels.to_string(),
                    "growth" => cfg.growth.to_string(),
                    "depth" => cfg.depth.to_string(),
                    "bn_size" => cfg.bn_size.to_string(),
                    "size" => cfg.size.height.to_string(),
                    "height" => cfg.size.height.to_string(),
                    "width" => cfg.size.width.to_string(),
                    _ => cfg.dtype.as_str().to_string(),
                };
                prop_assert_eq!(value, own);
                // A square size is blamed as `size`, a non-square one by its side.
                let square = cfg.size.is_square();
                prop_assert!(
                    if square { !["height", "width"].contains(&field) } else { field != "size" },
                    "{} blamed on {}", cfg.size, field
                );
                if cfg.family == Family::Mlp {
                    prop_assert!(
                        !["bn_size", "size", "height", "width"].contains(&field),
                        "mlp blamed on {}", field
                    );
                }
            }
            Err(e) => prop_assert!(false, "unexpected error kind: {}", e),
        }
    }
}
