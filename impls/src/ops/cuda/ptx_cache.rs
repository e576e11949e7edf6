//! The on-disk cache of the PTX that NVRTC makes of densebench's kernel modules, so that each
//! measuring process (one per row) does not compile the same sources again.
//!
//! NVRTC takes about a second for the three modules on a 2-core machine. A GPU sweep starts a
//! process per row, and a lent GPU's time is short. The first process of a machine compiles
//! and writes `<dir>/<key>.ptx`; later ones read it.
//!
//! - **Key:** SHA-256 of everything NVRTC's output depends on: the module's full source (prelude
//!   included), the options (architecture, block size) and NVRTC's version. A changed kernel,
//!   another GPU architecture or another libnvrtc is another file, never a stale one.
//! - **Integrity:** the file's first line holds the SHA-256 of the PTX after it. A file that
//!   does not match (truncated, edited, another format) is compiled again and replaced, so
//!   a damaged file costs a compile, never a wrong kernel. Files are written to a temporary
//!   name and renamed into place, so a reader never sees half a file, and processes that
//!   compile at once each write the same text.
//! - **Best effort:** a cache that cannot be read or written (read-only home, full disk) only
//!   means compiling, as without it. Compile errors are never cached: the log is reported on
//!   every run until the source compiles.
//! - **Where:** `DENSEBENCH_PTX_CACHE` names the folder (`0`, `off` or empty: no cache);
//!   otherwise `$XDG_CACHE_HOME/densebench/ptx`, else `$HOME/.cache/densebench/ptx`.
//!
//! Needs no CUDA but for `nvrtc_version` (`cuda` feature): the compile is a closure, so the
//! cache is tested in every build.

use sha2::{Digest, Sha256};

/// The version of the NVRTC library this process compiles with (`(13, 0)`), part of the key,
/// or `None` where it cannot be loaded or asked (`cuda` feature).
#[cfg(feature = "cuda")]
pub fn nvrtc_version() -> Option<(i32, i32)> {
    use candle_core::cuda_backend::cudarc::nvrtc::sys;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: nvrtcVersion writes two ints we own; cudarc loads the library (an error, not a
    // crash, where it is missing).
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    (rc == sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}
use std::path::{Path, PathBuf};

/// The environment variable naming the cache folder, or turning the cache off.
pub const CACHE_ENV: &str = "DENSEBENCH_PTX_CACHE";

/// What the first line of a cache file starts with, before the PTX's SHA-256.
const HEADER: &str = "// densebench ptx sha256 ";

/// The cache folder from the environment (see the module docs), or `None` for no cache.
pub fn dir() -> Option<PathBuf> {
    dir_from(
        std::env::var_os(CACHE_ENV),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn dir_from(
    explicit: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(v) = explicit {
        return match v.to_str() {
            Some("" | "0" | "off") => None,
            _ => Some(PathBuf::from(v)),
        };
    }
    let nonempty = |v: Option<std::ffi::OsString>| v.filter(|v| !v.is_empty()).map(PathBuf::from);
    nonempty(xdg)
        .or_else(|| nonempty(home).map(|h| h.join(".cache")))
        .map(|c| c.join("densebench").join("ptx"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cache key of `source` compiled with `options` by NVRTC `nvrtc` (major, minor): a
/// SHA-256 in hex. Each part is length-prefixed, so no two inputs share a key by
/// concatenation.
pub fn key(source: &str, options: &[String], nvrtc: (i32, i32)) -> String {
    let mut h = Sha256::new();
    let mut part = |s: &[u8]| {
        h.update((s.len() as u64).to_le_bytes());
        h.update(s);
    };
    part(b"densebench ptx v1");
    part(source.as_bytes());
    for o in options {
        part(o.as_bytes());
    }
    part(format!("nvrtc {}.{}", nvrtc.0, nvrtc.1).as_bytes());
    hex(&h.finalize())
}

fn file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}.ptx"))
}

/// The PTX stored under `key`, if the file is there and intact.
fn read(dir: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(file(dir, key)).ok()?;
    let (first, ptx) = text.split_once('\n')?;
    let sum = first.strip_prefix(HEADER)?;
    (sum == hex(&Sha256::digest(ptx.as_bytes()))).then(|| ptx.to_string())
}

/// Stores `ptx` under `key`: a temporary file in `dir`, renamed into place. Errors are
/// returned for the caller to ignore (the cache is best effort) or report.
fn write(dir: &Path, key: &str, ptx: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{key}.{}.{nanos}.tmp", std::process::id()));
    let text = format!("{HEADER}{}\n{ptx}", hex(&Sha256::digest(ptx.as_bytes())));
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, file(dir, key)));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Where a PTX text came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Read from the cache folder.
    Cache,
    /// Compiled (and written to the cache folder where there is one and it is writable).
    Compiled,
}

/// The PTX under `key` in `dir` if it is there and intact; otherwise `compile()`'s, stored
/// there for the next process. With `dir` `None`, just `compile()`. A compile error is
/// returned as it is and never stored.
pub fn get_or_compile(
    dir: Option<&Path>,
    key: &str,
    compile: impl FnOnce() -> Result<String, String>,
) -> Result<(String, Source), String> {
    if let Some(ptx) = dir.and_then(|d| read(d, key)) {
        return Ok((ptx, Source::Cache));
    }
    let ptx = compile()?;
    if let Some(d) = dir {
        // Best effort: without a writable cache the next process compiles, as it would
        // without a cache at all.
        let _ = write(d, key, &ptx);
    }
    Ok((ptx, Source::Compiled))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::ffi::OsString;

    const PTX: &str = "//\n// Generated by NVIDIA NVVM Compiler\n.version 9.0\n.target sm_90\n";

    fn opts(a: &str) -> Vec<String> {
        vec![
            format!("--gpu-architecture={a}"),
            "-DDB_REDUCE_THREADS=1024".into(),
        ]
    }

    #[test]
    fn the_key_changes_with_source_options_and_nvrtc() {
        let k = key("src", &opts("compute_90"), (13, 0));
        assert_eq!(k.len(), 64);
        assert_eq!(k, key("src", &opts("compute_90"), (13, 0)), "stable");
        assert_ne!(k, key("src ", &opts("compute_90"), (13, 0)));
        assert_ne!(k, key("src", &opts("compute_80"), (13, 0)));
        assert_ne!(k, key("src", &opts("compute_90"), (13, 1)));
        assert_ne!(k, key("src", &opts("compute_90"), (12, 8)));
        // Parts are length-prefixed: moving text between them changes the key.
        assert_ne!(
            key("ab", &["c".into()], (13, 0)),
            key("a", &["bc".into()], (13, 0))
        );
    }

    #[test]
    fn a_second_process_reads_what_the_first_compiled() {
        let d = tempfile::tempdir().unwrap();
        let calls = Cell::new(0);
        let compile = || {
            calls.set(calls.get() + 1);
            Ok(PTX.to_string())
        };
        let k = key("src", &opts("compute_90"), (13, 0));
        let first = get_or_compile(Some(d.path()), &k, compile).unwrap();
        assert_eq!(first, (PTX.to_string(), Source::Compiled));
        let second = get_or_compile(Some(d.path()), &k, compile).unwrap();
        assert_eq!(second, (PTX.to_string(), Source::Cache));
        assert_eq!(calls.get(), 1);
        // Nothing but the cache file is left behind (no temporary files).
        let names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![OsString::from(format!("{k}.ptx"))]);
        // Another key compiles again.
        let other = key("src", &opts("compute_80"), (13, 0));
        assert_eq!(
            get_or_compile(Some(d.path()), &other, compile).unwrap().1,
            Source::Compiled
        );
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn a_damaged_file_is_compiled_again_and_replaced() {
        let d = tempfile::tempdir().unwrap();
        let k = key("src", &opts("compute_90"), (13, 0));
        get_or_compile(Some(d.path()), &k, || Ok(PTX.to_string())).unwrap();
        let path = d.path().join(format!("{k}.ptx"));
        let good = std::fs::read_to_string(&path).unwrap();
        for bad in [
            good[..good.len() - 5].to_string(),           // truncated
            good.replace("sm_90", "sm_80"),               // edited body
            PTX.to_string(),                              // no header
            format!("{HEADER}{}\n{PTX}", "0".repeat(64)), // wrong sum
            String::new(),                                // empty
        ] {
            std::fs::write(&path, &bad).unwrap();
            let got = get_or_compile(Some(d.path()), &k, || Ok(PTX.to_string())).unwrap();
            assert_eq!(got, (PTX.to_string(), Source::Compiled), "{bad:?}");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), good, "replaced");
        }
    }

    #[test]
    fn compile_errors_are_returned_and_never_stored() {
        let d = tempfile::tempdir().unwrap();
        let k = key("broken", &opts("compute_90"), (13, 0));
        let err = get_or_compile(Some(d.path()), &k, || Err("x.cu(3): error".into()));
        assert_eq!(err, Err("x.cu(3): error".to_string()));
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
        let ok = get_or_compile(Some(d.path()), &k, || Ok(PTX.to_string())).unwrap();
        assert_eq!(ok.1, Source::Compiled);
    }

    #[test]
    fn an_unwritable_cache_only_means_compiling() {
        let d = tempfile::tempdir().unwrap();
        // A file where the folder should be: neither read nor write can succeed.
        let blocked = d.path().join("not-a-folder");
        std::fs::write(&blocked, "x").unwrap();
        let k = key("src", &opts("compute_90"), (13, 0));
        for _ in 0..2 {
            let got = get_or_compile(Some(&blocked), &k, || Ok(PTX.to_string())).unwrap();
            assert_eq!(got, (PTX.to_string(), Source::Compiled));
        }
        let none = get_or_compile(None, &k, || Ok(PTX.to_string())).unwrap();
        assert_eq!(none.1, Source::Compiled);
    }

    #[test]
    fn the_folder_comes_from_the_environment() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            dir_from(s("/c"), s("/x"), s("/h")),
            Some(PathBuf::from("/c"))
        );
        for off in ["", "0", "off"] {
            assert_eq!(dir_from(s(off), s("/x"), s("/h")), None, "{off:?}");
        }
        assert_eq!(
            dir_from(None, s("/x"), s("/h")),
            Some(PathBuf::from("/x/densebench/ptx"))
        );
        assert_eq!(
            dir_from(None, s(""), s("/h")),
            Some(PathBuf::from("/h/.cache/densebench/ptx"))
        );
        assert_eq!(dir_from(None, None, None), None);
    }
}
