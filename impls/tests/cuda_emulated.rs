//! densebench's CUDA kernel sources run on the host: each module's text exactly as NVRTC gets it
//! (`impls::ops::cuda::src`, prelude included) is compiled as C++ against a small emulation of the
//! CUDA execution model (`tests/cuda_emulated/shim.hpp`), and every entry point, f32, f64 and
//! bf16 (features stored as bf16, computed and tabled in f32, as the CPU twins' `Elem`), is
//! launched with the launchers' geometry and with smaller grids (which exercise the grid-stride
//! loops that cover capped grids) and compared with its CPU twin in `impls::ops::bn` /
//! `impls::ops::elementwise`: the element-wise kernels bit for bit, the reductions within the bound of a
//! different f64 summation order, and two runs of a reduction bit for bit. The kernels' own
//! bf16 conversions are checked against the `half` crate's bit for bit.
//!
//! This checks the kernels' indexing (rows, columns, taps, coefficient tables, views), their
//! rounding claims and the fixed-tree block sum without a GPU. It does not check the driver
//! path, NVRTC (`nvrtc_compile.rs` does), warps or real concurrency: `fused_cuda.rs` on a GPU.
//!
//! Needs a C++20 compiler (`$CXX`, else `c++`); `.ci/run` installs g++ where there is none. Its
//! absence fails the test: a kernel check that silently does not run is no check.

use candle_core::{Device, Tensor, WithDType};
use half::bf16;
use impls::config::{BN_EPS, BN_MOMENTUM};
use impls::ops::conv3x3::{self, gpu};
use impls::ops::cuda::src::{self, CudaModule};
use impls::ops::elementwise;
use impls::ops::layout::grid::{Grid, TAPS};
use impls::ops::{bn, bn_backward, shift};
use libloading::{Library, Symbol};
use std::ffi::{c_char, c_int, c_void, CString};
use std::path::Path;
use std::process::Command;

type LaunchFn = unsafe extern "C" fn(
    *const c_char,
    u32,
    u32,
    u32,
    u32,
    u32,
    u32,
    *mut *mut c_void,
    c_int,
) -> c_int;

type Dim = (u32, u32, u32);

/// The launchers' geometry (`impls/src/ops/cuda/launch.rs`, restated): element-wise kernels get
/// blocks of `ELEMENTWISE_THREADS` over `n` (grid capped at `MAX_GRID_X`), row kernels the
/// columns in x and the rows in y (both capped), reductions one block of `REDUCE_THREADS` per row.
fn elementwise_geometry(n: usize) -> (Dim, Dim) {
    let t = src::ELEMENTWISE_THREADS;
    let gx = n.div_ceil(t as usize).clamp(1, src::MAX_GRID_X as usize) as u32;
    ((gx, 1, 1), (t, 1, 1))
}

fn rows_geometry(rows: usize, cols: usize) -> (Dim, Dim) {
    let t = src::ELEMENTWISE_THREADS;
    let gx = cols.div_ceil(t as usize).clamp(1, src::MAX_GRID_X as usize) as u32;
    let gy = rows.clamp(1, src::MAX_GRID_Y as usize) as u32;
    ((gx, gy, 1), (t, 1, 1))
}

fn reduce_geometry(rows: usize) -> (Dim, Dim) {
    ((rows as u32, 1, 1), (src::REDUCE_THREADS, 1, 1))
}

/// The launchers' geometry and two smaller grids: one block, and a few in each dimension, so
/// every grid-stride loop takes more than one turn.
fn row_geometries(rows: usize, cols: usize) -> Vec<(Dim, Dim)> {
    let (g, b) = rows_geometry(rows, cols);
    vec![(g, b), ((1, 1, 1), b), ((2, 2, 1), b)]
}

/// BN forward's step scalars `[eps, keep, mom, mom_unbias]` over `m` values per channel:
/// impls::ops::bn::PrepareScalars, restated — candle rounds each scalar to `T`; the unbiasing
/// factor is μ·(M/(M−1)), in that order.
fn prepare_scalars<T: WithDType>(m: usize) -> [T; 4] {
    let mf = m as f64;
    [
        BN_EPS,
        1.0 - BN_MOMENTUM,
        BN_MOMENTUM,
        BN_MOMENTUM * (mf / (mf - 1.0)),
    ]
    .map(T::from_f64)
}

fn flat_geometries(n: usize) -> Vec<(Dim, Dim)> {
    let (g, b) = elementwise_geometry(n);
    vec![(g, b), ((1, 1, 1), b), ((3, 1, 1), b)]
}

/// One kernel module compiled for the host, with `emu_launch(name, grid, block, params,
/// threads)` dispatching to every entry point.
struct Emulated {
    lib: Library,
    _dir: tempfile::TempDir,
}

fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".to_string())
}

/// `-fno-gnu-unique` for g++, nothing for clang (which emits no GNU_UNIQUE symbols).
fn gnu_unique_off(cxx: &str) -> Option<&'static str> {
    let version = Command::new(cxx).arg("--version").output().ok()?;
    (!String::from_utf8_lossy(&version.stdout).contains("clang")).then_some("-fno-gnu-unique")
}

impl Emulated {
    fn build(module: &CudaModule) -> Emulated {
        Emulated::build_with(module, &[], "")
    }

    /// [`Emulated::build`] with more `-D` definitions and C++ appended to the module (probes of
    /// its device functions, `extern "C"`).
    fn build_with(module: &CudaModule, defines: &[&str], extra: &str) -> Emulated {
        let dir = tempfile::tempdir().expect("temp dir");
        let shim_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cuda_emulated");
        let mut table = String::from(
            "extern \"C\" int emu_launch(const char *name, unsigned gx, unsigned gy, unsigned gz,\n\
             unsigned bx, unsigned by, unsigned bz, void **params, int threads) {\n\
             const db_dim3 g{gx, gy, gz}, b{bx, by, bz};\n",
        );
        for e in module.entry_points() {
            table.push_str(&format!(
                "if (!std::strcmp(name, \"{e}\")) return db_emu_launch({e}, g, b, params, threads != 0);\n"
            ));
        }
        table.push_str("return -1;\n}\n");
        let src = dir.path().join(format!("{}.cpp", module.name));
        let text = format!(
            "#include \"shim.hpp\"\n{}\n#line 1 \"emu_launch\"\n{table}{extra}",
            module.source()
        );
        std::fs::write(&src, text).expect("writing the C++ source");
        let lib = dir.path().join(format!("lib{}.so", module.name));
        let cxx = cxx();
        let out = Command::new(&cxx)
            .args(["-std=c++20", "-O1", "-ffp-contract=off", "-pthread"])
            .args(["-fPIC", "-shared", "-Wall", "-Wno-unknown-pragmas"])
            // every library its own statics, the __shared__ arrays of template kernels too
            // (shim.hpp: g++'s GNU_UNIQUE symbols are one object per process; clang makes none
            // and knows no such flag)
            .args(gnu_unique_off(&cxx))
            .arg(format!("-DDB_REDUCE_THREADS={}", src::REDUCE_THREADS))
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg("-I")
            .arg(&shim_dir)
            .arg("-o")
            .arg(&lib)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "no C++ compiler `{cxx}` ({e}): install g++ (Debian: apt-get install g++) \
                     or set CXX; the CUDA kernels cannot be checked on the host without one"
                )
            });
        assert!(
            out.status.success(),
            "{}: the host C++ build of the kernel source failed:\n{}",
            module.file,
            String::from_utf8_lossy(&out.stderr)
        );
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(
            !warnings.contains("warning"),
            "{}: warnings:\n{warnings}",
            module.file
        );
        // SAFETY: a library just built from the kernel sources and the shim; its initialisers
        // only set up the emulation's globals.
        let lib = unsafe { Library::new(&lib) }.expect("loading the emulated module");
        Emulated { lib, _dir: dir }
    }

    /// Launches `kernel` (`name_f32`/`_f64`) with `args`, one pointer per kernel argument.
    fn launch(&self, kernel: &str, (g, b): (Dim, Dim), args: &mut [*mut c_void], threads: bool) {
        let name = CString::new(kernel).expect("kernel name");
        // SAFETY: `emu_launch` has exactly this signature (generated above); every pointer in
        // `args` points at a live value of the type the kernel's parameter has, and the
        // buffers they point to are as long as the kernel reads and writes (the callers size
        // them like the launchers do).
        let rc = unsafe {
            let f: Symbol<LaunchFn> = self.lib.get(b"emu_launch\0").expect("emu_launch");
            f(
                name.as_ptr(),
                g.0,
                g.1,
                g.2,
                b.0,
                b.1,
                b.2,
                args.as_mut_ptr(),
                c_int::from(threads),
            )
        };
        assert_eq!(rc, 0, "{kernel}: not an entry point of the emulated module");
    }
}

/// f32, f64 and bf16 as the tests need them: features of `Self`, per-channel tables and
/// scalars of [`El::Acc`] (the kernels' `db_acc<T>`, the CPU twins' `Elem::Acc`).
trait El: WithDType + Copy {
    /// The compute and table type: itself for f32 and f64, f32 for bf16.
    type Acc: El;
    const SUFFIX: &'static str;
    /// Relative rounding of one result in this type (the half-ulp bound is 2⁻²⁴ / 2⁻⁵³; one
    /// ulp allows the two sides to round a nearly equal f64 to neighbours).
    const ULP: f64;
    fn bits(self) -> u64;
}
impl El for f32 {
    type Acc = f32;
    const SUFFIX: &'static str = "f32";
    const ULP: f64 = f32::EPSILON as f64;
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}
impl El for f64 {
    type Acc = f64;
    const SUFFIX: &'static str = "f64";
    const ULP: f64 = f64::EPSILON;
    fn bits(self) -> u64 {
        self.to_bits()
    }
}
impl El for bf16 {
    type Acc = f32;
    const SUFFIX: &'static str = "bf16";
    // 2⁻⁷ (8 significant bits): no tolerance uses it, every bf16 result is compared bit for
    // bit (the reductions' results are f32 tables, compared with `f32::ULP`)
    const ULP: f64 = 1.0 / 128.0;
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}

/// Deterministic values in [-2, 2) (SplitMix64), as `T`.
fn values<T: El>(n: usize, seed: u64) -> Vec<T> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            T::from_f64((z >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0)
        })
        .collect()
}

/// Values for the ReLU kernels: the random ones with NaN, ±0 and tiny values planted.
fn relu_values<T: El>(n: usize, seed: u64) -> Vec<T> {
    let mut v = values::<T>(n, seed);
    for (i, special) in [
        f64::NAN,
        0.0,
        -0.0,
        1e-30,
        -1e-30,
        f64::INFINITY,
        f64::NEG_INFINITY,
    ]
    .into_iter()
    .enumerate()
    {
        if let Some(x) = v.get_mut(i * 7) {
            *x = T::from_f64(special);
        }
    }
    v
}

fn tensor<T: El>(v: &[T], shape: (usize, usize)) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &Device::Cpu).expect("tensor")
}

fn vector<T: El>(v: &[T]) -> Tensor {
    Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).expect("vector")
}

fn host<T: El>(t: &Tensor) -> Vec<T> {
    t.flatten_all()
        .and_then(|t| t.to_vec1::<T>())
        .expect("to host")
}

fn assert_bitwise<T: El>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].bits() != want[i].bits()) {
        panic!(
            "{what}: element {i} is {:?} on the emulated GPU, {:?} on the CPU (bits differ)",
            got[i].to_f64(),
            want[i].to_f64()
        );
    }
}

/// [`assert_bitwise`] except that a NaN matches any NaN: where an operation creates a NaN
/// (√ of a negative, 0·∞, ∞ − ∞) its sign and payload are the hardware's choice (x86 gives the
/// negative default NaN, a GPU its canonical positive one), and where two NaN operands meet the
/// result carries one of them, which one depending on the operand order the compiler picked for
/// a commutative op. No kernel promises a NaN's bits, only that it is a NaN; every other value
/// is compared bit for bit (±0 and ±∞ included).
fn assert_bitwise_nan<T: El>(what: &str, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let same = |a: T, b: T| a.bits() == b.bits() || (a.to_f64().is_nan() && b.to_f64().is_nan());
    if let Some(i) = (0..got.len()).find(|&i| !same(got[i], want[i])) {
        panic!(
            "{what}: element {i} is {:?} on the emulated GPU, {:?} on the CPU (bits differ)",
            got[i].to_f64(),
            want[i].to_f64()
        );
    }
}

/// Pointer to a value, as a kernel parameter.
fn p<V>(v: &mut V) -> *mut c_void {
    (v as *mut V).cast()
}

/// `[C, M]` shapes of the BN kernels: M below a block's threads (some threads sum nothing), and
/// M past two whole batches of loads of every thread (2 · 8 · 1024 f32, 4 · 4 · 1024 f64; one
/// of 16 · 1024 bf16) and not a multiple of the block: whole batches, a partial batch where
/// only some threads have the last elements, and threads without any element of it
/// (`db_thread_rows`).
const BN_SHAPES: [(usize, usize); 3] = [(3, 200), (4, 517), (2, 2 * 8 * 1024 + 700)];

/// `bn_stats`: the planar `[2, C]` (mean; variance) of each row, one block per row, within
/// the f64-order bound of the CPU twin's interleaved sums, and the same bits on a second run
/// (the block sum is a fixed tree, not an arrival order). The table is `T::Acc` (f32 for bf16
/// `x`).
fn bn_stats_matches<T: El>(m: &Emulated) {
    let kernel = format!("bn_stats_{}", T::SUFFIX);
    for (k, &(c, cols)) in BN_SHAPES.iter().enumerate() {
        let x = values::<T>(c * cols, 10 + k as u64);
        let mv = host::<T::Acc>(&bn::bn_stats(&tensor(&x, (c, cols))).expect("cpu bn_stats"));
        let (mean, var) = mv.split_at(c);
        let run = || {
            let mut out = vec![T::Acc::from_f64(7.0); 2 * c];
            let (mut xp, mut op) = (x.as_ptr().cast_mut(), out.as_mut_ptr());
            let (mut cc, mut mm) = (c as u64, cols as u64);
            m.launch(
                &kernel,
                reduce_geometry(c),
                &mut [p(&mut xp), p(&mut op), p(&mut cc), p(&mut mm)],
                true,
            );
            out
        };
        let (a, b) = (run(), run());
        assert_bitwise(&format!("{kernel} run twice"), &a, &b);
        for r in 0..c {
            let row: Vec<f64> = x[r * cols..(r + 1) * cols]
                .iter()
                .map(|v| v.to_f64())
                .collect();
            let mu = row.iter().sum::<f64>() / cols as f64;
            let abs = row.iter().map(|v| v.abs()).sum::<f64>() / cols as f64;
            let sq = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f64>() / cols as f64;
            close::<T::Acc>(&kernel, "mean", r, a[r], mean[r], cols, abs, 0.0);
            close::<T::Acc>(&kernel, "variance", r, a[c + r], var[r], cols, sq, 0.0);
            // and bitwise the kernel's own order (two passes, the second about the f64 mean)
            let mu = kernel_order_sum(row.iter().copied()) / cols as f64;
            let var = kernel_order_sum(row.iter().map(|v| (v - mu) * (v - mu))) / cols as f64;
            let what = format!("{kernel} [{c}, {cols}] row {r} in the kernel's summation order");
            assert_bitwise(&what, &a[r..=r], &[T::Acc::from_f64(mu)]);
            assert_bitwise(&what, &a[c + r..=c + r], &[T::Acc::from_f64(var)]);
        }
    }
}

/// Launches BN forward's per-channel step: `bn_prepare` from the statistics at `first`, or
/// (`cols`: the features' columns) `bn_stats_prepare` from the features at `first`, with γ, β
/// and the running stats (`vectors`) and the scalars; returns its `[6, C]` (prefilled with 7s,
/// so an unwritten element shows).
fn launch_prepare<A: El>(
    m: &Emulated,
    kernel: &str,
    geom: (Dim, Dim),
    mut first: *mut c_void,
    vectors: [&[A]; 4],
    cols: Option<usize>,
    scalars: [A; 4],
) -> Vec<A> {
    let c = vectors[0].len();
    let mut out = vec![A::from_f64(7.0); 6 * c];
    let (table, running) = out.split_at_mut(4 * c);
    let [mut gp, mut bp, mut rmp, mut rvp] = vectors.map(|v| v.as_ptr().cast_mut());
    let (mut tp, mut rp) = (table.as_mut_ptr(), running.as_mut_ptr());
    let (mut cc, mut mm) = (c as u64, cols.unwrap_or(0) as u64);
    let [mut eps, mut keep, mut mom, mut mom_unbias] = scalars;
    let mut args = vec![
        p(&mut first),
        p(&mut gp),
        p(&mut bp),
        p(&mut rmp),
        p(&mut rvp),
    ];
    args.extend([p(&mut tp), p(&mut rp), p(&mut cc)]);
    if cols.is_some() {
        args.push(p(&mut mm));
    }
    args.extend([p(&mut eps), p(&mut keep), p(&mut mom), p(&mut mom_unbias)]);
    m.launch(kernel, geom, &mut args, cols.is_some());
    out
}

/// `bn_stats_prepare` (issue 38: BN2's statistics and per-channel step in one launch): its
/// `[6, C]` must be, bit for bit (NaN for NaN), what `bn_prepare` (f32 tables for bf16
/// features) makes from `bn_stats`' output on the emulated GPU, and the CPU twin
/// (`bn::bn_stats_prepare`) the CPU's two ops; γ has 0, −0 and ∞ planted, the running
/// variance a NaN. Reduction geometry, two runs bitwise equal.
fn bn_stats_prepare_matches<T: El>(m: &Emulated) {
    let kernel = format!("bn_stats_prepare_{}", T::SUFFIX);
    let stats = format!("bn_stats_{}", T::SUFFIX);
    let prepare = format!("bn_prepare_{}", <T::Acc as El>::SUFFIX);
    for (k, &(c, cols)) in BN_SHAPES.iter().enumerate() {
        let x = values::<T>(c * cols, 180 + k as u64);
        let mut gamma = values::<T::Acc>(c, 181 + k as u64);
        let beta = values::<T::Acc>(c, 182 + k as u64);
        let rmean = values::<T::Acc>(c, 183 + k as u64);
        let mut rvar = values::<T::Acc>(c, 184 + k as u64);
        for (r, g) in [0.0, -0.0, f64::INFINITY].into_iter().enumerate() {
            if let Some(v) = gamma.get_mut(r) {
                *v = T::Acc::from_f64(g);
            }
        }
        rvar[c - 1] = T::Acc::from_f64(f64::NAN);
        let scalars = prepare_scalars::<T::Acc>(cols);
        let vectors = [&gamma, &beta, &rmean, &rvar].map(|v| &v[..]);
        // the emulated GPU: one kernel, and the two it replaces
        let xp = x.as_ptr().cast_mut().cast();
        let fused = || {
            launch_prepare(
                m,
                &kernel,
                reduce_geometry(c),
                xp,
                vectors,
                Some(cols),
                scalars,
            )
        };
        let got = fused();
        assert_bitwise_nan(&format!("{kernel} run twice"), &fused(), &got);
        let mut mv = vec![T::Acc::from_f64(7.0); 2 * c];
        {
            let (mut xp, mut op) = (x.as_ptr().cast_mut(), mv.as_mut_ptr());
            let (mut cc, mut mm) = (c as u64, cols as u64);
            let args = &mut [p(&mut xp), p(&mut op), p(&mut cc), p(&mut mm)];
            m.launch(&stats, reduce_geometry(c), args, true);
        }
        let mvp = mv.as_ptr().cast_mut().cast();
        let two = launch_prepare(
            m,
            &prepare,
            flat_geometries(c)[0],
            mvp,
            vectors,
            None,
            scalars,
        );
        let what = format!("{kernel} [{c}, {cols}]");
        assert_bitwise_nan(&format!("{what}: bn_stats then bn_prepare"), &got, &two);
        // the CPU twin: the two ops, one op
        let xt = tensor(&x, (c, cols));
        let [g, b, rm, rv] = vectors.map(vector);
        let (t1, r1) = bn::bn_stats_prepare(&xt, &g, &b, &rm, &rv).expect("cpu fused");
        let mv_cpu = bn::bn_stats(&xt).expect("cpu stats");
        let (t2, r2) = bn::bn_prepare(&mv_cpu, &g, &b, &rm, &rv, cols).expect("cpu prepare");
        for (name, a, b) in [("table", &t1, &t2), ("running", &r1, &r2)] {
            assert_bitwise_nan(
                &format!("{what}: the CPU twin's {name}"),
                &host::<T::Acc>(a),
                &host::<T::Acc>(b),
            );
        }
    }
}

/// `got` and `want` are one result computed with two f64 summation orders over `m` terms whose
/// absolute values sum to `scale`, then rounded to `T`: each order's error is at most
/// `(m − 1) · 2⁻⁵³ · scale` (recursive summation; the kernel's tree of per-thread sums is within
/// that too), so they may differ by `m · 2⁻⁵² · scale` plus one rounding in `T` — plus `slack`
/// where one side computes in f32 what the other computes in f64 (bf16 features' backward sums
/// on the CPU: [`cpu_f32_sums`]).
#[allow(clippy::too_many_arguments)]
fn close<T: El>(
    kernel: &str,
    what: &str,
    row: usize,
    got: T,
    want: T,
    m: usize,
    scale: f64,
    slack: f64,
) {
    let (g, w) = (got.to_f64(), want.to_f64());
    let tol = m as f64 * f64::EPSILON * scale + T::ULP * w.abs() + slack;
    assert!(
        (g - w).abs() <= tol,
        "{kernel}: {what} of row {row}: {g:e} on the emulated GPU, {w:e} on the CPU (tolerance {tol:e})"
    );
}

/// The error the CPU's BN backward sums of features `T` may carry beyond an f64 sum of the
/// same terms, for terms whose absolute values sum to `scale`: bf16 features' terms are computed
/// in f32 (three roundings) and folded in f32 blocks (four additions) before f64
/// (`block_sums`), `7·2⁻²⁴·scale`, doubled; none for f32 and f64 features (f64 throughout). The
/// kernels keep f64 terms and sums for every dtype.
fn cpu_f32_sums<T: El>(scale: f64) -> f64 {
    if T::SUFFIX == "bf16" {
        14.0 * 2f64.powi(-24) * scale
    } else {
        0.0
    }
}

/// The kernels' summation order, on the host: thread t of a block of `REDUCE_THREADS` adds
/// terms t, t + R, t + 2R, … to +0 in this order, then the fixed tree of `db_block_sum` (round
/// s = R/2, R/4, …, 1: partial t += partial t + s). The kernels must give this sum bit for bit:
/// batching the loads (`db_thread_rows`) may change when they are issued, never the order of
/// the additions, and a skipped, repeated or reordered term shows up here as a different bit
/// pattern long before it leaves the f64-order bound of [`close`].
fn kernel_order_sum(terms: impl Iterator<Item = f64>) -> f64 {
    let r = src::REDUCE_THREADS as usize;
    let mut part = vec![0.0f64; r];
    for (i, v) in terms.enumerate() {
        part[i % r] += v;
    }
    let mut s = r / 2;
    while s > 0 {
        for t in 0..s {
            part[t] += part[t + s];
        }
        s /= 2;
    }
    part[0]
}

/// `bn_bwd_reduce`: planar `[5, C]` = (Σ gy; Σ gy·x̂; A; B; C). The two sums within the
/// f64-order bound of the CPU twin's (and, bf16, the CPU's f32 terms and blocks: [`cpu_f32_sums`]); the coefficients A, B, C, which the kernel computes in `T`
/// from its own rounded sums, bit for bit the CPU's coefficient maths
/// ([`bn_backward::generic_bn_bwd_coef`], the candle ops they replace) applied to the kernel's sums:
/// comparing them with the CPU twin's A, B, C would mix the sums' summation-order difference
/// into a check of the per-channel arithmetic (order of the roundings, `T(−1/M)` and `T(1/M)`,
/// planar indexing), which must be exact. γ has a 0 and a −0 and a few large values; and two
/// runs give the same bits. Features `T`, everything per channel (st, γ, the output, the
/// scalars) `T::Acc`.
fn bn_bwd_reduce_matches<T: El>(m: &Emulated) {
    let kernel = format!("bn_bwd_reduce_{}", T::SUFFIX);
    for (k, &(c, cols)) in BN_SHAPES.iter().enumerate() {
        let gy = values::<T>(c * cols, 20 + k as u64);
        let x = values::<T>(c * cols, 30 + k as u64);
        let mean = values::<T::Acc>(c, 40 + k as u64);
        let invstd: Vec<T::Acc> = values::<T::Acc>(c, 50 + k as u64)
            .iter()
            .map(|v| T::Acc::from_f64(v.to_f64().abs() + 0.5))
            .collect();
        let mut gamma = values::<T::Acc>(c, 55 + k as u64);
        for (r, g) in [0.0, -0.0, 1e6].into_iter().enumerate() {
            if let Some(v) = gamma.get_mut(r) {
                *v = T::Acc::from_f64(g);
            }
        }
        let st: Vec<T::Acc> = mean.iter().chain(&invstd).copied().collect();
        let (st_t, gamma_t) = (tensor(&st, (2, c)), vector(&gamma));
        let cpu = host::<T::Acc>(
            &bn_backward::bn_bwd_reduce(
                &tensor(&gy, (c, cols)),
                &tensor(&x, (c, cols)),
                &st_t,
                &gamma_t,
            )
            .expect("cpu bn_bwd_reduce"),
        );
        assert_eq!(cpu.len(), 5 * c, "cpu bn_bwd_reduce: [5, C]");
        let run = || launch_bwd_reduce(m, &kernel, &gy, &x, &st, &gamma, (c, cols), 5);
        let (a, b) = (run(), run());
        assert_bitwise(&format!("{kernel} run twice"), &a, &b);
        for r in 0..c {
            let range = r * cols..(r + 1) * cols;
            let (mu, is) = (mean[r].to_f64(), invstd[r].to_f64());
            let sg_scale: f64 = gy[range.clone()].iter().map(|g| g.to_f64().abs()).sum();
            let sgx_scale: f64 = range
                .map(|i| (gy[i].to_f64() * (x[i].to_f64() - mu) * is).abs())
                .sum();
            let (sg_slack, sgx_slack) = (cpu_f32_sums::<T>(sg_scale), cpu_f32_sums::<T>(sgx_scale));
            close::<T::Acc>(&kernel, "Σgy", r, a[r], cpu[r], cols, sg_scale, sg_slack);
            close::<T::Acc>(
                &kernel,
                "Σgy·x̂",
                r,
                a[c + r],
                cpu[c + r],
                cols,
                sgx_scale,
                sgx_slack,
            );
            // and bitwise the kernel's own order: gy · (x − mean) · invstd per term, in f64
            let range = r * cols..(r + 1) * cols;
            let sg = kernel_order_sum(gy[range.clone()].iter().map(|g| g.to_f64()));
            let sgx = kernel_order_sum(range.map(|i| gy[i].to_f64() * (x[i].to_f64() - mu) * is));
            let what = format!("{kernel} [{c}, {cols}] row {r} in the kernel's summation order");
            assert_bitwise(&what, &a[r..=r], &[T::Acc::from_f64(sg)]);
            assert_bitwise(&what, &a[c + r..=c + r], &[T::Acc::from_f64(sgx)]);
        }
        let coef = bn_backward::generic_bn_bwd_coef(
            &tensor(&a[..c], (c, 1)),
            &tensor(&a[c..2 * c], (c, 1)),
            &st_t,
            &gamma_t,
            cols,
        )
        .expect("cpu bn_bwd_coef");
        for (q, (name, want)) in ["A", "B", "C"].into_iter().zip(&coef).enumerate() {
            let rows = (q + 2) * c..(q + 3) * c;
            assert_bitwise(
                &format!("{kernel} [{c}, {cols}]: coefficient {name} of the kernel's sums"),
                &a[rows],
                &host::<T::Acc>(want),
            );
        }
    }
}

/// Launches a reduction of BN's backward (`bn_bwd_reduce[_relu]`) with the launcher's
/// geometry and scalars; returns its `q_out · C` outputs (prefilled with 7s, so an unwritten one
/// shows).
#[allow(clippy::too_many_arguments)]
fn launch_bwd_reduce<T: El>(
    m: &Emulated,
    kernel: &str,
    gy: &[T],
    x: &[T],
    st: &[T::Acc],
    gamma: &[T::Acc],
    (c, cols): (usize, usize),
    q_out: usize,
) -> Vec<T::Acc> {
    let mut out = vec![T::Acc::from_f64(7.0); q_out * c];
    let mut gp = gy.as_ptr().cast_mut();
    let mut xp = x.as_ptr().cast_mut();
    let mut sp = st.as_ptr().cast_mut();
    let mut gmp = gamma.as_ptr().cast_mut();
    let (mut op, mut cc, mut mm) = (out.as_mut_ptr(), c as u64, cols as u64);
    let mut neg_inv_m = T::Acc::from_f64(-1.0 / cols as f64);
    let mut inv_m = T::Acc::from_f64(1.0 / cols as f64);
    m.launch(
        kernel,
        reduce_geometry(c),
        &mut [
            p(&mut gp),
            p(&mut xp),
            p(&mut sp),
            p(&mut gmp),
            p(&mut op),
            p(&mut cc),
            p(&mut mm),
            p(&mut neg_inv_m),
            p(&mut inv_m),
        ],
        true,
    );
    out
}

/// `bn_bwd_reduce_relu`, BN's backward reduction with the backward of the ReLU after it fused
/// in (the gradient masked where `x·scale + shift ≤ 0`, or NaN), reading BN's saved table
/// `[4, C]`: its `[5, C]` output must be, bit for bit, the plain kernel's on the gradient the
/// CPU's `relu_bwd_affine` masks; and the CPU twin (`bn_bwd_reduce_relu`) the CPU's two steps. Row 0 has `x = ±0` with shift `+0` (an exactly zero pre-activation: closed); the
/// mask closes between a tenth and nine tenths of the elements.
fn bn_bwd_reduce_relu_matches<T: El>(m: &Emulated) {
    let kernel = format!("bn_bwd_reduce_relu_{}", T::SUFFIX);
    let plain = format!("bn_bwd_reduce_{}", T::SUFFIX);
    for (k, &(c, cols)) in BN_SHAPES.iter().enumerate() {
        let gy = values::<T>(c * cols, 120 + k as u64);
        let mut x = values::<T>(c * cols, 130 + k as u64);
        (x[7], x[14]) = (T::from_f64(0.0), T::from_f64(-0.0));
        let mean = values::<T::Acc>(c, 140 + k as u64);
        let invstd: Vec<T::Acc> = values::<T::Acc>(c, 150 + k as u64)
            .iter()
            .map(|v| T::Acc::from_f64(v.to_f64().abs() + 0.5))
            .collect();
        let gamma = values::<T::Acc>(c, 155 + k as u64);
        let scale = values::<T::Acc>(c, 160 + k as u64);
        let mut shift = values::<T::Acc>(c, 165 + k as u64);
        shift[0] = T::Acc::from_f64(0.0);
        let st: Vec<T::Acc> = mean.iter().chain(&invstd).copied().collect();
        let affine: Vec<T::Acc> = scale.iter().chain(&shift).copied().collect();
        let table: Vec<T::Acc> = st.iter().chain(&affine).copied().collect();
        let (gt, xt) = (tensor(&gy, (c, cols)), tensor(&x, (c, cols)));
        let masked_t =
            bn_backward::relu_bwd_affine(&gt, &xt, &tensor(&affine, (2, c))).expect("mask");
        let masked = host::<T>(&masked_t);
        let closed = masked
            .iter()
            .zip(&gy)
            .filter(|(a, b)| a.bits() != b.bits())
            .count();
        assert!(
            closed * 10 > c * cols && closed * 10 < 9 * c * cols,
            "{kernel}: the mask closes {closed} of {} elements",
            c * cols
        );
        let fused = launch_bwd_reduce(m, &kernel, &gy, &x, &table, &gamma, (c, cols), 5);
        let two_steps = launch_bwd_reduce(m, &plain, &masked, &x, &st, &gamma, (c, cols), 5);
        let what = format!("{kernel} [{c}, {cols}]");
        assert_bitwise(
            &format!("{what}: the plain kernel on the masked gradient"),
            &fused,
            &two_steps,
        );
        let (stt, gammat) = (tensor(&st, (2, c)), vector(&gamma));
        let cpu_fused = host::<T::Acc>(
            &bn_backward::bn_bwd_reduce_relu(&gt, &xt, &tensor(&table, (4, c)), &gammat)
                .expect("cpu reduce relu"),
        );
        let cpu_two = host::<T::Acc>(
            &bn_backward::bn_bwd_reduce(&masked_t, &xt, &stt, &gammat).expect("cpu reduce"),
        );
        assert_bitwise(
            &format!("{what}: the CPU twin's two steps"),
            &cpu_fused,
            &cpu_two,
        );
    }
}

/// Launches a dx kernel of BN's backward over `out` (`[C, M]`, the destination when
/// `accumulate`): `(gy, x)`, the `[3, C]` coefficients and, for the fused ReLU's kernels, a
/// non-empty `[2, C]` (scale; shift), in the launchers' argument order.
fn launch_dx<T: El>(
    m: &Emulated,
    kernel: &str,
    geom: (Dim, Dim),
    accumulate: bool,
    [gy, x]: [&[T]; 2],
    [coef, aff]: [&[T::Acc]; 2],
    out: &mut [T],
) {
    let c = coef.len() / 3;
    let cols = out.len() / c.max(1);
    let [mut gp, mut xp] = [gy, x].map(|v| v.as_ptr().cast_mut());
    let [mut cp, mut ap] = [coef, aff].map(|v| v.as_ptr().cast_mut());
    let (mut op, mut rows, mut mm) = (out.as_mut_ptr(), c as u64, cols as u64);
    let mut args = Vec::new();
    if accumulate {
        args.push(p(&mut op));
    }
    args.extend([p(&mut gp), p(&mut xp), p(&mut cp)]);
    if !aff.is_empty() {
        args.push(p(&mut ap));
    }
    if !accumulate {
        args.push(p(&mut op));
    }
    args.extend([p(&mut rows), p(&mut mm)]);
    m.launch(kernel, geom, &mut args, false);
}

/// `bn_bwd_dx[_accumulate]_relu`: dx with the ReLU's backward fused in, `coef [3, C]` = (A; B;
/// C) and the mask's `affine [2, C]` = (scale; shift), bit for bit the CPU twin's under the launcher's and smaller row grids, and
/// the CPU twin bit for bit `relu_bwd_affine` followed by the plain op (NaN for NaN): NaN, ±0,
/// ±∞ and tiny values in both the gradient and BN's input, row 0 with an exactly zero
/// pre-activation. The accumulating form also against `bn_bwd_dx_accumulate_from_relu` (CPU).
fn bn_bwd_dx_relu_matches<T: El>(m: &Emulated, accumulate: bool) {
    let kernel = format!(
        "bn_bwd_dx{}_relu_{}",
        if accumulate { "_accumulate" } else { "" },
        T::SUFFIX
    );
    let (c, cols) = (4, 333);
    let gy = relu_values::<T>(c * cols, 170);
    let x = relu_values::<T>(c * cols, 171);
    let mut shift = values::<T::Acc>(c, 176);
    shift[0] = T::Acc::from_f64(0.0);
    let coef: Vec<T::Acc> = [72u64, 73, 74]
        .iter()
        .flat_map(|&seed| values::<T::Acc>(c, seed))
        .collect();
    let aff: Vec<T::Acc> = values::<T::Acc>(c, 175).into_iter().chain(shift).collect();
    let (gt, xt) = (tensor(&gy, (c, cols)), tensor(&x, (c, cols)));
    let (abc, affine) = (tensor(&coef, (3, c)), tensor(&aff, (2, c)));
    let masked = bn_backward::relu_bwd_affine(&gt, &xt, &affine).expect("mask");
    let dst0 = values::<T>(c * cols, 177);
    let (want, two_steps) = if accumulate {
        let dst = tensor(&dst0, (c, cols));
        bn_backward::bn_bwd_dx_accumulate_relu(&dst, &gt, &xt, &abc, &affine).expect("cpu fused");
        let two = tensor(&dst0, (c, cols));
        bn_backward::bn_bwd_dx_accumulate(&two, &masked, &xt, &abc).expect("cpu");
        let from = tensor(&dst0, (c, cols));
        let fresh = tensor(&vec![T::from_f64(5.0); c * cols], (c, cols));
        bn_backward::bn_bwd_dx_accumulate_from_relu(&fresh, &from, &gt, &xt, &abc, &affine)
            .expect("cpu from");
        assert_bitwise_nan(
            &format!("{kernel}: the CPU's accumulation from a source"),
            &host::<T>(&fresh),
            &host::<T>(&dst),
        );
        (host::<T>(&dst), host::<T>(&two))
    } else {
        (
            host::<T>(&bn_backward::bn_bwd_dx_relu(&gt, &xt, &abc, &affine).expect("cpu fused")),
            host::<T>(&bn_backward::bn_bwd_dx(&masked, &xt, &abc).expect("cpu")),
        )
    };
    assert_bitwise_nan(
        &format!("{kernel}: the CPU twin's two steps"),
        &want,
        &two_steps,
    );
    for geom in row_geometries(c, cols) {
        let mut out = if accumulate {
            dst0.clone()
        } else {
            vec![T::from_f64(7.0); c * cols]
        };
        launch_dx(
            m,
            &kernel,
            geom,
            accumulate,
            [&gy, &x],
            [&coef, &aff],
            &mut out,
        );
        assert_bitwise_nan(&format!("{kernel} {geom:?}"), &out, &want);
    }
}

/// Per-channel inputs of `bn_prepare` that are not random: `(mean, var, γ, β, running mean,
/// running var)`, `None` keeping the random value. Zero and negative-zero variance (invstd
/// 1/√eps), a tiny negative one (still above −eps), one below −eps (√ of a negative: NaN),
/// large and overflowing values (in f32 `mean·scale` is ∞ for the second), γ = ±0 and ∞,
/// NaN in the mean and in the running variance, ∞ in the running mean and the variance.
const PREPARE_SPECIALS: [[Option<f64>; 6]; 12] = [
    [None, Some(0.0), None, None, None, None],
    [None, Some(-0.0), None, None, None, None],
    [None, Some(-1e-30), None, None, None, None],
    [None, Some(-1.0), None, None, None, None],
    [Some(1e30), Some(1e30), None, None, None, None],
    [Some(3e38), Some(1.0), Some(1e10), None, None, None],
    [None, None, Some(0.0), None, None, None],
    [Some(0.0), None, Some(-0.0), Some(-0.0), None, None],
    [Some(f64::NAN), None, None, None, None, None],
    [None, None, None, None, None, Some(f64::NAN)],
    [
        None,
        Some(f64::INFINITY),
        None,
        None,
        Some(f64::INFINITY),
        None,
    ],
    [None, Some(0.0), Some(f64::INFINITY), None, None, None],
];

/// `bn_prepare`, BN forward's per-channel step: the table `[4, C]` = (mean; invstd; scale;
/// shift) and the running-stat update `[2, C]`, computed in `T` one channel per thread, must be
/// the bits of the CPU twin's (`bn::bn_prepare`), NaN for NaN ([`assert_bitwise_nan`]), both
/// outputs, under the launcher's 1-D geometry, one block and three (C = 1000 > 3·256, so each
/// thread of the small grids walks several channels), for two M (the running variance's
/// M/(M−1)), with [`PREPARE_SPECIALS`] planted at channels spread over the blocks. The kernel
/// writes the two outputs through two pointers into one `[6, C]` buffer, as the launcher does.
fn bn_prepare_matches<T: El>(m: &Emulated) {
    let kernel = format!("bn_prepare_{}", T::SUFFIX);
    let c = 1000;
    let mut cols: Vec<Vec<T>> = (0..6).map(|q| values::<T>(c, 110 + q)).collect();
    // variances are ≥ 0 but for the planted ones; the running variance too
    for q in [1, 5] {
        for v in cols[q].iter_mut() {
            *v = T::from_f64(v.to_f64().abs());
        }
    }
    for (i, special) in PREPARE_SPECIALS.iter().enumerate() {
        for (q, v) in special.iter().enumerate() {
            if let Some(v) = v {
                cols[q][i * 83] = T::from_f64(*v);
            }
        }
    }
    let [mean, var, gamma, beta, rmean, rvar] = [0, 1, 2, 3, 4, 5].map(|q| cols[q].clone());
    let mv: Vec<T> = mean.iter().chain(&var).copied().collect();
    for bn_m in [2usize, 517] {
        let (table, running) = bn::bn_prepare(
            &tensor(&mv, (2, c)),
            &vector(&gamma),
            &vector(&beta),
            &vector(&rmean),
            &vector(&rvar),
            bn_m,
        )
        .expect("cpu bn_prepare");
        let (table, running) = (host::<T>(&table), host::<T>(&running));
        assert_eq!(
            (table.len(), running.len()),
            (4 * c, 2 * c),
            "cpu bn_prepare shapes"
        );
        // the specials reach the outputs (else the NaN-tolerant comparison would prove little)
        for (what, v) in [("table", &table), ("running", &running)] {
            assert!(
                v.iter().any(|v| v.to_f64().is_nan()) && v.iter().any(|v| v.to_f64().is_infinite()),
                "cpu bn_prepare: the {what} has no NaN or no ∞ from the planted inputs"
            );
        }
        let scalars = prepare_scalars::<T>(bn_m);
        for geom in flat_geometries(c) {
            let mvp = mv.as_ptr().cast_mut().cast();
            let vectors = [&gamma, &beta, &rmean, &rvar].map(|v| &v[..]);
            let out = launch_prepare(m, &kernel, geom, mvp, vectors, None, scalars);
            let what = format!("{kernel} M = {bn_m} {geom:?}");
            assert_bitwise_nan(&format!("{what}: table"), &out[..4 * c], &table);
            assert_bitwise_nan(&format!("{what}: running stats"), &out[4 * c..], &running);
        }
    }
}

/// Half a bf16 ulp on [1, 2) (8 significant bits): added to a bf16 value there it makes an
/// exact tie of f32 → bf16 rounding.
const TIE_SHIFT: f64 = 1.0 / 256.0;

/// `affine_rows[_relu]` with planar `coef [2, C]` = (scale; shift) in `T::Acc`, bit for bit the
/// CPU twin's under the launcher's and smaller row grids, on inputs with NaN, ±0, tiny values
/// and ±∞.
fn affine_rows_match<T: El>(m: &Emulated, relu: bool) {
    let kernel = format!(
        "affine_rows{}_{}",
        if relu { "_relu" } else { "" },
        T::SUFFIX
    );
    let (c, cols) = (5, 300);
    let x = relu_values::<T>(c * cols, 60);
    let mut scale = values::<T::Acc>(c, 61);
    let mut shift = values::<T::Acc>(c, 62);
    // row 1 is x + 2⁻⁸: for bf16 x in ±[1, 2) half a bf16 ulp, an exact tie (to even), which
    // random coefficients almost never give
    (scale[1], shift[1]) = (T::Acc::from_f64(1.0), T::Acc::from_f64(TIE_SHIFT));
    let f = if relu {
        bn::affine_rows_relu
    } else {
        bn::affine_rows
    };
    let coef: Vec<T::Acc> = scale.iter().chain(&shift).copied().collect();
    let want = host::<T>(&f(&tensor(&x, (c, cols)), &tensor(&coef, (2, c))).expect("cpu affine"));
    // x contiguous, and as a column range of a wider map (row stride cols + 7, the extra
    // columns NaN, never to be read): the split front's chunks
    for pad in [0, 7] {
        let ld = cols + pad;
        let wide: Vec<T> = (0..c)
            .flat_map(|r| {
                x[r * cols..(r + 1) * cols]
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(T::from_f64(f64::NAN), pad))
            })
            .collect();
        affine_rows_launches(m, &kernel, (&wide, ld), &coef, (c, cols), &want, relu);
    }
    // the CPU twin on a strided view gives the same bits as on the contiguous map
    let wide = tensor(
        &(0..c)
            .flat_map(|r| {
                x[r * cols..(r + 1) * cols]
                    .iter()
                    .copied()
                    .chain([T::from_f64(0.0)])
            })
            .collect::<Vec<T>>(),
        (c, cols + 1),
    );
    let view = wide.narrow(1, 0, cols).expect("view");
    let got = host::<T>(&f(&view, &tensor(&coef, (2, c))).expect("cpu affine view"));
    let nan = |v: &T| v.to_f64().is_nan();
    let keep = |v: &[T]| -> Vec<T> { v.iter().copied().filter(|v| !nan(v)).collect() };
    assert_bitwise(&format!("{kernel} CPU view"), &keep(&got), &keep(&want));
}

/// Launches `kernel` on `x` (rows `ld` apart) under the launcher's and smaller row grids and
/// compares with `want` (NaN positions as NaN, the rest bit for bit).
fn affine_rows_launches<T: El>(
    m: &Emulated,
    kernel: &str,
    (x, ld): (&[T], usize),
    coef: &[T::Acc],
    (c, cols): (usize, usize),
    want: &[T],
    relu: bool,
) {
    for geom in row_geometries(c, cols) {
        let mut out = vec![T::from_f64(7.0); c * cols];
        let mut xp = x.as_ptr().cast_mut();
        let mut cp = coef.as_ptr().cast_mut();
        let (mut op, mut rows, mut mm) = (out.as_mut_ptr(), c as u64, cols as u64);
        let mut ldx = ld as u64;
        m.launch(
            kernel,
            geom,
            &mut [
                p(&mut xp),
                p(&mut ldx),
                p(&mut cp),
                p(&mut op),
                p(&mut rows),
                p(&mut mm),
            ],
            false,
        );
        // NaN inputs give NaN without ReLU: compare those as NaN, the rest bit for bit.
        let nan = |v: &T| v.to_f64().is_nan();
        assert!(
            out.iter().zip(want).all(|(a, b)| nan(a) == nan(b)),
            "{kernel}: NaN positions differ"
        );
        let keep = |v: &[T]| -> Vec<T> { v.iter().copied().filter(|v| !nan(v)).collect() };
        assert_bitwise(
            &format!("{kernel} {geom:?} ld {ld}"),
            &keep(&out),
            &keep(want),
        );
        if relu {
            assert!(!out.iter().any(nan), "{kernel}: ReLU let a NaN through");
        }
    }
}

/// `relu_bwd_affine[_inplace]`: the ReLU backward masked from BN's input and `(scale; shift)`,
/// bit for bit the CPU twin's (a fresh tensor, or the gradient masked in place) under the
/// launcher's and smaller row grids, on inputs with NaN, ±0, tiny values and ±∞ (x) and NaN
/// gradients (passed through where the mask is open).
fn relu_bwd_affine_matches<T: El>(m: &Emulated, inplace: bool) {
    let kernel = format!(
        "relu_bwd_affine{}_{}",
        if inplace { "_inplace" } else { "" },
        T::SUFFIX
    );
    let (c, cols) = (5, 300);
    let x = relu_values::<T>(c * cols, 63);
    let g = relu_values::<T>(c * cols, 64);
    let scale = values::<T::Acc>(c, 65);
    let mut shift = values::<T::Acc>(c, 66);
    // row 0 holds x = +0 and −0 (relu_values): with shift +0, v = ±0·scale + 0 is exactly
    // zero, where the mask must stay closed
    shift[0] = T::Acc::from_f64(0.0);
    let coef: Vec<T::Acc> = scale.iter().chain(&shift).copied().collect();
    let (gt, xt, ct) = (
        tensor(&g, (c, cols)),
        tensor(&x, (c, cols)),
        tensor(&coef, (2, c)),
    );
    let want =
        host::<T>(&bn_backward::relu_bwd_affine(&gt, &xt, &ct).expect("cpu relu bwd affine"));
    let want_inplace = host::<T>(
        &bn_backward::relu_bwd_affine_inplace(gt.copy().expect("copy"), &xt, &ct)
            .expect("cpu relu bwd affine inplace"),
    );
    assert_bitwise_nan(
        &format!("{kernel}: the CPU's two forms"),
        &want_inplace,
        &want,
    );
    for geom in row_geometries(c, cols) {
        let mut xp = x.as_ptr().cast_mut();
        let mut cp = coef.as_ptr().cast_mut();
        let (mut rows, mut mm) = (c as u64, cols as u64);
        let out = if inplace {
            let mut out = g.clone();
            let mut op = out.as_mut_ptr();
            m.launch(
                &kernel,
                geom,
                &mut [p(&mut op), p(&mut xp), p(&mut cp), p(&mut rows), p(&mut mm)],
                false,
            );
            out
        } else {
            let mut out = vec![T::from_f64(7.0); c * cols];
            let mut gp = g.as_ptr().cast_mut();
            let mut op = out.as_mut_ptr();
            m.launch(
                &kernel,
                geom,
                &mut [
                    p(&mut gp),
                    p(&mut xp),
                    p(&mut cp),
                    p(&mut op),
                    p(&mut rows),
                    p(&mut mm),
                ],
                false,
            );
            out
        };
        assert_bitwise_nan(&format!("{kernel} {geom:?}"), &out, &want);
    }
}

/// `bn_bwd_dx[_accumulate]` with planar `coef [3, C]` = (A; B; C) in `T::Acc`, bit for bit the CPU twin's
/// (the fresh tensor, or the destination updated in place) under the launcher's and smaller
/// row grids.
fn bn_bwd_dx_matches<T: El>(m: &Emulated, accumulate: bool) {
    let kernel = format!(
        "bn_bwd_dx{}_{}",
        if accumulate { "_accumulate" } else { "" },
        T::SUFFIX
    );
    let (c, cols) = (4, 333);
    let mut gy = values::<T>(c * cols, 70);
    let mut x = values::<T>(c * cols, 71);
    let (mut a, mut b, mut cc) = (
        values::<T::Acc>(c, 72),
        values::<T::Acc>(c, 73),
        values::<T::Acc>(c, 74),
    );
    // row 1 is gy + 2⁻⁸: exact ties for bf16 gy in ±[1, 2) (see `affine_rows_match`)
    (a[1], b[1], cc[1]) = (
        T::Acc::from_f64(1.0),
        T::Acc::from_f64(0.0),
        T::Acc::from_f64(TIE_SHIFT),
    );
    // row 2, element 0 (dst 0): A = 1, B = 2⁻⁸ + 2⁻¹⁶ + 2⁻³⁰, C = −1, gy = x = 1, where bf16
    // features' f32 arithmetic (2⁻⁸, a tie to even) and an f64 evaluation (2⁻⁸ + 2⁻¹⁵) round
    // apart (`bn_backward_takes_bf16_features_and_f32_tables` in bf16_kernels.rs)
    (a[2], b[2], cc[2]) = (
        T::Acc::from_f64(1.0),
        T::Acc::from_f64(2f64.powi(-8) + 2f64.powi(-16) + 2f64.powi(-30)),
        T::Acc::from_f64(-1.0),
    );
    (gy[2 * cols], x[2 * cols]) = (T::from_f64(1.0), T::from_f64(1.0));
    let mut dst0 = values::<T>(c * cols, 75);
    dst0[2 * cols] = T::from_f64(0.0);
    let coef: Vec<T::Acc> = a.iter().chain(&b).chain(&cc).copied().collect();
    let coef_t = tensor(&coef, (3, c));
    let want = if accumulate {
        let dst = tensor(&dst0, (c, cols));
        bn_backward::bn_bwd_dx_accumulate(
            &dst,
            &tensor(&gy, (c, cols)),
            &tensor(&x, (c, cols)),
            &coef_t,
        )
        .expect("cpu dx accumulate");
        host::<T>(&dst)
    } else {
        host::<T>(
            &bn_backward::bn_bwd_dx(&tensor(&gy, (c, cols)), &tensor(&x, (c, cols)), &coef_t)
                .expect("cpu dx"),
        )
    };
    for geom in row_geometries(c, cols) {
        let mut out = if accumulate {
            dst0.clone()
        } else {
            vec![T::from_f64(7.0); c * cols]
        };
        launch_dx(
            m,
            &kernel,
            geom,
            accumulate,
            [&gy, &x],
            [&coef, &[]],
            &mut out,
        );
        assert_bitwise(&format!("{kernel} {geom:?}"), &out, &want);
    }
}

/// The kernels' `db_taps`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Taps {
    oy: [i32; 9],
    ox: [i32; 9],
}

/// Tap offsets of the forward convolution (TAPS − 1) and of its flipped backward, in the
/// order the block lists them; non-square maps.
/// The convolution's taps forward and flipped, and offsets past the map's edges (the kernels
/// take any `i32` offset: a source outside the image reads as zero).
fn tap_sets() -> [[(isize, isize); 9]; 3] {
    let fwd = TAPS.map(|(dy, dx)| (dy as isize - 1, dx as isize - 1));
    let flipped = TAPS.map(|(dy, dx)| (1 - dy as isize, 1 - dx as isize));
    let far = [
        (-7, 0),
        (0, -9),
        (2, 3),
        (-1, -4),
        (0, 0),
        (5, -1),
        (-2, 8),
        (9, 9),
        (1, 2),
    ];
    [fwd, flipped, far]
}

fn taps(offsets: &[(isize, isize); 9]) -> Taps {
    Taps {
        oy: offsets.map(|(oy, _)| oy as i32),
        ox: offsets.map(|(_, ox)| ox as i32),
    }
}

const GRIDS: [Grid; 5] = [
    Grid { n: 2, h: 5, w: 7 },
    Grid { n: 1, h: 6, w: 3 },
    // W = 1 and H = 1 (division by one), and a map of several blocks' columns whose H·W and W
    // are no powers of two (shift.cu divides by multiplying with a magic number).
    Grid { n: 3, h: 4, w: 1 },
    Grid { n: 2, h: 1, w: 6 },
    Grid { n: 2, h: 17, w: 23 },
];

/// Row strides of the shift kernels' operands: contiguous, and column ranges of wider maps
/// (the extra columns of the input NaN, never to be read; those of the output never written).
const SHIFT_PADS: [(usize, usize); 2] = [(0, 0), (5, 3)];

fn shifts_match<T: El>(m: &Emulated) {
    let (stack_k, sum_k) = (
        format!("shift_stack_{}", T::SUFFIX),
        format!("shift_sum_{}", T::SUFFIX),
    );
    let c = 3;
    for (gi, grid) in GRIDS.into_iter().enumerate() {
        let cols = grid.n * grid.h * grid.w;
        for offsets in tap_sets() {
            let t = values::<T>(c * cols, 80 + gi as u64);
            let want = host::<T>(
                &shift::shift_stack(&tensor(&t, (c, cols)), grid, offsets).expect("cpu stack"),
            );
            let pp = values::<T>(9 * c * cols, 90 + gi as u64);
            let want_sum = host::<T>(
                &shift::shift_sum(&tensor(&pp, (9 * c, cols)), grid, offsets).expect("cpu sum"),
            );
            // the stack [C, M] → [9C, M], the sum [9C, M] → [C, M]
            shift_launches_match(m, &stack_k, (&t, c), (9 * c, &want), grid, &offsets);
            shift_launches_match(m, &sum_k, (&pp, 9 * c), (c, &want_sum), grid, &offsets);
        }
    }
}

/// Launches the shift `kernel` (`(input, ld_in, output, ld_out, C, M, H, W, taps)`, C = 3) on
/// `input` (`in_rows` rows of the grid's columns, type `S`) into `rows` rows of `T`, under
/// every row stride of [`SHIFT_PADS`] (the input's extra columns NaN, never to be read) and the
/// launcher's and smaller row grids: the view bit for `want`, the columns outside it untouched.
fn shift_launches_match<S: El, T: El>(
    m: &Emulated,
    kernel: &str,
    (input, in_rows): (&[S], usize),
    (rows, want): (usize, &[T]),
    grid: Grid,
    offsets: &[(isize, isize); 9],
) {
    let (c, cols) = (3, grid.n * grid.h * grid.w);
    let untouched = T::from_f64(7.0);
    let mut tp = taps(offsets);
    let (mut cc, mut mm) = (c as u64, cols as u64);
    let (mut h, mut w) = (grid.h as u64, grid.w as u64);
    for (pad_in, pad_out) in SHIFT_PADS {
        let (ld_in, ld_out) = (cols + pad_in, cols + pad_out);
        let wide: Vec<S> = (0..in_rows)
            .flat_map(|r| {
                input[r * cols..(r + 1) * cols]
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(S::from_f64(f64::NAN), pad_in))
            })
            .collect();
        // Both kernels walk the C channel rows in y (the launcher's geometry).
        for geom in row_geometries(c, cols) {
            let mut out = vec![untouched; rows * ld_out];
            let (mut ip, mut op) = (wide.as_ptr().cast_mut(), out.as_mut_ptr());
            let (mut li, mut lo) = (ld_in as u64, ld_out as u64);
            m.launch(
                kernel,
                geom,
                &mut [
                    p(&mut ip),
                    p(&mut li),
                    p(&mut op),
                    p(&mut lo),
                    p(&mut cc),
                    p(&mut mm),
                    p(&mut h),
                    p(&mut w),
                    p(&mut tp),
                ],
                false,
            );
            let what = format!("{kernel} {grid:?} {geom:?} ld {ld_in}/{ld_out}");
            let view: Vec<T> = (0..rows)
                .flat_map(|r| out[r * ld_out..r * ld_out + cols].to_vec())
                .collect();
            assert_bitwise(&what, &view, want);
            let pads: Vec<T> = (0..rows)
                .flat_map(|r| out[r * ld_out + cols..(r + 1) * ld_out].to_vec())
                .collect();
            assert_bitwise(
                &format!("{what}: columns outside the view"),
                &pads,
                &vec![untouched; pads.len()],
            );
        }
    }
}

/// `shift_sum_wide_bf16` (f32 tap products of a bf16 convolution into bf16 features), bit for
/// bit the CPU's mixed shift sum ([`shift::shift_sum_into`] of f32 into bf16: the f32 sum
/// rounded once), on every grid and tap set, row-strided operands, capped grids.
fn shift_sum_wide_matches(m: &Emulated) {
    let c = 3;
    for (gi, grid) in GRIDS.into_iter().enumerate() {
        let cols = grid.n * grid.h * grid.w;
        for offsets in tap_sets() {
            let pp = values::<f32>(9 * c * cols, 190 + gi as u64);
            let dst =
                Tensor::zeros((c, cols), candle_core::DType::BF16, &Device::Cpu).expect("zeros");
            shift::shift_sum_into(&dst, &tensor(&pp, (9 * c, cols)), grid, offsets)
                .expect("cpu sum of f32 into bf16");
            let want = host::<bf16>(&dst);
            let k = "shift_sum_wide_bf16";
            shift_launches_match(m, k, (&pp, 9 * c), (c, &want), grid, &offsets);
        }
    }
}

fn inplace_kernels_match<T: El>(m: &Emulated) {
    let n = 1000;
    let x = relu_values::<T>(n, 100);
    let g = values::<T>(n, 101);
    let relu = host::<T>(&elementwise::relu_inplace(tensor(&x, (1, n))).expect("cpu relu"));
    let relu_bwd =
        host::<T>(&elementwise::relu_bwd(&tensor(&g, (1, n)), &tensor(&x, (1, n))).expect("bwd"));
    let relu_bwd_in = host::<T>(
        &elementwise::relu_bwd_inplace(tensor(&g, (1, n)), &tensor(&x, (1, n))).expect("bwd in"),
    );
    let dst = tensor(&g, (1, n));
    let src = values::<T>(n, 102);
    elementwise::add_assign(&dst, &tensor(&src, (1, n))).expect("cpu add_assign");
    let added = host::<T>(&dst);
    let mut nn = n as u64;
    for geom in flat_geometries(n) {
        let s = T::SUFFIX;
        let mut out = x.clone();
        let mut op = out.as_mut_ptr();
        m.launch(
            &format!("relu_inplace_{s}"),
            geom,
            &mut [p(&mut op), p(&mut nn)],
            false,
        );
        assert_bitwise(&format!("relu_inplace_{s} {geom:?}"), &out, &relu);

        let mut out = vec![T::from_f64(7.0); n];
        let (mut op, mut gp, mut xp) = (
            out.as_mut_ptr(),
            g.as_ptr().cast_mut(),
            x.as_ptr().cast_mut(),
        );
        m.launch(
            &format!("relu_bwd_{s}"),
            geom,
            &mut [p(&mut op), p(&mut gp), p(&mut xp), p(&mut nn)],
            false,
        );
        assert_bitwise(&format!("relu_bwd_{s} {geom:?}"), &out, &relu_bwd);

        let mut out = g.clone();
        let (mut op, mut xp) = (out.as_mut_ptr(), x.as_ptr().cast_mut());
        m.launch(
            &format!("relu_bwd_inplace_{s}"),
            geom,
            &mut [p(&mut op), p(&mut xp), p(&mut nn)],
            false,
        );
        assert_bitwise(
            &format!("relu_bwd_inplace_{s} {geom:?}"),
            &out,
            &relu_bwd_in,
        );

        let mut out = g.clone();
        let (mut op, mut sp) = (out.as_mut_ptr(), src.as_ptr().cast_mut());
        m.launch(
            &format!("add_assign_{s}"),
            geom,
            &mut [p(&mut op), p(&mut sp), p(&mut nn)],
            false,
        );
        assert_bitwise(&format!("add_assign_{s} {geom:?}"), &out, &added);
    }
}

/// Every entry point of `bn.cu` (statistics, the forward per-channel step and the two fused,
/// apply with and
/// without ReLU, the ReLU backward masked from BN's input, backward reduction with its
/// coefficients, dx fresh and accumulated), f32, f64 and bf16 features (the per-channel step
/// is tables only: f32 and f64), against its CPU twin in `impls::ops::bn`: the GPU path of
/// every BN layer runs these.
#[test]
fn bn_kernels_match_their_cpu_twins_on_the_host() {
    let m = Emulated::build(&src::BN);
    bn_stats_matches::<f32>(&m);
    bn_stats_matches::<f64>(&m);
    bn_stats_matches::<bf16>(&m);
    bn_prepare_matches::<f32>(&m);
    bn_prepare_matches::<f64>(&m);
    bn_stats_prepare_matches::<f32>(&m);
    bn_stats_prepare_matches::<f64>(&m);
    bn_stats_prepare_matches::<bf16>(&m);
    bn_bwd_reduce_matches::<f32>(&m);
    bn_bwd_reduce_matches::<f64>(&m);
    bn_bwd_reduce_matches::<bf16>(&m);
    for relu in [false, true] {
        affine_rows_match::<f32>(&m, relu);
        affine_rows_match::<f64>(&m, relu);
        affine_rows_match::<bf16>(&m, relu);
    }
    for accumulate in [false, true] {
        bn_bwd_dx_matches::<f32>(&m, accumulate);
        bn_bwd_dx_matches::<f64>(&m, accumulate);
        bn_bwd_dx_matches::<bf16>(&m, accumulate);
    }
    for inplace in [false, true] {
        relu_bwd_affine_matches::<f32>(&m, inplace);
        relu_bwd_affine_matches::<f64>(&m, inplace);
        relu_bwd_affine_matches::<bf16>(&m, inplace);
    }
}

/// The kernels of BN's backward with the backward of the ReLU after BN fused in
/// (`bn_bwd_reduce_relu`, `bn_bwd_dx_relu`, `bn_bwd_dx_accumulate_relu`), f32, f64 and bf16:
/// bitwise the mask followed by the plain kernels, on the emulated GPU and on the CPU.
#[test]
fn fused_relu_bn_backward_kernels_are_the_two_steps_on_the_host() {
    let m = Emulated::build(&src::BN);
    bn_bwd_reduce_relu_matches::<f32>(&m);
    bn_bwd_reduce_relu_matches::<f64>(&m);
    bn_bwd_reduce_relu_matches::<bf16>(&m);
    for accumulate in [false, true] {
        bn_bwd_dx_relu_matches::<f32>(&m, accumulate);
        bn_bwd_dx_relu_matches::<f64>(&m, accumulate);
        bn_bwd_dx_relu_matches::<bf16>(&m, accumulate);
    }
}

/// `shift_stack` and `shift_sum` of `shift.cu` (the 3×3 convolution's shifted views), f32,
/// f64 and bf16, and `shift_sum_wide_bf16` (f32 products into bf16), bit for bit their CPU
/// twins on non-square grids, forward, flipped and far taps.
#[test]
fn shift_kernels_match_their_cpu_twins_on_the_host() {
    let m = Emulated::build(&src::SHIFT);
    shifts_match::<f32>(&m);
    shifts_match::<f64>(&m);
    shifts_match::<bf16>(&m);
    shift_sum_wide_matches(&m);
}

/// The same through the shift kernels' 64-bit locator, which a GPU takes only for maps of 2³¹
/// columns or more (too large to emulate): the module built with `DB_NARROW_COLUMNS=0`.
#[test]
fn shift_kernels_wide_locator_matches_too() {
    let m = Emulated::build_with(&src::SHIFT, &["DB_NARROW_COLUMNS=0"], "");
    shifts_match::<f32>(&m);
    shifts_match::<f64>(&m);
    shifts_match::<bf16>(&m);
    shift_sum_wide_matches(&m);
}

/// Each emulated module has its own launch geometry: a launch in one leaves `gridDim` and
/// `blockDim` of another as they were. (`inline` globals in the shim were one object for the
/// whole process, so the tests of this binary, which run at once, raced on them and a launch
/// could run on another's grid: a flaky unwritten column in CI.)
#[test]
fn emulated_modules_do_not_share_their_launch_state() {
    let probe = "extern \"C\" unsigned emu_geometry() { return gridDim.x * 1000 + blockDim.x; }\n";
    let a = Emulated::build_with(&src::SHIFT, &[], probe);
    let b = Emulated::build_with(&src::SHIFT, &["DB_NARROW_COLUMNS=0"], probe);
    let geometry = |m: &Emulated| {
        // SAFETY: `emu_geometry` is the probe just compiled with exactly this signature.
        let f: Symbol<unsafe extern "C" fn() -> u32> =
            unsafe { m.lib.get(b"emu_geometry\0") }.expect("emu_geometry");
        // SAFETY: reads two globals of the module.
        unsafe { f() }
    };
    assert_eq!(
        (geometry(&a), geometry(&b)),
        (1001, 1001),
        "before any launch"
    );
    // A sum of no columns: the kernel returns at once, the geometry stays set.
    let mut tp = taps(&tap_sets()[0]);
    let (mut input, mut output) = ([0f32; 9], [0f32; 1]);
    let (mut src, mut dst) = (input.as_mut_ptr(), output.as_mut_ptr());
    let (mut ld_in, mut ld_out, mut c, mut m, mut h, mut w) = (1u64, 1u64, 1u64, 0u64, 1u64, 1u64);
    a.launch(
        "shift_sum_f32",
        ((7, 1, 1), (3, 1, 1)),
        &mut [
            p(&mut src),
            p(&mut ld_in),
            p(&mut dst),
            p(&mut ld_out),
            p(&mut c),
            p(&mut m),
            p(&mut h),
            p(&mut w),
            p(&mut tp),
        ],
        false,
    );
    assert_eq!(geometry(&a), 7003, "the launched module");
    assert_eq!(geometry(&b), 1001, "the other module");
}

/// `shift.cu`'s division by a magic number is exact: every n < 2³¹ it can be given (a column,
/// or a column's offset in its image) divided by every divisor d < 2³¹ (H·W or W), checked
/// against integer division on divisors 1…2¹² with the numerators around their multiples and
/// on ten thousand random divisors up to 2³¹ − 1 with numerators at both ends and around
/// multiples of d.
#[test]
fn shift_magic_division_is_exact() {
    let m = Emulated::build_with(
        &src::SHIFT,
        &[],
        "extern \"C\" unsigned emu_quotient(unsigned n, unsigned d) {\n\
             return db_quotient(n, db_make_divider(d));\n}\n",
    );
    // SAFETY: `emu_quotient` is the probe just compiled with exactly this signature.
    let quotient: Symbol<unsafe extern "C" fn(u32, u32) -> u32> =
        unsafe { m.lib.get(b"emu_quotient\0") }.expect("emu_quotient");
    const MAX: u32 = (1 << 31) - 1;
    let mut checked = 0u64;
    let mut check = |n: u32, d: u32| {
        if n > MAX {
            return;
        }
        // SAFETY: a pure function of two integers.
        let q = unsafe { quotient(n, d) };
        assert_eq!(q, n / d, "{n} / {d}");
        checked += 1;
    };
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    for d in 1..=4096u32 {
        for n in 0..=3 * d {
            check(n, d);
        }
        for k in [1000u32, 65_536, 1 << 20, MAX / d] {
            let base = k.saturating_mul(d);
            for n in [base.saturating_sub(1), base, base.saturating_add(1), MAX] {
                check(n, d);
            }
        }
    }
    for _ in 0..10_000 {
        let d = (next() % u64::from(MAX)) as u32 + 1;
        let k = (next() % (u64::from(MAX / d) + 1)) as u32;
        let base = k * d;
        for n in [
            0,
            1,
            d - 1,
            d,
            base.saturating_sub(1),
            base,
            base.saturating_add(1),
            MAX,
        ] {
            check(n, d);
        }
        check((next() % (u64::from(MAX) + 1)) as u32, d);
    }
    assert!(checked > 25_000_000, "{checked} divisions checked");
}

/// The in-place element-wise kernels of `inplace.cu` (ReLU, its backward, `add_assign`), f32,
/// f64 and bf16, bit for bit `impls::ops::elementwise` under the launcher's and smaller flat
/// grids.
#[test]
fn inplace_kernels_match_their_cpu_twins_on_the_host() {
    let m = Emulated::build(&src::INPLACE);
    inplace_kernels_match::<f32>(&m);
    inplace_kernels_match::<f64>(&m);
    inplace_kernels_match::<bf16>(&m);
}

/// The kernels' bf16 conversions (`db_widen`, `db_narrow<db_bf16>` in `prelude.cuh`) are the
/// CPU twins' (`half::bf16::to_f32`, `from_f32`) bit for bit: every bf16 widened, and every
/// bf16 as the high half of an f32 with low halves at and around the rounding midpoint
/// (0x8000: ties to even, up or down by the kept half's last bit), the extremes and a few
/// random ones, so ties, carries into the exponent, overflow to ∞, subnormals and NaN
/// (signalling ones whose payload is only in the low half included) are all narrowed.
#[test]
fn bf16_conversions_match_the_cpu() {
    let m = Emulated::build_with(
        &src::INPLACE,
        &[],
        "extern \"C\" unsigned short emu_narrow(float v) { return db_narrow<db_bf16>(v).bits; }\n\
         extern \"C\" float emu_widen(unsigned short b) { return db_widen(db_bf16{b}); }\n",
    );
    // SAFETY: the probes just compiled with exactly these signatures; pure functions.
    let narrow: Symbol<unsafe extern "C" fn(f32) -> u16> =
        unsafe { m.lib.get(b"emu_narrow\0") }.expect("emu_narrow");
    // SAFETY: as above.
    let widen: Symbol<unsafe extern "C" fn(u16) -> f32> =
        unsafe { m.lib.get(b"emu_widen\0") }.expect("emu_widen");
    let (mut ties, mut nans, mut checked) = (0u32, 0u32, 0u32);
    let mut s = 0x9E37_79B9u32;
    for hi in 0..=u16::MAX {
        // SAFETY: a pure function of its argument.
        let w = unsafe { widen(hi) };
        let want = bf16::from_bits(hi).to_f32();
        assert_eq!(w.to_bits(), want.to_bits(), "widen {hi:#06x}");
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        const TIE: u32 = 0x8000;
        for (k, lo) in [0u32, 1, 0x7FFF, TIE, 0x8001, 0xFFFF, s & 0xFFFF]
            .into_iter()
            .enumerate()
        {
            let v = f32::from_bits((u32::from(hi) << 16) | lo);
            // SAFETY: as above.
            let got = unsafe { narrow(v) };
            let want = bf16::from_f32(v).to_bits();
            assert_eq!(got, want, "narrow {:#010x}", v.to_bits());
            // (the fixed midpoint only: the random low half may be one too)
            ties += u32::from(k == 3 && !v.is_nan());
            nans += u32::from(v.is_nan());
            checked += 1;
        }
    }
    // every high half took every fixed low half: 2¹⁶ ties (half of them rounding up), and the
    // NaN patterns of both signs
    assert_eq!((checked, ties), (7 << 16, (1 << 16) - 2 * 128), "patterns");
    assert!(nans > 2 * 7 * 127, "{nans} NaN patterns");
}

// ---- the direct 3×3 convolution (conv.cu) ------------------------------------------------------

/// Fused multiply-add in the kernels' accumulator type (one rounding, as `__fmaf_rn` /
/// `__fma_rn` and the shim's `std::fma`).
trait Fma: El {
    fn fma(a: Self, b: Self, c: Self) -> Self;
}
impl Fma for f32 {
    fn fma(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}
impl Fma for f64 {
    fn fma(a: f64, b: f64, c: f64) -> f64 {
        a.mul_add(b, c)
    }
}

/// A feature widened to the accumulator type (exact).
fn widen<T: El>(v: T) -> T::Acc {
    <T::Acc as WithDType>::from_f64(v.to_f64())
}

/// `db_conv_weight` of conv.cu.
#[repr(C)]
#[derive(Clone, Copy)]
struct WeightLayout {
    out: i64,
    inp: i64,
    step: i64,
    first: i64,
}

/// Maps and channel counts of the convolution checks: partial tiles in both directions (H not
/// a multiple of 8, W of 32), several input-channel chunks of 8 (20 in, or 20 out for the
/// data gradient), output-channel groups that do not fill a block, weight-gradient units in
/// several bands of rows (H > 4, a short last band) and segments of a row (W > 32), channel
/// groups in both directions (B > 8, k > 16), the degenerate 1×1 image, and more outputs than a
/// tensor-core block takes (k = 40 > 32: two forward groups, three weight-gradient output
/// groups of 16; the data gradient then has 40 inputs, three chunks of 16 bf16 channels).
const CONV_CASES: [(Grid, usize, usize); 5] = [
    (Grid { n: 2, h: 11, w: 37 }, 20, 6),
    (Grid { n: 1, h: 3, w: 5 }, 3, 18),
    (Grid { n: 3, h: 1, w: 1 }, 9, 4),
    (Grid { n: 2, h: 9, w: 8 }, 17, 5),
    (Grid { n: 1, h: 5, w: 6 }, 3, 40),
];

/// `db_conv_weight` of a forward (`data` false: `(9B, 9, 1, 0)`) or data-gradient pass (the
/// weight read transposed and flipped: `(9, 9B, −1, 8)`) of a convolution from `b` channels.
fn conv_layout(data: bool, b: usize) -> WeightLayout {
    if data {
        WeightLayout {
            out: 9,
            inp: 9 * b as i64,
            step: -1,
            first: 8,
        }
    } else {
        WeightLayout {
            out: 9 * b as i64,
            inp: 9,
            step: 1,
            first: 0,
        }
    }
}

/// Runs `kernel` (`conv3x3_*` or `conv3x3_mma_*`: the same parameters) of `x` [cin, M] into a
/// new `[cout, M]` (filled with 7 first) with weight `w` read through `layout`, under `geom`.
#[allow(clippy::too_many_arguments)]
fn launch_conv<T: El>(
    m: &Emulated,
    kernel: &str,
    geom: (Dim, Dim),
    x: &[T],
    (cin, cout): (usize, usize),
    w: &[T],
    layout: WeightLayout,
    g: Grid,
) -> Vec<T> {
    let mut out = vec![T::from_f64(7.0); cout * g.n * g.h * g.w];
    let (mut xp, mut op, mut wp) = (
        x.as_ptr().cast_mut(),
        out.as_mut_ptr(),
        w.as_ptr().cast_mut(),
    );
    let (mut ci, mut co, mut lay) = (cin as u64, cout as u64, layout);
    let (mut nn, mut hh, mut ww) = (g.n as u64, g.h as u64, g.w as u64);
    m.launch(
        kernel,
        geom,
        &mut [
            p(&mut xp),
            p(&mut ci),
            p(&mut op),
            p(&mut co),
            p(&mut wp),
            p(&mut lay),
            p(&mut nn),
            p(&mut hh),
            p(&mut ww),
        ],
        true,
    );
    out
}

/// Runs `kernel` (`conv3x3_wgrad_*` or `conv3x3_wgrad_mma_*`) of `gy` [k, M] and `s` [B, M]
/// into new partials (filled with NaN first; the slices of `gpu::weight_slices`), then
/// `sum` of them into a new `dW` (filled with 7 first) under `sum_geom`.
#[allow(clippy::too_many_arguments)]
fn launch_wgrad<T: El, A: El>(
    m: &Emulated,
    (kernel, geom): (&str, (Dim, Dim)),
    (sum, sum_geom): (&str, (Dim, Dim)),
    gy: &[T],
    s: &[T],
    (b, k): (usize, usize),
    g: Grid,
) -> Vec<A> {
    let sl = gpu::weight_slices(g, b, k);
    let len = 9 * k * b;
    let mut part = vec![A::from_f64(f64::NAN); (sl.slices * len).max(1)];
    let (mut gp, mut sp, mut pp) = (
        gy.as_ptr().cast_mut(),
        s.as_ptr().cast_mut(),
        part.as_mut_ptr(),
    );
    let (mut bb, mut kk, mut ps) = (b as u64, k as u64, sl.per_slice as u64);
    let (mut nn, mut hh, mut ww) = (g.n as u64, g.h as u64, g.w as u64);
    m.launch(
        kernel,
        geom,
        &mut [
            p(&mut gp),
            p(&mut sp),
            p(&mut pp),
            p(&mut bb),
            p(&mut kk),
            p(&mut nn),
            p(&mut hh),
            p(&mut ww),
            p(&mut ps),
        ],
        true,
    );
    let mut dw = vec![A::from_f64(7.0); len];
    let (mut pp, mut dp) = (part.as_mut_ptr(), dw.as_mut_ptr());
    let (mut slices, mut ln) = (sl.slices as u64, len as u64);
    m.launch(
        sum,
        sum_geom,
        &mut [p(&mut pp), p(&mut dp), p(&mut slices), p(&mut ln)],
        false,
    );
    dw
}

/// The kernel's sum for output (o, pixel): over c, then dy, then dx, `fma(w(o, c, tap), x, acc)`
/// from +0 in the accumulator type, a tap outside the image reading 0, rounded once to `T`.
fn conv_restated<T: El>(
    x: &[T],
    cin: usize,
    cout: usize,
    w: impl Fn(usize, usize, usize) -> T,
    g: Grid,
) -> Vec<T>
where
    T::Acc: Fma,
{
    let (plane, m) = (g.h * g.w, g.n * g.h * g.w);
    let mut out = Vec::with_capacity(cout * m);
    for o in 0..cout {
        for p in 0..m {
            let (img, y, xx) = (p / plane, (p % plane) / g.w, p % g.w);
            let mut acc = <T::Acc as WithDType>::from_f64(0.0);
            for c in 0..cin {
                for dy in 0..3 {
                    for dx in 0..3 {
                        let (yy, x2) = ((y + dy) as isize - 1, (xx + dx) as isize - 1);
                        let inside = yy >= 0 && yy < g.h as isize && x2 >= 0 && x2 < g.w as isize;
                        let v = if inside {
                            widen(x[c * m + img * plane + yy as usize * g.w + x2 as usize])
                        } else {
                            <T::Acc as WithDType>::from_f64(0.0)
                        };
                        acc = Fma::fma(widen(w(o, c, 3 * dy + dx)), v, acc);
                    }
                }
            }
            out.push(narrow::<T>(acc.to_f64()));
        }
    }
    out
}

/// An accumulator's value (f32 for bf16 features) rounded once to `T` as the kernels'
/// `db_narrow` does: for bf16 from the f32 to nearest even through `half`'s `from_f32` — its
/// `from_f64` rounds some values just past a tie the wrong way (half 2.7.1: −17.562504 to
/// −17.5), which a restated sum must not inherit.
fn narrow<T: El>(v: f64) -> T {
    if T::SUFFIX == "bf16" {
        T::from_f64(bf16::from_f32(v as f32).to_f64())
    } else {
        T::from_f64(v)
    }
}

/// The weight gradient's partials and their sum, restated: slice `s` sums its units (4 rows of
/// one image, 32 columns of them) in order, a unit's rows in order and a row's columns in
/// order, `fma(gy, s_shifted, acc)` from +0; `dW` adds the slices' partials in order from +0.
fn wgrad_restated<T: El>(gy: &[T], s: &[T], b: usize, k: usize, g: Grid) -> Vec<T::Acc>
where
    T::Acc: Fma,
{
    let (plane, m) = (g.h * g.w, g.n * g.h * g.w);
    let sl = gpu::weight_slices(g, b, k);
    let (segs, bands) = (g.w.div_ceil(gpu::WGRAD_SEG), g.h.div_ceil(gpu::WGRAD_ROWS));
    let zero = <T::Acc as WithDType>::from_f64(0.0);
    let mut dw = vec![zero; 9 * k * b];
    for slice in 0..sl.slices {
        let units = slice * sl.per_slice..((slice + 1) * sl.per_slice).min(sl.units);
        for o in 0..k {
            for c in 0..b {
                let mut acc = [zero; 9];
                for u in units.clone() {
                    let img = u / (bands * segs);
                    let y0 = ((u / segs) % bands) * gpu::WGRAD_ROWS;
                    let x0 = (u % segs) * gpu::WGRAD_SEG;
                    for (y, xx) in (y0..(y0 + gpu::WGRAD_ROWS).min(g.h))
                        .flat_map(|y| (x0..(x0 + gpu::WGRAD_SEG).min(g.w)).map(move |xx| (y, xx)))
                    {
                        let gv = widen(gy[o * m + img * plane + y * g.w + xx]);
                        for dy in 0..3 {
                            for dx in 0..3 {
                                let (yy, x2) = ((y + dy) as isize - 1, (xx + dx) as isize - 1);
                                let inside =
                                    yy >= 0 && yy < g.h as isize && x2 >= 0 && x2 < g.w as isize;
                                let sv = if inside {
                                    widen(s[c * m + img * plane + yy as usize * g.w + x2 as usize])
                                } else {
                                    zero
                                };
                                let j = 3 * dy + dx;
                                acc[j] = Fma::fma(gv, sv, acc[j]);
                            }
                        }
                    }
                }
                for (j, a) in acc.into_iter().enumerate() {
                    let i = (o * b + c) * 9 + j;
                    // dW[i] += partial (the sum kernel's db_add, in the accumulator type)
                    dw[i] = add_acc::<T>(dw[i], a);
                }
            }
        }
    }
    dw
}

/// `a + b` in the accumulator type (one rounding).
fn add_acc<T: El>(a: T::Acc, b: T::Acc) -> T::Acc
where
    T::Acc: Fma,
{
    // a·1 + b with one rounding is the plain sum
    Fma::fma(a, <T::Acc as WithDType>::from_f64(1.0), b)
}

/// `got` within `n_terms · ε · Σ|terms|` (plus half an ulp of `T` for a rounded output) of the
/// f64 convolution `want` whose absolute terms sum to `abs`: the kernel and the CPU twin agree
/// as two summation orders of the same convolution (orientation, flip and layout included).
fn conv_close<T: El>(what: &str, got: &[T], want: &[f64], abs: &[f64], n_terms: usize, ulp: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for i in 0..got.len() {
        let tol = n_terms as f64 * ulp * abs[i] + T::ULP * want[i].abs() + 1e-300;
        let d = (got[i].to_f64() - want[i]).abs();
        assert!(
            d <= tol,
            "{what}: element {i} is {} on the emulated GPU, {} in f64 on the CPU (|Δ| {d:e} > {tol:e})",
            got[i].to_f64(),
            want[i]
        );
    }
}

fn to_f64_tensor<T: El>(v: &[T], shape: &[usize], abs: bool) -> Tensor {
    let v: Vec<f64> = v
        .iter()
        .map(|x| if abs { x.to_f64().abs() } else { x.to_f64() })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).expect("f64 tensor")
}

/// `conv3x3_{T}` (forward, and the data gradient through the transposed, flipped weight view),
/// `conv3x3_wgrad_{T}` and `conv3x3_wgrad_sum` on every case of [`CONV_CASES`], under the
/// launcher's geometry (`impls::ops::conv3x3::gpu`) and under one-block grids (the tile and
/// group loops then stride): bit for bit the kernel's order restated on the host, and within a
/// summation-order bound of the CPU's convolution in f64.
fn conv_kernels_match<T: El>(m: &Emulated)
where
    T::Acc: Fma,
{
    for (ci, (g, b, k)) in CONV_CASES.into_iter().enumerate() {
        let cols = g.n * g.h * g.w;
        let seed = 300 + 10 * ci as u64;
        let s = values::<T>(b * cols, seed);
        let w = values::<T>(9 * k * b, seed + 1);
        let gy = values::<T>(k * cols, seed + 2);
        let f64w = |v: &[T], shape: &[usize]| to_f64_tensor(v, shape, false);
        let absw = |v: &[T], shape: &[usize]| to_f64_tensor(v, shape, true);
        let flat = |t: Tensor| host::<f64>(&t);
        // forward: s [B, M] → y [k, M]; data: gy [k, M] → ds [B, M]
        for data in [false, true] {
            let (x, cin, cout) = if data { (&gy, k, b) } else { (&s, b, k) };
            let want = if data {
                conv_restated(x, cin, cout, |o, c, j| w[(c * b + o) * 9 + 8 - j], g)
            } else {
                conv_restated(x, cin, cout, |o, c, j| w[(o * b + c) * 9 + j], g)
            };
            let (x64, xa) = (f64w(x, &[cin, cols]), absw(x, &[cin, cols]));
            let (w64, wa) = (f64w(&w, &[k, b, 3, 3]), absw(&w, &[k, b, 3, 3]));
            let (cpu, abs) = if data {
                (
                    conv3x3::backward_data(&x64, &w64, g),
                    conv3x3::backward_data(&xa, &wa, g),
                )
            } else {
                (
                    conv3x3::forward(&x64, &w64, g),
                    conv3x3::forward(&xa, &wa, g),
                )
            };
            let (cpu, abs) = (flat(cpu.expect("cpu conv")), flat(abs.expect("cpu |conv|")));
            let kernel = format!("conv3x3_{}", T::SUFFIX);
            let (gd, bd) = gpu::conv_dims(g, cout);
            let pass = if data { "data" } else { "forward" };
            for geom in [(gd, bd), ((1, 1, 1), bd)] {
                let layout = conv_layout(data, b);
                let out = launch_conv(m, &kernel, geom, x, (cin, cout), &w, layout, g);
                let what = format!("{kernel} {pass} {g:?} B={b} k={k} {geom:?}");
                assert_bitwise(&what, &out, &want);
                conv_close(&what, &out, &cpu, &abs, 9 * cin, <T::Acc as El>::ULP);
            }
        }
        // weight gradient: (gy [k, M], s [B, M]) → partials → dW [k, B, 3, 3]
        let want = wgrad_restated::<T>(&gy, &s, b, k, g);
        let cpu = conv3x3::backward_weight(&f64w(&gy, &[k, cols]), &f64w(&s, &[b, cols]), g);
        let abs = conv3x3::backward_weight(&absw(&gy, &[k, cols]), &absw(&s, &[b, cols]), g);
        let (cpu, abs) = (flat(cpu.expect("cpu dW")), flat(abs.expect("cpu |dW|")));
        let len = 9 * k * b;
        let (gd, bd) = gpu::wgrad_dims(g, b, k);
        let kernel = format!("conv3x3_wgrad_{}", T::SUFFIX);
        let sum = format!("conv3x3_wgrad_sum_{}", <T::Acc as El>::SUFFIX);
        for geom in [(gd, bd), ((1, 1, 1), bd), ((2, 1, 2), bd)] {
            for sgeom in [gpu::sum_dims(len), ((1, 1, 1), (32, 1, 1))] {
                let dw: Vec<T::Acc> =
                    launch_wgrad(m, (&kernel, geom), (&sum, sgeom), &gy, &s, (b, k), g);
                let what = format!("{kernel} + {sum} {g:?} B={b} k={k} {geom:?} {sgeom:?}");
                assert_bitwise(&what, &dw, &want);
                conv_close(&what, &dw, &cpu, &abs, cols, <T::Acc as El>::ULP);
            }
        }
    }
}

/// `conv.cu` (the GPU's direct 3×3 convolution, `DENSEBENCH_CONV=direct`): forward, data
/// gradient and weight gradient, f32, f64 and bf16 features, on the host.
#[test]
fn conv_kernels_match_their_restated_order_and_the_cpu_convolution() {
    let m = Emulated::build(&src::CONV);
    conv_kernels_match::<f32>(&m);
    conv_kernels_match::<f64>(&m);
    conv_kernels_match::<bf16>(&m);
}

// ---- the tensor-core 3×3 convolution (conv.cu's conv3x3_mma) -----------------------------------

/// A feature as the tensor core's operand: f32 rounded to TF32 (to nearest, ties away: the
/// CPU's `round_tf32` with [`elementwise::Tf32Rounding::Nearest`], what `cvt.rna` makes), bf16
/// widened (exact).
fn mma_operand<T: El>(v: &[T]) -> Vec<f32> {
    let wide: Vec<f32> = v.iter().map(|x| x.to_f64() as f32).collect();
    if T::SUFFIX != "f32" {
        return wide;
    }
    let n = wide.len();
    let t = Tensor::from_vec(wide, n, &Device::Cpu).expect("f32 tensor");
    let r = elementwise::round_tf32(&t, elementwise::Tf32Rounding::Nearest).expect("tf32");
    host::<f32>(&r)
}

/// `conv3x3_mma`'s sum for output (o, pixel), restated: from +0 in f32, chunk by chunk of 8
/// (f32) or 16 (bf16) input channels, tap by tap in order (3·dy + dx), an mma adding the
/// chunk's channels in order as fused multiply-adds (a channel past `cin`, a tap outside the
/// image reading 0 — the kernel's zero slots, added like any other), rounded once to `T`.
/// `x` and `w(o, c, tap)` are the operands already as the tensor core reads them.
fn conv_mma_restated<T: El>(
    x: &[f32],
    cin: usize,
    cout: usize,
    w: impl Fn(usize, usize, usize) -> f32,
    g: Grid,
) -> Vec<T> {
    let per = if T::SUFFIX == "bf16" { 2 } else { 1 };
    let chunk = gpu::MMA_SLOTS * per;
    let (plane, m) = (g.h * g.w, g.n * g.h * g.w);
    let mut out = Vec::with_capacity(cout * m);
    for o in 0..cout {
        for p in 0..m {
            let (img, y, xx) = (p / plane, (p % plane) / g.w, p % g.w);
            let mut acc = 0.0f32;
            for c0 in (0..cin).step_by(chunk) {
                for j in 0..9 {
                    let (yy, x2) = ((y + j / 3) as isize - 1, (xx + j % 3) as isize - 1);
                    let inside = yy >= 0 && yy < g.h as isize && x2 >= 0 && x2 < g.w as isize;
                    for c in c0..c0 + chunk {
                        let (xv, wv) = if c < cin && inside {
                            let at = c * m + img * plane + yy as usize * g.w + x2 as usize;
                            (x[at], w(o, c, j))
                        } else if c < cin {
                            (0.0, w(o, c, j))
                        } else {
                            (0.0, 0.0)
                        };
                        acc = wv.mul_add(xv, acc);
                    }
                }
            }
            out.push(narrow::<T>(f64::from(acc)));
        }
    }
    out
}

/// `conv3x3_mma_{f32,bf16}` (forward, and the data gradient through the transposed, flipped
/// weight view) on every case of [`CONV_CASES`], under the launcher's geometry
/// (`gpu::mma_dims`) and a one-block grid: bit for bit the restated order (the shim's warp
/// exchange of PTX's fragments), and within a summation-order bound of the CPU's
/// convolution in f64 of the same operands (TF32-rounded for f32).
fn conv_mma_matches<T: El>(m: &Emulated) {
    for (ci, (g, b, k)) in CONV_CASES.into_iter().enumerate() {
        let cols = g.n * g.h * g.w;
        let seed = 700 + 10 * ci as u64;
        let s = values::<T>(b * cols, seed);
        let w = values::<T>(9 * k * b, seed + 1);
        let gy = values::<T>(k * cols, seed + 2);
        let (so, wo, gyo) = (mma_operand(&s), mma_operand(&w), mma_operand(&gy));
        for data in [false, true] {
            let (x, xo, cin, cout) = if data {
                (&gy, &gyo, k, b)
            } else {
                (&s, &so, b, k)
            };
            let want = if data {
                conv_mma_restated::<T>(xo, cin, cout, |o, c, j| wo[(c * b + o) * 9 + 8 - j], g)
            } else {
                conv_mma_restated::<T>(xo, cin, cout, |o, c, j| wo[(o * b + c) * 9 + j], g)
            };
            let pair = |abs: bool| {
                let (xt, wt) = (
                    f32_tensor(xo, &[cin, cols], abs),
                    f32_tensor(&wo, &[k, b, 3, 3], abs),
                );
                let r = if data {
                    conv3x3::backward_data(&xt, &wt, g)
                } else {
                    conv3x3::forward(&xt, &wt, g)
                };
                host::<f64>(&r.expect("cpu conv"))
            };
            let (cpu, abs) = (pair(false), pair(true));
            let kernel = format!("conv3x3_mma_{}", T::SUFFIX);
            let (gd, bd) = gpu::mma_dims(g, cout);
            let pass = if data { "data" } else { "forward" };
            for geom in [(gd, bd), ((1, 1, 1), bd)] {
                let layout = conv_layout(data, b);
                let out = launch_conv(m, &kernel, geom, x, (cin, cout), &w, layout, g);
                let what = format!("{kernel} {pass} {g:?} B={b} k={k} {geom:?}");
                conv_close(&what, &out, &cpu, &abs, 9 * cin, f32::EPSILON as f64);
                assert_bitwise(&what, &out, &want);
            }
        }
    }
}

/// `v` (operands as f32) as an f64 tensor of `shape`, or of their absolute values.
fn f32_tensor(v: &[f32], shape: &[usize], abs: bool) -> Tensor {
    let v: Vec<f64> = v
        .iter()
        .map(|&x| {
            if abs {
                f64::from(x).abs()
            } else {
                f64::from(x)
            }
        })
        .collect();
    Tensor::from_vec(v, shape, &Device::Cpu).expect("f64 tensor")
}

/// `conv3x3_wgrad_mma`'s partials and their sum, restated: per slice, output and input
/// channel, warp w sums row w of each unit of the slice (rows past the image skipped), the
/// row's columns in steps of 8 (TF32) or 16 (bf16) pixels (a step starting past the unit's
/// columns skipped; a column of a step past them adds +0 times the input there), nine tap sums
/// as fused multiply-adds in f32 from +0; the slice's partial is warp 0's sum plus warps 1, 2,
/// 3's in order; `dW` the slices' partials added in order from +0. `gy` and `s` are the
/// operands as the tensor core reads them.
fn wgrad_mma_restated(gy: &[f32], s: &[f32], b: usize, k: usize, g: Grid, per: usize) -> Vec<f32> {
    let (plane, m) = (g.h * g.w, g.n * g.h * g.w);
    let sl = gpu::weight_slices(g, b, k);
    let (segs, bands) = (g.w.div_ceil(gpu::WGRAD_SEG), g.h.div_ceil(gpu::WGRAD_ROWS));
    let step = gpu::MMA_SLOTS * per;
    let mut dw = vec![0.0f32; 9 * k * b];
    for slice in 0..sl.slices {
        let units = slice * sl.per_slice..((slice + 1) * sl.per_slice).min(sl.units);
        for o in 0..k {
            for c in 0..b {
                let mut acc = [[0.0f32; 9]; gpu::MMA_WARPS];
                for u in units.clone() {
                    let img = u / (bands * segs);
                    let y0 = ((u / segs) % bands) * gpu::WGRAD_ROWS;
                    let x0 = (u % segs) * gpu::WGRAD_SEG;
                    let nr = gpu::WGRAD_ROWS.min(g.h - y0);
                    let sw = gpu::WGRAD_SEG.min(g.w - x0);
                    for (w, acc) in acc.iter_mut().enumerate().take(nr) {
                        let y = y0 + w;
                        for k0 in (0..sw).step_by(step) {
                            for (j, a) in acc.iter_mut().enumerate() {
                                for q in k0..k0 + step {
                                    let gv = if q < sw {
                                        gy[o * m + img * plane + y * g.w + x0 + q]
                                    } else {
                                        0.0
                                    };
                                    let yy = (y + j / 3) as isize - 1;
                                    let xx = (x0 + q + j % 3) as isize - 1;
                                    let inside = yy >= 0
                                        && yy < g.h as isize
                                        && xx >= 0
                                        && xx < g.w as isize;
                                    let sv = if inside {
                                        s[c * m + img * plane + yy as usize * g.w + xx as usize]
                                    } else {
                                        0.0
                                    };
                                    *a = gv.mul_add(sv, *a);
                                }
                            }
                        }
                    }
                }
                for j in 0..9 {
                    let mut total = acc[0][j];
                    for a in &acc[1..] {
                        total += a[j];
                    }
                    let i = (o * b + c) * 9 + j;
                    dw[i] += total;
                }
            }
        }
    }
    dw
}

/// `conv3x3_wgrad_mma_{f32,bf16}` and the sum on every case of [`CONV_CASES`], under the
/// launcher's geometry (`gpu::wgrad_mma_dims`) and smaller grids (the slice and channel-group
/// loops then stride): bit for bit [`wgrad_mma_restated`], and within a summation-order bound
/// of the CPU's weight gradient in f64 of the same operands.
fn wgrad_mma_matches<T: El>(m: &Emulated) {
    let per = if T::SUFFIX == "bf16" { 2 } else { 1 };
    for (ci, (g, b, k)) in CONV_CASES.into_iter().enumerate() {
        let cols = g.n * g.h * g.w;
        let seed = 900 + 10 * ci as u64;
        let s = values::<T>(b * cols, seed);
        let gy = values::<T>(k * cols, seed + 2);
        let (so, gyo) = (mma_operand(&s), mma_operand(&gy));
        let want = wgrad_mma_restated(&gyo, &so, b, k, g, per);
        let pair = |abs: bool| {
            let r = conv3x3::backward_weight(
                &f32_tensor(&gyo, &[k, cols], abs),
                &f32_tensor(&so, &[b, cols], abs),
                g,
            );
            host::<f64>(&r.expect("cpu dW"))
        };
        let (cpu, abs) = (pair(false), pair(true));
        let (gd, bd) = gpu::wgrad_mma_dims(g, b, k);
        let kernel = format!("conv3x3_wgrad_mma_{}", T::SUFFIX);
        let sum = ("conv3x3_wgrad_sum_f32", gpu::sum_dims(9 * k * b));
        for geom in [(gd, bd), ((1, 1, 1), bd), ((2, 1, 2), bd)] {
            let dw: Vec<f32> = launch_wgrad(m, (&kernel, geom), sum, &gy, &s, (b, k), g);
            let what = format!("{kernel} {g:?} B={b} k={k} {geom:?}");
            assert_bitwise(&what, &dw, &want);
            conv_close(&what, &dw, &cpu, &abs, cols, f32::EPSILON as f64);
        }
    }
}

/// `conv.cu`'s tensor-core convolution on the host: f32 features as TF32 and bf16 features,
/// forward, data gradient and weight gradient.
#[test]
fn conv_mma_kernels_match_their_restated_order_and_the_cpu_convolution() {
    let m = Emulated::build(&src::CONV);
    conv_mma_matches::<f32>(&m);
    conv_mma_matches::<bf16>(&m);
    wgrad_mma_matches::<f32>(&m);
    wgrad_mma_matches::<bf16>(&m);
}

/// The checks above fail a kernel whose A fragment takes its channel slots in the wrong
/// registers (a0 ↔ a2: channels t and t + 4 of a chunk swapped on the pixels' side only), one
/// that adds the taps of a chunk in another order (dx outer), a weight gradient whose b1 reads
/// one column off, and one whose slice sum drops warp 0's rows: the fragment layouts and the
/// restated order are what the tests pin down, not only the sum.
#[test]
fn conv_mma_check_fails_a_wrong_fragment_or_order() {
    let good = src::CONV.body;
    let fragment = "xs[t][row][col], xs[t][row][col + 8],";
    assert!(
        good.contains(fragment),
        "conv.cu's A fragment moved: update this test"
    );
    let swapped = good.replacen(fragment, "xs[t + 4][row][col], xs[t][row][col + 8],", 1);
    let taps = "for (unsigned dy = 0; dy < 3; ++dy) {\n#pragma unroll\n                    for (unsigned dx = 0; dx < 3; ++dx) {\n                        unsigned b[NT][2]";
    assert!(
        good.contains(taps),
        "conv.cu's tap loops moved: update this test"
    );
    let reordered = good.replacen(
        taps,
        "for (unsigned dx = 0; dx < 3; ++dx) {\n#pragma unroll\n                    for (unsigned dy = 0; dy < 3; ++dy) {\n                        unsigned b[NT][2]",
        1,
    );
    let b1 = "db_pair(row, k0 + PER * (t + 4) + dx)";
    assert!(
        good.contains(b1),
        "conv.cu's weight-gradient B fragment moved: update this test"
    );
    let b1_off = good.replacen(b1, "db_pair(row, k0 + PER * (t + 4) + dx + 1)", 1);
    let warps = "float v = red[0][j][ol][cl];";
    assert!(
        good.contains(warps),
        "conv.cu's warp sum moved: update this test"
    );
    let warps_off = good.replacen(warps, "float v = -0.0f * red[0][j][ol][cl];", 1);
    let conv = |m: &Emulated| conv_mma_matches::<bf16>(m);
    let wgrad = |m: &Emulated| wgrad_mma_matches::<f32>(m);
    type Check<'a> = &'a dyn Fn(&Emulated);
    let breaks: [(&str, String, Check); 4] = [
        ("a0/a2 swapped", swapped, &conv),
        ("taps reordered", reordered, &conv),
        ("weight gradient's b1 one column off", b1_off, &wgrad),
        ("weight gradient's warp 0 dropped", warps_off, &wgrad),
    ];
    for (what, body, check) in breaks {
        let module = CudaModule {
            body: Box::leak(body.into_boxed_str()),
            ..src::CONV
        };
        let m = Emulated::build(&module);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&m)));
        assert!(
            caught.is_err(),
            "{what}: the tensor-core check passed a broken kernel"
        );
    }
}
