//! `densebench report RESULTS.csv...`: writes the markdown report of one or more result CSVs
//! read as one set ([`crate::outputs::report::render`]).

use crate::outputs::plots::shown;
use crate::outputs::report::{is_report, max_depth_paired, read_max_depth, render, same_search};
use crate::plan::bounds::bad_input;
use crate::results::replace::{refuse_foreign, Kind};
use crate::results::store::{read_rows_all, refuse_input_as_output, Reserved};
use anyhow::{anyhow, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Result CSVs written by `bench-all` or `run`, reported as one set (e.g. the CPU and the
    /// GPU reference: each configuration's tables are per device).
    #[arg(required = true, value_name = "CSV")]
    pub csvs: Vec<PathBuf>,
    /// Markdown file to write (its folder is created if missing). An existing file is replaced
    /// only when it is an earlier report (or empty), unless --force.
    #[arg(long, default_value = "results/REPORT.md")]
    pub out: PathBuf,
    /// Replace --out even when it is not an earlier report (e.g. a result CSV).
    #[arg(long)]
    pub force: bool,
    /// Folder holding the figures written by `densebench plots` (linked relative to the report).
    #[arg(long, default_value = "plots")]
    pub plots: PathBuf,
    /// CSVs written by `max-depth --out` (e.g. `--dtype f32,bf16`): where one holds answers in
    /// f32 and in bf16 for the same variant, family and budget, the "bf16 against f32" section
    /// sets their depths side by side.
    #[arg(long = "max-depth", value_name = "CSV")]
    pub max_depth: Vec<PathBuf>,
}

/// `densebench report`.
pub fn run(a: Args) -> Result<ExitCode> {
    let inputs: Vec<&std::path::Path> = a
        .csvs
        .iter()
        .chain(&a.max_depth)
        .map(PathBuf::as_path)
        .collect();
    refuse_input_as_output(&a.out, "--out", &inputs)?;
    // Bad input, before any work: a folder where the markdown file goes, or a file where the
    // figures' folder is.
    if a.out.is_dir() {
        return Err(bad_input(anyhow!(
            "--out {} is a folder: give the markdown file to write (e.g. {})",
            a.out.display(),
            a.out.join("REPORT.md").display()
        )));
    }
    let report = Kind {
        name: "a densebench report (Markdown)",
        recognise: is_report,
    };
    refuse_foreign(&a.out, "--out", &report, a.force)?;
    if a.plots.exists() && !a.plots.is_dir() {
        return Err(bad_input(anyhow!(
            "--plots {} is a file, not the folder `densebench plots` wrote the figures to",
            a.plots.display()
        )));
    }
    // --out's lock before any input is read: a second report to it fails at once, and it is
    // replaced only if it is still what it is now.
    let out = Reserved::new(&a.out)?;
    let rows = read_rows_all(&a.csvs)?;
    if !rows.iter().any(|r| r.is_ok()) {
        let mut statuses = std::collections::BTreeMap::<&str, usize>::new();
        for r in &rows {
            *statuses.entry(r.status.as_str()).or_default() += 1;
        }
        anyhow::bail!(
            "{}: no rows with status ok ({} rows in all{}); nothing to report{}",
            shown(&a.csvs),
            rows.len(),
            if statuses.is_empty() {
                String::new()
            } else {
                format!(": {}", crate::results::row::join_counts(&statuses))
            },
            if rows.is_empty() {
                ""
            } else {
                " (their `error` column says why)"
            }
        );
    }
    let mut answers = Vec::new();
    let mut files = Vec::new();
    for p in &a.max_depth {
        let read = read_max_depth(p)?;
        files.push((p, answers.len()..answers.len() + read.len()));
        answers.extend(read);
    }
    for (p, at) in &files {
        let own = &answers[at.clone()];
        if own.is_empty() {
            crate::say!(
                "densebench report: --max-depth {} holds no answers: nothing from it in the report",
                p.display()
            );
        } else if !own.iter().any(|x| max_depth_paired(&answers, x)) {
            crate::say!(
                "densebench report: --max-depth {}: none of its answers has a partner in the other \
                 dtype (f32 and bf16, same variant, budget and block: `max-depth --dtype f32,bf16` \
                 writes both): nothing from it in the report",
                p.display()
            );
        }
    }
    for (i, x) in answers.iter().enumerate() {
        if let Some(y) = answers[i + 1..]
            .iter()
            .find(|y| same_search(x, y) && y.dtype == x.dtype && y.max_depth != x.max_depth)
        {
            crate::say!(
                "densebench report: warning: two {} answers of `{}` within {} for {} disagree \
                 (L = {} and L = {}): the last one given is used",
                x.dtype,
                x.variant,
                crate::progress::human_bytes(Some(x.budget_bytes)),
                x.block,
                x.max_depth,
                y.max_depth
            );
        }
    }
    let text = render(&rows, &a.csvs, &a.out, &a.plots, &answers)?;
    out.write_bytes(text.as_bytes())
        .with_context(|| format!("writing the report {}", a.out.display()))?;
    crate::tell!(
        "wrote {} ({} rows from {})",
        a.out.display(),
        rows.len(),
        shown(&a.csvs)
    );
    Ok(ExitCode::SUCCESS)
}
