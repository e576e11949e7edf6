//! `densebench case` writes the very case a measured row runs on: loading it gives the config
//! and, bitwise, the parameters, input and upstream gradient the library builds from the seed.

mod common;

use candle_core::Device;
use common::{densebench, path_str, stderr};
use impls::{Case, Config, Family};

#[test]
fn the_case_file_is_the_case_a_row_measures() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("c.safetensors");
    let o = densebench(&[
        "case",
        "--family",
        "bc",
        "--depth",
        "2",
        "--batch",
        "2",
        "--growth",
        "2",
        "--channels",
        "3",
        "--bn-size",
        "2",
        "--size",
        "4",
        "--seed",
        "7",
        "--out",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let cfg = Config {
        family: Family::Bc,
        batch: 2,
        channels: 3,
        growth: 2,
        depth: 2,
        bn_size: 2,
        size: impls::Spatial::square(4),
        activation: true,
        dtype: candle_core::DType::F32,
        seed: 7,
    };
    let want = Case::random(&cfg, &Device::Cpu).expect("case");
    let got = Case::load(&out, None, &Device::Cpu).expect("the case file loads");
    // The file holds tensors, not the seed: the config read back has seed 0, the rest equal.
    assert_eq!(
        Config {
            seed: 7,
            ..got.cfg.clone()
        },
        cfg
    );
    let same = |a: &candle_core::Tensor, b: &candle_core::Tensor| {
        a.flatten_all().and_then(|t| t.to_vec1::<f32>()).ok()
            == b.flatten_all().and_then(|t| t.to_vec1::<f32>()).ok()
    };
    assert!(same(&got.input, &want.input), "input differs");
    assert!(
        same(&got.grad_output, &want.grad_output),
        "grad_output differs"
    );
    for (name, t) in &want.params.tensors {
        let g = got.params.tensors.get(name).expect("every parameter saved");
        assert!(same(g, t), "{name} differs");
    }
    // A bad config is the user's input: exit 2, nothing written.
    let bad = dir.path().join("bad.safetensors");
    let o = densebench(&[
        "case",
        "--family",
        "bc",
        "--depth",
        "0",
        "--batch",
        "2",
        "--growth",
        "2",
        "--channels",
        "3",
        "--out",
        path_str(&bad),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(!bad.exists());
}

#[test]
fn a_non_square_case_keeps_height_and_width_in_order() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("hxw.safetensors");
    let o = densebench(&[
        "case",
        "--family",
        "bc",
        "--depth",
        "2",
        "--batch",
        "2",
        "--growth",
        "2",
        "--channels",
        "3",
        "--bn-size",
        "2",
        "--size",
        "3x5",
        "--out",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains(" 3x5 "), "{}", stderr(&o));
    let got = Case::load(&out, None, &Device::Cpu).expect("the case file loads");
    assert_eq!(got.cfg.size, impls::Spatial::new(3, 5));
    // PyTorch's layout: [N, C0, H, W].
    assert_eq!(got.input.dims(), [2, 3, 3, 5]);
    assert_eq!(got.grad_output.dims(), [2, 3 + 2 * 2, 3, 5]);
}

/// The mlp activation, which the tensors cannot show, travels in the case file: `case
/// --activation off` records it, `step` without the flag runs the linear block (the same bytes
/// as with `--activation off`, not the ReLU block's), and a flag contradicting the file is
/// refused with one line, exit 2.
#[test]
fn the_mlp_activation_travels_in_the_case_file() {
    let dir = tempfile::tempdir().expect("temp dir");
    let case = dir.path().join("off.safetensors");
    let o = densebench(&[
        "case",
        "--family",
        "mlp",
        "--depth",
        "2",
        "--batch",
        "8",
        "--channels",
        "4",
        "--growth",
        "4",
        "--activation",
        "off",
        "--out",
        path_str(&case),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Case::load(&case, None, &Device::Cpu).expect("the case file loads");
    assert!(!got.cfg.activation, "the file's activation was not read");
    let step = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec![
            "step",
            "--case",
            path_str(&case),
            "--variant",
            "cat-store-copy",
            "--out",
            path_str(&out),
        ];
        args.extend_from_slice(extra);
        (densebench(&args), out)
    };
    let (o, plain) = step("plain.safetensors", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let (o, off) = step("off-flag.safetensors", &["--activation", "off"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&plain).unwrap(), std::fs::read(&off).unwrap());
    let (o, _) = step("on.safetensors", &["--activation", "on"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("ReLU is off") && e.contains("--activation on") && e.lines().count() == 1,
        "{e}"
    );
}
