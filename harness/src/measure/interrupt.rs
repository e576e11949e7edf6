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
//!
//! Files the process must not leave behind (the results store's lock files and temporaries) are
//! registered with [`remove_on_exit`]; a command that writes but never stops in order
//! (`report`, `merge`, …: no [`install`]) gets the same thread through [`install_cleanup`], and
//! there the first signal removes them and exits at once, as the second does everywhere.
//! [`STOP_WATCHDOG`] after a first signal that the command has not acted on (something blocked),
//! the process exits the same way. Stop signals ignored when the process starts (`nohup`) stay
//! ignored. SIGXFSZ is ignored by every densebench process ([`ignore_file_size_signal`]): a
//! write past a file-size limit fails with EFBIG, which the store handles like a full disk.

use anyhow::{Context, Result};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};

/// The signals that stop a sweep.
pub const STOP_SIGNALS: [i32; 3] = [SIGTERM, SIGINT, SIGHUP];

/// The first stop signal received, 0 before any.
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// Whether the command stops in order on a first signal ([`install`]); otherwise a first signal
/// exits at once after removing the registered files ([`install_cleanup`]).
static GRACEFUL: AtomicBool = AtomicBool::new(false);

/// How long after a first stop signal a command that stops in order may take to do so before
/// the process exits anyway: killing and reaping the children takes milliseconds, so a process
/// still running after this is blocked (a read that cannot end) and would swallow the signal.
pub const STOP_WATCHDOG: std::time::Duration = std::time::Duration::from_secs(10);

/// Files to remove if the process exits on a signal (lock files, temporaries).
static TO_REMOVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Removes `path` if the process exits on a stop signal before [`keep_on_exit`] forgets it.
pub fn remove_on_exit(path: &Path) {
    to_remove().push(path.to_path_buf());
}

/// Forgets a path given to [`remove_on_exit`] (its owner removed or kept it).
pub fn keep_on_exit(path: &Path) {
    let mut paths = to_remove();
    if let Some(i) = paths.iter().rposition(|p| p == path) {
        paths.remove(i);
    }
}

fn to_remove() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    // A panic while holding the lock cannot leave the list inconsistent (one push or remove).
    TO_REMOVE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Removes the registered files and exits with 128 + `signal`.
fn exit_now(signal: i32) -> ! {
    for p in to_remove().iter() {
        let _ = std::fs::remove_file(p);
    }
    std::process::exit(128 + signal);
}

/// Ignores SIGXFSZ for this process and its children (an ignored disposition survives exec): a
/// write past a file-size limit (`ulimit -f`) then fails with EFBIG, which the results store
/// reports like a full disk, keeping whole rows, instead of killing the process mid-row.
pub fn ignore_file_size_signal() {
    // SAFETY: signal(2) with SIG_IGN installs no handler code; it cannot fail for SIGXFSZ.
    unsafe {
        libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
    }
}

/// Whether `signal` is ignored now (inherited from `nohup` or a scheduler).
fn ignored(signal: i32) -> bool {
    // SAFETY: sigaction(2) with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

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

/// Starts the signal thread (once per process; later calls do nothing) for a command that stops
/// in order on a first signal (it checks [`caught`]). Commands that spawn children call it
/// first.
pub fn install() -> Result<()> {
    GRACEFUL.store(true, Ordering::SeqCst);
    start_thread()
}

/// Starts the signal thread, if no command did, so that a stop signal removes the files given
/// to [`remove_on_exit`] before the process exits (the results store calls it when it takes a
/// lock). A command that has called [`install`] keeps stopping in order.
pub fn install_cleanup() -> Result<()> {
    start_thread()
}

fn start_thread() -> Result<()> {
    static INSTALLED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let caught: Vec<i32> = STOP_SIGNALS.into_iter().filter(|&s| !ignored(s)).collect();
            let mut signals = signal_hook::iterator::Signals::new(caught)
                .map_err(|e| format!("installing the signal handlers: {e}"))?;
            std::thread::Builder::new()
                .name("densebench-signals".to_string())
                .spawn(move || {
                    for signal in signals.forever() {
                        let first = CAUGHT
                            .compare_exchange(0, signal, Ordering::SeqCst, Ordering::SeqCst)
                            .is_ok();
                        kill_all();
                        if !GRACEFUL.load(Ordering::SeqCst) {
                            exit_now(signal);
                        }
                        if first {
                            watchdog(signal);
                        } else {
                            crate::say!(
                                "densebench: {} again: exiting now (the children are killed; \
                                 --resume continues a sweep)",
                                signal_name(signal)
                            );
                            exit_now(signal);
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

/// Exits [`STOP_WATCHDOG`] after the first signal if the command has not stopped by then.
fn watchdog(signal: i32) {
    let spawned = std::thread::Builder::new()
        .name("densebench-stop-watchdog".to_string())
        .spawn(move || {
            std::thread::sleep(STOP_WATCHDOG);
            crate::say!(
                "densebench: still running {} s after {}: exiting now (the children are \
                 killed; --resume continues a sweep)",
                STOP_WATCHDOG.as_secs(),
                signal_name(signal)
            );
            exit_now(signal);
        });
    // Without the thread (no resources left) a second signal still exits at once.
    drop(spawned);
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
