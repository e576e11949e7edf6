//! Helpers of the peer tests (`tests/peer.rs`, `tests/peer_failures.rs`): a tiny f32 bc sweep,
//! the fake peer (`tests/fixtures/fake_peer.py`, no PyTorch needed) and `bench-all` run on it
//! in a fresh directory. Included with `#[path = "common/peer.rs"] mod peer_common;` beside
//! `mod common;`.
#![allow(dead_code)] // each test file uses its own part

use crate::common::{bin, path_str};
use densebench::results::row::{read_rows, Row};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A tiny bc config, f32, one measured step: seconds per row.
pub const BC_SWEEP: &str = "[defaults]\nsteps = 1\nwarmup = 0\ntimeout_secs = 120\n\
    [[group]]\nfamily = 'bc'\nbatch = 2\nchannels = 3\ngrowth = 2\nbn_size = 2\nsize = 3\n\
    depth = 2\nvariants = ['autograd', 'buffer-recompute-inplace']\n";

/// The fake peer program.
pub fn fake_peer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/fake_peer.py")
}

/// The real peer program of this checkout.
pub fn repo_peer() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("peer/pytorch_peer.py")
}

/// Runs `bench-all` on `sweep` in a fresh temp dir (own cache: a perturbed run must not leave
/// a peer error for another test) with `env`; returns the output and the rows, if written.
pub fn bench(sweep: &str, extra: &[&str], env: &[(&str, &str)]) -> (Output, Option<Vec<Row>>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let sweep_path = dir.path().join("s.toml");
    std::fs::write(&sweep_path, sweep).expect("write sweep");
    let out = dir.path().join("r.csv");
    let cache = dir.path().join("cache");
    let mut cmd = Command::new(bin());
    cmd.args([
        "bench-all",
        "--sweep",
        path_str(&sweep_path),
        "--out",
        path_str(&out),
    ])
    .args(["--cache-dir", path_str(&cache), "--mem-limit", "2GiB"])
    .args(extra)
    .env("DENSEBENCH_PEER", fake_peer())
    .env("FAKE_DENSEBENCH", bin())
    .env_remove("DENSEBENCH_PERTURB")
    .env_remove("DENSEBENCH_PYTHON");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = cmd.output().expect("densebench runs");
    let rows = out
        .exists()
        .then(|| read_rows(&out).expect("the CSV reads back"));
    (o, rows)
}

/// The row of `variant` (the first, if several).
pub fn row<'a>(rows: &'a [Row], variant: &str) -> &'a Row {
    rows.iter()
        .find(|r| r.variant == variant)
        .unwrap_or_else(|| panic!("no {variant} row"))
}
