//! The CPU's bf16 dot-product kernel for bf16-operand products (PyTorch autocast's matmuls):
//! one tile `acc [mr, nc] += a [mr, kc] · b [kc, nc]` of bf16 operands into f32 accumulators,
//! the operands packed in pairs along the inner dimension, on one of three instruction sets
//! ([`Isa`], picked once per process):
//!
//! - **AVX-512 BF16**: `vdpbf16ps` (each f32 lane adds two bf16 products), 8 × 32 outputs per
//!   micro-kernel call;
//! - **AVX2 + FMA** (every x86-64 CPU of the last decade without AVX-512 BF16): the same packed
//!   pairs, each pair's halves widened in registers (a shift and a mask) and added by two
//!   `vfmadd231ps`, the pair's odd element first, as the SDM's pseudo-code of `vdpbf16ps` adds
//!   them; the 8 × 32 block as four 4 × 16 blocks (16 ymm registers);
//! - **AVX-512F** (Intel's Xeons from Skylake-SP to Ice Lake): the AVX2 kernel's arithmetic on
//!   512-bit vectors, the whole 8 × 32 block in registers, bit for bit its sums.
//!
//! [`crate::ops::dense`]'s bf16 products take it where the CPU has any of them ([`enabled`]) and
//! otherwise widen their operands to f32 for `gemm`.
//!
//! Numerics: the two products of a pair are exact in f32 and are added into the lane one after
//! the other with round-to-nearest-even. `vdpbf16ps` takes subnormal inputs and outputs as zero
//! (the instruction's fixed DAZ/FTZ, as oneDNN's bf16 convolutions that PyTorch autocast runs
//! on such a CPU); the AVX2 kernel keeps IEEE subnormals. Every output element is summed pair by
//! pair in inner-dimension order whatever the tile's position, so results do not depend on how
//! a product is cut into tiles or threads; they differ from the widened path's `gemm` order by
//! rounding only (bounded like any f32 sum of the same terms).

use half::bf16;
use std::sync::atomic::{AtomicU8, Ordering};

/// Rows of the micro-kernel's output block.
pub(crate) const MR: usize = 8;
/// Columns of the micro-kernel's output block (two 16-lane vectors).
pub(crate) const NR: usize = 32;

/// 0: not yet decided, 1: the dot kernel on AVX-512 BF16, 3: on AVX2 + FMA, 4: on AVX-512F,
/// 2: widened (no instruction set for it, or forced) — [`mode_of`].
static MODE: AtomicU8 = AtomicU8::new(0);

/// The environment variable that picks the bf16 products' kernel: unset or `1`, the best this
/// CPU has ([`detected`]); `0`, none (the operands widened to f32 for `gemm`: the widened
/// path's bits); `avx2` or `avx512f`, that widening kernel where the CPU can run it (else the
/// best it has) — to time the kernels side by side on one machine. Read once per process.
pub const BF16_DOT_ENV: &str = "DENSEBENCH_BF16_DOT";

/// The instruction set the dot-product kernel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// `vdpbf16ps` (AVX-512 BF16, with the AVX-512F and BW the packing uses).
    Avx512Bf16,
    /// Pairs widened in registers, two FMAs each (AVX2 + FMA).
    Avx2Fma,
    /// [`Isa::Avx2Fma`]'s arithmetic on 512-bit vectors (AVX-512F and BW with FMA, without
    /// AVX-512 BF16: Intel's Xeons from Skylake-SP to Ice Lake), bit for bit the same sums.
    Avx512F,
}

fn mode_of(isa: Option<Isa>) -> u8 {
    match isa {
        Some(Isa::Avx512Bf16) => 1,
        Some(Isa::Avx2Fma) => 3,
        Some(Isa::Avx512F) => 4,
        None => 2,
    }
}

/// The instruction set bf16 products run the kernel on in this process, `None` where they are
/// widened for `gemm`: the best this CPU has ([`detected`]) unless [`BF16_DOT_ENV`] `= 0` or
/// [`force_widened`] turned the kernel off. Decided once per process.
pub fn isa() -> Option<Isa> {
    match MODE.load(Ordering::Relaxed) {
        1 => Some(Isa::Avx512Bf16),
        3 => Some(Isa::Avx2Fma),
        4 => Some(Isa::Avx512F),
        2 => None,
        _ => {
            let isa = chosen(std::env::var(BF16_DOT_ENV).ok().as_deref(), &available());
            MODE.store(mode_of(isa), Ordering::Relaxed);
            isa
        }
    }
}

/// Whether bf16 products use this kernel ([`isa`] is not `None`).
pub fn enabled() -> bool {
    isa().is_some()
}

/// The best instruction set this CPU has for the kernel: AVX-512 BF16 (with AVX-512F and BW:
/// every CPU with AVX-512 BF16 has both), else AVX-512F and BW with FMA, else AVX2 with FMA,
/// else `None`.
pub fn detected() -> Option<Isa> {
    available().first().copied()
}

/// Every instruction set this CPU can run the kernel on, the best first.
pub fn available() -> Vec<Isa> {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = std::arch::is_x86_feature_detected!("fma");
        let avx2 = std::arch::is_x86_feature_detected!("avx2") && fma;
        let mut isas = Vec::new();
        if avx2 && avx512_packing() {
            if std::arch::is_x86_feature_detected!("avx512bf16") {
                isas.push(Isa::Avx512Bf16);
            }
            isas.push(Isa::Avx512F);
        }
        if avx2 {
            isas.push(Isa::Avx2Fma);
        }
        isas
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Vec::new()
    }
}

/// The kernel [`BF16_DOT_ENV`]'s value picks among `available` (the CPU's, best first): see
/// there; a value naming a kernel the CPU cannot run, or none at all, gets the best (and says
/// so on stderr).
fn chosen(env: Option<&str>, available: &[Isa]) -> Option<Isa> {
    let best = available.first().copied();
    let want = match env.map(str::trim) {
        None | Some("1") | Some("") => return best,
        Some("0") => return None,
        Some("avx2") => Isa::Avx2Fma,
        Some("avx512f") => Isa::Avx512F,
        Some(other) => {
            eprintln!(
                "densebench: {BF16_DOT_ENV}={other:?} is none of 0, 1, avx2, avx512f: the best kernel this CPU has runs"
            );
            return best;
        }
    };
    if available.contains(&want) {
        Some(want)
    } else {
        eprintln!(
            "densebench: {BF16_DOT_ENV} asks for the {want:?} kernel, which this CPU cannot run: the best it has runs"
        );
        best
    }
}

/// Whether the packers may take their AVX-512 register transposes (AVX-512F and BW).
#[cfg(target_arch = "x86_64")]
fn avx512_packing() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// Makes every later bf16 product of this process widen its operands to f32 for `gemm`
/// (`true`), or use this kernel where [`detected`] (`false`): for timing the two side by side
/// and for testing the widened path on a CPU that can run the kernel. Process-wide; a product
/// already running keeps its choice.
pub fn force_widened(on: bool) {
    // the CPU's own best, or none: always one it can run
    force_isa(if on { None } else { detected() });
}

/// Makes every later bf16 product of this process run on `isa` (`None`: widened to f32 for
/// `gemm`), as [`force_widened`] does, for running one product on every kernel this CPU has
/// (tests, side-by-side timings); an instruction set this CPU cannot run ([`available`]) is
/// refused (`false`, nothing changed). Process-wide; a product already running keeps its
/// choice.
pub fn force_isa(isa: Option<Isa>) -> bool {
    if isa.is_some_and(|i| !available().contains(&i)) {
        return false;
    }
    MODE.store(mode_of(isa), Ordering::Relaxed);
    true
}

/// Which kernel bf16 products use in this process, in words (for a row's notes).
pub fn describe() -> &'static str {
    match isa() {
        Some(Isa::Avx512Bf16) => {
            "bf16 products: AVX-512 BF16 dot products (vdpbf16ps), f32 accumulation"
        }
        Some(Isa::Avx2Fma) => {
            "bf16 products: bf16 pairs widened in registers, AVX2 FMA, f32 accumulation"
        }
        Some(Isa::Avx512F) => {
            "bf16 products: bf16 pairs widened in registers, AVX-512F FMA, f32 accumulation"
        }
        None => "bf16 products: operands widened to f32, f32 gemm",
    }
}

/// u32 elements of the packed left block of `mr` rows and inner length `kc` ([`pack_a`]).
pub(crate) fn packed_a_len(mr: usize, kc: usize) -> usize {
    mr.next_multiple_of(MR) * kc.div_ceil(2)
}

/// u32 elements of the packed right block of `nc` columns and inner length `kc` ([`pack_b`]).
pub(crate) fn packed_b_len(nc: usize, kc: usize) -> usize {
    nc.next_multiple_of(NR) * kc.div_ceil(2)
}

/// bits of `lo` in the low half, `hi` in the high half: one pair of a packed operand.
#[inline(always)]
fn pair(lo: bf16, hi: bf16) -> u32 {
    lo.to_bits() as u32 | ((hi.to_bits() as u32) << 16)
}

/// Packs `a`'s block (`mr` rows × `kc`, element (i, p) at `a + i·rs + p·cs`) into `out`: for
/// each panel of [`MR`] rows, for each pair p of the inner dimension, the panel's rows' pairs
/// `(a[i, 2p], a[i, 2p+1])` in row order; rows past `mr` and the pair past an odd `kc` are +0.
///
/// # Safety
/// Every element of the block must be readable; `out` holds [`packed_a_len`]`(mr, kc)`; the
/// CPU can run the kernel ([`detected`]; the AVX-512 register transposes only where it has
/// AVX-512F and BW).
pub(crate) unsafe fn pack_a(
    a: *const bf16,
    rs: usize,
    cs: usize,
    mr: usize,
    kc: usize,
    out: &mut [u32],
) {
    // SAFETY: the caller's contract, row by row
    unsafe { pack_a_rows(|i| a.wrapping_add(i * rs), cs, mr, kc, out) }
}

/// [`pack_a`] of rows anywhere: row `i`'s element p at `row(i) + p·cs` (e.g. the shifted rows of
/// a tile that a stacked product reads, never stacked in memory).
///
/// # Safety
/// For every row `i < mr`, `row(i) + p·cs` must be readable for every `p < kc`; `out` holds
/// [`packed_a_len`]`(mr, kc)`; the CPU can run the kernel ([`detected`]).
pub(crate) unsafe fn pack_a_rows(
    row: impl Fn(usize) -> *const bf16,
    cs: usize,
    mr: usize,
    kc: usize,
    out: &mut [u32],
) {
    let kp = kc.div_ceil(2);
    let full = kc / 2; // pairs with both elements inside the block
    let out = &mut out[..packed_a_len(mr, kc)];
    for (panel, block) in out.chunks_exact_mut(MR * kp).enumerate() {
        // A whole panel of contiguous rows: 16 (AVX-512) or 8 (AVX2) pairs of its 8 rows at a
        // time, transposed in registers into the panel's layout ([`transposer`]); the rest pair
        // by pair.
        let mut done = 0;
        #[cfg(target_arch = "x86_64")]
        if cs == 1 && (panel + 1) * MR <= mr {
            let (step, transpose) = transposer();
            let rows: [*const u32; MR] = std::array::from_fn(|i| row(panel * MR + i) as *const u32);
            while done + step <= full {
                // SAFETY: pairs done .. done + step ≤ full of every row: inside the rows (the
                // caller's contract); the block holds kp·MR ≥ (done + step)·MR u32; the
                // transposer's instructions present (`transposer`, the caller's contract)
                unsafe {
                    transpose(
                        rows.map(|r| r.add(done)),
                        block[done * MR..(done + step) * MR].as_mut_ptr(),
                        MR,
                    )
                };
                done += step;
            }
        }
        for i in 0..MR {
            let r = panel * MR + i;
            if r >= mr {
                for p in 0..kp {
                    block[p * MR + i] = 0;
                }
                continue;
            }
            // every index below < kc: inside the row (the caller's contract)
            let base = row(r);
            if cs == 1 {
                // a pair is two adjacent elements: one unaligned 32-bit read, low half first
                // (little-endian), as `pair` puts them
                for p in done..full {
                    block[p * MR + i] =
                        u32::from_le(unsafe { (base.add(2 * p) as *const u32).read_unaligned() });
                }
            } else {
                for p in 0..full {
                    block[p * MR + i] =
                        unsafe { pair(*base.add(2 * p * cs), *base.add((2 * p + 1) * cs)) };
                }
            }
            if full < kp {
                block[full * MR + i] = pair(unsafe { *base.add(2 * full * cs) }, bf16::ZERO);
            }
        }
    }
}

/// Pairs ahead of the one [`pack_b`] interleaves whose two rows it requests into L2: a tile's
/// row segments are only `nc·2` bytes (8 lines on a tile of 256 columns), too short for the
/// hardware's stream prefetchers, so the packer otherwise waited on every row (the forward
/// `W·X` of a Linear or Conv1×1, 2 threads: ×0.86–0.88 at C = 2240 on the mlp, `gemm_shapes`).
#[cfg(target_arch = "x86_64")]
const PACK_AHEAD: usize = 4;

/// Requests rows `k` and `k + 1` (those below `kc`), elements `0 .. nc` of each, into L2.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_rows(row: &impl Fn(usize) -> *const bf16, k: usize, kc: usize, nc: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    if nc == 0 {
        return;
    }
    for r in (k..kc).take(2) {
        let at = row(r);
        for j in (0..nc).step_by(32).chain([nc - 1]) {
            // SAFETY: a prefetch reads nothing and faults on nothing (the address is formed
            // without dereferencing: wrapping arithmetic)
            unsafe { _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(j) as *const i8) };
        }
    }
}

/// `transpose(rows, dst, ld)`: see [`transposer`].
#[cfg(target_arch = "x86_64")]
type Transpose = unsafe fn([*const u32; MR], *mut u32, usize);

/// A register transpose of `MR` rows' pairs, `dst[t·ld + i] = rows[i][t]` for t < the step:
/// [`transpose_8x16`] (16 pairs) where the CPU has AVX-512F and BW, else [`transpose_8x8_avx2`]
/// (8 pairs; every CPU the kernel runs on has AVX2).
#[cfg(target_arch = "x86_64")]
fn transposer() -> (usize, Transpose) {
    if avx512_packing() {
        (16, transpose_8x16)
    } else {
        (8, transpose_8x8_avx2)
    }
}

/// `dst[t·ld + i] = rows[i][t]` for t < 16, i < 8: 16 pairs of 8 rows, each row's 16 u32 read
/// in one load, transposed with three rounds of two-source permutes (pairs of rows, then
/// quadruples, then all eight), written as eight 64-byte stores (`ld` = 8) or sixteen 32-byte
/// ones.
///
/// # Safety
/// Each `rows[i]` addresses 16 readable u32 (unaligned is fine), `dst + t·ld` 8 writable ones
/// for every t < 16; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_8x16(rows: [*const u32; MR], dst: *mut u32, ld: usize) {
    use std::arch::x86_64::*;
    /// Round 1 (u32 lanes of two rows a, b): `a[t], b[t]` for t in `first .. first + 8`.
    const fn pairs(first: u32) -> [u32; 16] {
        let mut x = [0u32; 16];
        let mut t = 0;
        while t < 8 {
            x[2 * t] = first + t as u32;
            x[2 * t + 1] = 16 + first + t as u32;
            t += 1;
        }
        x
    }
    const A_LO: [u32; 16] = pairs(0);
    const A_HI: [u32; 16] = pairs(8);
    // round 2 (u64 lanes: one t of two rows): the t-th of each, four t at a time
    const B_LO: [u64; 8] = [0, 8, 1, 9, 2, 10, 3, 11];
    const B_HI: [u64; 8] = [4, 12, 5, 13, 6, 14, 7, 15];
    // round 3 (pairs of u64 lanes: one t of four rows): rows 0-3 then 4-7 of a t, two t
    const C_LO: [u64; 8] = [0, 1, 8, 9, 2, 3, 10, 11];
    const C_HI: [u64; 8] = [4, 5, 12, 13, 6, 7, 14, 15];
    // SAFETY: the caller's contract; the index arrays are 64 bytes each
    unsafe {
        let load = |p: *const u32| _mm512_loadu_si512(p as *const __m512i);
        let r: [__m512i; MR] = std::array::from_fn(|i| load(rows[i]));
        let (a_lo, a_hi) = (load(A_LO.as_ptr()), load(A_HI.as_ptr()));
        let q = |x: &[u64; 8]| _mm512_loadu_si512(x.as_ptr() as *const __m512i);
        let (b_lo, b_hi, c_lo, c_hi) = (q(&B_LO), q(&B_HI), q(&C_LO), q(&C_HI));
        let mut out = 0;
        for idx in [a_lo, a_hi] {
            // rows (2i, 2i + 1) interleaved, t in this half's eight
            let h: [__m512i; 4] =
                std::array::from_fn(|i| _mm512_permutex2var_epi32(r[2 * i], idx, r[2 * i + 1]));
            for b in [b_lo, b_hi] {
                let (x, y) = (
                    _mm512_permutex2var_epi64(h[0], b, h[1]),
                    _mm512_permutex2var_epi64(h[2], b, h[3]),
                );
                for c in [c_lo, c_hi] {
                    // pairs 2·out and 2·out + 1, eight rows each
                    let v = _mm512_permutex2var_epi64(x, c, y);
                    if ld == MR {
                        _mm512_storeu_si512(dst.add(out * 2 * MR) as *mut __m512i, v);
                    } else {
                        let at = |t: usize| dst.add(t * ld) as *mut __m256i;
                        _mm256_storeu_si256(at(2 * out), _mm512_castsi512_si256(v));
                        _mm256_storeu_si256(at(2 * out + 1), _mm512_extracti64x4_epi64::<1>(v));
                    }
                    out += 1;
                }
            }
        }
    }
}

/// `dst[t·ld + i] = rows[i][t]` for t, i < 8: 8 pairs of 8 rows, each row's 8 u32 read in one
/// load, transposed with 32-bit and 64-bit interleaves and 128-bit lane permutes (AVX2's
/// [`transpose_8x16`]).
///
/// # Safety
/// Each `rows[i]` addresses 8 readable u32 (unaligned is fine), `dst + t·ld` 8 writable ones
/// for every t < 8; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose_8x8_avx2(rows: [*const u32; MR], dst: *mut u32, ld: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract
    unsafe {
        let r: [__m256i; MR] =
            std::array::from_fn(|i| _mm256_loadu_si256(rows[i] as *const __m256i));
        // t in (0, 1, 4, 5) / (2, 3, 6, 7) of rows (2i, 2i + 1), interleaved
        let lo: [__m256i; 4] =
            std::array::from_fn(|i| _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]));
        let hi: [__m256i; 4] =
            std::array::from_fn(|i| _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]));
        // rows 0-3 / 4-7 of one t per 128-bit lane: t = 0, 4 (q[0]), 1, 5, 2, 6, 3, 7
        let q = [
            _mm256_unpacklo_epi64(lo[0], lo[1]),
            _mm256_unpackhi_epi64(lo[0], lo[1]),
            _mm256_unpacklo_epi64(hi[0], hi[1]),
            _mm256_unpackhi_epi64(hi[0], hi[1]),
        ];
        let w = [
            _mm256_unpacklo_epi64(lo[2], lo[3]),
            _mm256_unpackhi_epi64(lo[2], lo[3]),
            _mm256_unpacklo_epi64(hi[2], hi[3]),
            _mm256_unpackhi_epi64(hi[2], hi[3]),
        ];
        for t in 0..4 {
            // q[t]: rows 0-3 at t (low lane) and t + 4 (high lane); w[t] the same of rows 4-7
            let first = _mm256_permute2x128_si256::<0x20>(q[t], w[t]);
            let second = _mm256_permute2x128_si256::<0x31>(q[t], w[t]);
            _mm256_storeu_si256(dst.add(t * ld) as *mut __m256i, first);
            _mm256_storeu_si256(dst.add((t + 4) * ld) as *mut __m256i, second);
        }
    }
}

/// [`pack_a`] of a block given element by element, `get(i, p)` for `i < mr`, `p < kc` (a
/// weight rearranged as it is packed; scalar, for blocks packed once per pass).
pub(crate) fn pack_a_with(
    get: impl Fn(usize, usize) -> bf16,
    mr: usize,
    kc: usize,
    out: &mut [u32],
) {
    let kp = kc.div_ceil(2);
    let out = &mut out[..packed_a_len(mr, kc)];
    for (panel, block) in out.chunks_exact_mut(MR * kp).enumerate() {
        for i in 0..MR {
            let r = panel * MR + i;
            for p in 0..kp {
                let at = |q: usize| {
                    if r < mr && q < kc {
                        get(r, q)
                    } else {
                        bf16::ZERO
                    }
                };
                block[p * MR + i] = pair(at(2 * p), at(2 * p + 1));
            }
        }
    }
}

/// Packs `b`'s block (`kc` × `nc` columns, element (p, j) at `b + p·rs + j·cs`) into `out`: for
/// each panel of [`NR`] columns, for each pair p of the inner dimension, the panel's columns'
/// pairs `(b[2p, j], b[2p+1, j])` in column order; columns past `nc` and the pair past an odd
/// `kc` are +0.
///
/// # Safety
/// Every element of the block must be readable; `out` holds [`packed_b_len`]`(nc, kc)`; the
/// CPU can run the kernel ([`detected`]).
pub(crate) unsafe fn pack_b(
    b: *const bf16,
    rs: usize,
    cs: usize,
    kc: usize,
    nc: usize,
    out: &mut [u32],
) {
    if rs == 1 && cs != 1 {
        // a transposed operand: a column's pair is two adjacent elements
        let kp = kc.div_ceil(2);
        let out = &mut out[..packed_b_len(nc, kc)];
        for (panel, block) in out.chunks_exact_mut(NR * kp).enumerate() {
            let j0 = panel * NR;
            let cols = NR.min(nc - j0);
            // The panel's whole groups of MR columns: 16 (AVX-512) or 8 (AVX2) pairs of MR
            // columns at a time, each column's pairs one load, transposed in registers
            // ([`transposer`]) into the panel's rows of NR. A last panel of fewer than NR
            // columns takes it too (a bc layer's `dzᵀ` of 48 columns: its second panel of 16
            // had been read pair by pair, 16 columns 2¹⁷ bytes apart, one cache set).
            let mut done = 0;
            let grouped = if cfg!(target_arch = "x86_64") {
                cols / MR * MR
            } else {
                0
            };
            #[cfg(target_arch = "x86_64")]
            if grouped > 0 {
                let (step, transpose) = transposer();
                let full = kc / 2;
                while done + step <= full {
                    for g in 0..grouped / MR {
                        let starts: [*const u32; MR] = std::array::from_fn(|i| {
                            b.wrapping_add(2 * done + (j0 + g * MR + i) * cs) as *const u32
                        });
                        // SAFETY: pairs done .. done + step ≤ full of the group's columns
                        // (< cols): inside the block (the caller's contract); the block holds
                        // kp·NR ≥ (done + step)·NR u32; the instructions present (as in
                        // pack_a_rows)
                        unsafe { transpose(starts, block[done * NR + g * MR..].as_mut_ptr(), NR) };
                    }
                    done += step;
                }
            }
            // pair by pair: the columns past the groups in the rows they filled, every column
            // in the rows after; then the padding
            for p in 0..kp {
                let dst = &mut block[p * NR..(p + 1) * NR];
                let (k0, k1) = (2 * p, 2 * p + 1);
                let first = if p < done { grouped } else { 0 };
                for (j, d) in dst[..cols].iter_mut().enumerate().skip(first) {
                    // SAFETY: rows k0 (and k1 where < kc), column j0 + j: inside the block
                    let at = unsafe { b.add(k0 + (j0 + j) * cs) };
                    *d = if k1 < kc {
                        u32::from_le(unsafe { (at as *const u32).read_unaligned() })
                    } else {
                        pair(unsafe { *at }, bf16::ZERO)
                    };
                }
                dst[cols..].fill(0);
            }
        }
        return;
    }
    // SAFETY: the caller's contract, row by row; rows in memory, requested ahead
    unsafe { pack_b_rows_ahead(|p| b.wrapping_add(p * rs), cs, kc, nc, out, true) }
}

/// [`pack_b`] of rows anywhere: row `p`'s element j at `row(p) + j·cs` (e.g. the shifted rows
/// of a tile, or a tile's rows from a column on, never copied into a block).
///
/// # Safety
/// For every row `p < kc`, `row(p) + j·cs` must be readable for every `j < nc`; `out` holds
/// [`packed_b_len`]`(nc, kc)`; the CPU can run the kernel ([`detected`]).
pub(crate) unsafe fn pack_b_rows(
    row: impl Fn(usize) -> *const bf16,
    cs: usize,
    kc: usize,
    nc: usize,
    out: &mut [u32],
) {
    // SAFETY: the caller's contract (the rows of a tile in cache: nothing requested ahead)
    unsafe { pack_b_rows_ahead(row, cs, kc, nc, out, false) }
}

/// [`pack_b_rows`], with `ahead` the rows [`PACK_AHEAD`] pairs on requested into L2 as it goes
/// (contiguous rows, `cs` = 1): for an operand's rows in memory, not a tile's in cache.
///
/// # Safety
/// As [`pack_b_rows`].
unsafe fn pack_b_rows_ahead(
    row: impl Fn(usize) -> *const bf16,
    cs: usize,
    kc: usize,
    nc: usize,
    out: &mut [u32],
    ahead: bool,
) {
    let kp = kc.div_ceil(2);
    let out = &mut out[..packed_b_len(nc, kc)];
    #[cfg(target_arch = "x86_64")]
    let interleave = interleaver();
    // Pair by pair, every panel of the pair's two rows in turn: each row is read front to back
    // (the panels' segments adjacent), not a segment of every row per panel — rows a power of
    // two apart (a bc feature map's M = 65536 columns) share cache sets, so a panel's 2·kp
    // segments evicted each other before the next panel could use their lines' neighbours.
    for p in 0..kp {
        #[cfg(target_arch = "x86_64")]
        if ahead && cs == 1 {
            prefetch_rows(&row, 2 * (p + PACK_AHEAD), kc, nc);
        }
        for (panel, block) in out.chunks_exact_mut(NR * kp).enumerate() {
            let j0 = panel * NR;
            let cols = NR.min(nc - j0);
            let dst = &mut block[p * NR..(p + 1) * NR];
            let (k0, k1) = (2 * p, 2 * p + 1);
            // SAFETY (every read below): rows k0 (and k1 where < kc), columns j0 .. j0 + cols:
            // inside the rows (the caller's contract)
            #[cfg(target_arch = "x86_64")]
            if cs == 1 && cols == NR && k1 < kc {
                // two contiguous row segments interleaved, 32 columns at a time (the
                // instructions present: `interleaver`, the caller's contract)
                unsafe { interleave(row(k0).add(j0), row(k1).add(j0), dst) };
                continue;
            }
            for (j, d) in dst[..cols].iter_mut().enumerate() {
                let at = |k: usize| unsafe { *row(k).add((j0 + j) * cs) };
                let hi = if k1 < kc { at(k1) } else { bf16::ZERO };
                *d = pair(at(k0), hi);
            }
            dst[cols..].fill(0);
        }
    }
}

/// `interleave(r0, r1, dst)`: see [`interleaver`].
#[cfg(target_arch = "x86_64")]
type Interleave = unsafe fn(*const bf16, *const bf16, &mut [u32]);

/// The register interleave of two rows' 32 columns into pairs, picked once per packed block as
/// [`transposer`] is: [`interleave_32`] where the CPU has AVX-512F and BW, else
/// [`interleave_32_avx2`].
#[cfg(target_arch = "x86_64")]
fn interleaver() -> Interleave {
    if avx512_packing() {
        interleave_32
    } else {
        interleave_32_avx2
    }
}

/// `dst[j] = pair(r0[j], r1[j])` for 32 columns: two 64-byte loads, two permutes, two stores.
///
/// # Safety
/// `r0` and `r1` address 32 readable elements each; the CPU has AVX-512F and BW.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn interleave_32(r0: *const bf16, r1: *const bf16, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    /// 16-bit lanes of the output: column t / 2's element of r0 (index t / 2) then of r1
    /// (index 32 + t / 2), for columns `first ..`.
    const fn lanes(first: u16) -> [u16; 32] {
        let mut a = [0u16; 32];
        let mut t = 0;
        while t < 32 {
            a[t] = first + (t / 2) as u16 + if t % 2 == 1 { 32 } else { 0 };
            t += 1;
        }
        a
    }
    const LO: [u16; 32] = lanes(0);
    const HI: [u16; 32] = lanes(16);
    assert!(dst.len() >= 32);
    // SAFETY: the caller's contract; dst holds 32 u32 (64 + 64 bytes), checked above
    unsafe {
        let v0 = _mm512_loadu_si512(r0 as *const __m512i);
        let v1 = _mm512_loadu_si512(r1 as *const __m512i);
        let lo =
            _mm512_permutex2var_epi16(v0, _mm512_loadu_si512(LO.as_ptr() as *const __m512i), v1);
        let hi =
            _mm512_permutex2var_epi16(v0, _mm512_loadu_si512(HI.as_ptr() as *const __m512i), v1);
        _mm512_storeu_si512(dst.as_mut_ptr() as *mut __m512i, lo);
        _mm512_storeu_si512(dst.as_mut_ptr().add(16) as *mut __m512i, hi);
    }
}

/// [`interleave_32`] on AVX2: per 16 columns, two 32-byte loads, the 16-bit interleaves (which
/// stay within 128-bit lanes) and two lane permutes that put the columns back in order.
///
/// # Safety
/// `r0` and `r1` address 32 readable elements each; the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn interleave_32_avx2(r0: *const bf16, r1: *const bf16, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    assert!(dst.len() >= 32);
    // SAFETY: the caller's contract; dst holds 32 u32, checked above
    unsafe {
        for h in 0..2 {
            let v0 = _mm256_loadu_si256(r0.add(16 * h) as *const __m256i);
            let v1 = _mm256_loadu_si256(r1.add(16 * h) as *const __m256i);
            // columns 0-3 and 8-11 / 4-7 and 12-15 of this half, as pairs
            let lo = _mm256_unpacklo_epi16(v0, v1);
            let hi = _mm256_unpackhi_epi16(v0, v1);
            let out = dst.as_mut_ptr().add(16 * h) as *mut __m256i;
            _mm256_storeu_si256(out, _mm256_permute2x128_si256::<0x20>(lo, hi));
            _mm256_storeu_si256(out.add(1), _mm256_permute2x128_si256::<0x31>(lo, hi));
        }
    }
}

/// `acc += A · B` for packed blocks ([`pack_a`] of `mr` rows, [`pack_b`] of `nc` columns, inner
/// length `kc`), `acc` row-major with row stride `ldc ≥ nc.next_multiple_of(NR)` and at least
/// `mr.next_multiple_of(MR)` rows: the padding rows and columns are written too (with sums of
/// +0 pads), so callers read only the `mr × nc` corner.
///
/// # Safety
/// [`enabled`] must be true (the CPU has the instructions); `pa`, `pb` packed as above; `acc`
/// holds the padded block.
pub(crate) unsafe fn multiply_packed(
    pa: &[u32],
    pb: &[u32],
    mr: usize,
    nc: usize,
    kc: usize,
    acc: &mut [f32],
    ldc: usize,
) {
    let isa = isa().expect("multiply_packed runs where the dot kernel is enabled");
    // SAFETY: the caller's contract, on the process's instruction set
    unsafe { multiply_packed_on(isa, pa, pb, mr, nc, kc, acc, ldc) }
}

/// [`multiply_packed`] on a given instruction set (its tests run every one this CPU has
/// without touching the process's choice).
///
/// # Safety
/// As [`multiply_packed`], with `isa` one of [`available`] instead of [`enabled`].
#[allow(clippy::too_many_arguments)]
unsafe fn multiply_packed_on(
    isa: Isa,
    pa: &[u32],
    pb: &[u32],
    mr: usize,
    nc: usize,
    kc: usize,
    acc: &mut [f32],
    ldc: usize,
) {
    let kp = kc.div_ceil(2);
    let (mp, np) = (mr.next_multiple_of(MR), nc.next_multiple_of(NR));
    assert!(pa.len() >= mp * kp && pb.len() >= np * kp && ldc >= np);
    assert!(acc.len() >= (mp - MR) * ldc + np);
    for pi in 0..mp / MR {
        let a = pa[pi * MR * kp..].as_ptr();
        let row = acc[pi * MR * ldc..].as_mut_ptr();
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the blocks' sizes checked above; the instructions present (the caller's
        // contract)
        unsafe {
            match isa {
                Isa::Avx512Bf16 => {
                    for pj in 0..np / NR {
                        kernel(kp, a, pb[pj * NR * kp..].as_ptr(), row.add(pj * NR), ldc);
                    }
                }
                // the left panel widened once for every right panel
                Isa::Avx2Fma => {
                    multiply_panel_wide(kp, a, pb.as_ptr(), np / NR, row, ldc, kernel_avx2)
                }
                Isa::Avx512F => {
                    multiply_panel_wide(kp, a, pb.as_ptr(), np / NR, row, ldc, kernel_avx512f)
                }
            }
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (a, row, isa);
    }
}

/// [`multiply_packed`] with the left block read where it lies instead of packed: `mr` rows of
/// an even `kc` contiguous elements, row `i` at `a + i·rs` (a row's pairs are adjacent elements
/// already, so the kernel broadcasts them from the rows in place; [`kernel_rows`]). The same
/// sums in the same order as [`multiply_packed`] of [`pack_a`]`(a, rs, 1, mr, kc)`, bit for
/// bit; the last panel of fewer than [`MR`] rows is packed (its padding rows +0). For a block
/// that one or two right panels multiply (a weight gradient's `X`, read from memory once per
/// product instead of packed and read again): where the packed panel's reuse by many right
/// panels does not pay for its copy, and on AVX-512 BF16 only ([`fused_output`]).
///
/// # Safety
/// [`fused_output`] must be true, `kc` and `rs` even; rows `i < mr` of `kc` elements at
/// `a + i·rs` readable; `pb` packed by [`pack_b`] for `nc` columns and `kc`; `acc` as for
/// [`multiply_packed`]; `scratch` (where a last partial panel is packed) holds
/// [`packed_a_len`]`(MR, kc)` where `mr` is not a multiple of [`MR`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn multiply_rows_a(
    (a, rs): (*const bf16, usize),
    mr: usize,
    pb: &[u32],
    nc: usize,
    kc: usize,
    acc: &mut [f32],
    ldc: usize,
    scratch: &mut [u32],
) {
    assert!(fused_output() && kc.is_multiple_of(2) && rs.is_multiple_of(2));
    let kp = kc / 2;
    let (mp, np) = (mr.next_multiple_of(MR), nc.next_multiple_of(NR));
    assert!(pb.len() >= np * kp && ldc >= np);
    assert!(acc.len() >= (mp - MR) * ldc + np);
    assert!(mr.is_multiple_of(MR) || scratch.len() >= packed_a_len(MR, kc));
    for pi in 0..mp / MR {
        let rows = a.wrapping_add(pi * MR * rs);
        if (pi + 1) * MR > mr {
            let pa = &mut scratch[..packed_a_len(MR, kc)];
            // SAFETY: the panel's mr - pi·MR rows readable (the caller's contract)
            unsafe { pack_a(rows, rs, 1, mr - pi * MR, kc, pa) };
            // SAFETY: a packed panel of MR rows, the right block and acc as checked above
            unsafe { multiply_packed(pa, pb, MR, nc, kc, &mut acc[pi * MR * ldc..], ldc) };
            continue;
        }
        let row = acc[pi * MR * ldc..].as_mut_ptr();
        #[cfg(target_arch = "x86_64")]
        for pj in 0..np / NR {
            // SAFETY: MR whole rows of kc elements (kp pairs) at stride rs, the right panel and
            // acc's block as checked above; the instructions present (fused_output)
            unsafe {
                kernel_rows(
                    kp,
                    rows as *const u32,
                    rs / 2,
                    pb[pj * NR * kp..].as_ptr(),
                    row.add(pj * NR),
                    ldc,
                )
            };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (rows, row);
    }
}

/// The micro-kernel's loop, shared by [`kernel`], [`kernel_into_bf16`] and [`kernel_rows`] (a
/// macro, so that the 16 accumulators stay in registers in each): `acc [MR][2]` += the `kp`
/// pairs of the left panel `a` (broadcast) times the right panel `b`, two `vdpbf16ps` per row
/// and pair, in pair order. Row `i`'s pair `p` is the u32 at `a + p·pair_step + i·row_step`
/// (read unaligned): a packed panel's `MR` and 1 (the default), rows in place `1` and the row
/// stride in pairs ([`kernel_rows`]).
/// Expands inside an `unsafe` block of a function with AVX-512F and AVX-512 BF16 enabled and
/// `std::arch::x86_64::*` in scope.
#[cfg(target_arch = "x86_64")]
macro_rules! dot_pairs {
    ($acc:ident, $kp:expr, $a:expr, $b:expr) => {
        dot_pairs!($acc, $kp, $a, $b, MR, 1)
    };
    ($acc:ident, $kp:expr, $a:expr, $b:expr, $pair_step:expr, $row_step:expr) => {
        for p in 0..$kp {
            let bp = $b.add(p * NR);
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp as *const __m512i));
            let b1: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(bp.add(16) as *const __m512i));
            let ap = $a.add(p * $pair_step);
            for (i, row) in $acc.iter_mut().enumerate() {
                let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(
                    ap.add(i * $row_step).read_unaligned() as i32,
                ));
                row[0] = _mm512_dpbf16_ps(row[0], ai, b0);
                row[1] = _mm512_dpbf16_ps(row[1], ai, b1);
            }
        }
    };
}

/// `dst [= or +=] A · B` for packed blocks of one inner block (as [`multiply_packed`]), `dst` a
/// bf16 block of `mr × nc` (multiples of [`MR`] and [`NR`]) at row stride `ldd`, without an f32
/// accumulator in memory: each `MR × NR` block of `dst` is widened into registers (`accumulate`)
/// or starts at +0, takes its pairs in order, and is rounded to bf16 as it is stored
/// (`f32_to_bf16`'s rounding, bit for bit). The same sums, in the same order, rounded once, as
/// [`multiply_packed`] into an accumulator that was widened from `dst` and narrowed back; where
/// it runs: [`fused_output`].
///
/// # Safety
/// [`fused_output`] must be true; `pa`, `pb` packed as for [`multiply_packed`]; `dst` addresses
/// `mr` rows of `nc` writable elements at stride `ldd`, not overlapping the packed blocks.
pub(crate) unsafe fn multiply_packed_into_bf16(
    pa: &[u32],
    pb: &[u32],
    mr: usize,
    nc: usize,
    kc: usize,
    (dst, ldd): (*mut bf16, usize),
    accumulate: bool,
) {
    let kp = kc.div_ceil(2);
    assert!(mr.is_multiple_of(MR) && nc.is_multiple_of(NR) && fused_output());
    assert!(pa.len() >= mr * kp && pb.len() >= nc * kp);
    for pi in 0..mr / MR {
        for pj in 0..nc / NR {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the blocks' sizes checked above, dst's rows the caller's contract; the
            // instructions present (fused_output)
            unsafe {
                kernel_into_bf16(
                    kp,
                    pa[pi * MR * kp..].as_ptr(),
                    pb[pj * NR * kp..].as_ptr(),
                    dst.add(pi * MR * ldd + pj * NR),
                    ldd,
                    accumulate,
                )
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = (pi, pj, dst, ldd, accumulate);
        }
    }
}

/// Whether [`multiply_packed_into_bf16`] runs here: the kernel on AVX-512 BF16 ([`isa`]).
pub(crate) fn fused_output() -> bool {
    isa() == Some(Isa::Avx512Bf16)
}

/// [`kernel`] into a bf16 block: `c [MR, NR] (+)= a_panel · b_panel`, `c` widened into the
/// registers (or +0) first and rounded to nearest even as it is stored (NaN kept quiet, as
/// `f32_to_bf16`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel_into_bf16(
    kp: usize,
    a: *const u32,
    b: *const u32,
    c: *mut half::bf16,
    ldc: usize,
    accumulate: bool,
) {
    use std::arch::x86_64::*;
    let c = c as *mut u16;
    // SAFETY (the whole body): a holds kp·MR pairs, b kp·NR, c MR rows of NR bf16 at stride
    // ldc (multiply_packed_into_bf16's checks); __m512bh and __m512i are the same 512 bits.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        if accumulate {
            for (i, row) in acc.iter_mut().enumerate() {
                row[0] = widen_16(c.add(i * ldc));
                row[1] = widen_16(c.add(i * ldc + 16));
            }
        }
        dot_pairs!(acc, kp, a, b);
        for (i, row) in acc.iter().enumerate() {
            narrow_16(row[0], c.add(i * ldc));
            narrow_16(row[1], c.add(i * ldc + 16));
        }
    }
}

/// 16 bf16 at `p` widened exactly to f32 (the bits shifted up: `bf16_to_f32`).
///
/// # Safety
/// `p` addresses 16 readable bf16 bit patterns; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn widen_16(p: *const u16) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract
    unsafe {
        let h = _mm256_loadu_si256(p as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

/// 16 f32 rounded to bf16 and stored at `p`, bit for bit `f32_to_bf16` (`half`'s `from_f32`):
/// up when the dropped half is above one half, or exactly one half and the kept part odd; a NaN
/// keeps its high mantissa bits and is made quiet. (Not `vcvtneps2bf16`, which flushes
/// subnormals.)
///
/// # Safety
/// `p` addresses 16 writable bf16; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn narrow_16(v: std::arch::x86_64::__m512, p: *mut u16) {
    use std::arch::x86_64::*;
    // SAFETY: the caller's contract
    unsafe {
        let x = _mm512_castps_si512(v);
        let up = _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x8000))
            & _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x1_7fff));
        let high = _mm512_srli_epi32::<16>(x);
        let rounded = _mm512_mask_add_epi32(high, up, high, _mm512_set1_epi32(1));
        let nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(x, _mm512_set1_epi32(0x7fff_ffff)),
            _mm512_set1_epi32(0x7f80_0000),
        );
        let out = _mm512_mask_or_epi32(rounded, nan, high, _mm512_set1_epi32(0x40));
        _mm256_storeu_si256(p as *mut __m256i, _mm512_cvtepi32_epi16(out));
    }
}

/// Pairs of a left panel that [`multiply_panel_wide`] widens at a time: its f32 halves take
/// `2·MR·WIDE_PAIRS` floats (8 KiB) on the stack.
#[cfg(target_arch = "x86_64")]
const WIDE_PAIRS: usize = 128;

/// One left panel (`MR` rows, `kp` pairs at `a`) times every right panel (`panels` of them,
/// `NR` columns each, at `b`), into `c`'s `MR` rows from column 0 on (stride `ldc`): the left
/// panel's pairs widened to f32 halves once per [`WIDE_PAIRS`] (on the stack, so the kernel
/// broadcasts them from memory instead of widening them per right panel), then `kernel`
/// ([`kernel_avx2`] or [`kernel_avx512f`]) per right panel on those pairs. Each output is still
/// summed pair by pair in inner-dimension order.
///
/// # Safety
/// `a` holds `kp·MR` pairs, `b` `panels·kp·NR`, `c` `MR` rows of `panels·NR` at stride `ldc`;
/// the CPU has AVX2 and FMA, and what `kernel` needs.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn multiply_panel_wide(
    kp: usize,
    a: *const u32,
    b: *const u32,
    panels: usize,
    c: *mut f32,
    ldc: usize,
    kernel: WideKernel,
) {
    use std::arch::x86_64::*;
    let mut wide = [0f32; 2 * MR * WIDE_PAIRS];
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    for p0 in (0..kp).step_by(WIDE_PAIRS) {
        let n = WIDE_PAIRS.min(kp - p0);
        // SAFETY: pairs p0 .. p0 + n of the panel: inside a (the caller's contract); `wide`
        // holds 2·MR·n floats; MR = 8 u32 is one 32-byte vector
        unsafe {
            for p in 0..n {
                let v = _mm256_loadu_si256(a.add((p0 + p) * MR) as *const __m256i);
                let out = wide.as_mut_ptr().add(2 * MR * p);
                _mm256_storeu_ps(out, _mm256_castsi256_ps(_mm256_and_si256(v, high)));
                _mm256_storeu_ps(out.add(MR), _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v)));
            }
            for pj in 0..panels {
                kernel(
                    n,
                    wide.as_ptr(),
                    b.add(pj * NR * kp + p0 * NR),
                    c.add(pj * NR),
                    ldc,
                );
            }
        }
    }
}

/// The micro-kernel: `c [MR, NR] += a_panel · b_panel` over `kp` pairs, 16 f32 accumulators in
/// registers, two `vdpbf16ps` per row and pair.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel(kp: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize) {
    use std::arch::x86_64::*;
    // SAFETY (the whole body): a holds kp·MR pairs, b kp·NR, c MR rows of NR at stride ldc
    // (multiply_packed's checks); __m512bh and __m512i are the same 512 bits.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for (i, row) in acc.iter_mut().enumerate() {
            row[0] = _mm512_loadu_ps(c.add(i * ldc));
            row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
        }
        dot_pairs!(acc, kp, a, b);
        for (i, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc), row[0]);
            _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
        }
    }
}

/// [`kernel`] with the left panel's rows in place ([`multiply_rows_a`]): row `i`'s pair `p`
/// at `a + i·rs + p` (u32 units, read unaligned).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel_rows(kp: usize, a: *const u32, rs: usize, b: *const u32, c: *mut f32, ldc: usize) {
    use std::arch::x86_64::*;
    // SAFETY (the whole body): MR rows of kp pairs at a (stride rs), b kp·NR, c MR rows of NR
    // at stride ldc (multiply_rows_a's checks); __m512bh and __m512i are the same 512 bits.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for (i, row) in acc.iter_mut().enumerate() {
            row[0] = _mm512_loadu_ps(c.add(i * ldc));
            row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
        }
        dot_pairs!(acc, kp, a, b, 1, rs);
        for (i, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc), row[0]);
            _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
        }
    }
}

/// [`kernel`] on AVX2 + FMA, over `kp` pairs of a left panel already widened
/// ([`multiply_panel_wide`]: per pair, the `MR` rows' high halves then their low halves, as
/// f32): the `MR × NR` block as four blocks of 4 rows × 16 columns (8 accumulators and the 4
/// widened halves of the right pair vectors in registers, the left halves broadcast from
/// memory), each right pair `(lo, hi)` widened exactly (`lo` shifted up 16 bits, `hi` masked)
/// and added as `acc + a_hi·b_hi`, then `+ a_lo·b_lo`, each a fused multiply-add (the products
/// are exact in f32, so each addition rounds once, as `vdpbf16ps` adds them in the SDM).
///
/// # Safety
/// `a` holds `kp·2·MR` floats, `b` `kp·NR` pairs, `c` `MR` rows of `NR` at stride `ldc`; the
/// CPU has AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(kp: usize, a: *const f32, b: *const u32, c: *mut f32, ldc: usize) {
    use std::arch::x86_64::*;
    const ROWS: usize = 4;
    const COLS: usize = 16;
    // SAFETY (the whole body): the caller's contract; each block reads rows r0 .. r0 + 4 ≤ MR
    // of a's pairs and columns c0 .. c0 + 16 ≤ NR of b's
    unsafe {
        let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        for r0 in (0..MR).step_by(ROWS) {
            for c0 in (0..NR).step_by(COLS) {
                let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
                for (i, row) in acc.iter_mut().enumerate() {
                    let at = c.add((r0 + i) * ldc + c0);
                    row[0] = _mm256_loadu_ps(at);
                    row[1] = _mm256_loadu_ps(at.add(8));
                }
                for p in 0..kp {
                    let bp = b.add(p * NR + c0);
                    let b0 = _mm256_loadu_si256(bp as *const __m256i);
                    let b1 = _mm256_loadu_si256(bp.add(8) as *const __m256i);
                    let (b0_lo, b0_hi) = (
                        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(b0)),
                        _mm256_castsi256_ps(_mm256_and_si256(b0, high)),
                    );
                    let (b1_lo, b1_hi) = (
                        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(b1)),
                        _mm256_castsi256_ps(_mm256_and_si256(b1, high)),
                    );
                    let hi = a.add(p * 2 * MR + r0);
                    let lo = hi.add(MR);
                    for (i, row) in acc.iter_mut().enumerate() {
                        let a_hi = _mm256_broadcast_ss(&*hi.add(i));
                        row[0] = _mm256_fmadd_ps(a_hi, b0_hi, row[0]);
                        row[1] = _mm256_fmadd_ps(a_hi, b1_hi, row[1]);
                    }
                    for (i, row) in acc.iter_mut().enumerate() {
                        let a_lo = _mm256_broadcast_ss(&*lo.add(i));
                        row[0] = _mm256_fmadd_ps(a_lo, b0_lo, row[0]);
                        row[1] = _mm256_fmadd_ps(a_lo, b1_lo, row[1]);
                    }
                }
                for (i, row) in acc.iter().enumerate() {
                    let at = c.add((r0 + i) * ldc + c0);
                    _mm256_storeu_ps(at, row[0]);
                    _mm256_storeu_ps(at.add(8), row[1]);
                }
            }
        }
    }
}

/// A kernel of [`multiply_panel_wide`]: `(kp, widened left pairs, right pairs, c, ldc)`.
#[cfg(target_arch = "x86_64")]
type WideKernel = unsafe fn(usize, *const f32, *const u32, *mut f32, usize);

/// [`kernel_avx2`] on 512-bit vectors: the whole `MR × NR` block at once (16 accumulators, the
/// 4 widened halves of the right pair vectors in registers, the left halves broadcast from
/// memory), each output `acc + a_hi·b_hi`, then `+ a_lo·b_lo`, pair by pair, one fused
/// multiply-add each: the same operations on each output in the same order, so bit for bit
/// [`kernel_avx2`]'s sums.
///
/// # Safety
/// As [`kernel_avx2`]; the CPU has AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel_avx512f(kp: usize, a: *const f32, b: *const u32, c: *mut f32, ldc: usize) {
    use std::arch::x86_64::*;
    // SAFETY (the whole body): the caller's contract: a holds kp·2·MR floats, b kp·NR pairs,
    // c MR rows of NR at stride ldc
    unsafe {
        let high = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for (i, row) in acc.iter_mut().enumerate() {
            row[0] = _mm512_loadu_ps(c.add(i * ldc));
            row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
        }
        for p in 0..kp {
            let bp = b.add(p * NR);
            let b0 = _mm512_loadu_si512(bp as *const __m512i);
            let b1 = _mm512_loadu_si512(bp.add(16) as *const __m512i);
            let (b0_lo, b0_hi) = (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(b0)),
                _mm512_castsi512_ps(_mm512_and_si512(b0, high)),
            );
            let (b1_lo, b1_hi) = (
                _mm512_castsi512_ps(_mm512_slli_epi32::<16>(b1)),
                _mm512_castsi512_ps(_mm512_and_si512(b1, high)),
            );
            let hi = a.add(p * 2 * MR);
            let lo = hi.add(MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let a_hi = _mm512_set1_ps(*hi.add(i));
                row[0] = _mm512_fmadd_ps(a_hi, b0_hi, row[0]);
                row[1] = _mm512_fmadd_ps(a_hi, b1_hi, row[1]);
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let a_lo = _mm512_set1_ps(*lo.add(i));
                row[0] = _mm512_fmadd_ps(a_lo, b0_lo, row[0]);
                row[1] = _mm512_fmadd_ps(a_lo, b1_lo, row[1]);
            }
        }
        for (i, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(c.add(i * ldc), row[0]);
            _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel against the plain sum, on odd sizes (padding rows, columns and the last pair)
    /// and every operand layout the packers distinguish (rows contiguous, transposed, both
    /// strided). Small integers (times 2⁻³) keep every product and partial sum exact in f32, so
    /// any order gives the same bits and a misplaced element shows.
    #[test]
    fn the_packed_product_is_the_plain_sum() {
        let isas = available();
        if isas.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512 BF16 nor AVX2 + FMA");
            return;
        }
        let val = |s: usize| bf16::from_f32(((s * 7919 % 17) as f32 - 8.0) / 8.0);
        // (16, 71, 33): two whole panels whose rows take the register transpose for 32 of
        // their 35 pairs, then pair by pair, then the odd last element
        for (mr, kc, nc) in [
            (11, 37, 45),
            (8, 2, 32),
            (1, 1, 1),
            (17, 64, 96),
            (16, 71, 33),
            // two whole panels of B, whose transposed layout takes it too
            (16, 71, 64),
            // a last panel of 16 columns (two groups of MR, a bc layer's `dzᵀ` of 48) and one
            // of 27 (three groups, then three columns pair by pair)
            (9, 71, 48),
            (9, 40, 59),
            // the widening kernels' left panel in two pieces (150 pairs: WIDE_PAIRS, then
            // 22) across three right panels
            (9, 300, 70),
        ] {
            let a_at = |i: usize, p: usize| val(i * 131 + p);
            let b_at = |p: usize, j: usize| val(p * 71 + j + 5);
            // (rs, cs, storage) of one matrix in three layouts: rows contiguous (with a wider
            // row), transposed, every other element of every other row
            let layouts = |rows: usize, cols: usize, at: &dyn Fn(usize, usize) -> bf16| {
                let mut out = Vec::new();
                for (rs, cs) in [(cols + 3, 1), (1, rows + 2), (2 * (2 * cols + 1), 2)] {
                    let mut v = vec![bf16::NAN; (rows - 1) * rs + (cols - 1) * cs + 1];
                    for i in 0..rows {
                        for j in 0..cols {
                            v[i * rs + j * cs] = at(i, j);
                        }
                    }
                    out.push((rs, cs, v));
                }
                out
            };
            let mut packed_a = Vec::new();
            for (rs, cs, v) in layouts(mr, kc, &a_at) {
                let mut pa = vec![7u32; packed_a_len(mr, kc)];
                unsafe { pack_a(v.as_ptr(), rs, cs, mr, kc, &mut pa) };
                packed_a.push(pa);
            }
            let mut packed_b = Vec::new();
            for (rs, cs, v) in layouts(kc, nc, &b_at) {
                let mut pb = vec![7u32; packed_b_len(nc, kc)];
                unsafe { pack_b(v.as_ptr(), rs, cs, kc, nc, &mut pb) };
                packed_b.push(pb);
            }
            let mut with = vec![7u32; packed_a_len(mr, kc)];
            pack_a_with(a_at, mr, kc, &mut with);
            packed_a.push(with);
            assert!(
                packed_a.windows(2).all(|w| w[0] == w[1]),
                "A packed alike in every layout"
            );
            assert!(
                packed_b.windows(2).all(|w| w[0] == w[1]),
                "B packed alike in every layout"
            );
            let ldc = nc.next_multiple_of(NR) + 3;
            // on every instruction set this CPU has, not only the process's
            for &isa in &isas {
                let mut acc = vec![0.5f32; mr.next_multiple_of(MR) * ldc];
                unsafe {
                    multiply_packed_on(isa, &packed_a[0], &packed_b[0], mr, nc, kc, &mut acc, ldc)
                };
                for i in 0..mr {
                    for j in 0..nc {
                        let want = (0..kc)
                            .fold(0.5f32, |s, p| s + a_at(i, p).to_f32() * b_at(p, j).to_f32());
                        assert_eq!(acc[i * ldc + j], want, "{isa:?} {mr}×{kc}×{nc} ({i}, {j})");
                    }
                    // the padding columns' sums are of +0 pads, and the stride's slack past
                    // the padded block is not written: 0.5 still in both
                    for j in nc..ldc {
                        let part = if j < nc.next_multiple_of(NR) {
                            "pad"
                        } else {
                            "past"
                        };
                        assert_eq!(
                            acc[i * ldc + j],
                            0.5,
                            "{isa:?} {mr}×{kc}×{nc} {part} ({i}, {j})"
                        );
                    }
                }
            }
        }
    }
    /// The registers' rounding to bf16 (`narrow_16`, the fused output's) is `f32_to_bf16` bit
    /// for bit, and its widening (`widen_16`) exact, on every special pattern (±0, subnormals
    /// of both halves, ties to even both ways, the largest finite values that round to ∞, ±∞,
    /// signalling and quiet NaNs with payloads) and on a stride through all 2³² patterns.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn rounding_in_registers_is_f32_to_bf16_bit_for_bit() {
        if !fused_output() {
            eprintln!("skipped: this CPU has no AVX-512 BF16 (the fused output does not run)");
            return;
        }
        let mut patterns: Vec<u32> = vec![
            0,
            0x8000_0000,
            1,
            0x8000,
            0x8001,
            0x1_8000,
            0x1_7fff,
            0x7f7f_7fff,
            0x7f7f_8000,
            0x7f7f_ffff,
            0xff7f_8000,
            0x7f80_0000,
            0xff80_0000,
            0x7f80_0001,
            0x7fc0_0000,
            0xffbf_ffff,
            0x7fff_ffff,
            0x0080_0000,
            0x007f_ffff,
            0x3f80_8000,
            0x3f81_8000,
            0x3f80_8001,
            0xbf81_7fff,
        ];
        patterns.extend((0..1u64 << 32).step_by(65_537 * 3 + 2).map(|x| x as u32));
        patterns.extend((0..1u32 << 17).map(|x| 0x3f80_0000 | x));
        while !patterns.len().is_multiple_of(16) {
            patterns.push(0x7fc0_0001);
        }
        for chunk in patterns.chunks(16) {
            let v: Vec<f32> = chunk.iter().map(|&x| f32::from_bits(x)).collect();
            let mut out = [0u16; 16];
            let mut back = [0u32; 16];
            // SAFETY: 16 values in and out; AVX-512F present (fused_output)
            unsafe {
                use std::arch::x86_64::*;
                narrow_16(_mm512_loadu_ps(v.as_ptr()), out.as_mut_ptr());
                _mm512_storeu_ps(back.as_mut_ptr() as *mut f32, widen_16(out.as_ptr()));
            }
            for (i, &x) in chunk.iter().enumerate() {
                let want = crate::ops::cpu::shared::f32_to_bf16(f32::from_bits(x)).to_bits();
                assert_eq!(out[i], want, "{x:#010x} rounded");
                assert_eq!(back[i], (want as u32) << 16, "{:#06x} widened", out[i]);
            }
        }
    }

    /// `DENSEBENCH_BF16_DOT`'s values: unset, `1` or blank the best; `0` none; `avx2` and
    /// `avx512f` that kernel where available, else the best; anything else the best.
    #[test]
    fn the_environment_picks_a_kernel_the_cpu_has() {
        use Isa::*;
        let all = [Avx512Bf16, Avx512F, Avx2Fma];
        assert_eq!(chosen(None, &all), Some(Avx512Bf16));
        assert_eq!(chosen(Some("1"), &all), Some(Avx512Bf16));
        assert_eq!(chosen(Some(" "), &all), Some(Avx512Bf16));
        assert_eq!(chosen(Some("0"), &all), None);
        assert_eq!(chosen(Some(" avx2\n"), &all), Some(Avx2Fma));
        assert_eq!(chosen(Some("avx512f"), &all), Some(Avx512F));
        assert_eq!(chosen(Some("avx512f"), &[Avx2Fma]), Some(Avx2Fma));
        assert_eq!(chosen(Some("avx2"), &[]), None);
        assert_eq!(chosen(Some("fast"), &[Avx512F, Avx2Fma]), Some(Avx512F));
        assert_eq!(chosen(None, &[]), None);
    }

    /// The widening kernels (AVX2, and AVX-512F where the CPU has it) against their stated
    /// arithmetic, bit for bit, on values whose sums round: per output, pair by pair in
    /// inner-dimension order, `acc = fma(a_hi, b_hi, acc)` then `fma(a_lo, b_lo, acc)` in f32
    /// (`f32::mul_add`), from the accumulator's initial value. A kernel that added a pair's
    /// halves the other way round, or summed in another order, differs in the last bits.
    /// Includes a subnormal operand (kept, not flushed). Where the CPU has no AVX2 + FMA,
    /// skipped.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx2_kernel_adds_each_pair_high_half_first_with_one_rounding_each() {
        let isas = available();
        if !isas.contains(&Isa::Avx2Fma) {
            eprintln!("skipped: this CPU has no AVX2 + FMA");
            return;
        }
        let mut kernels: Vec<(&str, WideKernel)> = vec![("avx2", kernel_avx2)];
        if isas.contains(&Isa::Avx512F) {
            kernels.push(("avx512f", kernel_avx512f));
        } else {
            eprintln!("this CPU has no AVX-512F: the AVX2 kernel alone");
        }
        for (name, kernel) in kernels {
            check_wide_kernel(name, kernel);
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn check_wide_kernel(name: &str, kernel: WideKernel) {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut draw = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // wide magnitudes so that sums round: 2^-12 .. 2^12, both signs
            let m = (state >> 40) as f32 / (1u64 << 24) as f32 + 0.5;
            let e = ((state >> 8) % 25) as i32 - 12;
            let v = m * 2f32.powi(e) * if state & 1 == 1 { -1.0 } else { 1.0 };
            bf16::from_f32(v)
        };
        let kp = 37 + super::WIDE_PAIRS; // two widened pieces
        let a: Vec<u32> = (0..kp * MR).map(|_| pair(draw(), draw())).collect();
        let mut b: Vec<u32> = (0..kp * NR).map(|_| pair(draw(), draw())).collect();
        b[5] = pair(bf16::from_bits(0x0001), bf16::from_f32(3.0)); // a subnormal lo half
        let ldc = NR + 5;
        let init: Vec<f32> = (0..MR * ldc).map(|i| (i as f32 - 100.0) / 7.0).collect();
        let mut c = init.clone();
        unsafe { multiply_panel_wide(kp, a.as_ptr(), b.as_ptr(), 1, c.as_mut_ptr(), ldc, kernel) };
        let half = |x: u32, hi: bool| f32::from_bits(if hi { x & 0xFFFF_0000 } else { x << 16 });
        for i in 0..MR {
            for j in 0..NR {
                let mut want = init[i * ldc + j];
                for p in 0..kp {
                    let (x, y) = (a[p * MR + i], b[p * NR + j]);
                    want = half(x, true).mul_add(half(y, true), want);
                    want = half(x, false).mul_add(half(y, false), want);
                }
                assert_eq!(
                    c[i * ldc + j].to_bits(),
                    want.to_bits(),
                    "{name}: ({i}, {j})"
                );
            }
            for j in NR..ldc {
                assert_eq!(
                    c[i * ldc + j],
                    init[i * ldc + j],
                    "{name}: outside the block ({i}, {j})"
                );
            }
        }
        // the other order differs somewhere (the test can tell)
        let mut swapped_differs = false;
        for j in 0..NR {
            let mut other = init[j];
            for p in 0..kp {
                let (x, y) = (a[p * MR], b[p * NR + j]);
                other = half(x, false).mul_add(half(y, false), other);
                other = half(x, true).mul_add(half(y, true), other);
            }
            swapped_differs |= other.to_bits() != c[j].to_bits();
        }
        assert!(swapped_differs, "the draws never round: make them wider");
    }
}
