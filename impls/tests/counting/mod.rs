//! A counting global allocator shared by the tests that measure allocations exactly (each test
//! binary installs it with `#[global_allocator]`): live bytes and their high-water mark, each
//! allocation counted at its request size or, with [`set_rounding`], rounded up the way a
//! block allocator (a GPU memory pool) charges it.

use candle_core::DType;
use impls::{Config, Family, Spatial};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Live heap bytes of the test binary.
pub static LIVE: AtomicUsize = AtomicUsize::new(0);
/// Highest `LIVE` since the binary started or a test reset it.
pub static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Live bytes of the allocations a GPU's memory pool would hold: those of alignment at most
/// [`ROUNDED_MAX_ALIGN`] (tensor storage, and candle's bookkeeping, which a GPU keeps on the
/// host), not gemm's align-128 packing buffers (matmul workspace: cuBLAS keeps its own outside
/// the pool). Charged like [`LIVE`].
pub static POOL_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Highest [`POOL_LIVE`] since the binary started or a test reset it.
pub static POOL_PEAK: AtomicUsize = AtomicUsize::new(0);

/// Live allocations with the alignment of an `f32` (4): in an f32 step, exactly its live f32
/// tensor storages (a `Vec<f32>` each; candle's shapes and bookkeeping align to 8, gemm's
/// packing to 128). Counted whatever the rounding, one per allocation.
pub static LIVE_F32_STORAGES: AtomicUsize = AtomicUsize::new(0);
/// Highest [`LIVE_F32_STORAGES`] since the binary started or a test reset it.
pub static PEAK_F32_STORAGES: AtomicUsize = AtomicUsize::new(0);

/// Allocations of at least this many bytes are charged rounded up to [`GRANULE`] (0: off).
static THRESHOLD: AtomicUsize = AtomicUsize::new(0);
/// See [`THRESHOLD`].
static GRANULE: AtomicUsize = AtomicUsize::new(1);

/// From now on, allocations of at least `threshold` bytes (and alignment at most
/// [`ROUNDED_MAX_ALIGN`]) count as the next multiple of `granule` (`threshold` 0: exact sizes
/// again). Set it while nothing it would round is live:
/// a block is freed at the charge it was allocated with only if the rule did not change between.
#[allow(dead_code)]
pub fn set_rounding(threshold: usize, granule: usize) {
    GRANULE.store(granule.max(1), Relaxed);
    THRESHOLD.store(threshold, Relaxed);
}

/// What an allocation of `size` bytes costs when allocations of at least `threshold` bytes
/// (0: none) are charged as whole `granule`s.
pub fn rounded(size: usize, threshold: usize, granule: usize) -> usize {
    if threshold == 0 || size < threshold {
        return size;
    }
    size.div_ceil(granule) * granule
}

/// Alignment above which an allocation is never rounded: tensor storage is a `Vec` of its
/// element type (align 4 or 8); gemm's packing buffers (align 128) are matmul workspace, which
/// a GPU's cuBLAS keeps outside the memory pool.
const ROUNDED_MAX_ALIGN: usize = 16;

/// What an allocation `l` is counted as under the current rounding.
fn charge(l: Layout) -> usize {
    if l.align() > ROUNDED_MAX_ALIGN {
        return l.size();
    }
    rounded(l.size(), THRESHOLD.load(Relaxed), GRANULE.load(Relaxed))
}

fn add(bytes: usize) {
    PEAK.fetch_max(LIVE.fetch_add(bytes, Relaxed) + bytes, Relaxed);
}

fn add_pool(l: Layout) {
    if l.align() <= ROUNDED_MAX_ALIGN {
        let bytes = charge(l);
        POOL_PEAK.fetch_max(POOL_LIVE.fetch_add(bytes, Relaxed) + bytes, Relaxed);
    }
}

fn sub_pool(l: Layout) {
    if l.align() <= ROUNDED_MAX_ALIGN {
        POOL_LIVE.fetch_sub(charge(l), Relaxed);
    }
}

/// Whether `l` is counted in [`LIVE_F32_STORAGES`].
fn is_f32_storage(l: Layout) -> bool {
    l.align() == std::mem::align_of::<f32>()
}

fn add_storage(l: Layout) {
    if is_f32_storage(l) {
        let live = LIVE_F32_STORAGES.fetch_add(1, Relaxed) + 1;
        PEAK_F32_STORAGES.fetch_max(live, Relaxed);
    }
}

/// Counts live bytes and their high-water mark.
pub struct Counting;
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        add(charge(l));
        add_pool(l);
        add_storage(l);
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        add(charge(l));
        add_pool(l);
        add_storage(l);
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(charge(l), Relaxed);
        sub_pool(l);
        if is_f32_storage(l) {
            LIVE_F32_STORAGES.fetch_sub(1, Relaxed);
        }
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let grown = Layout::from_size_align(new, l.align()).unwrap_or(l);
        let (old, new_charge) = (charge(l), charge(grown));
        if new_charge >= old {
            add(new_charge - old);
        } else {
            LIVE.fetch_sub(old - new_charge, Relaxed);
        }
        sub_pool(l);
        add_pool(grown);
        System.realloc(p, l, new)
    }
}

/// The counted peak of one step of `v` on `case` above the live bytes before it, after one
/// warm-up step (which settles gemm's thread-local scratch), in bytes.
#[allow(dead_code)]
pub fn measured_peak(v: impls::Variant, case: &impls::Case) -> u64 {
    let run = || {
        impls::step(
            v,
            &case.cfg,
            &case.params,
            &case.input,
            &case.grad_output,
            &mut impls::NoProbe,
        )
        .unwrap()
    };
    drop(run());
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let r = run();
    let measured = PEAK.load(Relaxed) - base;
    drop(r);
    measured as u64
}

/// The configs the memory-model tests measure: BC blocks on square and non-square maps, mlp
/// blocks with and without ReLU, f32 and f64.
#[allow(dead_code)]
pub fn model_configs() -> Vec<Config> {
    vec![
        Config {
            batch: 16,
            size: Spatial::square(16),
            depth: 6,
            dtype: DType::F32,
            ..Config::bc100_block()
        },
        // Non-square maps: M = N·H·W = 16·12·20, not N·H² or N·W².
        Config {
            batch: 16,
            size: Spatial::new(12, 20),
            depth: 6,
            dtype: DType::F32,
            ..Config::bc100_block()
        },
        Config {
            family: Family::Mlp,
            batch: 2048,
            channels: 64,
            growth: 32,
            depth: 6,
            bn_size: 1,
            size: Spatial::square(1),
            activation: true,
            dtype: DType::F64,
            seed: 1,
        },
        Config {
            family: Family::Mlp,
            batch: 4096,
            channels: 96,
            growth: 16,
            depth: 5,
            bn_size: 1,
            size: Spatial::square(1),
            activation: false,
            dtype: DType::F32,
            seed: 2,
        },
    ]
}
