//! Reading the files a user names, bounded: only a regular file is read (a FIFO, a device or a
//! socket may never end, or block forever in `open`, and is refused before it is opened, then
//! opened without blocking and checked again), and never more than a named byte limit —
//! [`MAX_CSV_BYTES`] for result CSVs (overridable with [`CSV_LIMIT_ENV`]), [`MAX_JSON_BYTES`]
//! for the small JSON records densebench reads back, the sweep file's
//! [`MAX_SWEEP_FILE_BYTES`](crate::plan::bounds::MAX_SWEEP_FILE_BYTES). A file over its limit is
//! refused with one line naming the file, its size and the limit (results/README.md, "Reading
//! inputs").

use crate::plan::bounds::bad_input;
use anyhow::{anyhow, Result};
use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The largest result CSV read, in bytes. A row is about 1.5 KB, so the largest sweep
/// ([`MAX_JOBS`](crate::plan::bounds::MAX_JOBS), 100 000 rows) is about 150 MB; a larger file is
/// not a result CSV of one sweep (a wrong path, a log, something that never ends) and is refused
/// before it is read, instead of growing the reader to the size of the disk.
pub const MAX_CSV_BYTES: u64 = 256 << 20;

/// The environment variable that replaces [`MAX_CSV_BYTES`] (a whole number of bytes), for a
/// merge of sweeps larger than any one sweep may be.
pub const CSV_LIMIT_ENV: &str = "DENSEBENCH_MAX_CSV_BYTES";

/// The largest small record read back (criterion's `estimates.json`, a cached peer error, the
/// figures' source record beside the plots): each is a few hundred bytes to a few KB.
pub const MAX_JSON_BYTES: u64 = 1 << 20;

/// What a file that is not a regular file is, in words (`a FIFO (named pipe)`, `a character
/// device`, …).
pub fn kind(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        "a folder"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    }
}

/// Refuses, as bad input, a file that is not a regular file: `what` names its role (`result
/// CSV`, `sweep file`).
fn refuse_non_regular(path: &Path, what: &str, meta: &Metadata) -> Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    Err(bad_input(anyhow!(
        "{what} {} is {}, not a regular file: densebench reads only regular files (a pipe or a \
         device may never end); copy it to a file first",
        path.display(),
        kind(meta)
    )))
}

/// Opens `path` for reading, refusing anything but a regular file before it is opened (opening
/// a FIFO blocks until a writer comes) and again once it is (it may have been replaced in
/// between; it is opened with `O_NONBLOCK`, so that open cannot block). Returns the file and its
/// length.
pub fn open_regular(path: &Path, what: &str) -> Result<(File, u64)> {
    let meta =
        std::fs::metadata(path).map_err(|e| anyhow!("reading {what} {}: {e}", path.display()))?;
    refuse_non_regular(path, what, &meta)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| anyhow!("opening {what} {}: {e}", path.display()))?;
    let meta = file
        .metadata()
        .map_err(|e| anyhow!("reading {what} {}: {e}", path.display()))?;
    refuse_non_regular(path, what, &meta)?;
    Ok((file, meta.len()))
}

/// The refusal of a file over its byte limit.
fn too_large(path: &Path, what: &str, len: u64, limit: u64, limit_name: &str) -> anyhow::Error {
    bad_input(anyhow!(
        "{what} {} is {len} bytes or more, over the limit of {limit} bytes ({limit_name}): not a \
         {what} densebench wrote, or raise the limit",
        path.display()
    ))
}

/// The whole of the regular file `path`, refused unread when it is over `limit` bytes
/// (`limit_name` says where the limit comes from, for the message) and cut off with an error
/// if it grows past it while read. An allocation the memory limit refuses is an error, not an
/// abort.
pub fn read_bounded(path: &Path, what: &str, limit: u64, limit_name: &str) -> Result<Vec<u8>> {
    let (file, len) = open_regular(path, what)?;
    if len > limit {
        return Err(too_large(path, what, len, limit, limit_name));
    }
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(usize::try_from(len).unwrap_or(usize::MAX))
        .map_err(|e| anyhow!("reading {what} {} ({len} bytes): {e}", path.display()))?;
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| anyhow!("reading {what} {}: {e}", path.display()))?;
    if bytes.len() as u64 > limit {
        return Err(too_large(path, what, bytes.len() as u64, limit, limit_name));
    }
    Ok(bytes)
}

/// The byte limit of a result CSV: [`CSV_LIMIT_ENV`] when set (a whole number of bytes, at
/// least 1; anything else is refused naming it), else [`MAX_CSV_BYTES`]. With where it comes
/// from, for messages.
pub fn csv_limit() -> Result<(u64, String)> {
    match std::env::var(CSV_LIMIT_ENV) {
        Err(std::env::VarError::NotPresent) => {
            Ok((MAX_CSV_BYTES, format!("{CSV_LIMIT_ENV} to raise it")))
        }
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => Ok((n, format!("from {CSV_LIMIT_ENV}"))),
            _ => Err(bad_input(anyhow!(
                "{CSV_LIMIT_ENV}={v} is not a byte limit: give a whole number of bytes (at \
                 least 1), e.g. {MAX_CSV_BYTES}, or unset it"
            ))),
        },
        Err(e) => Err(bad_input(anyhow!("{CSV_LIMIT_ENV}: {e}"))),
    }
}

/// A reader of at most `limit` bytes of a file: reading past it is an I/O error naming the file
/// and the limit (so a file that grows while it is read cannot grow the reader without end).
pub struct Bounded {
    file: File,
    left: u64,
    limit: u64,
    path: PathBuf,
    what: &'static str,
    limit_name: String,
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more tells a file that ends at the limit from one that goes on.
            let mut probe = [0u8; 1];
            return match self.file.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(format!(
                    "{} {} grew past the limit of {} bytes ({}) while it was read",
                    self.what,
                    self.path.display(),
                    self.limit,
                    self.limit_name
                ))),
            };
        }
        let max = usize::try_from(self.left)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let n = self.file.read(&mut buf[..max])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Opens the result CSV `path` for a reader: a regular file of at most [`csv_limit`] bytes,
/// refused before anything is read otherwise.
pub fn open_csv(path: &Path) -> Result<Bounded> {
    const WHAT: &str = "result CSV";
    let (limit, limit_name) = csv_limit()?;
    let (file, len) = open_regular(path, WHAT)?;
    if len > limit {
        return Err(too_large(path, WHAT, len, limit, &limit_name));
    }
    Ok(Bounded {
        file,
        left: limit,
        limit,
        path: path.to_path_buf(),
        what: WHAT,
        limit_name,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_regular_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("f");
        let c = std::ffi::CString::new(fifo.to_str().expect("utf-8")).expect("c string");
        // SAFETY: mkfifo(3) on a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Opening the FIFO for reading would block forever: it must be refused before.
        let e = read_bounded(&fifo, "sweep file", 10, "x").expect_err("a FIFO");
        assert!(
            format!("{e:#}").contains("a FIFO (named pipe), not a regular file"),
            "{e:#}"
        );
        let e = open_csv(Path::new("/dev/zero")).err().expect("a device");
        assert!(format!("{e:#}").contains("a character device"), "{e:#}");
        let e = open_csv(dir.path()).err().expect("a folder");
        assert!(format!("{e:#}").contains("a folder"), "{e:#}");
    }

    #[test]
    fn a_file_over_its_limit_is_refused_and_one_at_it_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.json");
        std::fs::write(&p, b"0123456789").expect("write");
        assert_eq!(
            read_bounded(&p, "record", 10, "x").expect("at the limit"),
            b"0123456789"
        );
        let e = read_bounded(&p, "record", 9, "LIMIT").expect_err("over");
        let e = format!("{e:#}");
        assert!(
            e.contains("10 bytes") && e.contains("limit of 9 bytes (LIMIT)"),
            "{e}"
        );
    }

    #[test]
    fn the_bounded_reader_stops_at_its_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("x.csv");
        std::fs::write(&p, b"0123456789").expect("write");
        let (file, _) = open_regular(&p, "result CSV").expect("open");
        let mut r = Bounded {
            file,
            left: 4,
            limit: 4,
            path: p.clone(),
            what: "result CSV",
            limit_name: "L".to_string(),
        };
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).expect_err("past the limit");
        assert_eq!(out, b"0123", "the limit's bytes, then the error");
        assert!(e.to_string().contains("limit of 4 bytes"), "{e}");
    }
}
