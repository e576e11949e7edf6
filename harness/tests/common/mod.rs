//! Helpers shared by the integration tests that drive the real `densebench` binary.

use std::path::Path;
use std::process::{Command, Output};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_densebench");

/// Runs `densebench ARGS` to completion.
pub fn densebench(args: &[&str]) -> Output {
    Command::new(BIN)
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
