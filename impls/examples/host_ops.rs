//! Host-side work of one training step on the GPU's op path, counted on the CPU while it runs the
//! path of other devices (`layer::with_tap_stack_on_cpu`: tap stack, candle matmuls into new
//! tensors), f32:
//!
//! - `tensors/step`: allocations with the alignment of an f32 `Vec` (4), i.e. the f32 tensor
//!   storages the step creates. On a GPU each is an allocation from the pool made by one candle
//!   op or fused kernel, which is also (at least) one launch: the closest CPU-side count of a GPU
//!   step's launches and per-op host work, which dominate small and medium blocks there (issue
//!   11). In-place kernels and views create none and are not counted;
//! - `allocs/step`: every heap allocation (candle's shapes and bookkeeping too);
//! - the best wall time of 20 steps of this tiny block (N = 1, 4×4).
//!
//! `cargo run --release -p densebench-impls --example host_ops -- [DEPTH]` (default 16).

use impls::layer::with_tap_stack_on_cpu;
use impls::{Case, Config, Family, Spatial, Variant};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Counts allocation calls (not bytes), and those with an f32 `Vec`'s alignment apart.
struct CountCalls;
static CALLS: AtomicUsize = AtomicUsize::new(0);
static F32_STORAGES: AtomicUsize = AtomicUsize::new(0);
fn count(l: Layout) {
    CALLS.fetch_add(1, Relaxed);
    if l.align() == std::mem::align_of::<f32>() {
        F32_STORAGES.fetch_add(1, Relaxed);
    }
}
unsafe impl GlobalAlloc for CountCalls {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        count(l);
        System.alloc(l)
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        count(l);
        System.alloc_zeroed(l)
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        CALLS.fetch_add(1, Relaxed);
        System.realloc(p, l, new)
    }
}
#[global_allocator]
static A: CountCalls = CountCalls;

fn main() -> impls::Result<()> {
    let depth: usize = match std::env::args().nth(1) {
        Some(d) => d.parse().map_err(|_| impls::Error::Unsupported {
            device: "cpu".into(),
            what: format!("DEPTH `{d}` is not a number"),
        })?,
        None => 16,
    };
    let cfg = Config {
        family: Family::Bc,
        depth,
        batch: 1,
        channels: 24,
        growth: 12,
        size: Spatial::square(4),
        ..Config::bc100_block()
    };
    cfg.validate()?;
    let case = Case::random(&cfg, &candle_core::Device::Cpu)?;
    println!("{} on the GPU's op path (CPU)", cfg.describe());
    println!(
        "{:<26} {:>14} {:>14} {:>14}",
        "variant", "tensors/step", "allocs/step", "µs/step (min)"
    );
    for v in Variant::all() {
        if v == Variant::Autograd {
            continue;
        }
        with_tap_stack_on_cpu(|| -> impls::Result<()> {
            drop(case.step(v)?); // warm-up (gemm's thread-local scratch, rayon)
            let (calls, tensors) = (CALLS.load(Relaxed), F32_STORAGES.load(Relaxed));
            drop(case.step(v)?);
            let allocs = CALLS.load(Relaxed) - calls;
            let tensors = F32_STORAGES.load(Relaxed) - tensors;
            let mut best = f64::INFINITY;
            for _ in 0..20 {
                let t = std::time::Instant::now();
                drop(case.step(v)?);
                best = best.min(t.elapsed().as_secs_f64());
            }
            println!(
                "{:<26} {:>14} {:>14} {:>14.0}",
                v.name(),
                tensors,
                allocs,
                best * 1e6
            );
            Ok(())
        })?;
    }
    Ok(())
}
