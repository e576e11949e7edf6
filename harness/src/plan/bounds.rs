//! What a user may ask for: the named bounds of every number a flag or a sweep key sets
//! (threads, time and memory limits, steps, shards, sweep size, retries), checked before any
//! work, and [`BadInput`], the error that marks a mistake in the user's input (the command line
//! or a file it names) so that `densebench` exits with status 2 instead of 1.
//!
//! Each bound exists so that a typo fails at once with a message naming the flag or key and the
//! bound, instead of running for minutes, allocating gigabytes or panicking.

use anyhow::{bail, Result};
use std::fmt;

/// The most compute threads a child may be given: more than any machine this runs on has cores,
/// far fewer than would exhaust the process limit (`threads = 100000` spawned 100000 threads).
pub const MAX_THREADS: usize = 1024;
/// The deepest block `max-depth` searches to: its model replays a bc block's schedule in time
/// that grows faster than L (1.3 s at 4096 layers, 24 s at 10000 for every variant; 220 s at
/// 65536), and no dense block is that deep (`--max-depth 100000000` ran silently for minutes).
pub const MAX_SEARCH_DEPTH: usize = 10_000;
/// The shortest time limit of a child, in seconds: 0 would kill every child at once.
pub const MIN_TIMEOUT_SECS: u64 = 1;
/// The longest time limit of a child, in seconds (one week): beyond it a hung child is never
/// noticed.
pub const MAX_TIMEOUT_SECS: u64 = 7 * 24 * 3600;
/// The smallest memory limit of a child, in bytes (1 MiB): the process itself needs more before
/// it measures anything, so below it every row would be `oom`.
pub const MIN_MEM_LIMIT: u64 = 1 << 20;
/// The most measured steps of one job: a median over more adds nothing but time.
pub const MAX_STEPS: usize = 10_000;
/// The most warm-up steps of one job.
pub const MAX_WARMUP: usize = 10_000;
/// The most shards a sweep is split into (`--shard I/N`, `plan --shards N`): more than any
/// cluster array this is run on, small enough that the split is computed in milliseconds.
pub const MAX_SHARDS: usize = 10_000;
/// The most jobs one sweep may expand to: the default sweep has a few hundred, and 100000 jobs
/// of the smallest config already take hours; counted before expansion, so a sweep that would
/// expand to 10^8 jobs fails at once.
pub const MAX_JOBS: u64 = 100_000;
/// The most reruns of a killed or crashed row (`--retries N`).
pub const MAX_RETRIES: usize = 100;
/// The largest sweep file read, in bytes: a sweep is a few hundred bytes of TOML, so a larger
/// file is a wrong path (a result CSV, a case file), refused before it is read whole.
pub const MAX_SWEEP_FILE_BYTES: u64 = 1 << 20;

/// A mistake in the user's input: the command line, or a file it names (a sweep file, a case
/// file). Displays as the error it wraps; `densebench` exits with status 2 for it.
#[derive(Debug)]
pub struct BadInput(anyhow::Error);

impl fmt::Display for BadInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The whole chain on one line: this error is printed as it is, with no source below.
        write!(f, "{:#}", self.0)
    }
}

impl std::error::Error for BadInput {}

/// Marks `e` as bad input (exit status 2).
pub fn bad_input(e: impl Into<anyhow::Error>) -> anyhow::Error {
    let e = e.into();
    if is_bad_input(&e) {
        return e;
    }
    anyhow::Error::new(BadInput(e))
}

/// `e` without the bad-input mark (exit status 1, not 2), its message unchanged: for `merge`,
/// whose status 2 means "merged, keys missing" and 1 "nothing written".
pub fn not_bad_input(e: anyhow::Error) -> anyhow::Error {
    if is_bad_input(&e) {
        anyhow::anyhow!("{e:#}")
    } else {
        e
    }
}

/// Whether `e` (or an error it wraps with context) is bad input.
pub fn is_bad_input(e: &anyhow::Error) -> bool {
    e.downcast_ref::<BadInput>().is_some()
}

/// Whether `e` carries an error of type `T`, as itself or context, or inside a bad-input mark
/// (which keeps the error it marks whole, not as a source): how a caller asks what kind of
/// failure a reader reported without matching its words.
pub fn carries<T>(e: &anyhow::Error) -> bool
where
    T: fmt::Display + fmt::Debug + Send + Sync + 'static,
{
    e.downcast_ref::<T>().is_some()
        || e.downcast_ref::<BadInput>()
            .is_some_and(|b| b.0.downcast_ref::<T>().is_some())
}

/// `.bad_input()` on a result: its error marked as bad input.
pub trait ResultExt<T> {
    fn bad_input(self) -> Result<T>;
}

impl<T, E: Into<anyhow::Error>> ResultExt<T> for std::result::Result<T, E> {
    fn bad_input(self) -> Result<T> {
        self.map_err(bad_input)
    }
}

/// `threads`: 0 (the compute library's default) or 1..=[`MAX_THREADS`].
pub fn check_threads(what: &str, n: usize) -> Result<usize> {
    if n > MAX_THREADS {
        bail!("{what} must be at most {MAX_THREADS} (0: the library's default), got {n}");
    }
    Ok(n)
}

/// A time limit in seconds: [`MIN_TIMEOUT_SECS`]..=[`MAX_TIMEOUT_SECS`].
pub fn check_timeout(what: &str, secs: u64) -> Result<u64> {
    if !(MIN_TIMEOUT_SECS..=MAX_TIMEOUT_SECS).contains(&secs) {
        bail!(
            "{what} must be between {MIN_TIMEOUT_SECS} and {MAX_TIMEOUT_SECS} seconds (one week), \
             got {secs}"
        );
    }
    Ok(secs)
}

/// A memory limit in bytes: at least [`MIN_MEM_LIMIT`].
pub fn check_mem_limit(what: &str, bytes: u64) -> Result<u64> {
    if bytes < MIN_MEM_LIMIT {
        bail!("{what} must be at least {MIN_MEM_LIMIT} bytes (1 MiB), got {bytes}");
    }
    Ok(bytes)
}

/// Measured steps: 1..=[`MAX_STEPS`].
pub fn check_steps(what: &str, n: usize) -> Result<usize> {
    if !(1..=MAX_STEPS).contains(&n) {
        bail!("{what} must be between 1 and {MAX_STEPS}, got {n}");
    }
    Ok(n)
}

/// `max-depth --max-depth`: 1..=[`MAX_SEARCH_DEPTH`].
pub fn check_search_depth(what: &str, n: usize) -> Result<usize> {
    if !(1..=MAX_SEARCH_DEPTH).contains(&n) {
        bail!("{what} must be between 1 and {MAX_SEARCH_DEPTH}, got {n}");
    }
    Ok(n)
}

/// Warm-up steps: 0..=[`MAX_WARMUP`].
pub fn check_warmup(what: &str, n: usize) -> Result<usize> {
    if n > MAX_WARMUP {
        bail!("{what} must be at most {MAX_WARMUP}, got {n}");
    }
    Ok(n)
}

/// A shard count: 1..=[`MAX_SHARDS`].
pub fn check_shards(what: &str, n: usize) -> Result<usize> {
    if !(1..=MAX_SHARDS).contains(&n) {
        bail!("{what} must be between 1 and {MAX_SHARDS}, got {n}");
    }
    Ok(n)
}

/// A shard count against the sweep it splits: a count above the number of jobs leaves shards
/// with nothing to run (so it is surely a mistake).
pub fn check_shards_for(what: &str, n: usize, jobs: usize, source: &str) -> Result<()> {
    if n > jobs {
        bail!(
            "{what}: {n} shards of {source}, which has only {jobs} jobs (at most one shard per \
             job; `densebench plan` shows the split)"
        );
    }
    Ok(())
}

/// Retries: 0..=[`MAX_RETRIES`].
pub fn check_retries(what: &str, n: usize) -> Result<usize> {
    if n > MAX_RETRIES {
        bail!("{what} must be at most {MAX_RETRIES}, got {n}");
    }
    Ok(n)
}

/// Clap value parsers for the bounded flags: the flag's name comes from clap's own message
/// ("invalid value '0' for '--timeout \<TIMEOUT>': …"), and clap exits with status 2.
pub mod flags {
    use anyhow::{Context, Result};

    fn int<T: std::str::FromStr>(s: &str) -> Result<T> {
        s.trim()
            .parse()
            .ok()
            .with_context(|| format!("`{s}` is not a non-negative integer"))
    }

    pub fn threads(s: &str) -> Result<usize> {
        super::check_threads("the thread count", int(s)?)
    }

    pub fn timeout(s: &str) -> Result<u64> {
        super::check_timeout("the time limit", int(s)?)
    }

    pub fn mem_limit(s: &str) -> Result<u64> {
        super::check_mem_limit("the memory limit", crate::plan::job::parse_bytes(s)?)
    }

    pub fn steps(s: &str) -> Result<usize> {
        super::check_steps("the step count", int(s)?)
    }

    pub fn search_depth(s: &str) -> Result<usize> {
        super::check_search_depth("the deepest block searched", int(s)?)
    }

    pub fn warmup(s: &str) -> Result<usize> {
        super::check_warmup("the warm-up step count", int(s)?)
    }

    pub fn shards(s: &str) -> Result<usize> {
        super::check_shards("the shard count", int(s)?)
    }

    pub fn retries(s: &str) -> Result<usize> {
        super::check_retries("the retry count", int(s)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_finds_a_typed_error_through_context_and_the_bad_input_mark() {
        #[derive(Debug)]
        struct Marked;
        impl fmt::Display for Marked {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("marked")
            }
        }
        impl std::error::Error for Marked {}
        let plain = anyhow::Error::new(Marked);
        assert!(carries::<Marked>(&plain));
        let wrapped = bad_input(anyhow::Error::new(Marked).context("reading x"));
        assert!(is_bad_input(&wrapped) && carries::<Marked>(&wrapped));
        assert_eq!(format!("{wrapped:#}"), "reading x: marked");
        // the same words without the type are not it
        assert!(!carries::<Marked>(&bad_input(anyhow::anyhow!(
            "reading x: marked"
        ))));
    }

    #[test]
    fn bounds_name_the_limit() {
        let e = |r: Result<u64>| r.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e(check_timeout("`timeout_secs`", 0)).contains("between 1 and 604800"));
        assert!(e(check_mem_limit("--mem-limit", 0)).contains("1 MiB"));
        assert_eq!(check_timeout("t", 604_800).ok(), Some(604_800));
        assert!(check_threads("t", 1025).is_err() && check_threads("t", 1024).is_ok());
        assert!(check_steps("s", 0).is_err() && check_steps("s", 10_001).is_err());
        assert!(flags::shards("10000000000000000000").is_err());
        assert!(flags::shards("1e19").is_err());
    }

    #[test]
    fn bad_input_survives_context_and_displays_its_chain() {
        use anyhow::Context;
        let e: Result<()> = Err(anyhow::anyhow!("inner"))
            .context("outer")
            .bad_input()
            .context("top");
        let e = e.err().map(|e| (is_bad_input(&e), format!("{e:#}")));
        assert_eq!(e, Some((true, "top: outer: inner".to_string())));
        let plain = anyhow::anyhow!("io");
        assert!(!is_bad_input(&plain));
    }
}
