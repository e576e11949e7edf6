//! Runs a sweep's jobs into the results store: one worker thread per device (one child at a
//! time each), whole configurations per worker, each row appended under one lock as soon as it
//! exists, progress weighted by predicted cost. A row whose child was killed or crashed is rerun
//! up to `retries` times, saying so. A stop signal ([`crate::measure::interrupt`]) ends every
//! worker after its child is killed: the rows before stay, whole, and no row is written for a
//! child we killed, so `--resume` runs exactly what is missing.

use crate::measure::interrupt::{self, Interrupted};
use crate::measure::reference::Cache;
use crate::plan::device::DeviceSpec;
use crate::plan::shard;
use crate::plan::sweep::Job;
use crate::progress::Progress;
use crate::results::record::measure_row_retrying;
use crate::results::store::Output;
use anyhow::{anyhow, Context, Result};
use std::path::Path;

/// What the workers share: the output file, the progress display and the tallies. Held under
/// one lock while a row is appended, so rows from concurrent devices never interleave.
struct Shared {
    out: Output,
    progress: Progress,
    started: usize,
    finished: usize,
    counts: std::collections::BTreeMap<String, usize>,
    out_of_tolerance: Vec<String>,
    /// Job key → the predicted cost of the reference its row computes first (the first row of
    /// a configuration whose reference is not cached): counted in the progress with the row.
    reference_costs: std::collections::HashMap<String, f64>,
}

/// The work items of a sweep run: with one worker, every job in sweep order (one item); with
/// several, whole configurations (all variants of a config run on one device, and its
/// reference is computed once), most expensive first (longest-processing-time list scheduling).
fn work_items<'a>(todo: &[&'a Job], workers: usize) -> Vec<Vec<&'a Job>> {
    if workers <= 1 {
        return vec![todo.to_vec()];
    }
    let owned: Vec<Job> = todo.iter().map(|j| (*j).clone()).collect();
    let mut groups = shard::groups(&owned);
    groups.sort_by(|a, b| b.cost.total_cmp(&a.cost));
    groups
        .into_iter()
        .map(|g| g.jobs.into_iter().map(|i| todo[i]).collect())
        .collect()
}

/// The references `todo` will compute, as predicted costs ([`shard::reference_cost_of`]) keyed
/// by the first job of each configuration (which computes it), so that the ETA counts them:
/// on BC-100's block an f64 reference is some 50 s, a row 8. A configuration whose reference is
/// cached costs nothing; an unreadable cache, nothing either (the run itself will say why).
fn reference_costs(todo: &[&Job], cache_dir: &Path) -> std::collections::HashMap<String, f64> {
    let mut out = std::collections::HashMap::new();
    let Ok(cache) = Cache::new(cache_dir) else {
        return out;
    };
    let mut seen = std::collections::HashSet::new();
    for j in todo {
        if !seen.insert(shard::group_key(j)) {
            continue;
        }
        if let Some(v) = cache.to_compute(&j.cfg, &j.settings) {
            out.insert(j.key.clone(), shard::reference_cost_of(&j.cfg, v));
        }
    }
    out
}

/// One worker: takes items off the queue and measures their jobs on `device` (the job's own
/// device when `None`), appending each row under the lock. Stops early when another worker
/// failed (`stop`).
fn worker(
    device: Option<DeviceSpec>,
    queue: &std::sync::Mutex<std::collections::VecDeque<Vec<&Job>>>,
    shared: &std::sync::Mutex<Shared>,
    stop: &std::sync::atomic::AtomicBool,
    cache_dir: &Path,
    retries: usize,
    ready: &std::sync::Barrier,
) -> Result<()> {
    use std::sync::atomic::Ordering;
    let lock_err = || anyhow!("a sweep worker panicked while holding the output lock");
    let refs = Cache::new(cache_dir);
    // waited for even when the cache failed, so that no other worker waits forever
    ready.wait();
    let mut refs = refs?;
    loop {
        let item = match queue.lock() {
            Ok(mut q) => q.pop_front(),
            Err(_) => return Err(lock_err()),
        };
        let Some(item) = item else { return Ok(()) };
        for j in item {
            if stop.load(Ordering::SeqCst) || interrupt::caught().is_some() {
                return Ok(());
            }
            let mut settings = j.settings.clone();
            if let Some(d) = device {
                settings.device = d;
            }
            let on = device.map(|d| format!(" on {d}")).unwrap_or_default();
            // The job's number: its start line and its finish line both carry it, so that with
            // several devices (jobs finishing in another order than they started) each finish
            // line is matched to its start.
            // the wait before this row's child (some 50 s on BC-100's block), said up front;
            // asked before the lock (file checks, on a GPU a query of the device)
            let reference = refs.to_compute(&j.cfg, &settings);
            let number = {
                let mut sh = shared.lock().map_err(|_| lock_err())?;
                sh.started += 1;
                let n = sh.started;
                sh.progress
                    .start(n, &format!("{} {}{on}", j.cfg.describe(), j.variant));
                // not a `[n/N]` line, which scripts read as a row's start or end
                if let Some(v) = reference {
                    sh.progress.note(&format!(
                        "  computing the f64 reference of {}{on} first ({v}; cached for the \
                         configuration's other rows)",
                        j.cfg.describe()
                    ));
                }
                n
            };
            let mut on_retry = |failed: &crate::results::row::Row, n: usize| {
                if let Ok(sh) = shared.lock() {
                    sh.progress.note(&format!(
                        "{}: {}; retrying ({n} of {retries})",
                        j.key, failed.error
                    ));
                }
            };
            let measured = measure_row_retrying(
                j.variant,
                &j.cfg,
                &settings,
                j.peer,
                &mut refs,
                retries,
                &mut on_retry,
            )
            .with_context(|| format!("measuring {}", j.key));
            let mut row = match measured {
                Ok(row) => row,
                // Stopped by a signal: the child was killed, and that is no result.
                Err(e) if interrupt::interrupted(&e).is_some() => return Ok(()),
                Err(e) => {
                    stop.store(true, Ordering::SeqCst);
                    return Err(e);
                }
            };
            if settings.device != j.settings.device {
                // Keyed by the sweep's (logical) device; the physical one is in device_desc.
                row.key = j.key.clone();
                row.device = j.settings.device.to_string();
                row.device_desc = format!("ran on {}: {}", settings.device, row.device_desc);
            }
            // The device it ran on, after the key (which names the sweep's device).
            let summary = row.summary(&on);
            let mut sh = shared.lock().map_err(|_| lock_err())?;
            sh.out.append(&row)?;
            sh.finished += 1;
            let cost = j.cost + sh.reference_costs.get(&j.key).copied().unwrap_or(0.0);
            sh.progress.finish(number, &summary, cost);
            *sh.counts.entry(row.status.clone()).or_default() += 1;
            if row.grad_ok == Some(false) {
                sh.out_of_tolerance.push(row.key.clone());
            }
        }
    }
}

/// What a finished run says: rows written, rows per status, keys out of tolerance, and the
/// signal that stopped it before the end, if one did.
pub struct Summary {
    pub finished: usize,
    pub counts: std::collections::BTreeMap<String, usize>,
    pub out_of_tolerance: Vec<String>,
    pub interrupted: Option<Interrupted>,
}

/// Measures `todo` into `out`: one worker per device of `devices` (the job's own device when
/// empty), each row appended as soon as it exists. Errs when a job could not be measured at all
/// (no child could be started) or the store could not be written; the rows before stay. A stop
/// signal is no error: the summary says which one stopped the run.
pub fn run(
    todo: &[&Job],
    devices: &[DeviceSpec],
    out: Output,
    cache_dir: &Path,
    retries: usize,
) -> Result<Summary> {
    let workers: Vec<Option<DeviceSpec>> = if devices.is_empty() {
        vec![None]
    } else {
        devices.iter().copied().map(Some).collect()
    };
    let queue = std::sync::Mutex::new(work_items(todo, workers.len()).into());
    let reference_costs = reference_costs(todo, cache_dir);
    let total = todo.iter().map(|j| j.cost).sum::<f64>() + reference_costs.values().sum::<f64>();
    let shared = std::sync::Mutex::new(Shared {
        out,
        progress: Progress::new(todo.len(), total),
        reference_costs,
        started: 0,
        finished: 0,
        counts: Default::default(),
        out_of_tolerance: Vec::new(),
    });
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Every worker ready (its reference cache open) before any takes an item, so that a fast
    // first worker does not drain a queue of quick jobs before the others exist.
    let ready = std::sync::Barrier::new(workers.len());
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .iter()
            .map(|&d| {
                let (queue, shared, stop, cache_dir, ready) =
                    (&queue, &shared, &stop, &cache_dir, &ready);
                scope.spawn(move || worker(d, queue, shared, stop, cache_dir, retries, ready))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a sweep worker panicked")))
            })
            .collect()
    });
    let shared = shared
        .into_inner()
        .map_err(|_| anyhow!("a sweep worker panicked while holding the output lock"))?;
    results.into_iter().collect::<Result<Vec<()>>>()?;
    let Shared {
        progress,
        finished,
        counts,
        out_of_tolerance,
        ..
    } = shared;
    progress.done();
    Ok(Summary {
        interrupted: interrupt::caught().filter(|_| finished < todo.len()),
        finished,
        counts,
        out_of_tolerance,
    })
}
