//! Build script: records the git revision the binary is built from (`DENSEBENCH_BUILD_GIT_REV`,
//! read by `plan::job::git_rev`), so that a row names the source of the binary that measured
//! it, not whatever the checkout holds when the binary runs.

use std::path::Path;
use std::process::Command;

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .current_dir(dir)
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn main() {
    let manifest = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".to_string());
    let dir = Path::new(&manifest);
    // The sources the binary is made of: a change there is a new build, and may change `+dirty`.
    for p in [
        "src",
        "sweeps",
        "assets",
        "Cargo.toml",
        "build.rs",
        "../impls/src",
        "../impls/Cargo.toml",
        "../Cargo.toml",
        "../Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={p}");
    }
    let rev = match git(dir, &["rev-parse", "--short", "HEAD"]) {
        Some(rev) if !rev.is_empty() => {
            // A commit, checkout or staged change moves these; rerun then too.
            let mut paths = vec![
                "HEAD".to_string(),
                "index".to_string(),
                "packed-refs".to_string(),
            ];
            if let Some(r) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
                paths.push(r);
            }
            for p in paths {
                if let Some(path) = git(dir, &["rev-parse", "--git-path", &p]) {
                    let path = dir.join(path);
                    if path.exists() {
                        println!("cargo:rerun-if-changed={}", path.display());
                    }
                }
            }
            let dirty = git(dir, &["status", "--porcelain", "--untracked-files=no"])
                .is_some_and(|s| !s.is_empty());
            if dirty {
                format!("{rev}+dirty")
            } else {
                rev
            }
        }
        _ => "unknown".to_string(),
    };
    println!("cargo:rustc-env=DENSEBENCH_BUILD_GIT_REV={rev}");
}
