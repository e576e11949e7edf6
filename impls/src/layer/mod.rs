//! The layer maths, written once: forward and hand-written backward of every op a dense layer
//! uses, on channel-major 2-D feature maps `[C, M]` (M = N·H·W).
//!
//! Channel-major makes each channel's values one contiguous row: BatchNorm statistics are row
//! reductions, Conv1×1 and Linear are a plain `W[out, C] @ X[C, M]`, and a prefix of the
//! concatenated features is a contiguous view. Every strategy calls these functions, so variants
//! with the same op order produce bitwise-identical results.
//!
//! Mixed precision (bf16, PyTorch autocast's rule, on the CPU's kernels and the GPU's path):
//! the features and their gradients are bf16; a matrix product reads a bf16 copy of its f32
//! weight ([`autocast`]), accumulates in f32 and rounds its bf16 output once (the tap-stack
//! convolution keeps its tap products in f32 and rounds each output's sum once); BatchNorm's
//! statistics, tables and running stats are f32; every parameter gradient is accumulated in
//! f32 and kept in f32 (weight gradients of bf16 operands, [`dense_bwd_weight`],
//! [`conv1_bwd_weight`], the 3×3 weight gradient; the bias gradient, [`dense_bwd_bias`]; BN's
//! dγ and dβ).

use crate::config::switch::{env_value, scoped};
use crate::config::variant::Relu;
use crate::config::Config;
use crate::error::{CandleContext, Result};
use crate::ops::conv3x3;
use crate::ops::dense;
use crate::ops::elementwise;
use crate::ops::layout::grid::{Grid, TAPS};
use crate::ops::{bn, bn_backward, shift};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;
use std::cell::Cell;

thread_local! {
    /// Set inside [`with_tf32_emulation_on_cpu`].
    static TF32_ON_CPU: Cell<Option<Tf32Rounding>> = const { Cell::new(None) };
    /// Set inside [`with_whole_front`].
    static WHOLE_FRONT_HERE: Cell<bool> = const { Cell::new(false) };
}

pub use crate::ops::cpu::shared::cpu_kernels;
use crate::ops::cpu::shared::{unfilled, TAP_STACK_ON_CPU};
pub use crate::ops::elementwise::Tf32Rounding;

/// Runs `f` with the CPU emulating a GPU's f32 products in TF32 (`--math tf32`): the path of
/// [`with_tap_stack_on_cpu`], and both operands of every matrix product (Linear, Conv1×1, the
/// tap-stacked 3×3) rounded to TF32 first; products of two TF32 values are exact in f32 and
/// the sums run in f32, as on tensor cores (up to summation order). For deriving the error of
/// tf32 rows against the f64 reference on a machine without a GPU (`examples/tf32_error.rs`);
/// f32 operands only (anything else is an error, never a silent no-op).
pub fn with_tf32_emulation_on_cpu<R>(rounding: Tf32Rounding, f: impl FnOnce() -> R) -> R {
    scoped(&TF32_ON_CPU, Some(rounding), || with_tap_stack_on_cpu(f))
}

/// `a @ b` through candle's matmul: the product of every path but the CPU's own kernels, with
/// its operands rounded to TF32 inside [`with_tf32_emulation_on_cpu`]. bf16 operands
/// (autocast) take [`product_new`] into bf16 instead: f32 accumulation, each output element
/// rounded once (cuBLAS with f32 compute on a GPU, the CPU's own product on its tap-stack
/// path; candle's CPU matmul has no bf16); so do strided operands candle's matmul refuses.
fn matmul(a: &Tensor, b: &Tensor, what: &'static str) -> Result<Tensor> {
    // candle's matmul takes contiguous or transposed-contiguous operands only; a block of a
    // matrix (the split front's `W1[:, block]ᵀ`) goes through the strided product
    let plain = |t: &Tensor| t.is_contiguous() || t.t().is_ok_and(|t| t.is_contiguous());
    if a.dtype() == DType::BF16 || !(plain(a) && plain(b)) {
        return product_new(a, b, a.dtype(), what);
    }
    operand(a)?.matmul(&operand(b)?).ctx(what)
}

/// `a @ b` into a new `[m, n]` tensor of `dtype` through [`gemm_into`] (β = 0: one allocation,
/// the output's): bf16 operands into bf16 or (a parameter gradient) f32, or operands of
/// `dtype`.
fn product_new(a: &Tensor, b: &Tensor, dtype: DType, what: &'static str) -> Result<Tensor> {
    let (m, n) = (a.dims2().ctx(what)?.0, b.dims2().ctx(what)?.1);
    // SAFETY: a product that does not add writes every element of its destination, reads none.
    let out = unsafe { unfilled((m, n), dtype, a.device(), what)? };
    gemm_into(&out, a, b, false)?;
    Ok(out)
}

/// `t` as the products read it: rounded to TF32 (a new tensor) inside
/// [`with_tf32_emulation_on_cpu`], else `t` itself.
fn operand(t: &Tensor) -> Result<Tensor> {
    match TF32_ON_CPU.with(Cell::get) {
        None => Ok(t.clone()),
        Some(r) => elementwise::round_tf32(t, r),
    }
}

/// Runs `f` with the CPU taking the GPU's path ([`crate::model::trace::Kernels::TapStack`]: the 3×3
/// convolution through the tap stack, dense products through candle's matmul into new tensors
/// except those that add into their destination) for the calls made on this thread. The GPU's
/// allocations, op for op, on a machine without one: the memory model of the GPU path is checked against the CPU's exact allocator
/// this way (`tests/memory_model_pool.rs`). The values differ from the CPU kernels' by
/// summation order only.
pub fn with_tap_stack_on_cpu<R>(f: impl FnOnce() -> R) -> R {
    scoped(&TAP_STACK_ON_CPU, true, f)
}

/// Runs `f` with a bc layer's front (BN1 → ReLU → Conv1×1) taken whole instead of split
/// ([`split_front`]), on any device: ReLU1's output and its gradient `[C_i, M]` made whole (on
/// the CPU's kernels bitwise the same results; on a GPU's path the same values up to cuBLAS's
/// summation order). For timing the split against the whole side by side
/// (`examples/step_timing.rs front`); the memory model made inside follows it.
pub fn with_whole_front<R>(f: impl FnOnce() -> R) -> R {
    scoped(&WHOLE_FRONT_HERE, true, f)
}

/// Whether a bc layer's front is split on this thread, on any device (the CPU's kernels and a
/// GPU's path): ReLU1's output made a column chunk at a time where it is not kept
/// ([`bn_relu_conv1_chunked`]), and the front's backward a column group ([`dw_groups`]) and
/// then a channel block ([`grad_blocks`]) at a time, unless inside [`with_whole_front`] (which
/// [`crate::step::step()`] enters wherever the schedule keeps the front whole,
/// [`WHOLE_FRONT_ENV`] included: a thread-local read per layer, not the environment).
pub fn split_front(_dev: &Device) -> bool {
    !WHOLE_FRONT_HERE.with(Cell::get)
}

/// The environment variable that makes every [`crate::step::step()`] run each bc layer's front
/// whole (`1`; `0` or unset: split where the schedule picks it), on any device: the step
/// enters [`with_whole_front`], e.g. for a `densebench run` timed against the split (the
/// memory model follows it).
pub const WHOLE_FRONT_ENV: &str = "DENSEBENCH_WHOLE_FRONT";

/// Whether [`with_whole_front`] or [`WHOLE_FRONT_ENV`] `= 1` is in force on this
/// thread (a value [`whole_front_override`] refuses counts as unset; steps check it first):
/// what the memory model's schedule reads.
pub fn whole_front_forced() -> bool {
    WHOLE_FRONT_HERE.with(Cell::get) || matches!(whole_front_override(), Ok(true))
}

/// [`WHOLE_FRONT_ENV`] read: `1` true, `0` or unset false, anything else an error naming it.
pub fn whole_front_override() -> Result<bool> {
    match env_value(WHOLE_FRONT_ENV) {
        None => Ok(false),
        Some(v) if v.trim() == "1" => Ok(true),
        Some(v) if v.trim() == "0" || v.trim().is_empty() => Ok(false),
        Some(v) => Err(bad_whole_front(v)),
    }
}

fn bad_whole_front(value: String) -> crate::error::Error {
    crate::error::Error::InvalidConfig {
        field: "DENSEBENCH_WHOLE_FRONT",
        value,
        reason: "expected 1 (every bc layer's front whole on the CPU, as a GPU runs it) or 0 \
                 (split, the default), or unset"
            .to_string(),
    }
}

/// The parameter `w` as a matrix product over features of dtype `features` reads it (PyTorch
/// autocast's cast of a weight): for bf16 features a bf16 copy of the f32 weight (a new tensor,
/// each element rounded to nearest even once), which the caller frees after its products; for
/// f32 and f64 features the weight itself (no copy).
pub fn autocast(w: &Tensor, features: DType) -> Result<Tensor> {
    if w.dtype() == features {
        Ok(w.clone())
    } else {
        w.to_dtype(features).ctx("autocast weight")
    }
}

/// What one BatchNorm application saves for backward: its per-channel table, planar `[4, C]` =
/// (batch mean; invstd = 1/√(var_biased + eps); scale = γ·invstd; shift = β − mean·scale), made
/// by one fused op ([`bn::bn_prepare`]). Backward reads mean and invstd (rows 0..2); a
/// recomputing strategy re-applies BN with scale and shift (rows 2..4), so the recomputed values
/// are bitwise those of forward and nothing per-channel is recomputed.
#[derive(Debug, Clone)]
pub struct BnStats {
    pub table: Tensor,
}

impl BnStats {
    /// `[2, C]` = (mean; invstd), a zero-copy view.
    pub fn mean_invstd(&self) -> Result<Tensor> {
        self.table.narrow(0, 0, 2).ctx("bn stats")
    }

    /// `[2, C]` = (scale; shift), a zero-copy view.
    pub fn affine(&self) -> Result<Tensor> {
        self.table.narrow(0, 2, 2).ctx("bn stats")
    }

    /// The table of channels `c0 .. c0 + n` (a block of [`grad_blocks`]): a new contiguous
    /// `[4, n]`, what the kernels read.
    pub fn channels(&self, c0: usize, n: usize) -> Result<BnStats> {
        Ok(BnStats {
            table: self
                .table
                .narrow(1, c0, n)
                .ctx("bn stats block")?
                .contiguous()
                .ctx("bn stats block")?,
        })
    }
}

/// Columns per chunk of a recomputed bc layer front on the CPU ([`bn_relu_conv1_chunked`]):
/// ReLU1's output exists a chunk `[C_i, ≤ 4096]` at a time, never as the whole `[C_i, M]`.
pub const FRONT_CHUNK_COLUMNS: usize = 4096;

/// Fewest columns of a front chunk: more than 64, so every product of a chunk sums each output
/// element exactly as the unsplit product does, and the split changes no bit. `gemm` blocks
/// the inner dimension by a length that depends on the inner dimension alone, except for
/// outputs of at most 64 × 64 (its small-size path blocks it by 512), and a bottleneck B ≤ 64
/// (BC-100's is 48) is the other side of these outputs.
pub const MIN_SPLIT: usize = 65;

/// `len` in `pieces` ranges `(start, len)` as even as possible, in order (the longer first).
fn even_split(len: usize, pieces: usize) -> Vec<(usize, usize)> {
    let pieces = pieces.clamp(1, len.max(1));
    let (base, extra) = (len / pieces, len % pieces);
    let mut start = 0;
    (0..pieces)
        .map(|p| {
            let n = base + usize::from(p < extra);
            let r = (start, n);
            start += n;
            r
        })
        .collect()
}

/// How a split front is cut on a GPU's path, where no bitwise argument ties it to the CPU's
/// constants and every chunk and block costs launches: columns per chunk of ReLU1's output (and
/// per column group of dW1), rows per channel block of its backward. The memory model picks it
/// ([`crate::model::schedule::Schedule::front_pieces`]: the fewest pieces within 0.5% of the
/// least predicted peak, or `DENSEBENCH_FRONT_SLACK`'s fraction); the step runs in
/// [`with_front_pieces`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrontPieces {
    /// Columns per chunk of ReLU1's output and per group of dW1 (at least [`MIN_SPLIT`]).
    pub columns: usize,
    /// Channels per block of `dr`, ReLU1's and BN1's backward (at least 1).
    pub rows: usize,
}

impl FrontPieces {
    /// The CPU's pieces ([`FRONT_CHUNK_COLUMNS`], [`GRAD_BLOCK_ROWS`]), the finest a GPU's
    /// path considers.
    pub const CPU: FrontPieces = FrontPieces {
        columns: FRONT_CHUNK_COLUMNS,
        rows: GRAD_BLOCK_ROWS,
    };
}

thread_local! {
    /// Set inside [`with_front_pieces`].
    static FRONT_PIECES_HERE: Cell<Option<FrontPieces>> = const { Cell::new(None) };
}

/// Runs `f` with a split front cut in `pieces` on this thread ([`front_chunks`], [`dw_groups`]
/// and [`grad_blocks`] follow it, and so do the model's traces made inside): what
/// [`crate::step::step()`] runs a GPU's step in. The CPU's kernels keep their constants, on
/// which their bitwise equalities rest: a step on them never enters this.
pub fn with_front_pieces<R>(pieces: FrontPieces, f: impl FnOnce() -> R) -> R {
    scoped(&FRONT_PIECES_HERE, Some(pieces), f)
}

/// The pieces in force: [`with_front_pieces`]'s, else [`FrontPieces::CPU`].
pub fn front_pieces() -> FrontPieces {
    FRONT_PIECES_HERE
        .with(Cell::get)
        .unwrap_or(FrontPieces::CPU)
}

/// The column chunks `(start, columns)` of a recomputed front over `m` columns: the fewest of
/// at most [`FRONT_CHUNK_COLUMNS`] (or [`with_front_pieces`]'s columns; each at least
/// [`MIN_SPLIT`], else one chunk).
pub fn front_chunks(m: usize) -> Vec<(usize, usize)> {
    let columns = front_pieces().columns.max(1);
    even_split(m, m.div_ceil(columns).min(m / MIN_SPLIT))
}

/// Columns per inner chunk of a bc layer's Conv1×1 weight gradient on the CPU
/// ([`conv1_bwd_weight`]): `gemm` never blocks an inner dimension of 512 or less (its blocking
/// length is at least `min(k, 512)` on any cache, and its small-size path blocks by 512), so a
/// chunk's product sums its 512 columns in one run whatever the machine and the threads, and
/// the chunks are added in order: the same bits for the whole front and the split one, which
/// both take all C_i rows in each call (and for any block of more than 256 / B rows: `gemm`
/// sums products of at most 256 outputs along another path).
pub const DW_CHUNK_COLUMNS: usize = 512;

/// The column groups `(start, columns)` a bc layer's Conv1×1 weight gradient reads ReLU1's
/// output in on the CPU ([`conv1_bwd_weight`]): [`FRONT_CHUNK_COLUMNS`] each (the last the
/// rest), whole [`DW_CHUNK_COLUMNS`] chunks, so a recomputing layer remakes r `[C_i, ≤ 4096]`
/// at a time, never whole; on a GPU's path [`with_front_pieces`]'s columns each.
pub fn dw_groups(m: usize) -> Vec<(usize, usize)> {
    const _: () = assert!(FRONT_CHUNK_COLUMNS.is_multiple_of(DW_CHUNK_COLUMNS));
    let columns = front_pieces().columns.max(1);
    (0..m)
        .step_by(columns)
        .map(|g0| (g0, columns.min(m - g0)))
        .collect()
}

/// Conv1×1's weight gradient of a bc layer on the CPU, `dW1 = dz · rᵀ [B, C]`, summed over the
/// M columns in chunks of [`DW_CHUNK_COLUMNS`] added in order (`dW1ᵀ += r[:, chunk] ·
/// dz[:, chunk]ᵀ`), ReLU1's output `r [c, ·]` given a column group of [`dw_groups`] at a time
/// by `r_of(start, columns)`: columns of the saved r (whole front), or remade from the layer
/// input (the split front's recompute, `block::Front::backward_blocked`). Both give the same
/// bits. `dz`'s chunk stays in cache for all C rows, where a block of rows at a time streamed
/// all of `dz` once per block. Other devices (a GPU's path): [`dense_bwd_weight`] of all of r,
/// `r_of(0, M)`, or with the front split ([`split_front`]) the groups' products added into one
/// `[B, c]` in group order (cuBLAS with β = 1).
pub fn conv1_bwd_weight(
    dz: &Tensor,
    c: usize,
    mut r_of: impl FnMut(usize, usize) -> Result<Tensor>,
) -> Result<Tensor> {
    let (b, m) = dz.dims2().ctx("conv1 dW")?;
    if !cpu_kernels(dz.device()) {
        if !split_front(dz.device()) {
            return dense_bwd_weight(dz, &r_of(0, m)?);
        }
        // the split front on a GPU's path: `dW1 (+)= dz[:, group] · r_groupᵀ` group by group
        // into one `[B, c]` (f32 for bf16 features), each group's r made and dropped in turn
        let dtype = crate::config::param_dtype(dz.dtype());
        // SAFETY: the first group's product (β = 0) writes all of dW1 before any group adds.
        let dw = unsafe { unfilled((b, c), dtype, dz.device(), "conv1 dW")? };
        for (i, (g0, gn)) in dw_groups(m).into_iter().enumerate() {
            let r = r_of(g0, gn)?;
            let dzg = dz.narrow(1, g0, gn).ctx("conv1 dW")?;
            gemm_into(&dw, &dzg, &r.t().ctx("conv1 dW")?, i > 0)?;
        }
        return Ok(dw);
    }
    // a parameter gradient: f32 for bf16 features, summed in f32 (not rounded to bf16)
    let dtype = crate::config::param_dtype(dz.dtype());
    // dW1ᵀ `[c, B]` in row blocks, one per thread, each its own tensor: an in-place product
    // holds its destination's storage for writing, so two threads summing into views of one
    // tensor took turns (measured: slower than one thread).
    let blocks = dw_row_blocks(c, rayon::current_num_threads())
        .into_iter()
        .map(|(c0, cn)| {
            Ok((
                c0,
                Tensor::zeros((cn, b), dtype, dz.device()).ctx("conv1 dW")?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    for (g0, gn) in dw_groups(m) {
        let r = r_of(g0, gn)?;
        // The chunks' operands, made here (TF32 rounding is this thread's setting).
        let chunks = (0..gn)
            .step_by(DW_CHUNK_COLUMNS)
            .map(|k0| {
                let n = DW_CHUNK_COLUMNS.min(gn - k0);
                let dz_t = dz
                    .narrow(1, g0 + k0, n)
                    .and_then(|v| v.t())
                    .ctx("conv1 dW")?;
                Ok((
                    operand(&r.narrow(1, k0, n).ctx("conv1 dW")?)?,
                    operand(&dz_t)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        // Each block takes every chunk in order on its own thread: a product this small
        // (`[C, B]` over 512 columns, 128 of them a step per layer) is one `gemm` panel that
        // a second thread only slowed. Rows split nothing an element sums: the same bits as
        // one `[C, B]` destination (`dw_row_blocks_keep_the_bits`).
        blocks
            .par_iter()
            .map(|(c0, dst)| -> Result<()> {
                for (i, (rc, dzc)) in chunks.iter().enumerate() {
                    let rows = rc
                        .narrow(0, *c0, dst.dim(0).ctx("conv1 dW")?)
                        .ctx("conv1 dW")?;
                    if g0 + i > 0 {
                        dense::accumulate(dst, &rows, dzc)?;
                    } else {
                        dense::product_into(dst, &rows, dzc)?;
                    }
                }
                Ok(())
            })
            .collect::<Result<Vec<()>>>()?;
    }
    // dW1 `[B, c]`, one new contiguous tensor (candle's `cat` of one tensor would hand back
    // the transposed view itself).
    let parts = blocks
        .iter()
        .map(|(_, t)| t.t().ctx("conv1 dW"))
        .collect::<Result<Vec<_>>>()?;
    match parts.as_slice() {
        [one] => one.contiguous().ctx("conv1 dW"),
        _ => Tensor::cat(&parts, 1).ctx("conv1 dW"),
    }
}

/// The row blocks `(first row, rows)` of dW1ᵀ `[c, B]` that [`conv1_bwd_weight`] sums on the
/// pool's `threads` at once: one per thread, each at least [`DW_MIN_BLOCK_ROWS`] rows (one
/// block below twice that).
fn dw_row_blocks(c: usize, threads: usize) -> Vec<(usize, usize)> {
    even_split(c, threads.min(c / DW_MIN_BLOCK_ROWS).max(1))
}

/// The fewest rows of dW1ᵀ a thread of [`conv1_bwd_weight`] takes. It was 96 (C = 24 and 60
/// had measured slower on two threads than on one, before the step's threads joined one pool
/// and before `dense` copied the chunks' `dzᵀ` row by row), which left 14 of BC-100 L=16's 16
/// layers to one thread: their 128 chunk products a step were 10% of the 2-thread f32 step's
/// work, and one of its two threads idled through them (`perf`, 21% of the step's wall time
/// with one thread working, 2% after). At 16 (every layer of C0 = 24 on both threads) that
/// step took ×0.92 of the time (`examples/step_timing.rs bc cat-store-copy`, 2 threads,
/// alternated); 8 and 12 rows measured the same as 16. Row blocks keep every bit
/// (`conv1_weight_gradient_in_chunks`).
const DW_MIN_BLOCK_ROWS: usize = 16;

/// Rows per block of a bc layer's ReLU1 and BN1 backward on the CPU ([`grad_blocks`]).
pub const GRAD_BLOCK_ROWS: usize = 64;

/// The channel blocks `(first channel, channels)` of a bc layer's `dr = W1ᵀ·dz`, ReLU1's mask
/// and BN1's backward on the CPU, at most [`GRAD_BLOCK_ROWS`] channels each (or
/// [`with_front_pieces`]'s rows; an even split): per-channel ops, and a product whose output
/// `[n, M]` is never small, so any split keeps every bit.
pub fn grad_blocks(c: usize) -> Vec<(usize, usize)> {
    even_split(c, c.div_ceil(front_pieces().rows.max(1)))
}

/// `W1 [B, C] @ relu(bn(x [C, M]))`, Conv1×1 of a bc layer's BN1 → ReLU output, a column
/// chunk ([`front_chunks`]) at a time: each chunk's BN1 → ReLU (`copy`: the BN output and the
/// ReLU's new tensor, as the strategy measures) is multiplied into its columns of `z` and
/// freed (on the CPU [`dense::product_of_column_chunks`], on a GPU's path one product with
/// β = 0 into the chunk's columns; `z` is not zeroed first). On the CPU bitwise
/// [`dense_fwd`]`(w1, None, &`[`bn_apply_relu`]`(x, stats, mode))`: the element-wise ops per
/// element, the products over the whole inner dimension C (see [`MIN_SPLIT`]); on a GPU the
/// same sums up to cuBLAS's order. Transient: one chunk's `[C, ≤ 4096]` instead of `[C, M]`.
pub fn bn_relu_conv1_chunked(
    w1: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    mode: Relu,
) -> Result<Tensor> {
    let m = x.dims()[1];
    if !cpu_kernels(x.device()) {
        // a GPU's path: each chunk's product written into its columns of z (cuBLAS, β = 0)
        let (b, what) = (w1.dims()[0], "front chunk");
        // SAFETY: the chunks tile the columns; each chunk's product writes all of its columns.
        let z = unsafe { unfilled((b, m), x.dtype(), x.device(), what)? };
        for (c0, n) in front_chunks(m) {
            let r = bn_apply_relu(&x.narrow(1, c0, n).ctx(what)?, stats, mode)?;
            gemm_into(&z.narrow(1, c0, n).ctx(what)?, w1, &r, false)?;
        }
        return Ok(z);
    }
    dense::product_of_column_chunks(&operand(w1)?, m, &front_chunks(m), |c0, n| {
        operand(&bn_apply_relu(
            &x.narrow(1, c0, n).ctx("front chunk")?,
            stats,
            mode,
        )?)
    })
}

/// Per-channel batch mean and biased variance of `x [C, M]`, planar `[2, C]` (two-pass, f64
/// accumulation; one fused op).
pub fn bn_stats(x: &Tensor) -> Result<Tensor> {
    bn::bn_stats(x)
}

/// The training-mode BN of one layer's forward from its batch statistics `mv [2, C]` =
/// (mean; biased var) over `cfg.m()` values per channel: the saved [`BnStats`] and PyTorch's
/// running-stat update, done once per layer in forward only, `r_mean ← (1−μ)·r_mean + μ·mean`,
/// `r_var ← (1−μ)·r_var + μ·var·M/(M−1)` (unbiased). One fused op ([`bn::bn_prepare`]).
/// Returns `(stats, new running mean, new running var)`.
pub fn bn_forward_stats(
    cfg: &Config,
    mv: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
) -> Result<(BnStats, Tensor, Tensor)> {
    forward_stats(bn::bn_prepare(
        mv,
        gamma,
        beta,
        running_mean,
        running_var,
        cfg.m(),
    )?)
}

/// `(stats, new running mean, new running var)` from a BN forward step's table and running
/// update.
fn forward_stats((table, running): (Tensor, Tensor)) -> Result<(BnStats, Tensor, Tensor)> {
    Ok((
        BnStats { table },
        bn::row(&running, 0)?,
        bn::row(&running, 1)?,
    ))
}

/// [`bn_forward_stats`] from the features `x [C, M]` themselves: their batch statistics and
/// the per-channel step in one op ([`bn::bn_stats_prepare`], one launch on a GPU), bitwise
/// [`bn_stats`] then [`bn_forward_stats`]. BN2's forward, whose statistics nothing else reads.
pub fn bn_forward_stats_of(
    x: &Tensor,
    gamma: &Tensor,
    beta: &Tensor,
    running_mean: &Tensor,
    running_var: &Tensor,
) -> Result<(BnStats, Tensor, Tensor)> {
    forward_stats(bn::bn_stats_prepare(
        x,
        gamma,
        beta,
        running_mean,
        running_var,
    )?)
}

/// `y = (x − mean)·invstd·γ + β`, computed as `x·scale + shift` with the per-channel
/// `scale = γ·invstd`, `shift = β − mean·scale` of `stats`: one pass, one new tensor.
pub fn bn_apply(x: &Tensor, stats: &BnStats) -> Result<Tensor> {
    bn::affine_rows(x, &stats.affine()?)
}

/// [`bn_apply`] followed by ReLU ([`relu_fwd`]): `copy` keeps the two steps (the BN output and
/// the ReLU's new tensor are both live, as the strategy measures); `inplace` fuses them into one
/// pass and one output ([`bn::affine_rows_relu`]), bitwise the same values and the same bytes
/// as BN apply then an in-place ReLU, whose pre-activation nothing may read anyway.
pub fn bn_apply_relu(x: &Tensor, stats: &BnStats, mode: Relu) -> Result<Tensor> {
    match mode {
        Relu::Copy => relu_fwd(bn_apply(x, stats)?, Relu::Copy),
        Relu::Inplace => bn::affine_rows_relu(x, &stats.affine()?),
    }
}

/// Gradients of [`bn_apply`] with batch statistics, given its input `x` and the saved stats:
/// `dx = γ·invstd·(gy − Σgy/M − x̂·Σ(gy·x̂)/M)`, `dγ = Σ gy·x̂`, `dβ = Σ gy`, with
/// `x̂ = (x − mean)·invstd`. Expanded per channel as `dx = A·gy + B·x + C` with
/// `A = γ·invstd`, `B = −A·invstd·Σ(gy·x̂)/M`, `C = A·(mean·invstd·Σ(gy·x̂) − Σgy)/M`, so the
/// kernels make one reduction pass (which also computes A, B, C) and one output pass, and no
/// temporaries. Returns `(dx [C, M], dγ [C], dβ [C])`.
pub fn bn_bwd(
    gy: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    bwd(gy, x, stats, gamma, false)
}

/// [`bn_bwd`] of [`bn_apply_relu`] with an `inplace` ReLU, from the gradient `g` of the ReLU's
/// output: the ReLU's backward is fused into BN's (its mask from BN's input `x` and `stats`,
/// [`bn_backward::bn_bwd_reduce_relu`]), bitwise [`relu_bwd_bn`] then [`bn_bwd`] with one pass
/// over `[C, M]` fewer and nothing allocated for the mask. (`copy` strategies keep the two
/// steps, each with its own output, as they measure.)
pub fn bn_relu_bwd(
    g: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    bwd(g, x, stats, gamma, true)
}

fn bwd(
    gy: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
    relu: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (coef, dgamma, dbeta) = bn_bwd_coef(gy, x, stats, gamma, relu)?;
    let dx = if relu {
        bn_backward::bn_bwd_dx_relu(gy, x, &coef, &stats.affine()?)?
    } else {
        bn_backward::bn_bwd_dx(gy, x, &coef)?
    };
    Ok((dx, dgamma, dbeta))
}

/// [`bn_bwd`] that adds `dx` into `dst` (**in place**, a view of the gradient buffer) instead
/// of returning it: no `[C, M]` temporary, bitwise the same sums. Returns `(dγ, dβ)`.
pub fn bn_bwd_accumulate(
    gy: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
    dst: &Tensor,
) -> Result<(Tensor, Tensor)> {
    bwd_accumulate(gy, x, stats, gamma, (None, dst), false)
}

/// [`bn_bwd_accumulate`] of [`bn_apply_relu`] with an `inplace` ReLU, its backward fused in as
/// [`bn_relu_bwd`]'s.
pub fn bn_relu_bwd_accumulate(
    g: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
    dst: &Tensor,
) -> Result<(Tensor, Tensor)> {
    bwd_accumulate(g, x, stats, gamma, (None, dst), true)
}

/// [`bn_bwd_accumulate`] into a copy of `from` made in the same pass: `dst = from + dx`, `dst`
/// written whole and never read (it may be unfilled), bitwise a copy followed by
/// [`bn_bwd_accumulate`]. CPU only ([`bn_backward::bn_bwd_dx_accumulate_from`]).
pub fn bn_bwd_accumulate_from(
    gy: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
    from: &Tensor,
    dst: &Tensor,
) -> Result<(Tensor, Tensor)> {
    bwd_accumulate(gy, x, stats, gamma, (Some(from), dst), false)
}

/// [`bn_bwd_accumulate_from`] of [`bn_apply_relu`] with an `inplace` ReLU, its backward fused
/// in as [`bn_relu_bwd`]'s. CPU only.
pub fn bn_relu_bwd_accumulate_from(
    g: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
    from: &Tensor,
    dst: &Tensor,
) -> Result<(Tensor, Tensor)> {
    bwd_accumulate(g, x, stats, gamma, (Some(from), dst), true)
}

/// The accumulating BN backwards: `dx` added into `dst`, or (`from`) `dst = from + dx`; with
/// `relu`, the ReLU after BN fused in.
fn bwd_accumulate(
    gy: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
    (from, dst): (Option<&Tensor>, &Tensor),
    relu: bool,
) -> Result<(Tensor, Tensor)> {
    let (coef, dgamma, dbeta) = bn_bwd_coef(gy, x, stats, gamma, relu)?;
    match (from, relu) {
        (None, false) => bn_backward::bn_bwd_dx_accumulate(dst, gy, x, &coef)?,
        (None, true) => {
            bn_backward::bn_bwd_dx_accumulate_relu(dst, gy, x, &coef, &stats.affine()?)?
        }
        (Some(f), false) => bn_backward::bn_bwd_dx_accumulate_from(dst, f, gy, x, &coef)?,
        (Some(f), true) => {
            bn_backward::bn_bwd_dx_accumulate_from_relu(dst, f, gy, x, &coef, &stats.affine()?)?
        }
    }
    Ok((dgamma, dbeta))
}

/// The reductions of BN backward and the per-channel `(A; B; C)` of `dx = A·gy + B·x + C`
/// (planar `[3, C]`; with `relu`, of the gradient masked by the ReLU after BN), with
/// `(dγ, dβ)`: views of one fused op's output.
fn bn_bwd_coef(
    gy: &Tensor,
    x: &Tensor,
    stats: &BnStats,
    gamma: &Tensor,
    relu: bool,
) -> Result<(Tensor, Tensor, Tensor)> {
    let r = if relu {
        bn_backward::bn_bwd_reduce_relu(gy, x, &stats.table, gamma)?
    } else {
        bn_backward::bn_bwd_reduce(gy, x, &stats.mean_invstd()?, gamma)?
    };
    Ok((
        r.narrow(0, 2, 3).ctx("bn bwd coef")?,
        bn::row(&r, 1)?,
        bn::row(&r, 0)?,
    ))
}

/// ReLU forward on a tensor the caller owns: `copy` writes a new tensor, `inplace` overwrites it.
pub fn relu_fwd(x: Tensor, mode: Relu) -> Result<Tensor> {
    match mode {
        Relu::Copy => elementwise::relu(&x),
        Relu::Inplace => elementwise::relu_inplace(x),
    }
}

/// ReLU backward from the output mask. `inplace` **overwrites `g`**.
pub fn relu_bwd(g: Tensor, out: &Tensor, mode: Relu) -> Result<Tensor> {
    match mode {
        Relu::Copy => elementwise::relu_bwd(&g, out),
        Relu::Inplace => elementwise::relu_bwd_inplace(g, out),
    }
}

/// ReLU backward of [`bn_apply_relu`]'s ReLU masked from BN's **input** `x` and its `stats`
/// ([`bn_backward::relu_bwd_affine`]: `x·scale + shift > 0`, the ReLU's own test of the same value),
/// not from the ReLU's output: bitwise [`relu_bwd`] with that output, which can then be freed
/// before the gradient it masks is made. `copy` writes a new tensor, `inplace` **overwrites
/// `g`**.
pub fn relu_bwd_bn(g: Tensor, x: &Tensor, stats: &BnStats, mode: Relu) -> Result<Tensor> {
    let coef = stats.affine()?;
    match mode {
        Relu::Copy => bn_backward::relu_bwd_affine(&g, x, &coef),
        Relu::Inplace => bn_backward::relu_bwd_affine_inplace(g, x, &coef),
    }
}

/// [`dense::accumulate`] (the CPU's `gemm`, on either path; cuBLAS with β = 1 on a GPU), with
/// both operands rounded to TF32 first inside
/// [`with_tf32_emulation_on_cpu`] (as cuBLAS does with `--math tf32`).
fn accumulate(dst: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    gemm_into(dst, a, b, true)
}

/// `dst += a · b` (`add`) or `dst = a · b` into `dst`'s view ([`dense::accumulate`],
/// [`dense::product_into`]), operands rounded to TF32 inside [`with_tf32_emulation_on_cpu`].
fn gemm_into(dst: &Tensor, a: &Tensor, b: &Tensor, add: bool) -> Result<()> {
    let (a, b) = (operand(a)?, operand(b)?);
    if add {
        dense::accumulate(dst, &a, &b)
    } else {
        dense::product_into(dst, &a, &b)
    }
}

/// `W[out, in] @ x[in, M]` (+ bias `[out]`): Linear and Conv1×1 in channel-major form.
///
/// With a bias, the bias is broadcast into the output first and the product added into it
/// ([`dense::accumulate`]: `gemm`, or cuBLAS with β = 1; one `[out, M]` tensor). Without one:
/// the CPU's panels ([`dense::product`]), on the GPU's path candle's matmul. `w` is in the
/// features' dtype (see [`autocast`]); an f32 bias of bf16 features is rounded to bf16 first
/// (a `[out]` copy, freed once broadcast), as autocast's Linear does.
pub fn dense_fwd(w: &Tensor, bias: Option<&Tensor>, x: &Tensor) -> Result<Tensor> {
    match bias {
        Some(b) => {
            // always a fresh tensor (even for M = 1): the product is added into it
            let y = elementwise::repeat_rows(&autocast(b, x.dtype())?, x.dims()[1])?;
            accumulate(&y, w, x)?;
            Ok(y)
        }
        None if cpu_kernels(x.device()) => dense::product(w, x),
        None => matmul(w, x, "dense forward"),
    }
}

/// Weight gradient of [`dense_fwd`]: `gy[out, M] @ xᵀ[M, in]`; of bf16 features an f32
/// gradient (f32 accumulation, not rounded to bf16).
pub fn dense_bwd_weight(gy: &Tensor, x: &Tensor) -> Result<Tensor> {
    if cpu_kernels(gy.device()) {
        // (X·Gᵀ)ᵀ: the orientation gemm runs fastest on these shapes (see the function)
        let gt = gy.t().ctx("dense dW")?;
        return match gy.dtype() {
            DType::BF16 => dense::product_transposed_f32(x, &gt),
            _ => dense::product_transposed(x, &gt),
        };
    }
    let xt = x.t().ctx("dense dW")?;
    match gy.dtype() {
        DType::BF16 => product_new(gy, &xt, DType::F32, "dense dW"),
        _ => matmul(gy, &xt, "dense dW"),
    }
}

/// Bias gradient of [`dense_fwd`]: `Σ_M gy`; of bf16 features an f32 gradient, on the CPU's
/// kernels each row summed in f64 and rounded once ([`elementwise::row_sums_f32`]), on the
/// GPU's path the product `gy · 1` into f32 (f32 accumulation, cuBLAS on a GPU; a transient
/// column of M bf16 ones).
pub fn dense_bwd_bias(gy: &Tensor) -> Result<Tensor> {
    if gy.dtype() == DType::BF16 {
        if cpu_kernels(gy.device()) {
            return elementwise::row_sums_f32(gy);
        }
        let (k, m) = gy.dims2().ctx("dense db")?;
        let ones = Tensor::ones((m, 1), DType::BF16, gy.device()).ctx("dense db")?;
        return product_new(gy, &ones, DType::F32, "dense db")?
            .reshape(k)
            .ctx("dense db");
    }
    gy.sum(1).ctx("dense db")
}

/// Input gradient of [`dense_fwd`]: `Wᵀ[in, out] @ gy[out, M]`.
pub fn dense_bwd_input(w: &Tensor, gy: &Tensor) -> Result<Tensor> {
    let wt = w.t().ctx("dense dx")?;
    if cpu_kernels(gy.device()) {
        return dense::product(&wt, gy);
    }
    matmul(&wt, gy, "dense dx")
}

/// [`dense_bwd_input`] added into `dst [in, M]` (**in place**, e.g. a view of the gradient
/// buffer; `gy` may be another, disjoint view of it): the product is added straight into
/// `dst` (`gemm`, cuBLAS with β = 1), `dst + Σ` rounded once, no `[in, M]` temporary.
pub fn dense_bwd_input_accumulate(w: &Tensor, gy: &Tensor, dst: &Tensor) -> Result<()> {
    accumulate(dst, &w.t().ctx("dense dx")?, gy)
}

/// [`dense_bwd_input_accumulate`] where `gy` is the `[out, M]` tail of `rows [top + out, M]`
/// and `dst` its first `top` rows (one view of a gradient buffer): **writes rows `[0, top)`**.
pub fn dense_bwd_input_accumulate_tail(w: &Tensor, rows: &Tensor, top: usize) -> Result<()> {
    let wt = w.t().ctx("dense dx")?;
    if TF32_ON_CPU.with(Cell::get).is_none() {
        return dense::accumulate_tail(rows, top, &wt);
    }
    // TF32 emulation: the rounded operands are new tensors, no longer rows of `dst`'s storage
    let out = rows.dims()[0].saturating_sub(top);
    let gy = rows.narrow(0, top, out).ctx("dense dx")?;
    accumulate(&rows.narrow(0, 0, top).ctx("dense dx")?, &wt, &gy)
}

/// Offsets of the forward taps: tap j = (dy, dx) reads input pixel (y + dy − 1, x + dx − 1).
fn fwd_offsets() -> [(isize, isize); 9] {
    TAPS.map(|(dy, dx)| (dy as isize - 1, dx as isize - 1))
}

/// Offsets of the backward taps: the gradient flows from output pixel (y − dy + 1, x − dx + 1).
fn bwd_offsets() -> [(isize, isize); 9] {
    TAPS.map(|(dy, dx)| (1 - dy as isize, 1 - dx as isize))
}

/// The spatial grid of `cfg`'s feature maps.
pub fn grid(cfg: &Config) -> Grid {
    Grid {
        n: cfg.batch,
        h: cfg.size.height,
        w: cfg.size.width,
    }
}

/// A PyTorch 3×3 weight `[k, B, 3, 3]` as the tap-stacked matrix `[9k, B]`: row `j·k + o` is
/// `W[o, :, dy_j, dx_j]`.
fn taps_matrix(w: &Tensor) -> Result<Tensor> {
    let (k, b) = (w.dims()[0], w.dims()[1]);
    w.permute((2, 3, 0, 1))
        .ctx("conv2 taps")?
        .contiguous()
        .ctx("conv2 taps")?
        .reshape((9 * k, b))
        .ctx("conv2 taps")
}

/// Columns per chunk of the tap-stack 3×3 convolution (rounded up to whole images) where no
/// step has picked them: the op timed or tested on its own. A step runs the chunking the
/// memory model picks for its variant ([`crate::model::schedule::tap_chunk_columns_for`]: the fewest
/// chunks of whole images within 1% of the variant's least predicted peak, so the tap products
/// and shifted gradients `[9k, ·]`, 9k·(images per chunk)·H·W instead of 9k·M, stop setting
/// it; docs/gpu.md, "The 3×3 convolution"), unless overridden: [`TAP_CHUNK_ENV`] (0: one chunk)
/// or [`with_tap_chunk_columns`].
pub const TAP_CHUNK_COLUMNS: usize = 32_768;

/// The environment variable that overrides the chunking of the tap stack for every variant
/// (columns per chunk, rounded up to whole images; 0: the whole batch in one chunk).
pub const TAP_CHUNK_ENV: &str = "DENSEBENCH_TAP_CHUNK_COLUMNS";

thread_local! {
    /// Set inside [`with_tap_chunk_columns`].
    static TAP_CHUNK_COLUMNS_HERE: Cell<Option<usize>> = const { Cell::new(None) };
}

/// Runs `f` with the tap-stack convolution chunked for `columns` (0: one chunk) on this thread,
/// whatever the model would pick and the environment says (the model's predictions made inside
/// follow it too): what [`crate::step::step()`] runs a step in, and lets tests chunk small maps.
pub fn with_tap_chunk_columns<R>(columns: usize, f: impl FnOnce() -> R) -> R {
    scoped(&TAP_CHUNK_COLUMNS_HERE, Some(columns), f)
}

/// The chunking forced on this thread: [`with_tap_chunk_columns`], else [`TAP_CHUNK_ENV`];
/// `None` when neither is set (the model picks). An environment value that is not a whole
/// number is an error.
pub fn tap_chunk_override() -> Result<Option<usize>> {
    if let Some(c) = TAP_CHUNK_COLUMNS_HERE.with(Cell::get) {
        return Ok(Some(c));
    }
    let bad = |what: String| crate::error::Error::InvalidConfig {
        field: "DENSEBENCH_TAP_CHUNK_COLUMNS",
        value: what,
        reason: "expected a whole number of columns per chunk of the 3×3 tap stack (0: one \
                 chunk), or unset"
            .to_string(),
    };
    match env_value(TAP_CHUNK_ENV) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| bad(v)),
    }
}

/// The columns per chunk the convolution runs with: the override, else (outside a step, e.g.
/// timing the op alone) [`TAP_CHUNK_COLUMNS`].
fn tap_chunk_columns() -> Result<usize> {
    Ok(tap_chunk_override()?.unwrap_or(TAP_CHUNK_COLUMNS))
}

/// Images per chunk of the tap-stack 3×3 convolution on `g` for `columns` per chunk (see
/// [`TAP_CHUNK_COLUMNS`]): the fewest whole images with at least `columns` columns, at most
/// the batch (`columns` = 0: the batch).
pub fn tap_chunk_images(g: Grid, columns: usize) -> usize {
    let n = g.n.max(1);
    if columns == 0 {
        return n;
    }
    columns.div_ceil(g.h.saturating_mul(g.w).max(1)).clamp(1, n)
}

/// The chunks of `g` for `columns`: `(first column, images)` per chunk, in order.
fn tap_chunks(g: Grid, columns: usize) -> impl Iterator<Item = (usize, usize)> {
    let (per, plane) = (tap_chunk_images(g, columns), g.h * g.w);
    (0..g.n)
        .step_by(per)
        .map(move |n0| (n0 * plane, per.min(g.n - n0)))
}

/// Conv3×3 (padding 1, stride 1, no bias) on a channel-major bottleneck `s [B, M]` with a
/// PyTorch weight `[k, B, 3, 3]`; returns channel-major `[k, M]`.
///
/// CPU: the direct, cache-blocked kernel of [`conv3x3`] (no transient beyond one scratch tile
/// per thread). Other devices: the tap stack, a range of whole images at a time
/// ([`tap_chunk_images`]): `P = W_taps [9k, B] @ s[:, range]` gives every tap's contribution
/// at its source pixel, then `y[:, range] = Σ_j shift(P_j, tap_j)`, written into `y`;
/// transients `P` (9k·columns of a chunk, one buffer for all chunks) and the tap-stacked
/// weight — an im2col would hold 9·B·M.
///
/// With the `cudnn` feature on a CUDA device and [`CONV_ENV`] `cudnn`: cuDNN's convolution
/// straight on the channel-major maps ([`conv_in_cudnn`]), no tap stack; its only transient is
/// cuDNN's workspace. With [`CONV_ENV`] `direct`: densebench's own kernels
/// ([`conv3x3::gpu`]), no transient.
pub fn conv3x3_fwd(cfg: &Config, s: &Tensor, w: &Tensor) -> Result<Tensor> {
    if cpu_kernels(s.device()) {
        return conv3x3::forward(s, w, grid(cfg));
    }
    #[cfg(feature = "cudnn")]
    if conv_in_cudnn(s.device())? {
        return conv3x3::cudnn::forward(s, w, grid(cfg));
    }
    #[cfg(feature = "cuda")]
    if let Some(mma) = conv_direct(s.device())? {
        return conv3x3::gpu::forward(s, w, grid(cfg), direct_mma(mma));
    }
    conv3x3_fwd_tap_stack(cfg, s, w)
}

/// The environment variable that picks a GPU's 3×3 convolution ([`GpuConv`]): `tap-stack` (the
/// default), `cudnn` (a binary built with the `cudnn` feature; an error in one without),
/// `direct` (densebench's own kernels, `ops/cuda/conv.cu`, on tensor cores where the dtype and
/// math mode allow) or `direct-fma` (the same kernels with fused multiply-adds only). cuDNN and the direct kernels are
/// asked for, not the default, until they have passed their checks and been timed on a GPU
/// (cuDNN's first run, on an H100, found its backward-data algorithms refusing the
/// channel-major layout; `ops::cuda::cudnn` now runs that pass as a forward convolution:
/// docs/gpu.md). Read at every convolution and by the memory model, so a step and its
/// prediction agree.
pub const CONV_ENV: &str = "DENSEBENCH_CONV";

/// A GPU's 3×3 convolution, picked by [`CONV_ENV`] (the CPU always runs its own direct kernel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuConv {
    /// The tap stack and cuBLAS products ([`conv3x3_fwd_tap_stack`]): the default.
    TapStack,
    /// cuDNN's convolution (the `cudnn` feature).
    Cudnn,
    /// densebench's direct kernels ([`conv3x3::gpu`]): no tap stack, the weight gradient
    /// through per-slice partial sums; every pass on tensor cores where `mma` and the dtype and
    /// math mode allow ([`conv3x3::gpu::conv_kernel`]: bf16, and f32 under `--math tf32`),
    /// else in fused multiply-adds (`direct-fma`: `mma` false).
    Direct { mma: bool },
}

/// The 3×3 convolution a CUDA device runs ([`CONV_ENV`]); an error for a value other than
/// `tap-stack`, `cudnn`, `direct`, `direct-fma` or empty, or `cudnn` asked of a binary without
/// the feature.
pub fn gpu_conv() -> Result<GpuConv> {
    conv_choice(env_value(CONV_ENV).as_deref(), cfg!(feature = "cudnn"))
}

/// Whether a bc layer's 3×3 convolution runs in cuDNN on `dev`: a CUDA device and
/// [`GpuConv::Cudnn`].
pub fn conv_in_cudnn(dev: &Device) -> Result<bool> {
    Ok(dev.is_cuda() && conv_in_cudnn_on_gpus()?)
}

/// [`conv_in_cudnn`] for any CUDA device, asked without one (the feature and [`CONV_ENV`]).
pub fn conv_in_cudnn_on_gpus() -> Result<bool> {
    Ok(gpu_conv()? == GpuConv::Cudnn)
}

/// Whether a bc layer's 3×3 convolution runs in densebench's direct GPU kernels on `dev` (a
/// CUDA device and [`GpuConv::Direct`]), and if so whether tensor cores may run its passes:
/// `Some(mma)`.
pub fn conv_direct(dev: &Device) -> Result<Option<bool>> {
    Ok(match gpu_conv()? {
        GpuConv::Direct { mma } if dev.is_cuda() => Some(mma),
        _ => None,
    })
}

/// The tensor-core policy of [`GpuConv::Direct`]'s `mma` (what [`conv_direct`] returns).
pub fn direct_mma(mma: bool) -> conv3x3::gpu::Mma {
    if mma {
        conv3x3::gpu::Mma::Allowed
    } else {
        conv3x3::gpu::Mma::Refused
    }
}

/// [`CONV_ENV`]'s value read for a binary with (`built`) or without the `cudnn` feature.
fn conv_choice(value: Option<&str>, built: bool) -> Result<GpuConv> {
    let asked = match value.map(str::trim) {
        None | Some("") | Some("tap-stack") => GpuConv::TapStack,
        Some("cudnn") => GpuConv::Cudnn,
        Some("direct") => GpuConv::Direct { mma: true },
        Some("direct-fma") => GpuConv::Direct { mma: false },
        Some(other) => {
            return Err(bad_conv(
                other.to_string(),
                "expected `tap-stack`, `cudnn`, `direct` or `direct-fma`, or unset",
            ))
        }
    };
    if asked == GpuConv::Cudnn && !built {
        return Err(bad_conv(
            "cudnn".to_string(),
            "this binary was built without the `cudnn` feature (build with `--features cudnn`)",
        ));
    }
    Ok(asked)
}

fn bad_conv(value: String, reason: &str) -> crate::error::Error {
    crate::error::Error::InvalidConfig {
        field: CONV_ENV,
        value,
        reason: reason.to_string(),
    }
}

/// [`conv3x3_fwd`] through the tap stack, the path of devices without a direct kernel (public
/// so the CPU can time it against the direct one). bf16 features (autocast): the tap products
/// `P` are f32 (bf16 operands, f32 accumulation) and each output is their f32 sum rounded once
/// ([`shift::shift_sum_into`]), as autocast's convolution accumulates in f32 and rounds once.
pub fn conv3x3_fwd_tap_stack(cfg: &Config, s: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (g, columns) = (grid(cfg), tap_chunk_columns()?);
    let (k, plane) = (w.dims()[0], g.h * g.w);
    let taps = taps_matrix(w)?;
    // SAFETY: the chunks cover every column of y, each written whole by its shift sum; each
    // chunk's columns of p are written whole by its product (β = 0) before the sum reads them.
    let y = unsafe { unfilled((k, g.n * plane), s.dtype(), s.device(), "conv2 forward")? };
    let per = tap_chunk_images(g, columns) * plane;
    let products = crate::config::param_dtype(s.dtype());
    let p = unsafe { unfilled((9 * k, per), products, s.device(), "conv2 forward")? };
    for (c0, n) in tap_chunks(g, columns) {
        let (cols, chunk) = (n * plane, Grid { n, ..g });
        let pc = p.narrow(1, 0, cols).ctx("conv2 forward")?;
        gemm_into(
            &pc,
            &taps,
            &s.narrow(1, c0, cols).ctx("conv2 forward")?,
            false,
        )?;
        let yc = y.narrow(1, c0, cols).ctx("conv2 forward")?;
        shift::shift_sum_into(&yc, &pc, chunk, fwd_offsets())?;
    }
    Ok(y)
}

/// Gradients of [`conv3x3_fwd`]: `(ds [B, M], dW [k, B, 3, 3])`.
///
/// CPU: [`conv3x3::backward_data`] (the flipped kernel, same tiles) then
/// [`conv3x3::backward_weight`] (per-group partials summed in a fixed order). Other devices:
/// per range of whole images, with `G = shift_stack(gy[:, range]) [9k, ·]` (block j is gy
/// shifted back by tap j), `ds[:, range] = W_tapsᵀ @ G` and `dW_taps (+)= G @ s[:, range]ᵀ`
/// (the chunks' products added in chunk order; f32 for bf16 features, a parameter gradient);
/// transients `G` (9k·columns of a chunk).
///
/// cuDNN (see [`conv3x3_fwd`]): `ds`, then `dW` in the features' dtype (cuDNN's filter
/// gradient takes its operands' type; under autocast a bf16 `dW`, as PyTorch's, widened to f32
/// here); transients: cuDNN's workspaces. Direct ([`conv3x3::gpu`]): `ds`, then `dW` in the
/// parameter dtype; transient: the weight gradient's slice partials.
pub fn conv3x3_bwd(cfg: &Config, gy: &Tensor, s: &Tensor, w: &Tensor) -> Result<(Tensor, Tensor)> {
    if cpu_kernels(gy.device()) {
        let ds = conv3x3::backward_data(gy, w, grid(cfg))?;
        let dw = conv3x3::backward_weight(gy, s, grid(cfg))?;
        return Ok((ds, dw));
    }
    #[cfg(feature = "cudnn")]
    if conv_in_cudnn(gy.device())? {
        let ds = conv3x3::cudnn::backward_data(gy, w, grid(cfg))?;
        let dw = conv3x3::cudnn::backward_filter(gy, s, grid(cfg))?;
        let param = crate::config::param_dtype(gy.dtype());
        let dw = if dw.dtype() == param {
            dw
        } else {
            dw.to_dtype(param).ctx("conv2 bwd dW")?
        };
        return Ok((ds, dw));
    }
    #[cfg(feature = "cuda")]
    if let Some(mma) = conv_direct(gy.device())? {
        let ds = conv3x3::gpu::backward_data(gy, w, grid(cfg), direct_mma(mma))?;
        let dw = conv3x3::gpu::backward_weight(gy, s, grid(cfg), direct_mma(mma))?;
        return Ok((ds, dw));
    }
    conv3x3_bwd_tap_stack(cfg, gy, s, w)
}

/// [`conv3x3_bwd`] through the tap stack (see [`conv3x3_fwd_tap_stack`]).
pub fn conv3x3_bwd_tap_stack(
    cfg: &Config,
    gy: &Tensor,
    s: &Tensor,
    w: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (g, columns) = (grid(cfg), tap_chunk_columns()?);
    let (k, b, plane) = (w.dims()[0], w.dims()[1], g.h * g.w);
    let (dtype, dev) = (gy.dtype(), gy.device());
    let taps = taps_matrix(w)?;
    let taps_t = taps.t().ctx("conv2 bwd ds")?;
    // SAFETY: the chunks cover every column of ds, each written by its product (β = 0); dW_taps
    // is written whole by the first chunk's product (β = 0) before later chunks add to it;
    // each chunk's columns of the stack are written whole by its shift stack before the
    // products read them.
    let ds = unsafe { unfilled((b, g.n * plane), dtype, dev, "conv2 bwd ds")? };
    let dw_taps = unsafe {
        unfilled(
            (9 * k, b),
            crate::config::param_dtype(dtype),
            dev,
            "conv2 bwd dW",
        )?
    };
    let per = tap_chunk_images(g, columns) * plane;
    let stack = unsafe { unfilled((9 * k, per), dtype, dev, "conv2 bwd")? };
    for (i, (c0, n)) in tap_chunks(g, columns).enumerate() {
        let (cols, chunk) = (n * plane, Grid { n, ..g });
        let gc = stack.narrow(1, 0, cols).ctx("conv2 bwd")?;
        let gy_c = gy.narrow(1, c0, cols).ctx("conv2 bwd")?;
        shift::shift_stack_into(&gc, &gy_c, chunk, bwd_offsets())?;
        let ds_c = ds.narrow(1, c0, cols).ctx("conv2 bwd ds")?;
        gemm_into(&ds_c, &taps_t, &gc, false)?;
        let s_t = s
            .narrow(1, c0, cols)
            .and_then(|v| v.t())
            .ctx("conv2 bwd dW")?;
        gemm_into(&dw_taps, &gc, &s_t, i > 0)?;
    }
    drop(stack);
    let dw = dw_taps
        .reshape((3, 3, k, b))
        .ctx("conv2 bwd dW")?
        .permute((2, 3, 0, 1))
        .ctx("conv2 bwd dW")?
        .contiguous()
        .ctx("conv2 bwd dW")?;
    Ok((ds, dw))
}

/// Canonical (PyTorch) `[N, C]` / `[N, C, H, W]` → channel-major `[C, M]`. Always a fresh
/// copy (even when the transpose happens to be contiguous, e.g. N = 1), so strategies may write
/// into the result in place without touching the caller's tensor.
pub fn to_channel_major(cfg: &Config, t: &Tensor) -> Result<Tensor> {
    if let Some(cm) = elementwise::to_channel_major(t) {
        return cm;
    }
    let c = t.dims()[1];
    t.transpose(0, 1)
        .ctx("to channel-major")?
        .force_contiguous()
        .ctx("to channel-major")?
        .reshape((c, cfg.m()))
        .ctx("to channel-major")
}

/// Channel-major `[C, M]` → canonical layout, as a zero-copy strided view.
pub fn to_canonical(cfg: &Config, t: &Tensor) -> Result<Tensor> {
    let c = t.dims()[0];
    let mut shape = vec![c, cfg.batch];
    if cfg.family == crate::config::Family::Bc {
        shape.extend([cfg.size.height, cfg.size.width]);
    }
    t.reshape(shape)
        .ctx("to canonical")?
        .transpose(0, 1)
        .ctx("to canonical")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::cpu::shared::{bits, randn};
    use candle_core::DType;

    /// `DENSEBENCH_CONV`: unset or empty is the tap stack (cuDNN and the direct kernels are
    /// asked for until they have passed on a GPU), `cudnn` only in a `cudnn` build (else an
    /// error saying how to build one), `tap-stack` and `direct` anywhere, anything else an error
    /// naming the variable; and neither cuDNN nor the direct kernels on the CPU.
    #[test]
    fn the_conv_switch_is_read_strictly() {
        for built in [false, true] {
            assert_eq!(conv_choice(None, built).unwrap(), GpuConv::TapStack);
            assert_eq!(conv_choice(Some(" "), built).unwrap(), GpuConv::TapStack);
            assert_eq!(
                conv_choice(Some("tap-stack"), built).unwrap(),
                GpuConv::TapStack
            );
            assert_eq!(
                conv_choice(Some(" direct"), built).unwrap(),
                GpuConv::Direct { mma: true }
            );
            assert_eq!(
                conv_choice(Some("direct-fma"), built).unwrap(),
                GpuConv::Direct { mma: false }
            );
        }
        assert_eq!(conv_choice(Some("cudnn"), true).unwrap(), GpuConv::Cudnn);
        let e = conv_choice(Some("cudnn"), false).unwrap_err().to_string();
        assert!(
            e.contains("DENSEBENCH_CONV") && e.contains("--features cudnn"),
            "{e}"
        );
        let e = conv_choice(Some("cuDNN"), true).unwrap_err().to_string();
        assert!(
            e.contains("DENSEBENCH_CONV = cuDNN")
                && e.contains("tap-stack")
                && e.contains("direct")
                && e.contains("direct-fma"),
            "{e}"
        );
        assert!(!conv_in_cudnn(&Device::Cpu).unwrap_or(true));
        assert_eq!(conv_direct(&Device::Cpu).ok(), Some(None));
    }

    /// Conv1×1's weight gradient summed a column chunk at a time is `dz · rᵀ` (f64, within
    /// rounding of another order), and a block of rows of r gives bitwise those rows of it,
    /// whatever the rows in the call (6 to all, [`DW_MIN_BLOCK_ROWS`] and a ragged 17 among
    /// them) and the threads (1–3): the chunk's sum does not depend on the call's shape. In f64,
    /// f32 and bf16 features (an f32 gradient, the dot kernel's tiles). Two column groups and a
    /// ragged last chunk.
    #[test]
    fn conv1_weight_gradient_in_chunks() -> Result<()> {
        let (c, b, m) = (200, 48, 2 * FRONT_CHUNK_COLUMNS + 300);
        assert_eq!(dw_groups(m).len(), 3);
        // one row block on one thread, one per thread on two or three (each at least
        // DW_MIN_BLOCK_ROWS rows): the blocks keep the bits too
        assert_eq!(dw_row_blocks(c, 1).len(), 1);
        assert_eq!(dw_row_blocks(c, 2), vec![(0, 100), (100, 100)]);
        assert_eq!(dw_row_blocks(c, 3).len(), 3);
        assert_eq!(dw_row_blocks(31, 2).len(), 1);
        assert_eq!(dw_row_blocks(32, 2), vec![(0, 16), (16, 16)]);
        for dtype in [DType::F64, DType::F32, DType::BF16] {
            let (r, dz) = (randn((c, m), dtype), randn((b, m), dtype));
            let whole = crate::ops::cpu::shared::in_pool(1, || {
                conv1_bwd_weight(&dz, c, |g0, n| r.narrow(1, g0, n).ctx("test"))
            })?;
            assert_eq!(whole.dims(), &[b, c]);
            if dtype == DType::F64 {
                let want = dz.matmul(&r.t()?)?;
                let diff = (&whole - &want)?.abs()?.flatten_all()?.to_vec1::<f64>()?;
                let err = diff.into_iter().fold(0.0, f64::max);
                assert!(err < 1e-10, "max |chunked − matmul| = {err}");
            }
            for threads in [1, 2, 3] {
                crate::ops::cpu::shared::in_pool(threads, || -> Result<()> {
                    let again = conv1_bwd_weight(&dz, c, |g0, n| r.narrow(1, g0, n).ctx("test"))?;
                    assert!(bits(&again) == bits(&whole), "{dtype:?}, {threads} threads");
                    for (r0, n) in [(0, 6), (0, DW_MIN_BLOCK_ROWS), (16, 17), (0, 70), (70, 80)] {
                        let rows = r.narrow(0, r0, n)?;
                        let part =
                            conv1_bwd_weight(&dz, n, |g0, k| rows.narrow(1, g0, k).ctx("test"))?;
                        let expect = whole.narrow(1, r0, n)?;
                        assert!(
                            bits(&part) == bits(&expect),
                            "{dtype:?}, rows {r0}+{n}, {threads} threads"
                        );
                    }
                    Ok(())
                })?;
            }
        }
        Ok(())
    }
}
