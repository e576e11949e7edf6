//! Counting global allocator: live bytes, their peak, and an optional limit, all lock-free.
//!
//! The `densebench` binary installs [`Counting`] as its `#[global_allocator]`, so every heap
//! allocation of the process (candle's CPU tensors included) passes through three atomics:
//! [`current`] live bytes, their [`peak`] since the last [`reset_peak`], and a byte limit set by
//! [`set_limit`]. An allocation that would take the live bytes above the limit, or that the
//! system refuses, ends the process at once (`out_of_memory`): one line "memory allocation of
//! N bytes failed" and exit status [`EXIT_OUT_OF_MEMORY`], where returning null would make Rust
//! abort with SIGABRT and, under `RUST_BACKTRACE`, a backtrace. The parent process classifies
//! that line as `oom` (see [`crate::measure::child`]); a command the user ran says it in one
//! line. (Nothing in densebench or its dependencies uses fallible allocation, `try_reserve`,
//! which a null would serve.)
//!
//! The first refused allocation also writes one line to stderr ([`REFUSAL_PREFIX`], written
//! with `write(2)` from a stack buffer: nothing is allocated inside the allocator) saying how
//! many bytes were live and what the limit was, so an `oom` row says how close the step came.
//!
//! Counts are of requested sizes (`Layout::size`), not of what the system allocator rounds them
//! up to: that is what a variant asks for, and it is exact and deterministic. The library (and
//! therefore the integration tests) can be used without the allocator installed; then the
//! counters stay at zero and [`installed`] says so.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// `usize::MAX` means "no limit".
static LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The counting allocator: the system allocator plus three atomics.
pub struct Counting;

impl Counting {
    pub const fn new() -> Self {
        Counting
    }
}

impl Default for Counting {
    fn default() -> Self {
        Self::new()
    }
}

/// The start of the line the first refused allocation writes to stderr: `{REFUSAL_PREFIX} N
/// bytes requested with L bytes live (limit X bytes)`, read back by
/// [`crate::measure::child::refusal`].
pub const REFUSAL_PREFIX: &str = "densebench: memory limit:";

/// Whether a refusal has been said (only the first is: the process ends on it).
static REFUSAL_SAID: AtomicBool = AtomicBool::new(false);

/// A line in a stack buffer (the allocator must not allocate to report).
struct LineBuf {
    bytes: [u8; 192],
    len: usize,
}

impl std::fmt::Write for LineBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let dst = self.bytes.get_mut(self.len..end).ok_or(std::fmt::Error)?;
        dst.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Writes the refusal line of the first refused allocation to stderr with `write(2)`.
#[cold]
#[inline(never)]
fn say_refusal(size: usize, live: usize, limit: usize) {
    if REFUSAL_SAID.swap(true, Relaxed) {
        return;
    }
    let mut line = LineBuf {
        bytes: [0; 192],
        len: 0,
    };
    let said = std::fmt::Write::write_fmt(
        &mut line,
        format_args!(
            "{REFUSAL_PREFIX} {size} bytes requested with {live} bytes live (limit {limit} bytes)\n"
        ),
    );
    if said.is_ok() {
        // SAFETY: writes `len` initialised bytes of a live stack buffer to fd 2; a failed or
        // short write loses only this diagnostic line.
        let _ = unsafe { libc::write(2, line.bytes.as_ptr().cast(), line.len) };
    }
}

/// Exit status of a process that ran out of memory (`out_of_memory`).
pub const EXIT_OUT_OF_MEMORY: i32 = 1;

/// Ends the process on an allocation of `size` bytes that cannot be served: writes
/// "memory allocation of N bytes failed" (what Rust's own handler says, and what
/// [`crate::measure::child`] reads as `oom`) to stderr with `write(2)` and exits with
/// [`EXIT_OUT_OF_MEMORY`], without unwinding, allocating or a backtrace.
#[cold]
#[inline(never)]
fn out_of_memory(size: usize, why: &str) -> ! {
    let mut line = LineBuf {
        bytes: [0; 192],
        len: 0,
    };
    let said = std::fmt::Write::write_fmt(
        &mut line,
        format_args!("memory allocation of {size} bytes failed{why}\n"),
    );
    if said.is_ok() {
        // SAFETY: writes `len` initialised bytes of a live stack buffer to fd 2.
        let _ = unsafe { libc::write(2, line.bytes.as_ptr().cast(), line.len) };
    }
    // SAFETY: `_exit` ends the process without running anything that could allocate.
    unsafe { libc::_exit(EXIT_OUT_OF_MEMORY) }
}

/// Adds `size` live bytes unless that would pass the limit; updates the peak.
#[inline]
fn reserve(size: usize) -> bool {
    let now = CURRENT.fetch_add(size, Relaxed).saturating_add(size);
    let limit = LIMIT.load(Relaxed);
    if now > limit {
        CURRENT.fetch_sub(size, Relaxed);
        say_refusal(size, now - size, limit);
        return false;
    }
    // A plain load first: most allocations do not raise the peak, and a load is cheaper than
    // a read-modify-write on a shared cache line.
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
    true
}

#[inline]
fn release(size: usize) {
    CURRENT.fetch_sub(size, Relaxed);
}

/// What [`out_of_memory`] adds when the system allocator, not the limit, refused.
const SYSTEM_REFUSED: &str = " (the system has no more memory for this process)";

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the
// counters are only bookkeeping, and an allocation that cannot be served ends the process
// (`out_of_memory`) instead of returning null.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size()) {
            out_of_memory(layout.size(), "");
        }
        let p = System.alloc(layout);
        if p.is_null() {
            out_of_memory(layout.size(), SYSTEM_REFUSED);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !reserve(layout.size()) {
            out_of_memory(layout.size(), "");
        }
        let p = System.alloc_zeroed(layout);
        if p.is_null() {
            out_of_memory(layout.size(), SYSTEM_REFUSED);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        release(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let old = layout.size();
        if new_size > old {
            if !reserve(new_size - old) {
                out_of_memory(new_size, "");
            }
            let p = System.realloc(ptr, layout, new_size);
            if p.is_null() {
                out_of_memory(new_size, SYSTEM_REFUSED);
            }
            p
        } else {
            let p = System.realloc(ptr, layout, new_size);
            if !p.is_null() {
                release(old - new_size);
            }
            p
        }
    }
}

/// Live heap bytes now.
pub fn current() -> usize {
    CURRENT.load(Relaxed)
}

/// Highest live heap bytes since the process started or the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Relaxed)
}

/// Starts a new peak measurement from the current live bytes.
pub fn reset_peak() {
    PEAK.store(CURRENT.load(Relaxed), Relaxed);
}

/// Refuses any allocation that would take live bytes above `limit` (`None`: no limit).
pub fn set_limit(limit: Option<usize>) {
    LIMIT.store(limit.unwrap_or(usize::MAX), Relaxed);
}

/// The limit in force, if any.
pub fn limit() -> Option<usize> {
    match LIMIT.load(Relaxed) {
        usize::MAX => None,
        l => Some(l),
    }
}

/// Whether [`Counting`] is this process's global allocator: a probe allocation must show up in
/// [`current`]. (In the `densebench` binary it is; in a test binary it is not.)
pub fn installed() -> bool {
    /// Large enough to dominate any concurrent frees of other threads at start-up.
    const PROBE_BYTES: usize = 1 << 20;
    // The probe is the harness's, not the measured step's: outside any memory limit (a child's
    // limit is set before its meter asks this, and a limit near 1 MiB made the probe itself the
    // row's `oom`).
    let limit = LIMIT.swap(usize::MAX, Relaxed);
    let before = current();
    let probe = std::hint::black_box(vec![1u8; PROBE_BYTES]);
    let after = current();
    drop(probe);
    LIMIT.store(limit, Relaxed);
    after >= before + PROBE_BYTES
}
