//! Sweep progress on stderr: a progress bar (current configuration, count, ETA) on a terminal,
//! one plain line per event otherwise (logs, CI, tests). Progress is weighted by each job's
//! estimated cost, so the ETA does not assume a depth-64 block costs what a depth-4 one does.
//! It knows nothing of rows or jobs (callers pass their one-line summaries), so any floor may
//! use it.

use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// One line on stderr that never panics: `eprintln!` panics when stderr cannot be written (a
/// full disk behind `2>file`, a closed pipe, a lost terminal), and a sweep must not die of its
/// own progress line. Use [`say!`](crate::say) rather than calling this.
pub fn say_line(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stderr(), "{args}");
}

/// `eprintln!` that never panics ([`say_line`]): the harness's every message on stderr.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => {
        $crate::progress::say_line(format_args!($($t)*))
    };
}

/// One line on stdout that never panics (a listing of written files, a report's summary): what
/// was written stays written when the reader has gone (`| head`).
pub fn tell_line(args: std::fmt::Arguments<'_>) {
    let _ = writeln!(std::io::stdout(), "{args}");
}

/// `println!` that never panics ([`tell_line`]), for informational lines on stdout.
#[macro_export]
macro_rules! tell {
    ($($t:tt)*) => {
        $crate::progress::tell_line(format_args!($($t)*))
    };
}

/// The bar's length: progress is the fraction of the total estimated cost done, in these units.
const BAR_UNITS: u64 = 1_000_000;

pub struct Progress {
    bar: Option<ProgressBar>,
    start: Instant,
    total_jobs: usize,
    total_cost: f64,
    done_cost: f64,
}

/// Bytes for people: B below 1 KiB, else KiB, MiB or GiB with one or two decimals, `-` when
/// unknown.
pub fn human_bytes(b: Option<u64>) -> String {
    match b {
        None => "-".to_string(),
        Some(b) if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        Some(b) if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        // below 1 KiB in bytes: `0.0 KiB` read as nothing (a `max-depth --budget 1`)
        Some(b) => format!("{b} B"),
    }
}

/// Nanoseconds for people: ms or s, `-` when unknown.
pub fn human_ns(ns: Option<u64>) -> String {
    match ns {
        None => "-".to_string(),
        Some(ns) if ns >= 1_000_000_000 => format!("{:.2} s", ns as f64 / 1e9),
        Some(ns) => format!("{:.1} ms", ns as f64 / 1e6),
    }
}

fn human_duration(d: Duration) -> String {
    let s = d.as_secs();
    format!("{}:{:02}", s / 60, s % 60)
}

impl Progress {
    /// `total_cost`: the sum of the estimated costs of the jobs to run.
    pub fn new(total_jobs: usize, total_cost: f64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(BAR_UNITS);
            // The template is a constant; if indicatif rejected it we fall back to its default.
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {percent:>3}% ETA {eta}\n  {msg}",
            ) {
                bar.set_style(style);
            }
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        Progress {
            bar,
            start: Instant::now(),
            total_jobs,
            total_cost: total_cost.max(f64::MIN_POSITIVE),
            done_cost: 0.0,
        }
    }

    /// A job is starting (`index` counts from 1).
    pub fn start(&self, index: usize, what: &str) {
        let msg = format!("[{index}/{}] {what}", self.total_jobs);
        match &self.bar {
            Some(bar) => bar.set_message(msg),
            None => say_line(format_args!("{msg} …")),
        }
    }

    fn eta(&self) -> String {
        if self.done_cost <= 0.0 {
            return "?".to_string();
        }
        let elapsed = self.start.elapsed().as_secs_f64();
        let left = elapsed * (self.total_cost - self.done_cost).max(0.0) / self.done_cost;
        human_duration(Duration::from_secs_f64(left))
    }

    /// A job is done, `summary` says how (one line); `index` is the number its
    /// [`start`](Self::start) line gave it (jobs on several devices finish in any order);
    /// `cost` is its estimated cost.
    pub fn finish(&mut self, index: usize, summary: &str, cost: f64) {
        self.done_cost += cost;
        let line = format!("[{index}/{}] {summary}", self.total_jobs);
        match &self.bar {
            Some(bar) => {
                bar.println(line);
                bar.inc((cost / self.total_cost * BAR_UNITS as f64) as u64);
            }
            None => say_line(format_args!(
                "{line}  ({} elapsed, ETA {})",
                human_duration(self.start.elapsed()),
                self.eta()
            )),
        }
    }

    /// A message that is not a job (skips, warnings).
    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.println(msg),
            None => say_line(format_args!("{msg}")),
        }
    }

    pub fn done(self) {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
    }
}
