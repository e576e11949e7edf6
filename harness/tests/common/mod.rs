//! Helpers shared by the integration tests that drive the real `densebench` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Names the `densebench` binary to test instead of the one cargo built next to this test, for
/// test binaries copied to another machine (e.g. a GPU node without Rust): run them with
/// `DENSEBENCH_BIN=/path/to/densebench`.
pub const BIN_ENV: &str = "DENSEBENCH_BIN";

/// The binary under test: `$DENSEBENCH_BIN` when set (it must exist); else the path cargo built
/// it at, if it is still there; else `densebench` beside the test binary or one directory up
/// (cargo puts tests in `target/<profile>/deps/`, the binary in `target/<profile>/`, so a copied
/// `target/<profile>` keeps working); else cargo's path, so the error names it.
pub fn bin() -> PathBuf {
    if let Some(p) = std::env::var_os(BIN_ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "{BIN_ENV}={} is not a file: point it at a densebench binary",
            p.display()
        );
        return p;
    }
    let built = PathBuf::from(env!("CARGO_BIN_EXE_densebench"));
    if built.is_file() {
        return built;
    }
    let name = built.file_name().map(PathBuf::from).unwrap_or_default();
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            let dir = exe.parent()?.to_path_buf();
            [dir.join(&name), dir.parent()?.join(&name)]
                .into_iter()
                .find(|p| p.is_file())
        })
        .unwrap_or(built)
}

/// Runs `densebench ARGS` to completion.
/// The smallest `run` the CLI documents (README, `densebench run --help`).
#[allow(dead_code)] // the GPU and git-rev tests' only
pub const TINY_RUN: &[&str] = &[
    "run",
    "--family",
    "mlp",
    "--variant",
    "cat-store-copy",
    "--depth",
    "2",
    "--batch",
    "2",
    "--growth",
    "2",
    "--channels",
    "2",
];

/// The case file of [`TINY_RUN`]'s configuration (`case` and its flags; `--out` to follow).
#[allow(dead_code)] // the bad-input and measuring tests' only
pub const TINY_CASE: &[&str] = &[
    "case",
    "--family",
    "mlp",
    "--depth",
    "2",
    "--batch",
    "2",
    "--growth",
    "2",
    "--channels",
    "2",
];

/// Writes [`TINY_CASE`]'s case file to `dir/case.safetensors` and returns its path; fails the
/// test when `case` fails.
#[allow(dead_code)] // the bad-input and measuring tests' only
pub fn tiny_case(dir: &Path) -> PathBuf {
    let case = dir.join("case.safetensors");
    let mut args = TINY_CASE.to_vec();
    args.extend(["--out", path_str(&case)]);
    let o = densebench(&args);
    assert!(o.status.success(), "case: {}", stderr(&o));
    case
}

/// The small mlp block of the `max-depth` tests (N=8, C0=4, k=2): searches of a few MiB.
#[allow(dead_code)] // the max-depth, bad-input and GPU tests' only
pub const TINY_MLP: &[&str] = &[
    "--family",
    "mlp",
    "--batch",
    "8",
    "--channels",
    "4",
    "--growth",
    "2",
];

pub fn densebench(args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .output()
        .expect("the densebench binary runs")
}

/// The process's standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A temp path as a command-line argument.
pub fn path_str(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}
