//! Compiles every CUDA kernel module (`src/ops/cuda/*.cu`, exactly the text and options the
//! launchers hand NVRTC, from `impls::ops::cuda::src`) for `compute_90` (H100/H200) and `compute_80`
//! (A100) with NVRTC, in a plain `cargo test`: no `cuda` feature, no driver, no GPU.
//!
//! `libnvrtc` is loaded at run time (libloading), so this test does not depend on cudarc's
//! features. Where it comes from:
//! - `DENSEBENCH_NVRTC=/path/to/libnvrtc.so.13` (what `.ci/run` exports after fetching the
//!   `nvidia-cuda-nvrtc` wheel): if set, the library must load and every module must compile
//!   without a warning, or the test fails;
//! - otherwise the caches `scripts/install-cuda-toolkit.sh` and `.ci/run` fill
//!   (`${XDG_CACHE_HOME:-~/.cache}/densebench-nvrtc/…`, `…/densebench-cuda/…`); a library
//!   found there must work too;
//! - with neither, the test prints that it skipped (nothing to compile with).
//!
//! NVRTC needs `libnvrtc-builtins.so.X.Y` at compile time and looks it up by name with the
//! dynamic loader, which does not search the directory `libnvrtc` was loaded from; the test
//! loads it from that directory first, so no `LD_LIBRARY_PATH` is needed.

use impls::ops::cuda::src::{self, CudaModule};
use libloading::{Library, Symbol};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};

/// The environment variable naming the NVRTC library to use.
const ENV: &str = "DENSEBENCH_NVRTC";

/// The architectures every module must compile for: H100/H200 (the GPUs the project targets)
/// and A100.
const ARCHS: [&str; 2] = ["compute_90", "compute_80"];

type Program = *mut c_void;
type CreateFn = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileFn = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type SizeFn = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type TextFn = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut Program) -> c_int;

/// NVRTC loaded from a file, with the builtins library loaded first from the same directory.
struct Nvrtc {
    path: PathBuf,
    _builtins: Option<Library>,
    lib: Library,
}

/// Output of one compilation: PTX, or NVRTC's result code and log.
#[derive(Debug)]
enum Outcome {
    Ok { ptx: String, log: String },
    Failed { code: c_int, log: String },
}

impl Nvrtc {
    fn load(path: &Path) -> Result<Self, String> {
        let dir = path.parent().unwrap_or(Path::new("."));
        // `libnvrtc-builtins.so.13.0` next to `libnvrtc.so.13` (not the `.alt.` variant).
        let builtins = std::fs::read_dir(dir)
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
            });
        // SAFETY: loading NVIDIA's libraries runs their initialisers, which have no
        // preconditions; nothing else in this test process uses them.
        let _builtins = match &builtins {
            Some(b) => Some(
                unsafe { Library::new(b) }.map_err(|e| format!("loading {}: {e}", b.display()))?,
            ),
            None => None,
        };
        // SAFETY: as above.
        let lib = unsafe { Library::new(path) }
            .map_err(|e| format!("loading {}: {e}", path.display()))?;
        Ok(Nvrtc {
            path: path.to_path_buf(),
            _builtins,
            lib,
        })
    }

    fn sym<T>(&self, name: &[u8]) -> Symbol<'_, T> {
        // SAFETY: each name is an NVRTC entry point whose C signature is the type `T` it is
        // requested as (nvrtc.h).
        unsafe { self.lib.get::<T>(name) }.unwrap_or_else(|e| {
            panic!(
                "{} lacks {}: {e}",
                self.path.display(),
                String::from_utf8_lossy(name)
            )
        })
    }

    /// Compiles `src` (named `name` in diagnostics) with `options`.
    fn compile(&self, name: &str, src: &str, options: &[String]) -> Outcome {
        let create: Symbol<CreateFn> = self.sym(b"nvrtcCreateProgram\0");
        let compile: Symbol<CompileFn> = self.sym(b"nvrtcCompileProgram\0");
        let log_size: Symbol<SizeFn> = self.sym(b"nvrtcGetProgramLogSize\0");
        let get_log: Symbol<TextFn> = self.sym(b"nvrtcGetProgramLog\0");
        let ptx_size: Symbol<SizeFn> = self.sym(b"nvrtcGetPTXSize\0");
        let get_ptx: Symbol<TextFn> = self.sym(b"nvrtcGetPTX\0");
        let destroy: Symbol<DestroyFn> = self.sym(b"nvrtcDestroyProgram\0");

        let c_src = CString::new(src).expect("sources contain no NUL");
        let c_name = CString::new(name).expect("names contain no NUL");
        let c_opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()).expect("options contain no NUL"))
            .collect();
        let opt_ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
        let text = |size_fn: &SizeFn, text_fn: &TextFn, prog: Program| -> String {
            let mut n = 0usize;
            // SAFETY: `prog` is a live program; NVRTC writes the size, then at most `n` bytes
            // (NUL included) into a buffer of `n` bytes.
            unsafe {
                assert_eq!(size_fn(prog, &mut n), 0, "nvrtc size query");
                let mut buf = vec![0u8; n.max(1)];
                assert_eq!(
                    text_fn(prog, buf.as_mut_ptr().cast()),
                    0,
                    "nvrtc text query"
                );
                CStr::from_bytes_until_nul(&buf)
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }
        };
        let mut prog: Program = std::ptr::null_mut();
        // SAFETY: every pointer is a NUL-terminated string or an array of `len` of them, alive
        // for the calls; no headers are passed (count 0, null arrays).
        unsafe {
            let rc = create(
                &mut prog,
                c_src.as_ptr(),
                c_name.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            );
            assert_eq!(rc, 0, "nvrtcCreateProgram({name}) returned {rc}");
            let len = c_int::try_from(opt_ptrs.len()).expect("few options");
            let rc = compile(prog, len, opt_ptrs.as_ptr());
            let log = text(&log_size, &get_log, prog);
            let out = if rc == 0 {
                Outcome::Ok {
                    ptx: text(&ptx_size, &get_ptx, prog),
                    log,
                }
            } else {
                Outcome::Failed { code: rc, log }
            };
            assert_eq!(destroy(&mut prog), 0, "nvrtcDestroyProgram");
            out
        }
    }
}

/// Directories a cache may hold `libnvrtc.so.*` in: the `.ci/run` cache and the toolkit the
/// install script puts under the user's cache.
fn cache_candidates() -> Vec<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    let Some(base) = base else {
        return Vec::new();
    };
    let mut dirs = Vec::new();
    for root in ["densebench-nvrtc", "densebench-cuda"] {
        // <root>/<version>/{lib, nvidia/cu13/lib}: whatever versions are there, newest name last.
        let Ok(entries) = std::fs::read_dir(base.join(root)) else {
            continue;
        };
        let mut versions: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        versions.sort();
        for v in versions.into_iter().rev() {
            dirs.push(v.join("lib"));
            dirs.push(v.join("nvidia/cu13/lib"));
        }
    }
    dirs
}

/// `libnvrtc.so.<major>` in `dir` (not the `.alt.` or builtins variants).
fn nvrtc_in(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc.so."))
        })
        .collect();
    found.sort();
    found.pop()
}

/// The NVRTC to test with, or `None` (after printing why) where none is configured or cached.
/// A configured or cached library that does not load fails the test.
fn nvrtc(test: &str) -> Option<Nvrtc> {
    let path = match std::env::var_os(ENV) {
        Some(p) => PathBuf::from(p),
        None => match cache_candidates().iter().find_map(|d| nvrtc_in(d)) {
            Some(p) => p,
            None => {
                println!(
                    "{test}: skipped: {ENV} is not set and no cached libnvrtc was found \
                     (.ci/run fetches one; or set {ENV}=/path/to/libnvrtc.so.13)"
                );
                return None;
            }
        },
    };
    match Nvrtc::load(&path) {
        Ok(n) => {
            println!("{test}: NVRTC from {}", path.display());
            Some(n)
        }
        Err(e) => panic!("{ENV}/cached NVRTC {} does not load: {e}", path.display()),
    }
}

fn compile_module(nvrtc: &Nvrtc, m: &CudaModule, arch: &str) -> Result<String, String> {
    match nvrtc.compile(m.file, &m.source(), &src::nvrtc_options(arch)) {
        Outcome::Ok { ptx, log } if log.trim().is_empty() => Ok(ptx),
        Outcome::Ok { log, .. } => Err(format!(
            "{} ({arch}) compiled with warnings:\n{log}",
            m.file
        )),
        Outcome::Failed { code, log } => Err(format!(
            "{} ({arch}) failed to compile (nvrtcResult {code}):\n{log}",
            m.file
        )),
    }
}

#[test]
fn every_cuda_module_compiles_with_nvrtc() {
    let Some(nvrtc) = nvrtc("every_cuda_module_compiles_with_nvrtc") else {
        return;
    };
    let mut failures = Vec::new();
    for m in src::MODULES {
        for arch in ARCHS {
            match compile_module(&nvrtc, &m, arch) {
                Ok(ptx) => {
                    // Every entry point the launchers ask for is in the PTX: a renamed kernel
                    // fails here, not at the first launch on a GPU.
                    let missing: Vec<String> = m
                        .entry_points()
                        .into_iter()
                        .filter(|e| !ptx.contains(&format!(".entry {e}(")))
                        .collect();
                    if missing.is_empty() {
                        println!("{} for {arch}: ok, {} bytes of PTX", m.file, ptx.len());
                    } else {
                        failures.push(format!("{} ({arch}): no entry {missing:?}", m.file));
                    }
                }
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The check can fail: a module with a syntax error is reported as a failure carrying NVRTC's
/// log, which names the file and line (the `#line` directive of `CudaModule::source`).
#[test]
fn a_syntax_error_is_reported_with_nvrtc_log() {
    let Some(nvrtc) = nvrtc("a_syntax_error_is_reported_with_nvrtc_log") else {
        return;
    };
    let broken = CudaModule {
        name: "broken",
        file: "broken.cu",
        body: "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f }\n",
        kernels: &["k"],
        bf16_kernels: &[],
        bf16_only: &[],
        f32_only: &[],
    };
    let e = compile_module(&nvrtc, &broken, ARCHS[0]).expect_err("a syntax error compiled");
    println!("expected failure:\n{e}");
    assert!(e.contains("failed to compile"), "{e}");
    assert!(
        e.contains("broken.cu(1)"),
        "the log should name broken.cu line 1: {e}"
    );
    assert!(e.contains("error"), "{e}");
}

/// Real NVRTC output round-trips through the on-disk PTX cache (`impls::ops::cuda::ptx_cache`): every
/// module's PTX, stored by one "process", is read back byte for byte by the next without
/// compiling, under a key that differs per module and architecture.
#[test]
fn real_ptx_round_trips_through_the_disk_cache() {
    use impls::ops::cuda::ptx_cache::{self, Source};
    let Some(nvrtc) = nvrtc("real_ptx_round_trips_through_the_disk_cache") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let mut keys = std::collections::HashSet::new();
    for m in src::MODULES {
        for arch in ARCHS {
            let key = ptx_cache::key(&m.source(), &src::nvrtc_options(arch), (13, 0));
            assert!(keys.insert(key.clone()), "{} {arch}: key shared", m.file);
            let (ptx, how) = ptx_cache::get_or_compile(Some(dir.path()), &key, || {
                compile_module(&nvrtc, &m, arch)
            })
            .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(how, Source::Compiled);
            let (again, how) = ptx_cache::get_or_compile(Some(dir.path()), &key, || {
                Err("compiled again instead of read from the cache".into())
            })
            .unwrap_or_else(|e| panic!("{} {arch}: {e}", m.file));
            assert_eq!(how, Source::Cache);
            assert!(again == ptx, "{} {arch}: the cached PTX differs", m.file);
        }
    }
}
