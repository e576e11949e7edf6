//! `densebench plots RESULTS.csv...`: regenerates every figure (SVG and PNG) of one or more
//! result CSVs read as one set ([`crate::outputs::plots::render_all`]) and says what it
//! skipped: on stderr, every row whose status is not ok, apart as the figures' footers show it
//! or no figure does.

use crate::outputs::plots::{
    csv_bytes, data, footer_listed, plan, render_all, shown, source_text, SOURCE_FILE,
};
use crate::plan::bounds::bad_input;
use crate::results::row::Row;
use crate::results::store::{read_rows_all, write_bytes_atomic};
use anyhow::{anyhow, bail, Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Result CSVs written by `bench-all` or `run`, drawn as one set (e.g. the CPU and the GPU
    /// reference: each configuration's figures are per device).
    #[arg(required = true, value_name = "CSV")]
    pub csvs: Vec<PathBuf>,
    /// Folder the figures are written to (created if missing); each figure as .svg and .png.
    #[arg(long, default_value = "plots")]
    pub out: PathBuf,
}

/// `densebench plots`.
pub fn run(a: Args) -> Result<ExitCode> {
    // Bad input, before any work: the figures go into a folder, never over a file (the CSV
    // itself, given as --out by mistake, included).
    if a.out.exists() && !a.out.is_dir() {
        return Err(bad_input(anyhow!(
            "--out {} is a file: give the folder to write the figures into (created if missing)",
            a.out.display()
        )));
    }
    let rows = read_rows_all(&a.csvs)?;
    let (groups, replaced) = data::group_rows(&rows);
    let ok = rows.iter().filter(|r| r.is_ok()).count();
    if ok == 0 {
        bail!(
            "{}: no rows with status ok ({} rows in all); nothing to plot",
            shown(&a.csvs),
            rows.len()
        );
    }
    crate::tell!(
        "plots: {ok} ok rows of {} in {}",
        rows.len(),
        shown(&a.csvs)
    );
    if replaced > 0 {
        crate::tell!(
            "note: {replaced} row(s) repeat an earlier (config, depth, variant); the last one is plotted"
        );
    }
    tell_skipped(&groups);
    for g in &groups {
        if g.depths().len() == 1 {
            crate::tell!(
                "note: {} has one depth only: no figures against depth",
                g.label
            );
        }
    }
    let mut files = render_all(&rows, &a.out)?;
    // which CSVs these figures are (for `report`)
    let bytes = csv_bytes(&a.csvs).context("reading the CSVs again to record them")?;
    let source = a.out.join(SOURCE_FILE);
    write_bytes_atomic(&source, source_text(&a.csvs, &bytes).as_bytes())?;
    files.push(source);
    crate::tell!("wrote {} files:", files.len());
    for f in &files {
        crate::tell!("  {}", f.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Lists on stderr the rows whose status is not ok, each with its device: first those some
/// figure's footer shows, then those none does (a configuration whose every row failed has no
/// figure; a full footer shows its first rows only).
fn tell_skipped(groups: &[data::Group]) {
    let listed = footer_listed(groups, &plan(groups));
    let (mut shown, mut unshown): (Vec<&Row>, Vec<&Row>) = (Vec::new(), Vec::new());
    for (g, flags) in groups.iter().zip(&listed) {
        for (r, &l) in g.skipped.iter().zip(flags) {
            if l {
                shown.push(r);
            } else {
                unshown.push(r);
            }
        }
    }
    if shown.is_empty() && unshown.is_empty() {
        return;
    }
    crate::say!(
        "skipped {} row(s) whose status is not ok:",
        shown.len() + unshown.len()
    );
    for (list, what) in [
        (&shown, "listed in the figures' footers"),
        (&unshown, "in no figure's footer"),
    ] {
        if list.is_empty() {
            continue;
        }
        crate::say!("  {} {what}:", list.len());
        for r in list.iter() {
            crate::say!("    {}", data::row_listing(r));
        }
    }
}
