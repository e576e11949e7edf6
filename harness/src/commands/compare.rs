//! `densebench compare BASE.csv NEW.csv`: matches rows by variant and every config field (not
//! timestamp, git revision or device), prints NEW/BASE per metric as text, markdown or CSV,
//! flags regressions beyond `--max-regression`, lists rows present on one side only, and warns
//! when the two files come from different devices.
//!
//! Exit status: 0 no regression beyond the threshold (or no threshold given); 1 a metric worse
//! than BASE by more than PCT%, a row ok in BASE that is not in NEW (another status, gradients
//! out of tolerance or unchecked: with or without a threshold), or rows of BASE missing from NEW
//! (unless `--allow-missing`); 2 a file could not be read, is not a result CSV of this schema,
//! or has a row whose key disagrees with its fields.

use crate::outputs::compare::{
    compare_rows, render_human, summary, write_csv, Metric, EXIT_REGRESSION,
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
                  metric worse than BASE by more than --max-regression PCT%, a row ok in BASE \
                  that failed in NEW (another status, or gradients out of tolerance or \
                  unchecked: judged with or without --max-regression), or rows of BASE \
                  missing from NEW without --allow-missing; 2 an input could not be read, has \
                  another schema, or has a row whose key disagrees with its fields."
)]
pub struct Args {
    /// The baseline result CSV.
    pub base: PathBuf,
    /// The result CSV compared against the baseline (ratios are NEW/BASE).
    pub new: PathBuf,
    /// Flag a metric as a regression when NEW is worse than BASE by more than PCT percent
    /// (e.g. 10), and exit with status 1 if any is. Without it no metric fails (a row that
    /// stopped working, or a missing one, still does).
    #[arg(long, value_name = "PCT")]
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

fn read(path: &Path, side: &str) -> Result<Vec<Row>> {
    read_rows(path).with_context(|| format!("reading {side} {}", path.display()))
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
    if let Some(p) = a.max_regression {
        if !(p.is_finite() && p >= 0.0) {
            anyhow::bail!("--max-regression {p}: expected a percentage ≥ 0, e.g. 10");
        }
    }
    let metrics = if a.metrics.is_empty() {
        vec![Metric::PeakBytes, Metric::MedianNs]
    } else {
        let mut m = a.metrics.clone();
        m.dedup();
        m
    };
    let c = compare_rows(&base, &new, &metrics, a.max_regression);
    match a.format {
        Format::Csv => {
            for w in &c.warnings {
                crate::say!("warning: {w}");
            }
            write_csv(&c, std::io::stdout().lock()).context("writing CSV to stdout")?;
            crate::say!("{}", summary(&c, a.max_regression));
        }
        Format::Text | Format::Markdown => {
            let text = render_human(
                &c,
                &a.base,
                &a.new,
                a.max_regression,
                &metrics,
                a.format == Format::Markdown,
            );
            std::io::stdout()
                .lock()
                .write_all(text.as_bytes())
                .context("writing the comparison to stdout")?;
        }
    }
    let missing = !c.only_base.is_empty() && !a.allow_missing;
    if missing {
        crate::say!(
            "densebench compare: FAIL: {} row(s) of BASE are missing from NEW (listed above); \
             pass --allow-missing to accept that",
            c.only_base.len()
        );
    }
    let failed =
        missing || !c.broke.is_empty() || (a.max_regression.is_some() && c.regressions() > 0);
    Ok(if failed {
        ExitCode::from(EXIT_REGRESSION)
    } else {
        ExitCode::SUCCESS
    })
}
