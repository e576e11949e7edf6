//! What each variant keeps for backward, declared from the config alone, so memory can be
//! predicted without running anything. A test checks the declaration against the live saved
//! state the step reports at the end of forward.

use crate::block::FEATURES;
use crate::config::{Config, Family};
use crate::conv3x3;
use crate::probe::{saved_bytes, SavedTensor};
use crate::variant::{Concat, Intermediates, Variant};
use std::collections::BTreeSet;

/// The tensors `variant` keeps for backward at the end of forward, or `None` for `autograd`
/// (candle's graph keeps every op input; it is not enumerable from outside).
pub fn declare_saved(variant: Variant, cfg: &Config) -> Option<Vec<SavedTensor>> {
    let Variant::Manual(s) = variant else {
        return None;
    };
    let (m, k, b) = (cfg.m(), cfg.growth, cfg.bottleneck());
    let mut out = Vec::new();
    let pieces = s.concat == Concat::Cat && s.intermediates == Intermediates::Recompute;
    if s.concat == Concat::Buffer {
        out.push(SavedTensor::owned(FEATURES, vec![cfg.c_total(), m]));
    }
    if pieces {
        out.push(SavedTensor::owned("pieces.0", vec![cfg.channels, m]));
        for j in 0..cfg.depth {
            out.push(SavedTensor::owned(format!("pieces.{}", j + 1), vec![k, m]));
        }
    }
    for i in 0..cfg.depth {
        let c = cfg.c_in(i);
        let own_or_view = |name: String, shape: Vec<usize>| {
            if s.concat == Concat::Buffer {
                SavedTensor::view(name, shape, FEATURES)
            } else {
                SavedTensor::owned(name, shape)
            }
        };
        if !pieces {
            out.push(own_or_view(format!("layer{i}.x"), vec![c, m]));
        }
        // BN's per-channel table (mean; invstd; scale; shift), see `maths::BnStats`
        let stats = |out: &mut Vec<SavedTensor>, which: &str, ch: usize| {
            out.push(SavedTensor::owned(
                format!("layer{i}.{which}.stats"),
                vec![4, ch],
            ));
        };
        match (cfg.family, s.intermediates) {
            (Family::Mlp, _) => {
                let name = format!("layer{i}.out");
                out.push(if pieces {
                    SavedTensor::view(name, vec![k, m], &format!("pieces.{}", i + 1))
                } else {
                    own_or_view(name, vec![k, m])
                });
            }
            (Family::Bc, Intermediates::Store) => {
                stats(&mut out, "bn1", c);
                out.push(SavedTensor::owned(format!("layer{i}.r"), vec![c, m]));
                out.push(SavedTensor::owned(format!("layer{i}.z"), vec![b, m]));
                stats(&mut out, "bn2", b);
                out.push(SavedTensor::owned(format!("layer{i}.s"), vec![b, m]));
            }
            (Family::Bc, Intermediates::Recompute) => {
                stats(&mut out, "bn1", c);
                stats(&mut out, "bn2", b);
            }
        }
    }
    Some(out)
}

/// Bytes of [`declare_saved`], or `None` for `autograd`.
pub fn declared_saved_bytes(variant: Variant, cfg: &Config) -> Option<usize> {
    declare_saved(variant, cfg).map(|s| saved_bytes(&s, cfg.dtype_size()))
}

/// Live-bytes bookkeeping for the predicted trace of one step.
struct Trace<'a> {
    live: i128,
    peak: i128,
    /// Bytes per element.
    s: i128,
    /// Bytes gemm packs into while a dense product runs (CPU), see [`Trace::product`].
    pack: i128,
    /// What the allocator charges for one allocation of so many bytes ([`Charge`]).
    charge: Charge<'a>,
    /// Every distinct allocation size (bytes, before the charge) the trace made.
    sizes: BTreeSet<u64>,
}

impl<'a> Trace<'a> {
    fn new(cfg: &Config, pack: i128, charge: Charge<'a>) -> Self {
        Trace {
            live: 0,
            peak: 0,
            s: cfg.dtype_size() as i128,
            pack,
            charge,
            sizes: BTreeSet::new(),
        }
    }
    /// A matrix product runs: gemm's packing buffers are live while it does ([`Trace::pack`]).
    fn product(&mut self) {
        self.peak = self.peak.max(self.live + self.pack);
    }
    /// One allocation of `elems` elements (one tensor's storage).
    fn alloc(&mut self, elems: usize) {
        let bytes = elems as u64 * self.s as u64;
        self.sizes.insert(bytes);
        self.live += (self.charge)(bytes) as i128;
        self.peak = self.peak.max(self.live);
    }
    /// The allocation of `elems` elements made by an earlier [`Trace::alloc`] is freed.
    fn free(&mut self, elems: usize) {
        self.live -= (self.charge)(elems as u64 * self.s as u64) as i128;
    }
    /// BN1 → ReLU of a bc layer's input `[c, M]`: r, left live.
    fn bn1_relu(&mut self, c: usize, m: usize, copy: bool) {
        self.alloc(c * m); // BN1 output
        if copy {
            self.alloc(c * m); // ReLU copy
            self.free(c * m);
        }
    }
    /// BN1 → ReLU → Conv1×1 → BN2 → ReLU of a bc layer with `c` inputs and a bottleneck of `b`
    /// (`block::bc_front`), leaving z and s `[b, M]` live, and r `[c, M]` if `keep_r` (else
    /// freed once Conv1×1 has read it): in forward with each BN's per-channel table made (and
    /// kept: the running stats are the step's results), recomputed in backward from the saved
    /// tables (`forward` false).
    ///
    /// `split` (the CPU's kernels): a front that does not keep r makes it a column chunk at a
    /// time (`maths::bn_relu_conv1_chunked`), each multiplied into z and freed.
    #[allow(clippy::too_many_arguments)]
    fn bc_front(
        &mut self,
        c: usize,
        b: usize,
        m: usize,
        copy: bool,
        forward: bool,
        keep_r: bool,
        split: bool,
    ) {
        if forward {
            self.alloc(6 * c); // BN1's table and running stats
        }
        if split && !keep_r {
            self.alloc(b * m); // z, a column chunk at a time
            for (_, w) in crate::maths::front_chunks(m) {
                self.bn1_relu(c, w, copy); // the chunk's r
                self.product();
                self.free(c * w);
            }
        } else {
            self.bn1_relu(c, m, copy);
            self.alloc(b * m); // z = Conv1×1
            self.product();
            if !keep_r {
                self.free(c * m); // r, read by Conv1×1 only (recomputed in backward for dW1)
            }
        }
        if forward {
            self.alloc(2 * b); // z's (mean; var)
            self.alloc(6 * b); // BN2's table and running stats
            self.free(2 * b);
        }
        self.alloc(b * m); // BN2 output
        if copy {
            self.alloc(b * m);
            self.free(b * m);
        }
    }

    /// A bc layer front's backward from dz `[b, M]` over `c` input channels, all channels at
    /// once (`block::Front::backward_whole`): dW1 from r (remade first if `remake_r`; saved or
    /// recomputed r is freed after it), then dr and ReLU1's and BN1's backward, dx added into
    /// the gradient buffer or (`cat`) into the new input gradient made then.
    #[allow(clippy::too_many_arguments)]
    fn front_bwd_whole(
        &mut self,
        c: usize,
        b: usize,
        m: usize,
        copy: bool,
        remake_r: bool,
        cat: bool,
        path: Kernels,
    ) {
        if remake_r {
            self.bn1_relu(c, m, copy); // r again, for dW1 (`block::bc_backward`)
        }
        if path == Kernels::Cpu {
            self.alloc(b * c); // dW1ᵀ, transposed into dW1
            self.product();
            self.alloc(b * c); // dW1 (kept)
            self.free(b * c);
        } else {
            self.alloc(b * c); // dW1 (kept)
        }
        self.free(c * m); // r (ReLU1's backward masks from x and BN1's table)
        self.alloc(c * m); // dr
        self.product();
        self.free(b * m); // dz
        if copy {
            self.alloc(c * m); // ReLU1 backward copy
            self.free(c * m); // dr
        }
        if cat {
            self.alloc(c * m); // new input gradient: the previous one's prefix, dx added in
        } // buffer: BN1's backward adds dx straight into the gradient buffer
        self.alloc(5 * c); // BN1's sums and coefficients, kept for dγ1, dβ1
        self.free(c * m); // BN1 grad input
    }

    /// [`Trace::front_bwd_whole`] split (`block::Front::backward_blocked`, the CPU's): dW1 a
    /// column group at a time (`recompute`: the group's r `[C, ≤ 4096]` remade; else columns of
    /// the saved r, freed after), then dr, ReLU1's and BN1's backward a block of channels at a
    /// time.
    fn front_bwd_split(
        &mut self,
        c: usize,
        b: usize,
        m: usize,
        copy: bool,
        recompute: bool,
        cat: bool,
    ) {
        self.alloc(b * c); // dW1ᵀ, summed a column chunk at a time
        for (_, n) in crate::maths::dw_groups(m) {
            if recompute {
                self.bn1_relu(c, n, copy); // the group's r
            }
            self.product();
            if recompute {
                self.free(c * n);
            }
        }
        if !recompute {
            self.free(c * m); // r (saved), read by the blocks
        }
        self.alloc(b * c); // dW1 (kept), transposed
        self.free(b * c);
        let blocks = crate::maths::grad_blocks(c);
        for (j, &(_, n)) in blocks.iter().enumerate() {
            self.alloc(4 * n); // the block's BN1 table
            self.alloc(n * m); // the block's dr
            self.product();
            if copy {
                self.alloc(n * m); // ReLU1 backward copy
                self.free(n * m); // dr
            }
            if cat && j == 0 {
                self.alloc(c * m); // new input gradient: the previous one's prefix
            }
            self.alloc(5 * n); // BN1's sums and coefficients of the block
            self.free(n * m); // the block's BN1 grad input
            self.free(4 * n);
        }
        self.free(b * m); // dz
        if blocks.len() > 1 {
            self.alloc(c); // dγ1 (kept), gathered from the blocks
            self.alloc(c); // dβ1 (kept)
            for &(_, n) in &blocks {
                self.free(5 * n);
            }
        } // one block: dγ1 and dβ1 are rows of its sums (kept)
    }
}

/// What an allocator charges for one allocation of `bytes`: the identity for the CPU's counting
/// allocator (exact request sizes), the rounded-up block for a GPU memory pool (measured on the
/// device, see [`allocation_sizes`]). The model is a sequence of single allocations and frees,
/// so a charge applies to each tensor as the allocator sees it.
pub type Charge<'a> = &'a dyn Fn(u64) -> u64;

/// The identity [`Charge`]: exact request sizes.
pub fn exact(bytes: u64) -> u64 {
    bytes
}

/// Allowance for the bytes gemm allocates per matrix product to pack its operands, on top of
/// the output. Measured here with the counting allocator: 9 KiB for small products, 38 KiB for
/// [48, 200] @ [200, 65536], 264 KiB for [64, 4000] @ [4000, 4096] in f32 (twice in f64); it
/// depends on the shapes and the CPU's cache sizes, so the model carries one middle allowance
/// per compute thread (the CPU's products run as concurrent panels, each packing its own
/// operands: [`crate::dense`]), live only while a dense product (Linear, Conv1×1) runs — the
/// 3×3 kernel's per-tile products pack a few KiB, not counted. Under 1% of any default-sweep
/// peak. Capped by [`packing_allowance`] for blocks whose products are smaller than it.
pub const GEMM_PACKING_ALLOWANCE_BYTES: u64 = 128 * 1024;

/// The packing allowance per compute thread for `cfg`: [`GEMM_PACKING_ALLOWANCE_BYTES`], or
/// less where the block's dense products are smaller. gemm packs (a block of) the right-hand
/// operand and, for some shapes, the left-hand one: for a product `[m, k] · [k, n]` at most
/// `k·(m + n)` elements plus the rounding to its register tiles (`MR + NR` ≤ 24 rows or columns)
/// and two cache-line alignments. With C the widest layer input, o = max(bottleneck, growth)
/// and M the columns (images for mlp), the step's products are Conv1×1 or Linear forward
/// (`k = C`, `m + n = o + M`), their input gradients (`k = o`, `C + M`) and their weight
/// gradients (`k = M` at most, `o + C`); never less than [`GEMM_PACKING_FLOOR_BYTES`]. Without
/// the cap a block whose step needs 10–300 KB (the quick sweep's) was predicted 2–20× too
/// high: 128 KiB per thread that gemm never allocates there. Blocks with products of more than
/// 128 KiB (every test config and default sweep row) are unchanged.
pub fn packing_allowance(cfg: &Config) -> u64 {
    const TILES: u64 = 24;
    const ALIGN: u64 = 2 * 128;
    let elem = cfg.dtype.size_in_bytes() as u64;
    let c = cfg.c_in(cfg.depth.saturating_sub(1)) as u64;
    let o = cfg.bottleneck().max(cfg.growth) as u64;
    let m = cfg.m() as u64;
    let product = |k: u64, mn: u64| k.saturating_mul(mn.saturating_add(TILES));
    let bound = product(c, o + m)
        .max(product(o, c + m))
        .max(product(m, o + c))
        .saturating_mul(elem)
        .saturating_add(ALIGN);
    GEMM_PACKING_ALLOWANCE_BYTES.min(bound.max(GEMM_PACKING_FLOOR_BYTES))
}

/// The smallest peak the model's ±5% is claimed for. Below about 1 MiB, a few KiB the model
/// does not follow (candle's tensor headers and shape vectors, gemm's and the 3×3 kernel's
/// small buffers, whether gemm packs a tiny operand at all) are a visible fraction of the peak:
/// the quick sweep's blocks (peaks of 14–330 KB) land at ×0.5…×1.1 of the prediction, while
/// the tests' (≥ 9 MB) and the default sweep's (≥ 1.8 MB) land within ±5%. Figures and reports
/// say so rather than count such rows.
pub const MODEL_MIN_PEAK_BYTES: u64 = 1 << 20;

/// The least [`packing_allowance`]: what gemm was measured to allocate for small products
/// (9 KiB, [`GEMM_PACKING_ALLOWANCE_BYTES`]).
pub const GEMM_PACKING_FLOOR_BYTES: u64 = 9 * 1024;

/// Predicted peak bytes of one training step above the baseline (parameters, input and
/// upstream gradient allocated), or `None` for `autograd` (candle's graph is not modelled).
///
/// The prediction replays, allocation by allocation, what [`crate::block::step_manual`] does:
/// every full-size tensor (`[C, M]`, `[B, M]`, `[k, M]`, on a GPU `[9k, M]`), every parameter
/// gradient, the convolution's scratch tiles, and the per-channel tables of BN (planar
/// `[Q, C]`: the features' statistics, each BN's `[6, C]` table and running stats, kept to the
/// end of the step, and its backward's `[5, C]` sums, kept for dγ and dβ). The tables are
/// O(C) next to O(C·M), but a memory pool may charge a small allocation a whole block, so
/// each is an allocation of its own in the trace.
/// Written out as formulas (s = bytes per element, M = N·H·W, C_i = C0 + i·k, B = bn_size·k):
///
/// - forward keeps `declare_saved` (e.g. `buffer-*`: the buffer C_L·M; `cat-store` bc:
///   Σ_i (2·C_i + 2·B)·M; `cat-recompute`: the pieces C_L·M) plus the block output;
/// - the largest forward transient of bc layer i is BN1's output and ReLU's copy
///   (`copy`: 2·C_i·M, `inplace`: C_i·M; CPU, `recompute`: a column chunk of them,
///   C_i·M_f with M_f ≤ `maths::FRONT_CHUNK_COLUMNS`, see `maths::bn_relu_conv1_chunked`),
///   then Conv1×1/BN2/ReLU2 (B·M each), and Conv3×3's scratch (CPU: one tile per thread;
///   other devices: the tap products of one chunk of whole images, 9k·M_c with
///   M_c = `maths::tap_chunk_images`·H·W, see `maths::TAP_CHUNK_COLUMNS`);
/// - backward adds the upstream gradient C_L·M (the gradient buffer for `buffer-*`), and for
///   layer i: the recomputed front (`recompute`: z and s, r freed once Conv1×1 has read it, in
///   forward too), Conv3×3's scratch (CPU: tiles and the weight gradient's partial sums; other
///   devices: the shifted gradients of one chunk, 9k·M_c), then BN2's backward, then the
///   front's:
///   - CPU (`maths::split_front`): dW1 a column group of `maths::FRONT_CHUNK_COLUMNS` at a
///     time (`recompute`: the group's r remade, C_i·4096, twice with `copy`; `store`: columns
///     of the saved r, freed after), then `dr`, ReLU1's and BN1's backward a block of
///     `maths::GRAD_BLOCK_ROWS` rows at a time (n·M, twice with `copy`);
///   - other devices: r again (`recompute` where [`Schedule::defer_r`]: one BN1 apply more,
///     C_i·M not live through the convolution's backward) for dW1, then `dr` and `da` of
///     C_i·M each (`inplace` ReLU saves one; ReLU1's backward masks from the layer input and
///     BN1's table, so the recomputed or saved `r` is freed first);
///
///   BN1's `dx` is added straight into the gradient buffer (`buffer`) or into the new input
///   gradient C_i·M, a copy of the old one's prefix made when BN1's backward first needs it,
///   before the old C_{i+1}·M is freed (`cat`); mlp layers add their `dx` the same way (on a
///   GPU too: cuBLAS with β = 1).
///
/// The tests check this against the counting allocator on small configs (exact on CPU), and
/// the [`Kernels::TapStack`] trace against the CPU running that path
/// ([`crate::maths::with_tap_stack_on_cpu`]), at request sizes and under block-allocator
/// rounding ([`predict_peak_bytes_charged`]).
pub fn predict_peak_bytes(variant: Variant, cfg: &Config) -> Option<u64> {
    predict_peak_bytes_with(variant, cfg, Kernels::Cpu)
}

/// Which kernels a device runs, which sets the transients of the bc layer's 3×3 convolution
/// (see [`crate::maths::conv3x3_fwd`]) and of the dense products (see
/// [`crate::maths::dense_fwd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// The CPU's: the direct 3×3 kernel ([`crate::conv3x3`]: one scratch tile per thread, and
    /// the weight gradient's [`conv3x3::WEIGHT_GROUPS`] partial sums), and dense products that
    /// add into their destination ([`crate::dense`]: the Linear bias is the output's first value,
    /// the mlp input gradient goes straight into the gradient of the layer input).
    Cpu,
    /// A GPU's: the tap-stacked weight `[9k, B]` and tap products / shifted gradients `[9k, M]`;
    /// the other products through candle's matmul into new tensors, except Linear's (bias)
    /// and the mlp input gradient, added into their destination as on the CPU (cuBLAS with
    /// β = 1). The CPU takes this path inside [`crate::maths::with_tap_stack_on_cpu`].
    TapStack,
}

/// [`predict_peak_bytes`] for a device's kernels: [`Kernels::Cpu`] on the CPU,
/// [`Kernels::TapStack`] on a GPU.
pub fn predict_peak_bytes_with(variant: Variant, cfg: &Config, path: Kernels) -> Option<u64> {
    predict_peak_bytes_charged(variant, cfg, path, &exact)
}

/// [`predict_peak_bytes_with`] under an allocator that charges `charge(bytes)` for each
/// allocation of `bytes` (a GPU memory pool's rounding): every tensor of the trace is charged
/// on its own, so rounding is modelled allocation by allocation, not on the sum.
pub fn predict_peak_bytes_charged(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
    charge: Charge<'_>,
) -> Option<u64> {
    trace(variant, cfg, path, charge).map(|t| t.peak.max(0) as u64)
}

/// The distinct sizes in bytes of the allocations the model of `variant` on `cfg` makes (`None`
/// for `autograd`): what a GPU child measures the pool's charge for before predicting with
/// [`predict_peak_bytes_charged`].
pub fn allocation_sizes(variant: Variant, cfg: &Config, path: Kernels) -> Option<BTreeSet<u64>> {
    trace(variant, cfg, path, &exact).map(|t| t.sizes)
}

/// How a manual step runs where the strategy leaves a choice, picked by the memory model for
/// the least predicted peak ([`schedule_for`]); [`crate::step()`] runs it. The default is the
/// plain one: the tap stack in one chunk, r kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Schedule {
    /// Columns per chunk of the tap-stack 3×3 convolution (a GPU's path; 0: one chunk), see
    /// [`crate::maths::tap_chunk_images`].
    pub tap_chunk_columns: usize,
    /// A recomputing bc variant remakes ReLU1's output r `[C_i, M]` for Conv1×1's weight
    /// gradient after BN2's backward instead of keeping the recomputed front's through the 3×3
    /// convolution's backward (`block::bc_backward`): C_i·M fewer there, one BN1 apply more per
    /// layer, bitwise the same values. Where the convolution's backward does not set the peak
    /// (or the remade r with a `copy` ReLU's second tensor would), it only costs time. A whole
    /// front's choice: the CPU's split front never keeps r whole, so with
    /// [`Schedule::split_front`] it is false.
    pub defer_r: bool,
    /// The CPU's kernels split the bc layer's front ([`crate::maths::split_front`]): ReLU1's
    /// output made a column chunk at a time where it is not kept, the front's backward a
    /// column group, then a channel block at a time, so neither it nor its gradient `[C_i, M]`
    /// is ever whole; bitwise the same values (for its time, see [`SPLIT_FRONT_MIN_GAIN`]).
    pub split_front: bool,
}

/// How much a split front ([`Schedule::split_front`]) must lower a variant's predicted peak,
/// as a fraction of the whole front's, for [`schedule_for`] to pick it. The split's `dr`
/// blocks each repack `dz` (a few ms a layer on BC-100's block); since Conv1×1's weight
/// gradient is summed in column chunks ([`crate::maths::conv1_bwd_weight`]), the split
/// `buffer-recompute-inplace` step measured ×0.97 (L = 16) and ×1.00 (L = 48) of the whole
/// front's, where the block-wise split had cost ×1.05 and ×1.17 (README). It runs where it
/// saves memory that matters — the recomputing variants at BC-100's scale — not where it trims
/// 1–2% off a store variant's saved state.
pub const SPLIT_FRONT_MIN_GAIN: f64 = 0.05;

/// The [`Schedule`] of `variant` on `cfg` for a device's kernels. With the front whole: for
/// each choice of [`Schedule::defer_r`] (only recomputing bc variants have one) the tap-stack
/// chunking (`tap_chunk_columns_given`, a GPU's path only), then the choice with the lower
/// predicted peak (a tie keeps r: no extra work). On the CPU's kernels a bc variant's front
/// split ([`Schedule::split_front`]) where that lowers the peak by at least
/// [`SPLIT_FRONT_MIN_GAIN`] (never inside [`crate::maths::with_whole_front_on_cpu`] or with
/// [`crate::maths::WHOLE_FRONT_ENV`] set). An `Err` for an unreadable chunking override.
pub fn schedule_for(variant: Variant, cfg: &Config, path: Kernels) -> crate::Result<Schedule> {
    let manual_bc = matches!(variant, Variant::Manual(_)) && cfg.family == Family::Bc;
    let can_split = manual_bc && path == Kernels::Cpu && !crate::maths::whole_front_forced();
    let can_defer = matches!(variant, Variant::Manual(s)
            if s.intermediates == Intermediates::Recompute && cfg.family == Family::Bc);
    let mut best: Option<(i128, Schedule)> = None;
    for defer_r in [false, true] {
        if defer_r && !can_defer {
            continue;
        }
        let tap_chunk_columns = match path {
            Kernels::TapStack => tap_chunk_columns_given(variant, cfg, defer_r)?,
            Kernels::Cpu => 0,
        };
        let Some(t) = trace_with(
            variant,
            cfg,
            path,
            &exact,
            tap_chunk_columns,
            defer_r,
            false,
        ) else {
            break; // autograd: nothing to pick
        };
        let s = Schedule {
            tap_chunk_columns,
            defer_r,
            split_front: false,
        };
        if best.is_none_or(|(peak, _)| t.peak < peak) {
            best = Some((t.peak, s));
        }
    }
    if let (true, Some((whole, _))) = (can_split, best) {
        if let Some(t) = trace_with(variant, cfg, path, &exact, 0, false, true) {
            if (t.peak as f64) <= whole as f64 * (1.0 - SPLIT_FRONT_MIN_GAIN) {
                best = Some((
                    t.peak,
                    Schedule {
                        split_front: true,
                        ..Schedule::default()
                    },
                ));
            }
        }
    }
    Ok(best.map(|(_, s)| s).unwrap_or_default())
}

/// How far above its least possible predicted peak a variant's tap-stack chunking may leave
/// it: `tap_chunk_columns_given` picks the fewest chunks whose peak is within this fraction
/// of the peak with one image per chunk (the least the tap stack can add).
pub const TAP_CHUNK_PEAK_SLACK: f64 = 0.01;

/// Columns per chunk of the tap-stack 3×3 convolution (a GPU's path) for `variant` on `cfg`,
/// what [`crate::step()`] runs it with ([`schedule_for`] on [`Kernels::TapStack`]).
pub fn tap_chunk_columns_for(variant: Variant, cfg: &Config) -> crate::Result<usize> {
    Ok(schedule_for(variant, cfg, Kernels::TapStack)?.tap_chunk_columns)
}

/// The tap-stack chunking of `variant` on `cfg` with r deferred or not: the override if one
/// is set ([`crate::maths::tap_chunk_override`]); else the fewest chunks of whole images (the
/// fewest launches, the longest GEMMs) whose predicted peak is within [`TAP_CHUNK_PEAK_SLACK`]
/// of the peak with one image per chunk, as `images · H · W` columns, or 0 where one chunk is
/// within it (the tap transients do not set the variant's peak). For q chunks the images per
/// chunk are `⌈N/q⌉`, the most even split. An `Err` for an unreadable override.
fn tap_chunk_columns_given(variant: Variant, cfg: &Config, defer_r: bool) -> crate::Result<usize> {
    if let Some(columns) = crate::maths::tap_chunk_override()? {
        return Ok(columns);
    }
    if cfg.family != Family::Bc {
        return Ok(0);
    }
    let g = crate::maths::grid(cfg);
    let plane = g.h.saturating_mul(g.w).max(1);
    let peak = |images: usize| {
        let columns = images.saturating_mul(plane);
        trace_with(
            variant,
            cfg,
            Kernels::TapStack,
            &exact,
            columns,
            defer_r,
            false,
        )
        .map(|t| t.peak)
    };
    let Some(floor) = peak(1) else {
        return Ok(0);
    };
    let limit = floor as f64 * (1.0 + TAP_CHUNK_PEAK_SLACK);
    let n = g.n.max(1);
    let mut last = 0;
    for chunks in 1..=n {
        let images = n.div_ceil(chunks);
        if images == last {
            continue; // the same split as fewer chunks
        }
        last = images;
        if peak(images).is_some_and(|p| p as f64 <= limit) {
            return Ok(if images >= n { 0 } else { images * plane });
        }
    }
    Ok(plane)
}

/// The predicted allocation trace of one step (see [`predict_peak_bytes`]), the tap stack
/// chunked as [`tap_chunk_columns_for`] says (an unreadable override fails the step before it
/// measures anything; the trace then assumes one chunk).
fn trace<'a>(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
    charge: Charge<'a>,
) -> Option<Trace<'a>> {
    let s = schedule_for(variant, cfg, path).unwrap_or_default();
    trace_with(
        variant,
        cfg,
        path,
        charge,
        s.tap_chunk_columns,
        s.defer_r,
        s.split_front,
    )
}

/// [`trace`] with the tap stack in chunks of `columns` (see [`crate::maths::tap_chunk_images`]),
/// for a recomputing bc variant ReLU1's output remade for dW1 if `defer_r` (see
/// [`Schedule::defer_r`]), and the bc layer's front split if `split` (the CPU's kernels, see
/// [`Schedule::split_front`]).
fn trace_with<'a>(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
    charge: Charge<'a>,
    columns: usize,
    defer_r: bool,
    split: bool,
) -> Option<Trace<'a>> {
    let Variant::Manual(st) = variant else {
        return None;
    };
    let copy = st.relu == crate::variant::Relu::Copy;
    let cat = st.concat == Concat::Cat;
    let recompute = st.intermediates == Intermediates::Recompute;
    let (m, k, b, l) = (cfg.m(), cfg.growth, cfg.bottleneck(), cfg.depth);
    let (c0, ct) = (cfg.channels, cfg.c_total());
    let g = crate::maths::grid(cfg);
    // columns of one chunk of the tap-stack convolution
    let chunk = (crate::maths::tap_chunk_images(g, columns))
        .saturating_mul(g.h)
        .saturating_mul(g.w);
    let pack = match path {
        Kernels::Cpu => (packing_allowance(cfg) * rayon::current_num_threads() as u64) as i128,
        Kernels::TapStack => 0,
    };
    let mut t = Trace::new(cfg, pack, charge);
    // a split front (the CPU's kernels): r in column chunks where it is not kept, its
    // backward in column groups, then channel blocks (`maths::front_chunks`,
    // `maths::dw_groups`, `maths::grad_blocks`)
    let split = split && path == Kernels::Cpu;
    // ---- forward ----
    t.alloc(c0 * m); // input → channel-major copy
    if !cat {
        t.alloc(ct * m); // the buffer
        t.free(c0 * m); // copied in, dropped
    }
    if cfg.family == Family::Bc {
        t.alloc(2 * c0); // the features' per-channel (mean; var), see `block::ChannelStats`
    }
    for i in 0..l {
        let c = cfg.c_in(i);
        match cfg.family {
            Family::Mlp => {
                t.alloc(k * m); // the bias, then W @ x added into it
                t.product();
                if cfg.activation && copy {
                    t.alloc(k * m);
                    t.free(k * m);
                }
                if cat {
                    t.alloc((c + k) * m); // new concatenation
                    if recompute && i > 0 {
                        // previous concatenation (pieces keep y; the first is the input piece)
                        t.free(c * m);
                    }
                } else {
                    t.free(k * m); // appended, dropped
                }
            }
            Family::Bc => {
                t.bc_front(c, b, m, copy, true, !recompute, split);
                match path {
                    Kernels::Cpu => {
                        let tiles = conv3x3::scratch_elems(g, conv3x3::Pass::Forward, b, k);
                        t.alloc(9 * k * b); // stacked taps
                        t.alloc(k * m); // y
                        t.alloc(tiles);
                        t.free(tiles);
                        t.free(9 * k * b);
                    }
                    Kernels::TapStack => {
                        t.alloc(9 * k * b); // tap-stacked weight
                        t.alloc(k * m); // y, written a chunk of images at a time
                        t.alloc(9 * k * chunk); // tap products of one chunk (one buffer)
                        t.free(9 * k * chunk);
                        t.free(9 * k * b);
                    }
                }
                if i + 1 < l {
                    // y's (mean; var) appended to the features' (the last layer's never read)
                    t.alloc(2 * k);
                    t.alloc(2 * (c + k));
                    t.free(2 * c);
                    t.free(2 * k);
                }
                if cat {
                    t.alloc((c + k) * m); // new concatenation
                    if recompute {
                        if i > 0 {
                            t.free(c * m); // previous concatenation (the first is a piece)
                        }
                    } else {
                        t.free(k * m); // y (the concatenation holds it)
                    }
                } else {
                    t.free(k * m); // appended, dropped
                }
                if recompute {
                    // z, s not kept (r was freed after Conv1×1)
                    t.free(b * m);
                    t.free(b * m);
                }
            }
        }
    }
    if cfg.family == Family::Bc {
        t.free(2 * cfg.c_in(l.saturating_sub(1))); // the features' statistics, dropped
    }
    // ---- backward ----
    t.alloc(ct * m); // upstream gradient → channel-major (the gradient buffer for `buffer`)
    for i in (0..l).rev() {
        let c = cfg.c_in(i);
        let recat = cat && recompute;
        if recat {
            t.alloc(c * m); // re-concatenate the layer input
        }
        match cfg.family {
            Family::Mlp => {
                if cfg.activation && copy {
                    t.alloc(k * m); // ReLU backward copy
                }
                if cat && !recompute {
                    t.free(k * m); // saved output
                }
                if path == Kernels::Cpu {
                    t.alloc(k * c); // dWᵀ, transposed into dW
                    t.product();
                    t.alloc(k * c); // dW (kept)
                    t.free(k * c);
                    t.alloc(k); // db (kept)
                } else {
                    t.alloc(k * c); // dW (kept)
                    t.alloc(k); // db (kept)
                }
                if cat {
                    t.free(c * m); // the layer input (saved or re-concatenated)
                    t.alloc(c * m); // new input gradient: the prefix's values, dx added in
                }
                t.product(); // dx added in
                if cfg.activation && copy {
                    t.free(k * m);
                }
                if cat {
                    t.free((c + k) * m); // previous gradient
                }
            }
            Family::Bc => {
                if recompute {
                    t.bc_front(c, b, m, copy, false, !defer_r && !split, split);
                }
                match path {
                    Kernels::Cpu => {
                        let data = conv3x3::scratch_elems(g, conv3x3::Pass::Data, b, k);
                        t.alloc(9 * k * b); // flipped taps
                        t.alloc(b * m); // ds
                        t.alloc(data);
                        t.free(data);
                        t.free(9 * k * b);
                        let weight = conv3x3::scratch_elems(g, conv3x3::Pass::Weight, b, k);
                        let parts = conv3x3::weight_partial_elems(g, k, b).max(9 * k * b);
                        t.alloc(parts); // dW2 partials, summed into the first
                        t.alloc(weight);
                        t.free(weight);
                        t.alloc(9 * k * b); // dW2 (kept), the sum reordered
                        t.free(parts);
                    }
                    Kernels::TapStack => {
                        t.alloc(9 * k * b); // tap-stacked weight
                        t.alloc(b * m); // ds, written a chunk of images at a time
                        t.alloc(9 * k * b); // dW2 taps, the chunks' products added in order
                        t.alloc(9 * k * chunk); // shifted gradients of one chunk (one buffer)
                        t.free(9 * k * chunk);
                        t.alloc(9 * k * b); // dW2 (kept)
                        t.free(9 * k * b); // dW2 taps
                        t.free(9 * k * b); // tap-stacked weight
                    }
                }
                if copy {
                    t.alloc(b * m); // ReLU2 backward copy
                    t.free(b * m); // ds
                }
                t.free(b * m); // s
                t.alloc(5 * b); // BN2's (Σgy = dβ2; Σgy·x̂ = dγ2; A; B; C), kept for dγ2, dβ2
                t.alloc(b * m); // dz
                t.free(b * m); // BN2 grad input
                t.free(b * m); // z
                if split {
                    t.front_bwd_split(c, b, m, copy, recompute, cat);
                } else {
                    t.front_bwd_whole(c, b, m, copy, recompute && defer_r, cat, path);
                }
                if cat {
                    t.free(c * m); // the layer input (saved or re-concatenated)
                }
            }
        }
        if cat && cfg.family == Family::Bc {
            t.free((c + k) * m); // previous gradient
        }
    }
    Some(t)
}

/// Floating-point operations of one training step's matrix products and convolutions (the
/// model's work: forward plus the two backward products per layer; a multiply-add counts 2).
/// Recomputation is not counted, so GFLOP/s compares variants on the same useful work.
/// Element-wise ops (BN, ReLU, bias) are O(C·M) and left out.
pub fn flops(cfg: &Config) -> u64 {
    let (m, k, b) = (cfg.m() as u64, cfg.growth as u64, cfg.bottleneck() as u64);
    (0..cfg.depth)
        .map(|i| {
            let c = cfg.c_in(i) as u64;
            let forward = match cfg.family {
                Family::Mlp => 2 * k * c * m,
                Family::Bc => 2 * b * c * m + 2 * 9 * b * k * m,
            };
            3 * forward
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maths::with_tap_chunk_columns;
    use crate::variant::{Relu, Strategy};
    use crate::Spatial;

    fn manual(concat: Concat, intermediates: Intermediates, relu: Relu) -> Variant {
        Variant::Manual(Strategy {
            concat,
            intermediates,
            relu,
        })
    }

    /// The packing allowance is the full 128 KiB wherever a product is that large (BC-100's
    /// block at any depth, the forum mlp, the smallest test config) and scales down to its
    /// floor for tiny blocks, in proportion to the element size.
    #[test]
    fn the_packing_allowance_is_capped_by_the_products() {
        let bc = |depth, batch, size, dtype| Config {
            depth,
            batch,
            size: Spatial::square(size),
            dtype,
            ..Config::bc100_block()
        };
        use candle_core::DType::{F32, F64};
        for cfg in [bc(1, 64, 32, F32), bc(48, 64, 32, F32), bc(4, 16, 8, F32)] {
            assert_eq!(
                packing_allowance(&cfg),
                GEMM_PACKING_ALLOWANCE_BYTES,
                "{cfg:?}"
            );
        }
        // N = 2, 3×3: M = 18, C = 24 + 12 = 36, o = 48 (bottleneck)
        let tiny = bc(2, 2, 3, F32);
        let want = 4 * 48 * (36 + 18 + 24) + 256;
        assert_eq!(packing_allowance(&tiny), want.max(GEMM_PACKING_FLOOR_BYTES));
        let mid = bc(2, 4, 4, F32);
        let a32 = packing_allowance(&mid);
        assert!(
            GEMM_PACKING_FLOOR_BYTES < a32 && a32 < GEMM_PACKING_ALLOWANCE_BYTES,
            "{a32}"
        );
        assert_eq!(packing_allowance(&bc(2, 4, 4, F64)) - 256, 2 * (a32 - 256));
    }

    /// The torchvision-style block of the GPU sweep (batch 32, C0 = 64, k = 32, 56×56).
    fn torchvision(depth: usize) -> Config {
        Config {
            batch: 32,
            channels: 64,
            growth: 32,
            depth,
            size: Spatial::square(56),
            dtype: candle_core::DType::F32,
            ..Config::bc100_block()
        }
    }

    /// The model picks the fewest chunks of whole images within the slack of the least peak
    /// (one image per chunk), for each choice of deferring r: never more peak than that, and
    /// one chunk fewer (the next larger split) would exceed it; then the choice with the lower
    /// peak. One chunk where the tap transients do not set the peak (BC-100's block, where the
    /// layer input's gradient does), never on the mlp, and an override wins.
    #[test]
    fn the_tap_stack_is_chunked_as_little_as_the_peak_allows() {
        let bri = manual(Concat::Buffer, Intermediates::Recompute, Relu::Inplace);
        let brc = manual(Concat::Buffer, Intermediates::Recompute, Relu::Copy);
        let bc100 = |depth| Config {
            depth,
            ..Config::bc100_block()
        };
        let plane = |cfg: &Config| cfg.size.height * cfg.size.width;
        let peak_at = |v, cfg: &Config, images: usize, defer| {
            let columns = images * plane(cfg);
            trace_with(v, cfg, Kernels::TapStack, &exact, columns, defer, false)
                .unwrap()
                .peak
        };
        let mut chunked_somewhere = false;
        for cfg in [torchvision(6), torchvision(12), bc100(16), bc100(48)] {
            let n = cfg.batch;
            for v in Variant::for_config(&cfg) {
                if v == Variant::Autograd {
                    continue;
                }
                let what = format!("{v} on {}", cfg.describe());
                let mut options = Vec::new();
                for defer in [false, true] {
                    let columns = tap_chunk_columns_given(v, &cfg, defer).unwrap();
                    let images = if columns == 0 {
                        n
                    } else {
                        columns / plane(&cfg)
                    };
                    assert!(
                        columns.is_multiple_of(plane(&cfg)) && (1..=n).contains(&images),
                        "{what}"
                    );
                    assert!(columns == 0 || images < n, "{what}: a one-chunk split is 0");
                    let limit = peak_at(v, &cfg, 1, defer) as f64 * (1.0 + TAP_CHUNK_PEAK_SLACK);
                    let peak = peak_at(v, &cfg, images, defer);
                    assert!(peak as f64 <= limit, "{what}: {peak} over {limit}");
                    let chunks = n.div_ceil(images);
                    if chunks > 1 {
                        chunked_somewhere = true;
                        let fewer = n.div_ceil(chunks - 1);
                        assert!(
                            peak_at(v, &cfg, fewer, defer) as f64 > limit,
                            "{what}: {fewer} images would do"
                        );
                    }
                    options.push((peak, columns, defer));
                }
                let recomputing = matches!(v, Variant::Manual(s)
                    if s.intermediates == Intermediates::Recompute);
                let s = schedule_for(v, &cfg, Kernels::TapStack).unwrap();
                let picked = predict_peak_bytes_with(v, &cfg, Kernels::TapStack).unwrap();
                let best = if recomputing {
                    options.iter().min_by_key(|o| o.0).unwrap() // ties: the first, r kept
                } else {
                    &options[0]
                };
                assert_eq!(
                    (picked as i128, s.tap_chunk_columns, s.defer_r),
                    *best,
                    "{what}"
                );
            }
        }
        assert!(chunked_somewhere);
        // r is remade for dW1 where that lowers the peak: the leanest variant on a GPU's path;
        // not with a copy ReLU on BC-100's block, where the remade r's second tensor beside
        // dz would set it (+B rows). The CPU's path never keeps r whole in backward (its
        // blocked front), so there is nothing to defer.
        assert!(
            schedule_for(bri, &bc100(16), Kernels::TapStack)
                .unwrap()
                .defer_r
        );
        assert!(
            !schedule_for(brc, &bc100(16), Kernels::TapStack)
                .unwrap()
                .defer_r
        );
        let split = Schedule {
            split_front: true,
            ..Schedule::default()
        };
        for v in [bri, brc] {
            assert_eq!(schedule_for(v, &bc100(16), Kernels::Cpu).unwrap(), split);
            assert!(
                !schedule_for(v, &bc100(16), Kernels::TapStack)
                    .unwrap()
                    .split_front
            );
            // the split lowers the peak by more than SPLIT_FRONT_MIN_GAIN, and it is picked
            // for that: with the front whole, the leanest variant remakes r as on a GPU
            let whole = crate::maths::with_whole_front_on_cpu(|| {
                assert!(schedule_for(bri, &bc100(16), Kernels::Cpu).unwrap().defer_r);
                predict_peak_bytes(v, &bc100(16)).unwrap()
            });
            let picked = predict_peak_bytes(v, &bc100(16)).unwrap();
            assert!(
                (picked as f64) <= whole as f64 * (1.0 - SPLIT_FRONT_MIN_GAIN),
                "{v}"
            );
        }
        // naive at L = 16: the split would save under 1% (its peak is the saved state), so the
        // front stays whole, and no time is spent on it
        let naive = manual(Concat::Cat, Intermediates::Store, Relu::Copy);
        assert_eq!(
            schedule_for(naive, &bc100(16), Kernels::Cpu).unwrap(),
            Schedule::default()
        );
        assert!(
            schedule_for(brc, &torchvision(6), Kernels::TapStack)
                .unwrap()
                .defer_r
        );
        // the leanest variant of the torchvision-style block: two images per chunk, and the
        // prediction follows: the shifted gradients drop from 9k·M to 9k·2·56² (4 B each)
        let tv = torchvision(6);
        let m = 56 * 56;
        assert_eq!(tap_chunk_columns_for(bri, &tv).unwrap(), 2 * m);
        let chunked = predict_peak_bytes_with(bri, &tv, Kernels::TapStack).unwrap();
        let whole = with_tap_chunk_columns(0, || {
            predict_peak_bytes_with(bri, &tv, Kernels::TapStack).unwrap()
        });
        assert_eq!(whole - chunked, (9 * 32 * (32 - 2) * m * 4) as u64);
        // BC-100's: the layer input's gradient sets the peak, one chunk
        assert_eq!(tap_chunk_columns_for(bri, &bc100(48)).unwrap(), 0);
        let mlp = Config::tiny(Family::Mlp);
        assert_eq!(tap_chunk_columns_for(bri, &mlp).unwrap(), 0);
        // an override wins, for every variant
        with_tap_chunk_columns(m, || {
            assert_eq!(tap_chunk_columns_for(brc, &bc100(48)).unwrap(), m);
            assert_eq!(tap_chunk_columns_for(bri, &mlp).unwrap(), m);
        });
    }
}
