//! Misuse is an `Err`, never silent corruption: the append-only buffer, the gradient buffer,
//! case files with wrong tensors, invalid configs.

use candle_core::{DType, Device, Tensor};
use impls::strategies::buffer::{AppendBuffer, GradBuffer};
use impls::{Case, Config, Error, Family, Spatial, Variant};

fn rows(n: usize, cols: usize, v: f64) -> Tensor {
    Tensor::full(v, (n, cols), &Device::Cpu).unwrap()
}

#[test]
fn append_buffer_refuses_overlapping_and_out_of_order_writes() {
    let mut b = AppendBuffer::new("test", 6, 4, DType::F64, &Device::Cpu).unwrap();
    b.append(&rows(2, 4, 1.0)).unwrap();
    let saved = b.prefix(2).unwrap();
    // Overlap: rows [1, 3) would overwrite row 1, which `saved` covers.
    let e = b.write_at(1, &rows(2, 4, 9.0)).unwrap_err();
    assert!(matches!(e, Error::BufferMisuse { .. }), "{e}");
    assert!(e.to_string().contains("overlaps"), "{e}");
    // Out of order: a gap at rows [2, 3).
    let e = b.write_at(3, &rows(1, 4, 9.0)).unwrap_err();
    assert!(e.to_string().contains("out of order"), "{e}");
    // Beyond capacity.
    let e = b.append(&rows(5, 4, 9.0)).unwrap_err();
    assert!(e.to_string().contains("capacity"), "{e}");
    // Wrong width.
    assert!(matches!(
        b.append(&rows(1, 3, 9.0)),
        Err(Error::ShapeMismatch { .. })
    ));
    // Reading unwritten rows.
    assert!(b.prefix(3).is_err());
    // None of the refused writes touched the saved view.
    assert_eq!(saved.sum_all().unwrap().to_scalar::<f64>().unwrap(), 8.0);
    // A proper append leaves it untouched too.
    b.append(&rows(4, 4, 2.0)).unwrap();
    assert_eq!(saved.sum_all().unwrap().to_scalar::<f64>().unwrap(), 8.0);
    assert_eq!(
        b.into_full()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap(),
        8.0 + 32.0
    );
}

#[test]
fn grad_buffer_refuses_accumulating_into_sealed_rows() {
    let mut g = GradBuffer::from_upstream("grads", rows(5, 2, 1.0)).unwrap();
    let top = g.seal_top(2).unwrap(); // rows [3, 5) are final
    g.accumulate_prefix(&rows(3, 2, 0.5)).unwrap();
    let e = g.accumulate_prefix(&rows(4, 2, 0.5)).unwrap_err();
    assert!(e.to_string().contains("sealed"), "{e}");
    assert_eq!(
        top.sum_all().unwrap().to_scalar::<f64>().unwrap(),
        4.0,
        "sealed rows changed"
    );
    assert!(g.seal_top(4).is_err(), "only 3 rows are open");
    // 3 rows × 2 cols × (1 + 0.5).
    assert_eq!(
        g.into_open()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap(),
        9.0
    );
}

#[test]
fn case_file_with_wrong_shape_or_missing_tensor_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = Config::tiny(Family::Bc);
    let case = Case::random(&cfg, &Device::Cpu).unwrap();
    // Wrong shape of one parameter.
    let mut bad = case.clone();
    let name = "denselayer2.conv1.weight".to_string();
    bad.params.tensors.insert(
        name.clone(),
        Tensor::zeros((4, 6, 1, 1), DType::F64, &Device::Cpu).unwrap(),
    );
    let path = dir.path().join("bad.safetensors");
    bad.save(&path).unwrap();
    let e = Case::load(&path, None, &Device::Cpu)
        .unwrap_err()
        .to_string();
    // The message names the tensor, the shape found and the shape expected.
    assert!(
        e.contains(&name) && e.contains("[4, 6, 1, 1]") && e.contains("expected [4, 5, 1, 1]"),
        "{e}"
    );
    // Missing tensor.
    let mut missing = case.clone();
    missing
        .params
        .tensors
        .remove("denselayer1.norm2.running_var");
    missing.save(&path).unwrap();
    let e = Case::load(&path, None, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("denselayer1.norm2.running_var") && e.contains("missing"),
        "{e}"
    );
    // Missing file.
    let e = Case::load(&dir.path().join("nope.safetensors"), None, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nope.safetensors"), "{e}");
}

#[test]
fn invalid_configs_name_the_field() {
    let base = Config::tiny(Family::Bc);
    let cases: Vec<(Config, &str)> = vec![
        (
            Config {
                depth: 0,
                ..base.clone()
            },
            "depth",
        ),
        (
            Config {
                batch: 0,
                ..base.clone()
            },
            "batch",
        ),
        (
            Config {
                growth: 0,
                ..base.clone()
            },
            "growth",
        ),
        (
            Config {
                size: Spatial::square(0),
                ..base.clone()
            },
            "size",
        ),
        (
            Config {
                dtype: DType::U8,
                ..base.clone()
            },
            "dtype",
        ),
        (
            Config {
                batch: 1,
                size: Spatial::square(1),
                ..base.clone()
            },
            "batch",
        ),
        (
            Config {
                depth: usize::MAX / 2,
                ..base.clone()
            },
            "depth",
        ),
        (
            Config {
                channels: usize::MAX,
                ..base.clone()
            },
            "channels",
        ),
    ];
    for (cfg, field) in cases {
        let e = cfg.validate().unwrap_err().to_string();
        assert!(
            e.contains(field),
            "expected the error to name `{field}`: {e}"
        );
    }
    assert!(impls::config::parse_dtype("f16")
        .unwrap_err()
        .to_string()
        .contains("f16"));
    let e = Variant::parse("buffer-store").unwrap_err().to_string();
    assert!(
        e.contains("buffer-store") && e.contains("buffer-store-copy"),
        "{e}"
    );
    // A variant that means nothing for the config is an error, not an alias.
    let mlp = Config::tiny(Family::Mlp);
    let e = Variant::parse("buffer-recompute-copy")
        .unwrap()
        .check(&mlp)
        .unwrap_err()
        .to_string();
    assert!(e.contains("nothing to recompute"), "{e}");
    // Params with a wrong dtype are rejected by the step.
    let case = Case::random(&mlp, &Device::Cpu).unwrap();
    let mut p = case.params.clone();
    let w = p.tensors["layers.0.weight"].to_dtype(DType::F32).unwrap();
    p.tensors.insert("layers.0.weight".into(), w);
    let e = impls::step(
        Variant::NAIVE,
        &mlp,
        &p,
        &case.input,
        &case.grad_output,
        &mut impls::NoProbe,
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("layers.0.weight") && e.contains("f32"), "{e}");
}
