//! Signals to the parent (SIGTERM from a scheduler or `kill`, SIGINT from Ctrl-C, SIGHUP from a
//! closed terminal): the children die with the parent, and the parent stops cleanly.
//!
//! [`install`] starts one thread with `signal-hook`'s iterator (no hand-written handler: the
//! handler only writes to a pipe that thread reads). On the first signal the thread records it
//! ([`caught`]) and kills every live child with SIGKILL, by process group (each child is the
//! leader of its own group, see [`crate::measure::child::spawn`]). The workers then see their
//! child end, return [`Interrupted`] instead of a row (a child we killed is not a result), and
//! remove their temporary files; the command prints one line and exits with 128 + the signal.
//! A second signal exits at once (after killing the children again).
//!
//! What a signal cannot reach is covered by the child itself: a parent killed with SIGKILL takes
//! its children with it through `PR_SET_PDEATHSIG`.

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

/// The signals that stop a sweep.
pub const STOP_SIGNALS: [i32; 3] = [SIGTERM, SIGINT, SIGHUP];

/// The first stop signal received, 0 before any.
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// Process ids (and process-group ids: each child leads its own group) of the live children.
static LIVE: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// The run was stopped by a signal to the parent; its children were killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interrupted {
    pub signal: i32,
}

impl Interrupted {
    /// The conventional exit status of a process stopped by this signal: 128 + its number.
    pub fn exit_status(self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(u8::MAX)
    }
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stopped by {}", signal_name(self.signal))
    }
}

impl std::error::Error for Interrupted {}

/// Whether `e` (or an error it wraps with context) is an [`Interrupted`].
pub fn interrupted(e: &anyhow::Error) -> Option<Interrupted> {
    e.downcast_ref::<Interrupted>().copied()
}

/// `SIGTERM`, `SIGSEGV`, …; `signal N` for a number without a name.
pub fn signal_name(signal: i32) -> String {
    signal_hook::low_level::signal_name(signal)
        .map_or_else(|| format!("signal {signal}"), str::to_string)
}

/// The stop signal received so far, if any.
pub fn caught() -> Option<Interrupted> {
    match CAUGHT.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(Interrupted { signal }),
    }
}

/// Waits up to `limit` for a stop signal; whether one has been received.
pub fn wait_for_stop(limit: std::time::Duration) -> bool {
    let start = std::time::Instant::now();
    while caught().is_none() && start.elapsed() < limit {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    caught().is_some()
}

/// `Err(Interrupted)` once a stop signal has been received.
pub fn check() -> Result<()> {
    match caught() {
        Some(i) => Err(i.into()),
        None => Ok(()),
    }
}

/// Whether process `pid` exists (kill(2) with signal 0 probes without sending anything; a
/// process we may not signal exists too). Used to tell whether a recorded writer or the owner
/// of a temporary file still runs.
pub fn process_exists(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks whether the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn live() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    // A panic while holding the lock cannot leave the set inconsistent (one insert or remove).
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Kills a child's whole process group with SIGKILL.
pub fn kill_group(pid: i32) {
    // SAFETY: kill(2) has no memory-safety preconditions. A negative pid names the group the
    // child leads; an error (the group is gone already) changes nothing.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

fn kill_all() {
    for &pid in live().iter() {
        kill_group(pid);
    }
}

/// A live child, killed by the signal thread if a stop signal arrives while it runs. Dropping it
/// (after the child is reaped) forgets it.
pub struct Tracked(i32);

/// Tracks the child `pid`. When a stop signal has already been received, the child is killed at
/// once (it may have been started just after the signal thread killed the others).
pub fn track(pid: u32) -> Tracked {
    let pid = i32::try_from(pid).unwrap_or(i32::MAX);
    live().insert(pid);
    if caught().is_some() {
        kill_group(pid);
    }
    Tracked(pid)
}

impl Drop for Tracked {
    fn drop(&mut self) {
        live().remove(&self.0);
    }
}

/// Starts the signal thread (once per process; later calls do nothing). Commands that spawn
/// children call it first.
pub fn install() -> Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let mut signals = signal_hook::iterator::Signals::new(STOP_SIGNALS)
                .map_err(|e| format!("installing the signal handlers: {e}"))?;
            std::thread::Builder::new()
                .name("densebench-signals".to_string())
                .spawn(move || {
                    for signal in signals.forever() {
                        let first = CAUGHT
                            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok();
                        kill_all();
                        if !first {
                            crate::say!(
                                "densebench: {} again: exiting now (the children are killed; \
                                 --resume continues a sweep)",
                                signal_name(signal)
                            );
                            std::process::exit(128 + signal);
                        }
                    }
                })
                .map(drop)
                .map_err(|e| format!("starting the signal thread: {e}"))
        })
        .clone()
        .map_err(anyhow::Error::msg)
        .context("setting up SIGTERM/SIGINT/SIGHUP handling")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_exit_statuses() {
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
        assert_eq!(signal_name(1000), "signal 1000");
        let i = Interrupted {
            signal: libc::SIGTERM,
        };
        // 128 + 15: what a shell reports for a process stopped by SIGTERM.
        assert_eq!(i.exit_status(), 143);
        assert_eq!(i.to_string(), "stopped by SIGTERM");
        let e = anyhow::Error::new(i).context("measuring x");
        assert_eq!(interrupted(&e), Some(i));
    }
}
