//! The results store: the one place result CSVs are opened, resumed and appended to. A sweep
//! appends each row as one flushed, synced write, so a kill leaves whole rows.

use crate::results::row::{self, Row};
use anyhow::{anyhow, bail, Context, Result};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The result CSV being written: every row appended and flushed as one write.
pub struct Output {
    file: File,
    path: PathBuf,
}

/// Cuts a torn last line (a row cut short by a kill) off a result file; returns whether it did.
fn repair_torn_line(path: &Path) -> Result<bool> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.is_empty() || bytes.ends_with(b"\n") {
        return Ok(false);
    }
    let keep = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {} to repair it", path.display()))?;
    f.set_len(keep as u64)
        .with_context(|| format!("truncating the torn last line of {}", path.display()))?;
    Ok(true)
}

/// One row as a CSV line (no header), exactly as `bench-all` appends it.
pub fn csv_line(row: &Row) -> Result<Vec<u8>> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(Vec::new());
    w.serialize(row).context("serialising a row")?;
    w.into_inner()
        .map_err(|e| anyhow!("serialising a row: {e}"))
}

impl Output {
    /// Opens `path` for a sweep. Returns the output and the keys it already holds (with
    /// `resume`). Errs, before any work, when the file exists without `resume`/`force`, is not
    /// a result CSV, or cannot be written.
    pub fn open(
        path: &Path,
        resume: bool,
        force: bool,
        progress: &dyn Fn(&str),
    ) -> Result<(Output, HashSet<String>)> {
        let existing = path.metadata().map(|m| m.len() > 0).unwrap_or(false);
        if path.is_dir() {
            bail!("output {} is a directory, not a CSV file", path.display());
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).with_context(|| {
                format!("cannot create the output directory {}", parent.display())
            })?;
        }
        let mut done = HashSet::new();
        let file = if existing && resume {
            if repair_torn_line(path)? {
                progress(&format!(
                    "{}: cut off a torn last line (a row interrupted by a kill)",
                    path.display()
                ));
            }
            for r in row::read_rows(path)? {
                done.insert(r.key);
            }
            OpenOptions::new()
                .append(true)
                .open(path)
                .with_context(|| format!("cannot append to the output file {}", path.display()))?
        } else {
            if existing && !force {
                bail!(
                    "output file {} already exists: pass --resume to continue it (skipping the \
                     configurations it holds) or --force to overwrite it",
                    path.display()
                );
            }
            let mut f = File::create(path)
                .with_context(|| format!("cannot write the output file {}", path.display()))?;
            let mut w = csv::Writer::from_writer(Vec::new());
            w.write_record(Row::columns())
                .context("writing the header")?;
            let header = w
                .into_inner()
                .map_err(|e| anyhow!("writing the header: {e}"))?;
            f.write_all(&header)
                .and_then(|()| f.flush())
                .with_context(|| format!("writing the header of {}", path.display()))?;
            f
        };
        Ok((
            Output {
                file,
                path: path.to_path_buf(),
            },
            done,
        ))
    }

    /// Appends one row as a single write, flushed and synced: a kill leaves whole rows.
    pub fn append(&mut self, row: &Row) -> Result<()> {
        let line = csv_line(row)?;
        self.file
            .write_all(&line)
            .and_then(|()| self.file.flush())
            .and_then(|()| self.file.sync_data())
            .with_context(|| format!("appending a row to {}", self.path.display()))
    }
}

/// Writes `rows` as a result CSV to `path`, under a temporary name renamed into place.
pub fn write_rows(path: &Path, rows: &[Row]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(Row::columns())
        .context("writing the header")?;
    let mut bytes = w
        .into_inner()
        .map_err(|e| anyhow!("writing the header: {e}"))?;
    for r in rows {
        bytes.extend(csv_line(r)?);
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating the output directory {}", parent.display()))?;
    }
    let name = path
        .file_name()
        .with_context(|| format!("output {} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
        .with_context(|| format!("writing {}", tmp.display()));
    if let Err(e) = written.and_then(|()| {
        std::fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
    }) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(())
}

/// Whether two paths name the same file (both must exist to compare canonical paths).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}
