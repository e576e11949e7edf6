//! `densebench compare BASE.csv NEW.csv`: matches rows by variant and every config field (not
//! timestamp or git revision; math mode, execution and device only where a side holds rows of
//! several: [`crate::outputs::compare::Split`]), prints NEW/BASE per metric as text, markdown
//! or CSV, flags regressions beyond `--max-regression`, lists rows present on one side only,
//! and warns when the two files come from different devices.
//!
//! Exit status: 0 no regression beyond the threshold (or no threshold given); 1 a metric worse
//! than BASE by more than PCT%, a metric NaN or infinite on either side (with or without a
//! threshold), a row ok in BASE that is not in NEW (another status, gradients
//! out of tolerance or unchecked: with or without a threshold), or rows of BASE missing from NEW
//! (unless `--allow-missing`); 2 a file could not be read, is not a result CSV of this schema,
//! or has a row whose key disagrees with its fields, no row of NEW matches one of BASE (nothing
//! to compare: refused, `--allow-missing` or not), or a bad flag value (`--max-regression` not a
//! finite percentage ≥ 0: clap's usage error).

use crate::outputs::compare::{
    compare_rows, nothing_matched, render_human, summary, write_csv, Gate, Metric, EXIT_REGRESSION,
};
use crate::results::row::{read_rows, Row};
use anyhow::{Context, Result};
use clap::ValueEnum;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status when an input could not be read or has the wrong schema.
pub const EXIT_BAD_INPUT: u8 = 2;

#[derive(clap::Args, Debug, Clone)]
#[command(
    after_help = "Exit status: 0 no regression beyond --max-regression (or none given); 1 a \
                  metric worse than BASE by more than --max-regression PCT%, a metric NaN or \
                  infinite on either side (with or without --max-regression), a row ok in BASE \
                  that failed in NEW (another status, or gradients out of tolerance or \
                  unchecked: judged with or without --max-regression), or rows of BASE \
                  missing from NEW without --allow-missing; 2 an input could not be read, has \
                  another schema, or has a row whose key disagrees with its fields, no row of \
                  NEW matches a row of BASE (nothing compared, --allow-missing or not), or a \
                  flag value is bad (--max-regression not a finite percentage ≥ 0)."
)]
pub struct Args {
    /// The baseline result CSV.
    pub base: PathBuf,
    /// The result CSV compared against the baseline (ratios are NEW/BASE).
    pub new: PathBuf,
    /// Flag a metric as a regression when NEW is worse than BASE by more than PCT percent
    /// (a finite number ≥ 0, e.g. 10; 0 flags any worsening), and exit with status 1 if any is.
    /// Without it no metric fails (a row that stopped working, or a missing one, still does).
    #[arg(
        long,
        value_name = "PCT",
        value_parser = percentage,
        allow_negative_numbers = true
    )]
    pub max_regression: Option<f64>,
    /// A metric to compare; repeat for several. Default: peak_bytes and median_ns.
    #[arg(long = "metric", value_enum, value_name = "METRIC")]
    pub metrics: Vec<Metric>,
    /// Accept rows of BASE that NEW lacks (listed either way). Without it a missing row fails the
    /// comparison (exit 1): a NEW run that silently dropped configurations is not "no
    /// regression".
    #[arg(long)]
    pub allow_missing: bool,
    /// Output format: aligned text, a markdown table to paste into a report, or CSV.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Markdown,
    Csv,
}

/// `--max-regression PCT`: a finite percentage ≥ 0. Anything else is clap's usage error (exit
/// 2), saying what a valid value is; a negative one reaches here too, not "unexpected argument".
fn percentage(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        // `abs` turns -0 into 0, printed as "0%"
        Ok(p) if p.is_finite() && p >= 0.0 => Ok(p.abs()),
        _ => Err(PERCENTAGE.to_string()),
    }
}

/// What a valid `--max-regression` is, as clap's usage error says it.
const PERCENTAGE: &str = "expected a percentage: a finite number ≥ 0 such as 10 (NEW may be \
                          10% worse than BASE; 0 flags any worsening)";

fn read(path: &Path, side: &str) -> Result<Vec<Row>> {
    crate::results::store::warn_if_being_written(path);
    read_rows(path).with_context(|| format!("reading {side} {}", path.display()))
}

/// A write to stdout whose reader went away (`compare … | head`) is no failure of the
/// comparison: the rest of the output goes nowhere, and the exit status is still the verdict's
/// (an error here exited 1, which reads as "a regression").
trait FilterBrokenPipe {
    fn filter_broken_pipe(self) -> Result<()>;
}

impl FilterBrokenPipe for Result<()> {
    fn filter_broken_pipe(self) -> Result<()> {
        let broken = |e: &anyhow::Error| {
            e.chain().any(|c| {
                let io = c.downcast_ref::<std::io::Error>().or_else(|| {
                    match c.downcast_ref::<csv::Error>().map(csv::Error::kind) {
                        Some(csv::ErrorKind::Io(io)) => Some(io),
                        _ => None,
                    }
                });
                io.is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            })
        };
        match self {
            Err(e) if broken(&e) => Ok(()),
            other => other,
        }
    }
}

/// `densebench compare`.
pub fn run(a: Args) -> Result<ExitCode> {
    let (base, new) = match (read(&a.base, "BASE"), read(&a.new, "NEW")) {
        (Ok(b), Ok(n)) => (b, n),
        (b, n) => {
            for e in [b.err(), n.err()].into_iter().flatten() {
                crate::say!("densebench compare: error: {e:#}");
            }
            return Ok(ExitCode::from(EXIT_BAD_INPUT));
        }
    };
    let metrics = if a.metrics.is_empty() {
        vec![Metric::PeakBytes, Metric::MedianNs]
    } else {
        // Each once, in the order first given: a metric named twice (not only twice in a row)
        // was compared twice, its regressions counted twice.
        let mut m: Vec<Metric> = Vec::new();
        for &x in &a.metrics {
            if !m.contains(&x) {
                m.push(x);
            }
        }
        m
    };
    let c = compare_rows(&base, &new, &metrics, a.max_regression);
    // Nothing paired: no verdict to give, pass or fail; the inputs are what to fix.
    if let Some(why) = nothing_matched(&c, &a.base, &a.new) {
        crate::say!("densebench compare: error: {why}");
        return Ok(ExitCode::from(EXIT_BAD_INPUT));
    }
    let gate = Gate {
        max_regression: a.max_regression,
        allow_missing: a.allow_missing,
    };
    match a.format {
        Format::Csv => {
            for w in &c.warnings {
                crate::say!("warning: {w}");
            }
            let written = write_csv(&c, std::io::stdout().lock());
            if let Err(e) = written.filter_broken_pipe() {
                return Err(e.context("writing CSV to stdout"));
            }
            crate::say!("{}", summary(&c, gate));
        }
        Format::Text | Format::Markdown => {
            let text = render_human(
                &c,
                &a.base,
                &a.new,
                gate,
                &metrics,
                a.format == Format::Markdown,
            );
            let written = std::io::stdout()
                .lock()
                .write_all(text.as_bytes())
                .map_err(anyhow::Error::from);
            if let Err(e) = written.filter_broken_pipe() {
                return Err(e.context("writing the comparison to stdout"));
            }
        }
    }
    // The verdict printed above (`summary`) and the exit status come from the same failures.
    Ok(if !c.failures(gate).is_empty() {
        ExitCode::from(EXIT_REGRESSION)
    } else {
        ExitCode::SUCCESS
    })
}
