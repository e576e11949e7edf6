//! bf16 (mixed precision, PyTorch autocast's rule: bf16 features, f32 parameters, parameter
//! gradients and BN statistics) through the binary: `run --dtype bf16` gives an ok row checked
//! against the f64 reference under the bf16 tolerance, a stale running statistic fails it,
//! `case --dtype bf16` writes a mixed-dtype case file that `step` runs, a sweep's bf16 rows
//! beside (fake) peer rows take the peer-derived bf16 tolerance, under which a ×1.5 tensor fails
//! either side's row, `max-depth` answers in bf16 (the CPU's kernels and a GPU's path), and a
//! GPU run is not refused for bf16, and every bf16 kernel this CPU has gives a checked row.

mod common;
#[path = "common/peer.rs"]
mod peer_common;

use common::{bin, densebench, path_str, stderr};
use densebench::measure::step::BF16_REL_BOUND;
use densebench::results::row::Row;
use std::process::{Command, Output};

/// A tiny block of `family` in bf16 (`run` arguments after the variant).
fn tiny(family: &str) -> Vec<&'static str> {
    let mut a = vec![
        "--depth", "3", "--batch", "2", "--growth", "2", "--dtype", "bf16",
    ];
    a.extend(match family {
        "bc" => [
            "--family",
            "bc",
            "--channels",
            "3",
            "--bn-size",
            "2",
            "--size",
            "3",
        ]
        .as_slice(),
        _ => ["--family", "mlp", "--channels", "5"].as_slice(),
    });
    a
}

/// `densebench run --variant V <tiny bf16 block> --format json`, with `env` set.
fn run(variant: &str, family: &str, cache: &str, env: &[(&str, &str)]) -> Output {
    let mut args = vec![
        "run",
        "--variant",
        variant,
        "--steps",
        "1",
        "--format",
        "json",
    ];
    args.extend(tiny(family));
    args.extend(["--cache-dir", cache]);
    let mut c = Command::new(bin());
    c.args(&args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running densebench")
}

fn row(o: &Output) -> Row {
    let text = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("one JSON row ({e}): {text}"))
}

#[test]
fn run_bf16_gives_an_ok_row_within_the_bf16_tolerance() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    for (family, variant) in [
        ("bc", "buffer-recompute-inplace"),
        ("bc", "cat-store-copy"),
        ("mlp", "buffer-store-inplace"),
    ] {
        let o = run(variant, family, path_str(&cache), &[]);
        assert!(o.status.success(), "{variant} {family}: {}", stderr(&o));
        let r = row(&o);
        assert_eq!(r.dtype, "bf16", "{}", r.key);
        assert!(r.key.contains("/bf16/"), "{}", r.key);
        assert_eq!(r.status, "ok", "{}", r.key);
        assert_eq!(r.reference, "autograd/f64", "{}", r.key);
        assert_eq!(r.tolerance, Some(BF16_REL_BOUND), "{}", r.key);
        assert_eq!(r.grad_ok, Some(true), "{}: {}", r.key, r.error);
        // bf16's own rounding (u = 2⁻⁸ = 3.9e-3) is there, and small on a tiny block
        // (measured 4.1e-3 mlp, 2.2e-2 bc): not f32's ~1e-7, not a wrong gradient's O(1)
        let err = r.max_rel_err.expect("an error");
        assert!(err > 1e-4 && err < 1e-1, "{}: max_rel_err {err}", r.key);
        assert!(
            r.saved_bytes
                .is_some_and(|s| s > 0 && Some(s) <= r.peak_bytes),
            "{}",
            r.key
        );
    }
}

/// Every kernel `DENSEBENCH_BF16_DOT` can pick on this CPU (the widened path, and each
/// instruction set `bf16_dot::available` lists) gives an ok row within the bf16 tolerance, and
/// the row's `note` names the kernel that ran: a machine with AVX-512 BF16 checks whole steps
/// on the AVX2 and AVX-512F kernels too, as a CPU without it would run them.
#[test]
fn every_bf16_kernel_of_this_cpu_gives_a_checked_row_that_names_it() {
    use impls::ops::cpu::bf16_dot::{available, Isa};
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    let mut kernels = vec![("0", "operands widened to f32")];
    for isa in available() {
        kernels.push(match isa {
            Isa::Avx512Bf16 => ("1", "AVX-512 BF16 dot products"),
            Isa::Avx2Fma => ("avx2", "AVX2 FMA"),
            Isa::Avx512F => ("avx512f", "AVX-512F FMA"),
        });
    }
    for (value, named) in kernels {
        for (family, variant) in [("bc", "cat-store-copy"), ("mlp", "buffer-store-inplace")] {
            let env = [("DENSEBENCH_BF16_DOT", value)];
            let o = run(variant, family, path_str(&cache), &env);
            let at = format!("DENSEBENCH_BF16_DOT={value} {variant} {family}");
            assert!(o.status.success(), "{at}: {}", stderr(&o));
            let r = row(&o);
            assert_eq!(r.status, "ok", "{at}");
            assert_eq!(r.grad_ok, Some(true), "{at}: {}", r.error);
            assert!(r.note.contains(named), "{at}: note {:?}", r.note);
        }
    }
}

#[test]
fn a_bf16_row_keeps_half_the_f32_rows_features() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = path_str(&dir.path().join("cache")).to_string();
    let o = run("cat-store-copy", "bc", &cache, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let b = row(&o);
    let mut args = vec![
        "run",
        "--variant",
        "cat-store-copy",
        "--steps",
        "1",
        "--format",
        "json",
    ];
    let mut t = tiny("bc");
    t[7] = "f32"; // --dtype
    args.extend(t);
    args.extend(["--cache-dir", &cache]);
    let o = densebench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let f = row(&o);
    assert_eq!(f.dtype, "f32");
    // every saved tensor but BN's per-channel tables is a feature map: bf16 halves those,
    // the f32 tables stay; so between half and all of the f32 row's saved bytes
    let (bs, fs) = (
        b.saved_bytes.expect("bf16 saved"),
        f.saved_bytes.expect("f32 saved"),
    );
    assert!(2 * bs > fs && bs < fs, "bf16 saved {bs} vs f32 saved {fs}");
}

#[test]
fn a_stale_running_statistic_fails_a_bf16_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("cache");
    let o = run(
        "buffer-recompute-inplace",
        "bc",
        path_str(&cache),
        &[("DENSEBENCH_PERTURB", "stale:denselayer2.norm2.running_var")],
    );
    let r = row(&o);
    assert_eq!(r.grad_ok, Some(false), "{}: {}", r.key, stderr(&o));
    assert!(
        r.max_rel_err.is_some_and(|e| e > BF16_REL_BOUND),
        "{:?}",
        r.max_rel_err
    );
    assert!(!o.status.success());
}

#[test]
fn case_and_step_in_bf16() {
    let dir = tempfile::tempdir().expect("temp dir");
    let case = dir.path().join("case.safetensors");
    let out = dir.path().join("result.safetensors");
    let mut args = vec!["case", "--out", path_str(&case)];
    args.extend(tiny("bc"));
    let o = densebench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let c = impls::Case::load(&case, None, &candle_core::Device::Cpu).expect("the case loads");
    assert_eq!(c.cfg.dtype, candle_core::DType::BF16);
    assert_eq!(c.input.dtype(), candle_core::DType::BF16);
    assert!(c
        .params
        .tensors
        .values()
        .all(|t| t.dtype() == candle_core::DType::F32));
    let o = densebench(&[
        "step",
        "--case",
        path_str(&case),
        "--variant",
        "buffer-recompute-inplace",
        "--out",
        path_str(&out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = impls::case::load_result(&c.cfg, &out, &candle_core::Device::Cpu)
        .expect("the result loads in autocast's dtypes");
    assert_eq!(r.grad_input.dtype(), candle_core::DType::BF16);
    // `step` runs what it is given: bitwise the library's step on the same case
    let want = c.step(impls::Variant::NAIVE).expect("a bf16 step");
    let cmp = impls::check::compare::compare(&r, &want).expect("comparable");
    assert!(cmp.overall.bitwise, "{:?}", cmp.per_tensor);
    // autograd is refused in bf16, saying why
    let o = densebench(&[
        "step",
        "--case",
        path_str(&case),
        "--variant",
        "autograd",
        "--out",
        path_str(&out),
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("does not run in bf16"),
        "{}",
        stderr(&o)
    );
}

/// bf16 runs on a GPU too (issue 39: cuBLAS bf16 GEMMs, the bf16 CUDA kernels): a `cuda:0`
/// run is not refused for its dtype. Without a GPU (or a `cuda` build) it fails for the
/// device, naming it; with one it gives an ok row whose gradients were checked.
#[test]
fn bf16_on_a_gpu_is_not_refused_for_its_dtype() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args = vec![
        "run",
        "--variant",
        "cat-store-copy",
        "--device",
        "cuda:0",
        "--steps",
        "1",
        "--format",
        "json",
        "--cache-dir",
    ];
    args.push(path_str(dir.path()));
    args.extend(tiny("mlp"));
    let o = densebench(&args);
    let err = stderr(&o);
    if o.status.success() {
        let r = row(&o);
        assert_eq!(
            (r.dtype.as_str(), r.status.as_str()),
            ("bf16", "ok"),
            "{}",
            r.key
        );
        assert_eq!(r.grad_ok, Some(true), "{}: {}", r.key, r.error);
    } else {
        assert!(!err.contains("CPU only"), "refused for bf16: {err}");
        assert!(
            err.contains("cuda") || err.contains("CUDA") || err.contains("--device"),
            "{err}"
        );
    }
}

/// `max-depth --no-confirm` (the model alone) on a bc block in `dtype` on `device`: variant →
/// max depth.
fn model_max_depth(
    dtype: &str,
    device: &str,
    out: &std::path::Path,
) -> std::collections::BTreeMap<String, u64> {
    let o = densebench(&[
        "max-depth",
        "--device",
        device,
        "--family",
        "bc",
        "--batch",
        "16",
        "--size",
        "8",
        "--budget",
        "16MiB",
        "--dtype",
        dtype,
        "--no-confirm",
        "--max-depth",
        "200",
        "--out",
        path_str(out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(out).expect("the CSV");
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[3].parse().expect("a depth"))
        })
        .collect()
}

#[test]
fn max_depth_in_bf16_goes_deeper_than_f32() {
    let dir = tempfile::tempdir().expect("temp dir");
    // the CPU's kernels, and a GPU's path (the model alone: no GPU needed with --no-confirm)
    for device in ["cpu", "cuda:0"] {
        let f = model_max_depth("f32", device, &dir.path().join("f32.csv"));
        let b = model_max_depth("bf16", device, &dir.path().join("bf16.csv"));
        // the same hand-written variants (max-depth answers for no autograd in either)
        assert!(
            f.keys().eq(b.keys()) && b.len() == 8,
            "{device}: {f:?} {b:?}"
        );
        for (v, depth) in &b {
            // bf16 halves the stored features, which grow with depth; parameters stay f32
            assert!(*depth > f[v], "{device} {v}: bf16 {depth} vs f32 {}", f[v]);
        }
    }
}

/// `max-depth --dtype f32,bf16` answers both dtypes in one run: a table each, one CSV whose
/// `dtype` column says which, each answer the one a run in its dtype alone gives; a dtype
/// named twice is refused before anything runs.
#[test]
fn max_depth_answers_f32_and_bf16_in_one_csv() {
    let dir = tempfile::tempdir().expect("temp dir");
    let f = model_max_depth("f32", "cpu", &dir.path().join("f32.csv"));
    let b = model_max_depth("bf16", "cpu", &dir.path().join("bf16.csv"));
    let both = model_max_depth_csv("f32,bf16", &dir.path().join("both.csv"));
    let of = |dtype: &str| -> std::collections::BTreeMap<String, u64> {
        both.iter()
            .filter(|(_, d, _)| d == dtype)
            .map(|(v, _, l)| (v.clone(), *l))
            .collect()
    };
    assert_eq!(both.len(), 16, "{both:?}");
    assert_eq!(of("f32"), f);
    assert_eq!(of("bf16"), b);
    // f32's rows first, as asked
    assert!(both[..8].iter().all(|(_, d, _)| d == "f32"), "{both:?}");
    let o = densebench(&[
        "max-depth",
        "--family",
        "bc",
        "--budget",
        "16MiB",
        "--dtype",
        "bf16,f32,bf16",
        "--no-confirm",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("`bf16` is named twice"),
        "{}",
        stderr(&o)
    );
}

/// `max-depth --no-confirm --dtype DTYPES` on the bc block of [`model_max_depth`]: each row's
/// variant, dtype and max depth, in file order, read by the CSV's header.
fn model_max_depth_csv(dtypes: &str, out: &std::path::Path) -> Vec<(String, String, u64)> {
    let o = densebench(&[
        "max-depth",
        "--family",
        "bc",
        "--batch",
        "16",
        "--size",
        "8",
        "--budget",
        "16MiB",
        "--dtype",
        dtypes,
        "--no-confirm",
        "--max-depth",
        "200",
        "--out",
        path_str(out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        stdout.matches("max depth of bc").count(),
        dtypes.split(',').count(),
        "a table per dtype: {stdout}"
    );
    #[derive(serde::Deserialize)]
    struct Answer {
        variant: String,
        dtype: String,
        max_depth: u64,
    }
    csv::Reader::from_path(out)
        .expect("the CSV")
        .deserialize::<Answer>()
        .map(|r| {
            let a = r.expect("a row");
            (a.variant, a.dtype, a.max_depth)
        })
        .collect()
}

/// The peer tests' tiny bc block (`peer_common::BC_SWEEP`) in bf16, its hand-written variant
/// only (autograd does not run in bf16).
const BC_BF16_SWEEP: &str = "[defaults]\nsteps = 1\nwarmup = 0\ntimeout_secs = 120\n\
    [[group]]\nfamily = 'bc'\nbatch = 2\nchannels = 3\ngrowth = 2\nbn_size = 2\nsize = 3\n\
    depth = 2\ndtype = 'bf16'\nvariants = ['buffer-recompute-inplace']\n";

#[test]
fn bf16_rows_beside_peer_rows_take_the_derived_tolerance_and_a_perturbed_tensor_fails() {
    use densebench::measure::step::{peer_derived_tolerance, peer_row_tolerance};
    use peer_common::{bench, row};
    let cfg = impls::Config {
        dtype: candle_core::DType::BF16,
        ..impls::Config::bc100_block()
    };
    let (o, rows) = bench(BC_BF16_SWEEP, &["--peer", "pytorch"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = rows.expect("rows written");
    // the fake peer's RESULT is densebench's bf16 `cat-store-copy` step on the bf16 case
    let naive = row(&rows, "pytorch-naive");
    assert_eq!(naive.dtype, "bf16");
    let peer_err = naive.max_rel_err.expect("the peer's error");
    let ours = row(&rows, "buffer-recompute-inplace");
    let dense_err = ours.max_rel_err.expect("densebench's error");
    assert_eq!(ours.tolerance, Some(peer_derived_tolerance(&cfg, peer_err)));
    assert_eq!(naive.tolerance, Some(peer_row_tolerance(&cfg, dense_err)));
    for r in &rows {
        assert_eq!(r.grad_ok, Some(true), "{}: {}", r.key, r.error);
        // derived from a small bf16 error: tighter than a ×1.5 tensor's 3.3e-1
        assert!(
            r.tolerance.is_some_and(|t| t < 0.3),
            "{}: {:?}",
            r.key,
            r.tolerance
        );
    }
    // a ×1.5 input gradient fails densebench's bf16 row; a ×1.5 weight gradient the peer's
    let (o, rows) = bench(
        BC_BF16_SWEEP,
        &["--peer", "pytorch"],
        &[("DENSEBENCH_PERTURB", "grad.input")],
    );
    assert!(!o.status.success());
    let rows = rows.expect("rows written");
    assert_eq!(row(&rows, "buffer-recompute-inplace").grad_ok, Some(false));
    assert_eq!(row(&rows, "pytorch-naive").grad_ok, Some(true));
    let (o, rows) = bench(
        BC_BF16_SWEEP,
        &["--peer", "pytorch"],
        &[("FAKE_PERTURB", "grad.denselayer2.conv1.weight")],
    );
    assert!(!o.status.success());
    let rows = rows.expect("rows written");
    assert_eq!(row(&rows, "pytorch-naive").grad_ok, Some(false));
    assert_eq!(row(&rows, "buffer-recompute-inplace").grad_ok, Some(true));
}
