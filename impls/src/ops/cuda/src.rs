//! The CUDA C sources of densebench's kernels (`ops/cuda/*.cu`, embedded with `include_str!`)
//! and the NVRTC options they are compiled with: one place shared by the launchers (`cuda`
//! feature, [`crate::ops::bn`], [`crate::ops::bn_backward`], [`crate::ops::shift`] and [`crate::ops::elementwise`]) and by the NVRTC compile test, which runs
//! in every build (`tests/nvrtc_compile.rs`), so CI compiles exactly what a GPU run compiles.
//!
//! This module needs no CUDA: it is text and constants.
//!
//! How kernels are built: at first use on a device, the module's source (the shared
//! [`PRELUDE`] followed by the `.cu` file) is compiled by NVRTC for that device's virtual
//! architecture (`compute_XY` from its compute capability) into PTX, cached per process and
//! architecture, and loaded once per device through candle's module cache.

/// Helpers every module uses (explicitly rounded arithmetic, the fixed-tree block sum). NVRTC
/// reads no files, so it is prepended to each module's source instead of `#include`d.
pub const PRELUDE: &str = include_str!("prelude.cuh");

/// Threads per block of the per-channel reductions (BN statistics, BN backward reduce): one
/// block per channel. Passed to NVRTC as `-DDB_REDUCE_THREADS`, so the kernel's fixed-shape tree
/// and the launch agree by construction. 1024 (the most a block may have, a power of two as the
/// tree requires): with each thread's loads issued 32 bytes per row at a time
/// (`db_thread_rows` in `prelude.cuh`) a block keeps 32 KiB of reads in flight, so a BN over
/// fewer channels than the GPU has SMs still streams (BN2's 48 channels on BC-100; with 256
/// threads and ptxas's own 4× unrolling it was 4 KiB per block). ptxas (sm_90, CUDA 13.0):
/// 32–37 registers, no spills, 8 KiB of shared memory per block.
pub const REDUCE_THREADS: u32 = 1024;

/// Threads per block of the element-wise and row-wise kernels (the columns of one row).
/// A multiple of the warp size that every CUDA GPU accepts.
pub const ELEMENTWISE_THREADS: u32 = 256;

/// Most blocks in the x dimension of a launch: the kernels' grid-stride loops cover the rest.
/// 65 535 is the y/z limit and plenty in x to fill any current GPU.
pub const MAX_GRID_X: u32 = 65_535;

/// Most blocks in the y dimension (the hardware limit); the row loops stride over the rest.
pub const MAX_GRID_Y: u32 = 65_535;

/// One kernel module: a `.cu` file compiled (with [`PRELUDE`]) into one PTX module.
#[derive(Debug, Clone, Copy)]
pub struct CudaModule {
    /// The name candle caches the loaded module under (once per device).
    pub name: &'static str,
    /// File name under `ops/cuda/`, cited by NVRTC's error messages (through `#line`).
    pub file: &'static str,
    /// The file's text.
    pub body: &'static str,
    /// Every `extern "C"` kernel the launchers call, without the dtype suffix; each exists as
    /// `{kernel}_f32` and `{kernel}_f64`.
    pub kernels: &'static [&'static str],
    /// The kernels of [`Self::kernels`] that also exist for bf16 features, as
    /// `{kernel}_bf16` (features stored as bf16, computed and tabled in f32: `prelude.cuh`).
    /// Every kernel with a bf16 CPU twin; the rest (BN forward's per-channel step, which
    /// works on f32 tables only) take their f32 entry point for bf16 features.
    pub bf16_kernels: &'static [&'static str],
    /// Kernels that exist only as `{kernel}_bf16`, written out in the file (not by its macro):
    /// mixed-type steps of bf16 features, e.g. f32 tap products summed into bf16.
    pub bf16_only: &'static [&'static str],
    /// Kernels that exist only as `{kernel}_f32`, written out in the file: f32 features on a
    /// path of their own (the TF32 tensor-core convolution).
    pub f32_only: &'static [&'static str],
}

impl CudaModule {
    /// The complete source handed to NVRTC: [`PRELUDE`], then the file, with a `#line`
    /// directive so that diagnostics name `file` and its own line numbers.
    pub fn source(&self) -> String {
        format!("{PRELUDE}\n#line 1 \"{}\"\n{}", self.file, self.body)
    }

    /// The entry-point names of every kernel in both float dtypes (`relu_inplace_f32`, …),
    /// then of the bf16 ones (`relu_inplace_bf16`, …, [`Self::bf16_only`]'s last), then
    /// [`Self::f32_only`]'s.
    pub fn entry_points(&self) -> Vec<String> {
        let floats = self
            .kernels
            .iter()
            .flat_map(|k| DTYPE_SUFFIXES.iter().map(move |s| format!("{k}_{s}")));
        let bf16 = self
            .bf16_kernels
            .iter()
            .chain(self.bf16_only)
            .map(|k| format!("{k}_{BF16_SUFFIX}"));
        let f32 = self.f32_only.iter().map(|k| format!("{k}_f32"));
        floats.chain(bf16).chain(f32).collect()
    }
}

/// The dtype suffixes every kernel is instantiated for (`float`, `double`).
pub const DTYPE_SUFFIXES: [&str; 2] = ["f32", "f64"];

/// The suffix of the bf16 instances ([`CudaModule::bf16_kernels`], the C type `db_bf16`).
pub const BF16_SUFFIX: &str = "bf16";

/// In-place ReLU, ReLU backward (new and in place) and accumulation ([`crate::ops::elementwise`]).
pub const INPLACE: CudaModule = CudaModule {
    name: "densebench_inplace",
    file: "inplace.cu",
    body: include_str!("inplace.cu"),
    kernels: &["relu_inplace", "relu_bwd", "relu_bwd_inplace", "add_assign"],
    bf16_kernels: &["relu_inplace", "relu_bwd", "relu_bwd_inplace", "add_assign"],
    bf16_only: &[],
    f32_only: &[],
};

/// BatchNorm statistics, the per-channel forward step, apply (with and without ReLU), backward
/// reduce (with its coefficients) and dx ([`crate::ops::bn`], [`crate::ops::bn_backward`], [`crate::ops::shift`]).
pub const BN: CudaModule = CudaModule {
    name: "densebench_bn",
    file: "bn.cu",
    body: include_str!("bn.cu"),
    kernels: &[
        "bn_stats",
        "bn_stats_prepare",
        "bn_prepare",
        "affine_rows",
        "affine_rows_relu",
        "relu_bwd_affine",
        "relu_bwd_affine_inplace",
        "bn_bwd_reduce",
        "bn_bwd_reduce_relu",
        "bn_bwd_dx",
        "bn_bwd_dx_relu",
        "bn_bwd_dx_accumulate",
        "bn_bwd_dx_accumulate_relu",
    ],
    bf16_kernels: &[
        "bn_stats",
        "bn_stats_prepare",
        "affine_rows",
        "affine_rows_relu",
        "relu_bwd_affine",
        "relu_bwd_affine_inplace",
        "bn_bwd_reduce",
        "bn_bwd_reduce_relu",
        "bn_bwd_dx",
        "bn_bwd_dx_relu",
        "bn_bwd_dx_accumulate",
        "bn_bwd_dx_accumulate_relu",
    ],
    bf16_only: &[],
    f32_only: &[],
};

/// The 3×3 convolution's shift stack and shift sum ([`crate::ops::bn`], [`crate::ops::bn_backward`], [`crate::ops::shift`]).
pub const SHIFT: CudaModule = CudaModule {
    name: "densebench_shift",
    file: "shift.cu",
    body: include_str!("shift.cu"),
    kernels: &["shift_stack", "shift_sum"],
    bf16_kernels: &["shift_stack", "shift_sum"],
    // f32 tap products of a bf16 convolution summed into bf16 features (`shift::shift_sum_into`)
    bf16_only: &["shift_sum_wide"],
    f32_only: &[],
};

/// The direct 3×3 convolution ([`crate::ops::conv3x3::gpu`], `DENSEBENCH_CONV=direct`):
/// forward and data gradient (`conv3x3`), the weight gradient's slice partials
/// (`conv3x3_wgrad`) and their sum; the first two also on tensor cores for bf16 and for f32 in
/// TF32 (`conv3x3_mma`, `conv3x3_wgrad_mma`).
pub const CONV: CudaModule = CudaModule {
    name: "densebench_conv",
    file: "conv.cu",
    body: include_str!("conv.cu"),
    kernels: &["conv3x3", "conv3x3_wgrad", "conv3x3_wgrad_sum"],
    // the sum adds f32 partials for bf16 features: its f32 entry point
    bf16_kernels: &["conv3x3", "conv3x3_wgrad"],
    bf16_only: &["conv3x3_mma", "conv3x3_wgrad_mma"],
    f32_only: &["conv3x3_mma", "conv3x3_wgrad_mma"],
};

/// Every module, in no particular order.
pub const MODULES: [CudaModule; 4] = [INPLACE, BN, SHIFT, CONV];

/// The virtual architecture of a compute capability, as NVRTC's `--gpu-architecture` takes it
/// (`(9, 0)` → `compute_90`).
pub fn virtual_arch(major: i32, minor: i32) -> String {
    format!("compute_{major}{minor}")
}

/// NVRTC options for `arch` (e.g. `compute_90`): the architecture and the block size the
/// reductions are written for. Nothing else: NVRTC's defaults (IEEE division and square root,
/// no flush-to-zero) are what the CPU twins compute; contraction into FMA is prevented in the
/// source itself (explicitly rounded intrinsics), so `--fmad` does not matter.
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        format!("-DDB_REDUCE_THREADS={REDUCE_THREADS}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each listed kernel is defined for both dtypes by a `DB_*_KERNELS(T, S)` macro line
    /// `... void {kernel}_##S(`: a renamed kernel or a typo in a list fails here, without NVRTC.
    /// (That each instance exists, bf16 ones included, is the NVRTC test's and the host
    /// emulation's check: both look every entry point up.)
    #[test]
    fn every_listed_kernel_is_defined_in_its_file() {
        for m in MODULES {
            for k in m.kernels {
                let def = format!(" {k}_##S(");
                assert!(m.body.contains(&def), "{}: no `{def}` in the file", m.file);
            }
            for s in DTYPE_SUFFIXES {
                let inst = format!(
                    "_KERNELS({}, {s})",
                    if s == "f32" { "float" } else { "double" }
                );
                assert!(m.body.contains(&inst), "{}: no `{inst}` line", m.file);
            }
            for k in m.bf16_kernels {
                assert!(m.kernels.contains(k), "{}: bf16 `{k}` is no kernel", m.file);
            }
            for (k, suffix) in m
                .bf16_only
                .iter()
                .map(|k| (k, BF16_SUFFIX))
                .chain(m.f32_only.iter().map(|k| (k, "f32")))
            {
                let def = format!("{k}_{suffix}(");
                assert!(m.body.contains(&def), "{}: no `{def}` in the file", m.file);
                assert!(!m.kernels.contains(k), "{}: `{k}` is listed twice", m.file);
            }
            if !m.bf16_kernels.is_empty() {
                let inst = format!("_KERNELS(db_bf16, {BF16_SUFFIX})");
                assert!(m.body.contains(&inst), "{}: no `{inst}` line", m.file);
            }
        }
    }

    #[test]
    fn options_carry_the_block_size_of_the_launches() {
        let o = nvrtc_options(&virtual_arch(9, 0));
        assert_eq!(o[0], "--gpu-architecture=compute_90");
        assert_eq!(o[1], format!("-DDB_REDUCE_THREADS={REDUCE_THREADS}"));
        assert!(REDUCE_THREADS.is_power_of_two() && (32..=1024).contains(&REDUCE_THREADS));
    }
}
