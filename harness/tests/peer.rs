//! Peer rows end to end (issue 12): `bench-all --peer pytorch` with a fake peer that needs no
//! PyTorch (`tests/fixtures/fake_peer.py`, through `DENSEBENCH_PEER`: its RESULT is made by
//! `densebench step`, so the conversion JSON + RESULT → row is tested for real), the tolerance
//! rule (a perturbed gradient fails in any row, the reference variant's and a peer's included),
//! fail-fast without PyTorch, and — when `pytorch_peer.py --check` succeeds here — a real tiny
//! peer sweep (it says plainly on stderr when it skipped).

mod common;
#[path = "common/peer.rs"]
mod peer_common;

use common::{densebench, path_str, stderr};
use densebench::measure::step::{peer_derived_tolerance, peer_row_tolerance, F32_REL_BOUND};
use densebench::results::row::Row;
use peer_common::{bench, repo_peer, row, BC_SWEEP};
use std::process::Command;

#[test]
fn peer_rows_are_converted_and_checked_like_densebench_rows() {
    let (o, rows) = bench(BC_SWEEP, &["--peer", "pytorch"], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = rows.expect("rows written");
    // Peer first (naive, memory-efficient, then both in channels_last), then densebench's.
    let order: Vec<&str> = rows.iter().map(|r| r.variant.as_str()).collect();
    assert_eq!(
        order,
        [
            "pytorch-naive",
            "pytorch-memory-efficient",
            "pytorch-channels-last-naive",
            "pytorch-channels-last-memory-efficient",
            "autograd",
            "buffer-recompute-inplace"
        ]
    );
    let naive = row(&rows, "pytorch-naive");
    assert_eq!(naive.key, "pytorch-naive/bc/2/3/2/2/2/3/on/f32/0/cpu");
    assert_eq!(
        (naive.framework.as_str(), naive.framework_version.as_str()),
        ("pytorch", "fake-torch 0.0")
    );
    assert_eq!((naive.status.as_str(), naive.grad_ok), ("ok", Some(true)));
    // From the JSON line, one to one.
    assert_eq!(
        (naive.peak_bytes, naive.baseline_bytes, naive.median_ns),
        (Some(1000), Some(500), Some(9))
    );
    assert_eq!(naive.timeline, "f0=1;f1=2");
    // No model of PyTorch's memory; densebench's FLOP count.
    assert_eq!(
        (naive.declared_saved_bytes, naive.predicted_peak_bytes),
        (None, None)
    );
    assert!(naive.flops.is_some_and(|f| f > 0));
    // Peer rows are judged against NOISE_FACTOR × densebench's naive f32 error on the same
    // case (here a few ulps: the bc floor), and compared with the f64 reference.
    assert_eq!(
        naive.tolerance,
        Some(peer_row_tolerance(&impls::Config::bc100_block(), 1e-7))
    );
    assert!(naive.tolerance.is_some_and(|t| t < F32_REL_BOUND));
    assert_eq!(naive.reference, "autograd/f64");
    assert!(naive.max_rel_err.is_some_and(|e| e < 1e-4), "{naive:?}");
    assert!(naive.note.is_empty(), "{}", naive.note);
    for v in [
        "pytorch-memory-efficient",
        "pytorch-channels-last-memory-efficient",
    ] {
        let eff = row(&rows, v);
        assert!(eff.note.contains("96136"), "{v}: {}", eff.note);
    }
    let cl = row(&rows, "pytorch-channels-last-naive");
    assert_eq!(
        cl.key,
        "pytorch-channels-last-naive/bc/2/3/2/2/2/3/on/f32/0/cpu"
    );
    assert_eq!((cl.status.as_str(), cl.grad_ok), ("ok", Some(true)));
    assert_eq!(cl.tolerance, naive.tolerance);
    // densebench's f32 rows: NOISE_FACTOR × the naive peer's error on the same case, clamped.
    let want = peer_derived_tolerance(&impls::Config::bc100_block(), naive.max_rel_err.unwrap());
    for v in ["autograd", "buffer-recompute-inplace"] {
        let r = row(&rows, v);
        assert_eq!(r.framework, "densebench");
        assert_eq!(r.tolerance, Some(want), "{v}");
        assert_eq!(r.grad_ok, Some(true), "{v}: {}", r.error);
    }
}

#[test]
fn a_perturbed_peer_gradient_fails_its_row() {
    let (o, rows) = bench(
        BC_SWEEP,
        &["--peer", "pytorch"],
        &[("FAKE_PERTURB", "grad.denselayer2.conv1.weight")],
    );
    // Exit 1: gradients out of tolerance.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let rows = rows.expect("rows written");
    for v in [
        "pytorch-naive",
        "pytorch-memory-efficient",
        "pytorch-channels-last-naive",
        "pytorch-channels-last-memory-efficient",
    ] {
        let r = row(&rows, v);
        assert_eq!((r.status.as_str(), r.grad_ok), ("ok", Some(false)), "{v}");
        // Scaled by 1.5: a relative error of 0.5 in that tensor.
        assert!(
            r.max_rel_err.is_some_and(|e| (e - 0.5).abs() < 1e-3),
            "{r:?}"
        );
    }
    assert!(stderr(&o).contains("pytorch-naive/bc/2/3/2/2/2/3/on/f32/0/cpu"));
}

#[test]
fn a_perturbed_gradient_fails_any_densebench_row_the_reference_variants_included() {
    // Without a peer: the documented bound, which comes from no densebench row.
    let (o, rows) = bench(BC_SWEEP, &[], &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    for r in rows.expect("rows written") {
        assert_eq!(r.tolerance, Some(F32_REL_BOUND), "{}", r.key);
        assert_eq!(r.grad_ok, Some(true), "{}: {}", r.key, r.error);
    }
    // the last: a running variance left as it was before the step (a tenth of its batch
    // change away by value, wholly wrong as an update)
    for tensor in [
        "grad.input",
        "denselayer1.norm1.running_mean",
        "stale:denselayer2.norm2.running_var",
    ] {
        let (o, rows) = bench(BC_SWEEP, &[], &[("DENSEBENCH_PERTURB", tensor)]);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let rows = rows.expect("rows written");
        // autograd is the reference variant: its own row fails too.
        for v in ["autograd", "buffer-recompute-inplace"] {
            let r = row(&rows, v);
            assert_eq!(r.grad_ok, Some(false), "{v} with {tensor} perturbed");
            assert!(r.error.contains("gradients differ"), "{}", r.error);
        }
    }
}

#[test]
fn a_peer_out_of_memory_is_an_oom_row() {
    let log_dir = tempfile::tempdir().expect("temp dir");
    let log = log_dir.path().join("runs.log");
    let (o, rows) = bench(
        BC_SWEEP,
        &["--peer", "pytorch"],
        &[("FAKE_EXIT", "4"), ("FAKE_LOG", path_str(&log))],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = rows.expect("rows written");
    let r = row(&rows, "pytorch-naive");
    assert_eq!(r.status, "oom");
    assert!(r.error.starts_with("out of memory"), "{}", r.error);
    // Its version is the probe's; without the naive peer's error the densebench rows fall back
    // to the documented bound, and say so.
    assert_eq!(r.framework_version, "fake-torch 0.0");
    let d = row(&rows, "autograd");
    assert_eq!(d.tolerance, Some(F32_REL_BOUND));
    assert!(d.note.contains("documented f32 bound"), "{}", d.note);
    let b = row(&rows, "buffer-recompute-inplace");
    assert_eq!(b.tolerance, Some(F32_REL_BOUND));
    assert!(b.note.contains("documented f32 bound"), "{}", b.note);
    // The peer's four rows, then one attempt at its error for the tolerance: the failure is
    // remembered for the config's other rows (each attempt is a PyTorch start on a GPU).
    let runs = std::fs::read_to_string(&log).expect("the fake peer's log");
    assert_eq!(
        runs.lines().collect::<Vec<_>>(),
        [
            "pytorch-naive",
            "pytorch-memory-efficient",
            "pytorch-channels-last-naive",
            "pytorch-channels-last-memory-efficient",
            "pytorch-naive"
        ],
        "{runs}"
    );
}

/// DENSEBENCH_PEER_LD_LIBRARY_PATH is the peer's library path (its own CUDA libraries, not the
/// ones densebench's binaries were given), for the probe and every run; unset, the peer
/// inherits densebench's.
#[test]
fn the_peer_gets_its_own_library_path_when_one_is_given() {
    let dir = tempfile::tempdir().expect("temp dir");
    for (given, want) in [
        (Some("/peer/own/libs"), "/peer/own/libs"),
        (None, "/densebench/libs"),
    ] {
        let log = dir.path().join(format!("env-{}.log", given.is_some()));
        let mut env = vec![
            ("FAKE_ENV_LOG", path_str(&log)),
            ("LD_LIBRARY_PATH", "/densebench/libs"),
        ];
        if let Some(g) = given {
            env.push(("DENSEBENCH_PEER_LD_LIBRARY_PATH", g));
        }
        let (o, _) = bench(BC_SWEEP, &["--peer", "pytorch"], &env);
        assert!(o.status.success(), "{}", stderr(&o));
        let seen = std::fs::read_to_string(&log).expect("the fake peer's log");
        assert!(
            seen.lines().count() >= 3,
            "the probe and the two rows: {seen}"
        );
        assert!(seen.lines().all(|l| l == want), "{given:?}: {seen}");
    }
}

#[test]
fn without_pytorch_the_sweep_fails_fast_saying_how_to_get_it() {
    let (o, rows) = bench(BC_SWEEP, &["--peer", "pytorch"], &[("FAKE_NO_TORCH", "1")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(rows.is_none(), "nothing may be written");
    let err = stderr(&o);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("just peer-setup"), "{err}");
    // The same through the sweep file's key.
    let keyed = format!("{BC_SWEEP}peer = 'pytorch'\n");
    let (o, rows) = bench(&keyed, &[], &[("FAKE_NO_TORCH", "1")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(rows.is_none());
}

#[test]
fn plan_lists_the_peer_keys() {
    let o = densebench(&["plan", "--quick", "--peer", "pytorch", "--format", "tsv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for v in [
        "pytorch-naive/bc/",
        "pytorch-memory-efficient/bc/",
        "pytorch-channels-last-naive/bc/",
        "pytorch-channels-last-memory-efficient/bc/",
        "pytorch-checkpoint/mlp/",
    ] {
        assert!(text.contains(v), "no {v} key in the plan:\n{text}");
    }
    assert!(!text.contains("pytorch-checkpoint/bc/"));
    // a Linear block has no memory format
    assert!(!text.contains("pytorch-channels-last-naive/mlp/"));
}

#[test]
fn real_pytorch_peer_on_tiny_configs() {
    // CI has no PyTorch: then this test says so and checks nothing else.
    let probe = Command::new("python3")
        .arg(repo_peer())
        .arg("--check")
        .env_remove("DENSEBENCH_PEER")
        .output();
    match &probe {
        Ok(p) if p.status.success() => {}
        Ok(p) => {
            eprintln!(
                "SKIPPED real_pytorch_peer_on_tiny_configs: `pytorch_peer.py --check` failed: {}",
                stderr(p).trim()
            );
            return;
        }
        Err(e) => {
            eprintln!("SKIPPED real_pytorch_peer_on_tiny_configs: python3 does not run: {e}");
            return;
        }
    }
    let sweep = "[defaults]\nsteps = 1\nwarmup = 0\ntimeout_secs = 300\n\
        [[group]]\nfamily = 'bc'\nbatch = 2\nchannels = 3\ngrowth = 2\nbn_size = 2\nsize = 3\n\
        depth = 2\nvariants = ['cat-store-copy']\n\
        [[group]]\nfamily = 'mlp'\nbatch = 8\nchannels = 4\ngrowth = 3\ndepth = 3\n\
        variants = ['cat-store-copy']\n";
    let peer = repo_peer();
    let (o, rows) = bench(
        sweep,
        &["--peer", "pytorch"],
        &[("DENSEBENCH_PEER", path_str(&peer))],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let rows = rows.expect("rows written");
    // bc: four peer rows (naive, memory-efficient, each in channels_last) and densebench's;
    // mlp: two and densebench's
    assert_eq!(rows.len(), 8);
    for r in &rows {
        assert_eq!(r.status, "ok", "{}: {}", r.key, r.error);
        assert_eq!(r.grad_ok, Some(true), "{}: {}", r.key, r.error);
    }
    let peers: Vec<&Row> = rows.iter().filter(|r| r.is_peer()).collect();
    assert_eq!(peers.len(), 6);
    for r in peers {
        assert!(
            r.framework_version.starts_with("torch "),
            "{}",
            r.framework_version
        );
        // PyTorch's f32 step on a tiny case: a few ulps from the f64 reference.
        assert!(
            r.max_rel_err.is_some_and(|e| e < 1e-4),
            "{}: {:?}",
            r.key,
            r.max_rel_err
        );
        assert!(r.peak_bytes.is_some_and(|p| p > 0), "{}", r.key);
    }
}
