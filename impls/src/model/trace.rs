//! The predicted allocation trace of one step: live bytes allocation by allocation as the
//! variant's forward and backward would make them (`trace_with`), for a device's kernels
//! ([`Kernels`]) and an allocator's charge ([`Charge`]). The bottom of the memory model: the
//! schedule ([`crate::model::schedule`]) and the peak predictions ([`crate::model`]) read it.

use crate::config::variant::{Concat, Intermediates, Variant};
use crate::config::{Config, Family};
use crate::ops::conv3x3;
pub use crate::ops::conv3x3::ConvWorkspaces;
use std::collections::BTreeSet;

/// Live-bytes bookkeeping for the predicted trace of one step.
///
/// Three element sizes: a feature's ([`Trace::alloc`]: activations, their gradients and the
/// append buffers, the config's dtype), a parameter's ([`Trace::alloc_p`]: parameter
/// gradients, BN tables and running stats, the 3×3 convolution's scratch tiles and stacked
/// weights, which the CPU kernels hold in the compute type: [`Config::param_size`]), and the
/// bf16 copies of weights that a mixed-precision product reads ([`Trace::cast`]; nothing for f32
/// and f64, whose products read the weight itself). For f32 and f64 the first two are the same.
pub(crate) struct Trace<'a> {
    pub(crate) live: i128,
    pub(crate) peak: i128,
    /// Bytes per feature element.
    pub(crate) s: i128,
    /// Bytes per parameter (and table, and compute-type scratch) element.
    pub(crate) p: i128,
    /// Whether products read a copy of their weight in the features' dtype (bf16).
    pub(crate) autocast: bool,
    /// Bytes gemm packs into while a dense product runs (CPU), see [`Trace::product`].
    pub(crate) pack: i128,
    /// What the allocator charges for one allocation of so many bytes ([`Charge`]).
    pub(crate) charge: Charge<'a>,
    /// Every distinct allocation size (bytes, before the charge) the trace made.
    pub(crate) sizes: BTreeSet<u64>,
}

impl<'a> Trace<'a> {
    fn new(cfg: &Config, pack: i128, charge: Charge<'a>) -> Self {
        Trace {
            live: 0,
            peak: 0,
            s: cfg.dtype_size() as i128,
            p: cfg.param_size() as i128,
            autocast: cfg.dtype != cfg.param_dtype(),
            pack,
            charge,
            sizes: BTreeSet::new(),
        }
    }
    /// A matrix product runs: gemm's packing buffers are live while it does ([`Trace::pack`]).
    fn product(&mut self) {
        self.peak = self.peak.max(self.live + self.pack);
    }
    /// One allocation of `bytes` (one tensor's storage).
    fn alloc_bytes(&mut self, bytes: u64) {
        self.sizes.insert(bytes);
        self.live += (self.charge)(bytes) as i128;
        self.peak = self.peak.max(self.live);
    }
    /// One allocation of `elems` feature elements (one tensor's storage).
    fn alloc(&mut self, elems: usize) {
        self.alloc_bytes(elems as u64 * self.s as u64);
    }
    /// The allocation of `bytes` made by an earlier [`Trace::alloc_bytes`] is freed.
    fn free_bytes(&mut self, bytes: u64) {
        self.live -= (self.charge)(bytes) as i128;
    }
    /// The allocation of `elems` elements made by an earlier [`Trace::alloc`] is freed.
    fn free(&mut self, elems: usize) {
        self.free_bytes(elems as u64 * self.s as u64);
    }
    /// A workspace of `bytes` for one library call, freed when the call is queued (none for 0:
    /// the call then gets a null workspace, see [`ConvWorkspaces`]).
    fn workspace(&mut self, bytes: u64) {
        if bytes > 0 {
            self.alloc_bytes(bytes);
            self.free_bytes(bytes);
        }
    }
    /// One allocation of `elems` parameter-sized elements (a parameter gradient, a BN table,
    /// compute-type scratch).
    fn alloc_p(&mut self, elems: usize) {
        self.alloc_bytes(elems as u64 * self.p as u64);
    }
    /// The allocation of `elems` elements made by an earlier [`Trace::alloc_p`] is freed.
    fn free_p(&mut self, elems: usize) {
        self.free_bytes(elems as u64 * self.p as u64);
    }
    /// A weight of `elems` elements cast to the features' dtype for its products
    /// (`layer::autocast`): a feature-sized copy under mixed precision, nothing otherwise.
    fn cast(&mut self, elems: usize) {
        if self.autocast {
            self.alloc(elems);
        }
    }
    /// The copy of an earlier [`Trace::cast`] is freed.
    fn uncast(&mut self, elems: usize) {
        if self.autocast {
            self.free(elems);
        }
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
    /// time (`layer::bn_relu_conv1_chunked`), each multiplied into z and freed.
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
            self.alloc_p(6 * c); // BN1's table and running stats
        }
        self.cast(b * c); // W1 in the features' dtype
        if split && !keep_r {
            self.alloc(b * m); // z, a column chunk at a time
            for (_, w) in crate::layer::front_chunks(m) {
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
        self.uncast(b * c);
        if forward {
            self.alloc_p(6 * b); // BN2's table and running stats, with z's statistics (one op)
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
        if path.is_cpu() {
            self.alloc_p(b * c); // dW1ᵀ, transposed into dW1
            self.product();
            self.alloc_p(b * c); // dW1 (kept)
            self.free_p(b * c);
        } else {
            self.alloc_p(b * c); // dW1 (kept)
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
        self.alloc_p(5 * c); // BN1's sums and coefficients, kept for dγ1, dβ1
        self.free(c * m); // BN1 grad input
    }

    /// [`Trace::front_bwd_whole`] split (`block::Front::backward_blocked`, the CPU's): dW1 a
    /// column group at a time (`recompute`: the group's r `[C, ≤ 4096]` remade; else columns of
    /// the saved r, freed after), then dr, ReLU1's and BN1's backward a block of channels at a
    /// time.
    #[allow(clippy::too_many_arguments)]
    fn front_bwd_split(
        &mut self,
        c: usize,
        b: usize,
        m: usize,
        copy: bool,
        recompute: bool,
        cat: bool,
        path: Kernels,
    ) {
        // the CPU sums dW1ᵀ a column chunk at a time and transposes it; a GPU's path adds the
        // groups' products into dW1 itself (`layer::conv1_bwd_weight`)
        self.alloc_p(b * c); // dW1ᵀ (CPU) or dW1 (kept)
        for (_, n) in crate::layer::dw_groups(m) {
            if recompute {
                self.bn1_relu(c, n, copy); // the group's r
            }
            self.product();
            if recompute {
                self.free(c * n);
            }
        }
        if !recompute {
            self.free(c * m); // r (saved), read by the groups
        }
        if path.is_cpu() {
            self.alloc_p(b * c); // dW1 (kept), transposed
            self.free_p(b * c);
        }
        let blocks = crate::layer::grad_blocks(c);
        for (j, &(_, n)) in blocks.iter().enumerate() {
            self.alloc_p(4 * n); // the block's BN1 table
            self.alloc(n * m); // the block's dr
            self.product();
            if copy {
                self.alloc(n * m); // ReLU1 backward copy
                self.free(n * m); // dr
            }
            if cat && j == 0 {
                self.alloc(c * m); // new input gradient: the previous one's prefix
            }
            self.alloc_p(5 * n); // BN1's sums and coefficients of the block
            self.free(n * m); // the block's BN1 grad input
            self.free_p(4 * n);
        }
        self.free(b * m); // dz
        if blocks.len() > 1 {
            self.alloc_p(c); // dγ1 (kept), gathered from the blocks
            self.alloc_p(c); // dβ1 (kept)
            for &(_, n) in &blocks {
                self.free_p(5 * n);
            }
        } // one block: dγ1 and dβ1 are rows of its sums (kept)
    }
}

/// What an allocator charges for one allocation of `bytes`: the identity for the CPU's counting
/// allocator (exact request sizes), the rounded-up block for a GPU memory pool (measured on the
/// device, see [`crate::model::allocation_sizes`]). The model is a sequence of single allocations and frees,
/// so a charge applies to each tensor as the allocator sees it.
pub type Charge<'a> = &'a dyn Fn(u64) -> u64;

/// The identity [`Charge`]: exact request sizes.
pub fn exact(bytes: u64) -> u64 {
    bytes
}

/// Which kernels a device runs, which sets the transients of the bc layer's 3×3 convolution
/// (see [`crate::layer::conv3x3_fwd`]) and of the dense products (see
/// [`crate::layer::dense_fwd`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// The CPU's: the direct 3×3 kernel ([`crate::ops::conv3x3`]: one scratch tile per thread, and
    /// the weight gradient's [`conv3x3::WEIGHT_GROUPS`] partial sums), and dense products that
    /// add into their destination ([`crate::ops::dense`]: the Linear bias is the output's first value,
    /// the mlp input gradient goes straight into the gradient of the layer input).
    Cpu,
    /// A GPU's: the tap-stacked weight `[9k, B]` and tap products / shifted gradients `[9k, M]`;
    /// the other products through candle's matmul into new tensors, except Linear's (bias)
    /// and the mlp input gradient, added into their destination as on the CPU (cuBLAS with
    /// β = 1). The CPU takes this path inside [`crate::layer::with_tap_stack_on_cpu`].
    TapStack,
    /// A GPU's with cuDNN's 3×3 convolution (the `cudnn` feature; `crate::layer::conv3x3_fwd`):
    /// no tap stack and no stacked weight, the output or input gradient written by cuDNN,
    /// a workspace per call of the sizes cuDNN asks for the algorithms it runs, and under
    /// autocast the filter gradient in the features' dtype (cuDNN's rule, PyTorch's too),
    /// widened to f32; the other products as [`Kernels::TapStack`].
    Cudnn(ConvWorkspaces),
    /// A GPU's with densebench's direct 3×3 kernels ([`crate::layer::GpuConv::Direct`]): no
    /// tap stack and no stacked weight; the output or input gradient written whole, and the
    /// weight gradient's slice partials ([`conv3x3::gpu::partial_elems`], parameter dtype)
    /// beside `dW` while it is summed; the other products as [`Kernels::TapStack`].
    Direct,
}

impl Kernels {
    /// The CPU's kernels ([`Kernels::Cpu`]), whose dense products add into their destination.
    pub fn is_cpu(self) -> bool {
        self == Kernels::Cpu
    }
}

/// [`crate::model::schedule::trace`] with the tap stack in chunks of `columns` (see [`crate::layer::tap_chunk_images`]),
/// for a recomputing bc variant ReLU1's output remade for dW1 if `defer_r` (see
/// [`crate::model::schedule::Schedule::defer_r`]), and the bc layer's front split if `split` (the CPU's kernels, see
/// [`crate::model::schedule::Schedule::split_front`]).
pub(crate) fn trace_with<'a>(
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
    let copy = st.relu == crate::config::variant::Relu::Copy;
    let cat = st.concat == Concat::Cat;
    let recompute = st.intermediates == Intermediates::Recompute;
    let (m, k, b, l) = (cfg.m(), cfg.growth, cfg.bottleneck(), cfg.depth);
    let (c0, ct) = (cfg.channels, cfg.c_total());
    let g = crate::layer::grid(cfg);
    // columns of one chunk of the tap-stack convolution
    let chunk = (crate::layer::tap_chunk_images(g, columns))
        .saturating_mul(g.h)
        .saturating_mul(g.w);
    let pack = match path {
        Kernels::Cpu => (packing_allowance(cfg) * rayon::current_num_threads() as u64) as i128,
        Kernels::TapStack | Kernels::Cudnn(_) | Kernels::Direct => 0,
    };
    let mut t = Trace::new(cfg, pack, charge);
    // a split front (either path): r in column chunks where it is not kept, its backward in
    // column groups, then channel blocks (`layer::front_chunks`, `layer::dw_groups`,
    // `layer::grad_blocks`)
    // ---- forward ----
    t.alloc(c0 * m); // input → channel-major copy
    if !cat {
        t.alloc(ct * m); // the buffer
        t.free(c0 * m); // copied in, dropped
    }
    if cfg.family == Family::Bc {
        t.alloc_p(2 * c0); // the features' per-channel (mean; var), see `block::ChannelStats`
    }
    for i in 0..l {
        let c = cfg.c_in(i);
        match cfg.family {
            Family::Mlp => {
                t.cast(k * c); // W in the features' dtype
                t.cast(k); // the bias in the features' dtype, freed once broadcast
                t.alloc(k * m); // the bias, then W @ x added into it
                t.uncast(k);
                t.product();
                t.uncast(k * c);
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
                t.cast(9 * k * b); // W2 in the features' dtype
                match path {
                    Kernels::Cpu => {
                        let tiles = conv3x3::scratch_elems(g, conv3x3::Pass::Forward, b, k);
                        t.alloc_p(9 * k * b); // stacked taps (compute type)
                        t.alloc(k * m); // y
                        t.alloc_p(tiles);
                        t.free_p(tiles);
                        t.free_p(9 * k * b);
                    }
                    Kernels::TapStack => {
                        t.alloc(9 * k * b); // tap-stacked weight
                        t.alloc(k * m); // y, written a chunk of images at a time
                                        // tap products of one chunk (one buffer; f32 for bf16 features)
                        t.alloc_p(9 * k * chunk);
                        t.free_p(9 * k * chunk);
                        t.free(9 * k * b);
                    }
                    Kernels::Cudnn(ws) => {
                        t.alloc(k * m); // y
                        t.workspace(ws.forward);
                    }
                    Kernels::Direct => t.alloc(k * m), // y
                }
                t.uncast(9 * k * b);
                if i + 1 < l {
                    // y's (mean; var) appended to the features' (the last layer's never read)
                    t.alloc_p(2 * k);
                    t.alloc_p(2 * (c + k));
                    t.free_p(2 * c);
                    t.free_p(2 * k);
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
        t.free_p(2 * cfg.c_in(l.saturating_sub(1))); // the features' statistics, dropped
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
                if path.is_cpu() {
                    t.alloc_p(k * c); // dWᵀ, transposed into dW
                    t.product();
                    t.alloc_p(k * c); // dW (kept)
                    t.free_p(k * c);
                    t.alloc_p(k); // db (kept)
                } else {
                    t.alloc_p(k * c); // dW (kept)
                    if t.autocast {
                        // db = gy · 1 into f32: a column of M ones in the features' dtype
                        t.alloc(m);
                        t.alloc_p(k); // db (kept)
                        t.free(m);
                    } else {
                        t.alloc_p(k); // db (kept)
                    }
                }
                if cat {
                    t.free(c * m); // the layer input (saved or re-concatenated)
                }
                t.cast(k * c); // W in the features' dtype, for dx
                if cat {
                    t.alloc(c * m); // new input gradient: the prefix's values, dx added in
                }
                t.product(); // dx added in
                t.uncast(k * c);
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
                t.cast(9 * k * b); // W2 in the features' dtype
                match path {
                    Kernels::Cpu => {
                        let data = conv3x3::scratch_elems(g, conv3x3::Pass::Data, b, k);
                        t.alloc_p(9 * k * b); // flipped taps (compute type)
                        t.alloc(b * m); // ds
                        t.alloc_p(data);
                        t.free_p(data);
                        t.free_p(9 * k * b);
                        let weight = conv3x3::scratch_elems(g, conv3x3::Pass::Weight, b, k);
                        let parts = conv3x3::weight_partial_elems(g, k, b).max(9 * k * b);
                        t.alloc_p(parts); // dW2 partials, summed into the first
                        t.alloc_p(weight);
                        t.free_p(weight);
                        t.alloc_p(9 * k * b); // dW2 (kept), the sum reordered
                        t.free_p(parts);
                    }
                    Kernels::TapStack => {
                        t.alloc(9 * k * b); // tap-stacked weight
                        t.alloc(b * m); // ds, written a chunk of images at a time
                        t.alloc_p(9 * k * b); // dW2 taps, the chunks' products added in order
                        t.alloc(9 * k * chunk); // shifted gradients of one chunk (one buffer)
                        t.free(9 * k * chunk);
                        t.alloc_p(9 * k * b); // dW2 (kept)
                        t.free_p(9 * k * b); // dW2 taps
                        t.free(9 * k * b); // tap-stacked weight
                    }
                    Kernels::Cudnn(ws) => {
                        t.alloc(b * m); // ds
                        t.workspace(ws.data);
                        if t.autocast {
                            t.alloc(9 * k * b); // dW2 in the features' dtype (cuDNN's rule)
                            t.workspace(ws.filter);
                            t.alloc_p(9 * k * b); // dW2 (kept), widened
                            t.free(9 * k * b);
                        } else {
                            t.alloc_p(9 * k * b); // dW2 (kept)
                            t.workspace(ws.filter);
                        }
                    }
                    Kernels::Direct => {
                        t.alloc(b * m); // ds
                        let parts = conv3x3::gpu::partial_elems(g, b, k).max(1);
                        t.alloc_p(9 * k * b); // dW2 (kept)
                        t.alloc_p(parts); // its slices' partial sums, summed into it
                        t.free_p(parts);
                    }
                }
                t.uncast(9 * k * b);
                if copy {
                    t.alloc(b * m); // ReLU2 backward copy
                    t.free(b * m); // ds
                }
                t.free(b * m); // s
                t.alloc_p(5 * b); // BN2's (Σgy = dβ2; Σgy·x̂ = dγ2; A; B; C), kept for dγ2, dβ2
                t.alloc(b * m); // dz
                t.free(b * m); // BN2 grad input
                t.free(b * m); // z
                t.cast(b * c); // W1 in the features' dtype, for the front's backward
                if split {
                    t.front_bwd_split(c, b, m, copy, recompute, cat, path);
                } else {
                    t.front_bwd_whole(c, b, m, copy, recompute && defer_r, cat, path);
                }
                t.uncast(b * c);
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

/// Allowance for the bytes gemm allocates per matrix product to pack its operands, on top of
/// the output. Measured here with the counting allocator: 9 KiB for small products, 38 KiB for
/// [48, 200] @ [200, 65536], 264 KiB for [64, 4000] @ [4000, 4096] in f32 (twice in f64); it
/// depends on the shapes and the CPU's cache sizes, so the model carries one middle allowance
/// per compute thread (the CPU's products run as concurrent panels, each packing its own
/// operands: [`crate::ops::dense`]), live only while a dense product (Linear, Conv1×1) runs — the
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
    if cfg.dtype != cfg.param_dtype() {
        // bf16 operands: the products run in the thread's scratch
        // (`ops::dense::WIDEN_SCRATCH_BYTES`, made before the step): blocks packed in bf16
        // pairs for the dot-product kernel (`ops::cpu::bf16_dot`), or f32 blocks of at most
        // 128×256 by 256×256 that gemm packs without allocating per product as the f32 step's
        // whole-operand products do (measured: with the f32 allowance the model was ×0.946 …
        // ×0.975 of the allocator on an mlp block, N=2048, C0=64, k=32, L=6)
        return GEMM_PACKING_FLOOR_BYTES;
    }
    const TILES: u64 = 24;
    const ALIGN: u64 = 2 * 128;
    let elem = cfg.dtype_size() as u64;
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

/// The least [`packing_allowance`]: what gemm was measured to allocate for small products
/// (9 KiB, [`GEMM_PACKING_ALLOWANCE_BYTES`]).
pub const GEMM_PACKING_FLOOR_BYTES: u64 = 9 * 1024;
