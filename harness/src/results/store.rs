//! The results store: every file densebench writes goes through here, so that an interrupted,
//! concurrent or mistyped run can never destroy or falsify results.
//!
//! - **One writer per file.** A writer holds an exclusive advisory lock on `.NAME.lock` beside
//!   the output for as long as it writes; a second writer fails at once, naming the pid that
//!   holds it ([`WriterLock`]).
//! - **Sweeps append whole rows.** [`Output`] checks an existing file's header before it resumes
//!   or appends (a file that is not a densebench result CSV of a known schema is refused and left
//!   byte for byte unchanged), repairs a torn last row only (a complete row without its newline is
//!   kept), and appends each row as one flushed, synced write; a failed append is cut back, so a
//!   full disk leaves whole rows.
//! - **Everything else is replaced atomically** ([`write_atomic`]): written to a temporary file
//!   in the same folder, synced, renamed over the old one, the folder synced. A failure (a full
//!   disk: ENOSPC, EFBIG) leaves the previous file intact and says so in one line.
//! - **An output is never one of the command's inputs** ([`refuse_input_as_output`]), through
//!   any path or link.
//! - **Outputs are regular files** ([`refuse_non_regular_output`]): a FIFO, a device, a socket
//!   or a folder at an output path is refused, `--force` included, and a rename never replaces
//!   one. [`Reserved`] takes an output's lock before the command reads its inputs and replaces
//!   the output only if it is still what it was then (same inode, size and time, or still
//!   absent); otherwise it refuses and keeps the new file under its temporary name.

use crate::measure::interrupt;
use crate::plan::bounds::bad_input;
use crate::plan::input;
use crate::results::row::{self, Row};
use anyhow::{anyhow, bail, Context, Result};
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// How many bytes of a file's start are read to find its header line.
const HEADER_PROBE_BYTES: u64 = 64 * 1024;

/// How often acquiring a lock is retried when its file was replaced under us (a writer that
/// finished removed it between our open and our lock).
const LOCK_ATTEMPTS: usize = 8;

/// How long a lock whose recorded writer is no longer alive is waited for. A writer killed with
/// SIGKILL releases its lock when the last descriptor of it closes, and a measuring child it
/// was forking at that moment shares the descriptor until its `exec` (which closes it): a few
/// milliseconds, longer on a loaded machine. Seen as a refused `--resume` right after a
/// `kill -9` in the test suite on a busy 2-core machine.
const DEAD_WRITER_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Waits up to [`DEAD_WRITER_GRACE`] for a lock held past its writer's death; true once ours.
fn lock_after_dead_writer(file: &File, holder: &str) -> bool {
    let Ok(pid) = holder.parse::<i32>() else {
        return false;
    };
    if pid <= 0 || interrupt::process_exists(pid) {
        return false;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < DEAD_WRITER_GRACE {
        std::thread::sleep(std::time::Duration::from_millis(10));
        if file.try_lock().is_ok() {
            return true;
        }
    }
    false
}

/// What a lock file says of its holder: the pid its writer wrote (trimmed; empty when unreadable).
fn lock_holder(file: &mut File) -> String {
    let mut holder = String::new();
    let _ = file.take(64).read_to_string(&mut holder);
    holder.trim().to_string()
}

/// `path` with its file name replaced by `.NAME` + `suffix` (hidden, in the same folder, so a
/// rename stays on one filesystem).
fn sibling(path: &Path, suffix: &str) -> Result<PathBuf> {
    let name = path
        .file_name()
        .with_context(|| format!("output {} has no file name", path.display()))?;
    Ok(path.with_file_name(format!(".{}{suffix}", name.to_string_lossy())))
}

/// A write failure in words: a full disk (or a file-size limit) says so plainly, with the
/// promise the store keeps about the previous file.
fn io_failure(e: std::io::Error, what: &str, path: &Path, kept: &str) -> anyhow::Error {
    match e.raw_os_error() {
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => anyhow!(
            "{what} {}: no space left on the device; {kept}",
            path.display()
        ),
        Some(libc::EFBIG) => anyhow!(
            "{what} {}: file too large (a file-size limit was reached); {kept}",
            path.display()
        ),
        _ => anyhow!("{what} {}: {e}; {kept}", path.display()),
    }
}

/// Exclusive right to write one output file, held until dropped.
pub struct WriterLock {
    path: PathBuf,
    file: File,
}

impl WriterLock {
    /// Takes the lock of `output` or fails at once, naming the process that holds it. A lock
    /// file left by a writer that could not remove it (killed with SIGKILL; its lock went with
    /// it) is said on stderr and taken over. The lock file is removed again on every way out
    /// that can run code: dropping the lock, an error writing it (a full disk), a stop signal
    /// ([`interrupt::remove_on_exit`]).
    pub fn acquire(output: &Path) -> Result<WriterLock> {
        let path = sibling(output, ".lock")?;
        interrupt::install_cleanup()?;
        for _ in 0..LOCK_ATTEMPTS {
            // Without blocking: a FIFO planted at the lock's name would block the read below.
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .custom_flags(libc::O_NONBLOCK)
                .open(&path)
                .map_err(|e| {
                    io_failure(e, "creating the lock file", &path, "nothing was written")
                })?;
            if let Ok(m) = file.metadata().map(|m| m.file_type()) {
                if !m.is_file() {
                    return Err(bad_input(anyhow!(
                        "the lock file {} of {} is not a regular file: remove it",
                        path.display(),
                        output.display()
                    )));
                }
            }
            // Whoever wrote the file last: the holder, or a writer that died holding it.
            let holder = lock_holder(&mut file);
            match file.try_lock() {
                Ok(()) => {}
                Err(TryLockError::WouldBlock) => {
                    if !lock_after_dead_writer(&file, &holder) {
                        bail!(
                        "{} is being written by densebench {} (lock {}): wait for it to finish \
                         or stop it; two writers would interleave rows",
                        output.display(),
                        if holder.is_empty() {
                            "(pid unknown)".to_string()
                        } else {
                            format!("pid {holder}")
                        },
                        path.display()
                        );
                    }
                }
                Err(TryLockError::Error(e)) => {
                    return Err(e).with_context(|| format!("locking {}", path.display()))
                }
            }
            // The holder before us removes the file while it still holds the lock; if that
            // happened between our open and our lock, we locked a file nobody else will see.
            let ours = file.metadata().map(|m| (m.dev(), m.ino()));
            let now = std::fs::metadata(&path).map(|m| (m.dev(), m.ino()));
            match (ours, now) {
                (Ok(a), Ok(b)) if a == b => {}
                _ => continue,
            }
            interrupt::remove_on_exit(&path);
            // From here on, dropping it (an error below included) removes the file.
            let mut lock = WriterLock { path, file };
            if !holder.is_empty() {
                crate::say!(
                    "densebench: taking over the stale lock {} of {}: {}",
                    lock.path.display(),
                    output.display(),
                    match holder.parse::<i32>() {
                        Ok(pid) if pid > 0 && !interrupt::process_exists(pid) => format!(
                            "its writer, pid {pid}, is no longer running (killed before it \
                             could remove it)"
                        ),
                        _ => format!("its writer `{holder}` no longer holds it"),
                    }
                );
            }
            lock.file
                .set_len(0)
                .and_then(|()| lock.file.seek(SeekFrom::Start(0)).map(drop))
                .and_then(|()| {
                    lock.file
                        .write_all(std::process::id().to_string().as_bytes())
                })
                .and_then(|()| lock.file.flush())
                .map_err(|e| {
                    io_failure(
                        e,
                        "writing the lock file",
                        &lock.path,
                        "nothing was written",
                    )
                })?;
            return Ok(lock);
        }
        bail!(
            "could not lock {}: its lock file {} kept changing (another writer starting and \
             stopping?)",
            output.display(),
            path.display()
        )
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        // Removed while still locked (see `acquire`); the lock goes with the descriptor.
        let _ = std::fs::remove_file(&self.path);
        interrupt::keep_on_exit(&self.path);
        let _ = self.file.unlock();
    }
}

/// Creates the folder of `path` if it has one and it is missing. Where a file stands in the
/// way (`--out notes.txt/r.csv`), the error names it: the system says only "Not a directory".
fn create_parent(path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| {
            let what = format!("creating the output folder {}", parent.display());
            match parent.ancestors().find(|a| a.exists() && !a.is_dir()) {
                Some(file) => anyhow!(
                    "{what}: {} is a file, not a folder (another path for the output?)",
                    file.display()
                ),
                None => anyhow::Error::new(e).context(what),
            }
        })?;
    }
    Ok(())
}

/// Syncs a folder so a rename in it survives a crash (best effort: not every filesystem lets a
/// folder be opened for it).
fn sync_dir(path: &Path) {
    let dir = match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(d) => d.to_path_buf(),
        None => PathBuf::from("."),
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Refuses, as bad input, an output path that exists and is not a regular file (a FIFO, a
/// character or block device, a socket, a folder; through a symbolic link too): densebench writes
/// only to regular files or new paths, `--force` included, so `--out /dev/null` or a FIFO is
/// never replaced by a plain file. `flag` names the output (`--out`, `output`).
pub fn refuse_non_regular_output(path: &Path, flag: &str) -> Result<()> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if meta.is_file() {
        return Ok(());
    }
    Err(bad_input(anyhow!(
        "{flag} {} is {}, not a regular file: densebench writes only to regular files or new \
         paths (--force included); give the path of a file",
        path.display(),
        input::kind(&meta)
    )))
}

/// What is at an output path, as a rename would see it: the entry itself (a symbolic link is
/// not followed), its device, inode, length and modification time; `None` when nothing is.
type Snapshot = Option<(u64, u64, u64, i64, i64)>;

fn snapshot(path: &Path) -> Result<Snapshot> {
    match std::fs::symlink_metadata(path) {
        Ok(m) => Ok(Some((m.dev(), m.ino(), m.len(), m.mtime(), m.mtime_nsec()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow!("reading the output {}: {e}", path.display())),
    }
}

/// How long to wait before the rename, from the test hook `DENSEBENCH_TEST_RENAME_DELAY_MS`
/// (`harness/tests/hostile_io.rs` changes the output in that window); none without it.
fn test_rename_delay() {
    if let Some(ms) = std::env::var("DENSEBENCH_TEST_RENAME_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Renames `tmp` over `path` only if `path` is still what `was` says: the same file (inode,
/// length, time) or still absent (then with `RENAME_NOREPLACE`, so a file that appears at the
/// last moment is not replaced either, where the filesystem supports it). `Ok(Err(..))`: the
/// output changed; the caller keeps `tmp` and says so.
fn rename_if_unchanged(
    tmp: &Path,
    path: &Path,
    was: Snapshot,
    kept: &str,
) -> Result<std::result::Result<(), anyhow::Error>> {
    let changed = |now: &str| {
        anyhow!(
            "{} changed while densebench worked ({now}): refusing to replace it; the new \
             output is kept in {}",
            path.display(),
            tmp.display()
        )
    };
    let now = snapshot(path)?;
    if now != was {
        let now = match (was, now) {
            (None, Some(_)) => "a file appeared there",
            (Some(_), None) => "it was removed",
            _ => "it was replaced or written",
        };
        return Ok(Err(changed(now)));
    }
    if now.is_some() {
        std::fs::rename(tmp, path).map_err(|e| io_failure(e, "replacing", path, kept))?;
        return Ok(Ok(()));
    }
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes());
    let (Ok(from), Ok(to)) = (c(tmp), c(path)) else {
        bail!("output {} has a NUL byte in its path", path.display());
    };
    // SAFETY: renameat2(2) on two valid NUL-terminated paths relative to the working directory.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(Ok(()));
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => Ok(Err(changed("a file appeared there"))),
        // A filesystem without RENAME_NOREPLACE: the check above is what there is.
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            std::fs::rename(tmp, path).map_err(|e| io_failure(e, "replacing", path, kept))?;
            Ok(Ok(()))
        }
        _ => Err(io_failure(e, "replacing", path, kept)),
    }
}

/// An output reserved for replacing: its writer lock taken and what was at its path noted,
/// before the command reads its inputs (`merge`, `report`), so that a second writer fails at
/// once and a file that appears at the path meanwhile is not replaced ([`Reserved::write`]).
pub struct Reserved {
    path: PathBuf,
    was: Snapshot,
    _lock: WriterLock,
}

impl Reserved {
    /// Takes `path`'s writer lock (creating its folder if missing), refusing a path that is not
    /// a regular file ([`refuse_non_regular_output`]), and notes what is there.
    pub fn new(path: &Path) -> Result<Reserved> {
        refuse_non_regular_output(path, "output")?;
        create_parent(path)?;
        let lock = WriterLock::acquire(path)?;
        // Checked again under the lock: only now can nothing of ours change it.
        refuse_non_regular_output(path, "output")?;
        Ok(Reserved {
            path: path.to_path_buf(),
            was: snapshot(path)?,
            _lock: lock,
        })
    }

    /// Replaces the output atomically with what `write` puts into the temporary file it is
    /// given (a hidden sibling of the output with the same extension, so libraries that pick a
    /// format by extension still do), if the output is still what it was when reserved. On a
    /// failure the temporary file is removed and the previous output is left as it was; when
    /// the output changed meanwhile, it is left as it is now and the temporary file is kept,
    /// named in the error.
    pub fn write(&self, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
        let path = self.path.as_path();
        let ext = path
            .extension()
            .map(|e| format!(".{}", e.to_string_lossy()))
            .unwrap_or_default();
        let tmp = sibling(path, &format!(".tmp{}{ext}", std::process::id()))?;
        let kept = format!("the previous {} is unchanged", path.display());
        interrupt::remove_on_exit(&tmp);
        // Anything at the temporary name is a dead process's (the name holds our pid), or
        // planted: a FIFO there would block the writer's open.
        let _ = std::fs::remove_file(&tmp);
        let result = write(&tmp)
            .and_then(|()| {
                File::open(&tmp)
                    .and_then(|f| f.sync_all())
                    .map_err(|e| io_failure(e, "syncing", &tmp, &kept))
            })
            .and_then(|()| {
                test_rename_delay();
                rename_if_unchanged(&tmp, path, self.was, &kept)
            });
        interrupt::keep_on_exit(&tmp);
        match result {
            Ok(Ok(())) => {
                sync_dir(path);
                Ok(())
            }
            Ok(Err(changed)) => Err(changed),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(write_failure(e, path, &kept))
            }
        }
    }

    /// [`Reserved::write`] of a byte buffer, with a full disk reported as such.
    pub fn write_bytes(&self, bytes: &[u8]) -> Result<()> {
        let path = self.path.as_path();
        self.write(|tmp| {
            let kept = format!("the previous {} is unchanged", path.display());
            File::create(tmp)
                .and_then(|mut f| f.write_all(bytes).and_then(|()| f.flush()))
                .map_err(|e| io_failure(e, "writing", path, &kept))
        })
    }
}

/// A failed write in one line: a write error deep in a library (plotters, safetensors) keeps
/// only the OS's words, so a full disk is recognised there too, and the promise the store keeps
/// about the previous file (`kept`) is added.
fn write_failure(e: anyhow::Error, path: &Path, kept: &str) -> anyhow::Error {
    let text = format!("{e:#}");
    if let Some(errno) = [libc::ENOSPC, libc::EDQUOT, libc::EFBIG]
        .into_iter()
        .find(|n| text.contains(&format!("(os error {n})")))
    {
        return io_failure(
            std::io::Error::from_raw_os_error(errno),
            "writing",
            path,
            kept,
        );
    }
    if text.contains(kept) {
        return e;
    }
    e.context(format!("writing {} failed; {kept}", path.display()))
}

/// Replaces `path` atomically with what `write` puts into the temporary file it is given
/// ([`Reserved::write`]), holding `path`'s writer lock meanwhile. On any failure the temporary
/// file is removed and the previous `path` is left as it was.
pub fn write_atomic(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if path.is_dir() {
        bail!("output {} is a folder, not a file", path.display());
    }
    Reserved::new(path)?.write(write)
}

/// [`write_atomic`] of a byte buffer, with a full disk reported as such.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic(path, |tmp| {
        let kept = format!("the previous {} is unchanged", path.display());
        File::create(tmp)
            .and_then(|mut f| f.write_all(bytes).and_then(|()| f.flush()))
            .map_err(|e| io_failure(e, "writing", path, &kept))
    })
}

/// Identity of an existing file (device and inode), or of the file a not-yet-existing path
/// would create (its folder's identity and its name).
fn identity(p: &Path) -> Option<(u64, u64, Option<std::ffi::OsString>)> {
    if let Ok(m) = std::fs::metadata(p) {
        return Some((m.dev(), m.ino(), None));
    }
    let parent = p.parent().filter(|d| !d.as_os_str().is_empty());
    let dir = std::fs::metadata(parent.unwrap_or(Path::new("."))).ok()?;
    Some((
        dir.dev(),
        dir.ino(),
        p.file_name().map(|n| n.to_os_string()),
    ))
}

/// Refuses an output that is one of the command's inputs (the same file through any path, hard
/// or symbolic link): writing it would destroy the input before, or while, it is read.
pub fn refuse_input_as_output(output: &Path, flag: &str, inputs: &[&Path]) -> Result<()> {
    let out = identity(output);
    for input in inputs {
        if out.is_some() && identity(input) == out {
            return Err(bad_input(anyhow!(
                "{flag} {} is the input {}: refusing to overwrite an input; write to another file",
                output.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// [`row::read_rows`] of each CSV, their rows one file after the other (`plots` and `report` of a
/// CPU and a GPU reference together). A CSV named twice (through any path or link) is refused:
/// its rows would count twice. Rows that repeat a key on the same machine (within a file or
/// across files) are warned about and counted once, the last of each kept
/// ([`row::last_of_each_key`]).
pub fn read_rows_all(paths: &[std::path::PathBuf]) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    // the file of each row, for messages
    let mut file_of = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].iter().any(|q| q == p || same_file(q, p)) {
            return Err(bad_input(anyhow!(
                "{} is named twice: give each result CSV once",
                p.display()
            )));
        }
        warn_if_being_written(p);
        let read = row::read_rows(p)?;
        file_of.extend(std::iter::repeat_n(p, read.len()));
        rows.extend(read);
    }
    // A row's key does not name its 3×3 convolution: rows of two would be taken for repeats of
    // one measurement below, and the last kept, one convolution's rows mixed into the other's.
    if let Some((machine, convs)) = crate::results::conv_path::mixed_on_one_machine(&rows) {
        return Err(bad_input(anyhow!(
            "the GPU rows of {machine} were measured with {} 3×3 convolutions ({}): a row's key \
             does not name its convolution (DENSEBENCH_CONV; its `note` does), so one would be \
             taken for a repeat of the other; give one convolution's files at a time (`compare` \
             sets two side by side)",
            convs.len(),
            convs
                .iter()
                .map(|&(which, n, first)| format!(
                    "{which}: {n} rows, the first {} in {}",
                    rows[first].key,
                    file_of[first].display()
                ))
                .collect::<Vec<_>>()
                .join("; ")
        )));
    }
    let (rows, repeated) = row::last_of_each_key(rows);
    if let Some(w) = row::repeated_keys_warning(&repeated) {
        crate::say!("warning: {w}");
    }
    Ok(rows)
}

/// The pid of the densebench that is writing the result CSV `path` right now (a sweep in
/// progress): its writer lock's file exists and names a live process. Read without taking the
/// lock (a reader must never make a starting writer fail); a lock left by a dead writer, or none,
/// is `None`.
pub fn being_written_by(path: &Path) -> Option<i32> {
    let lock = sibling(path, ".lock").ok()?;
    let mut file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&lock)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let pid = lock_holder(&mut file).parse::<i32>().ok()?;
    (pid > 0 && pid != std::process::id() as i32 && interrupt::process_exists(pid)).then_some(pid)
}

/// Says on stderr that the result CSV `path` is being written right now ([`being_written_by`]):
/// what a reader shows of it is the rows written so far.
pub fn warn_if_being_written(path: &Path) {
    if let Some(pid) = being_written_by(path) {
        crate::say!(
            "warning: {} is being written by densebench pid {pid} right now (a sweep in \
             progress): read as far as it is written",
            path.display()
        );
    }
}

/// Whether two paths name the same existing file (through any path or link).
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
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

/// The header line of the current schema, with its newline.
pub fn header_line() -> Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(Row::columns())
        .context("writing the header")?;
    w.into_inner()
        .map_err(|e| anyhow!("writing the header: {e}"))
}

/// The whole file of `rows`: header and one line per row.
pub fn csv_bytes(rows: &[Row]) -> Result<Vec<u8>> {
    let mut bytes = header_line()?;
    for r in rows {
        bytes.extend(csv_line(r)?);
    }
    Ok(bytes)
}

/// Writes `rows` as a result CSV to `path`, atomically ([`write_atomic`]).
pub fn write_rows(path: &Path, rows: &[Row]) -> Result<()> {
    let bytes = csv_bytes(rows)?;
    write_bytes_atomic(path, &bytes)
}

/// Refuses, without changing a byte, a file whose first line is not the header of the result
/// schema this densebench writes.
fn check_header(path: &Path, file: &mut File) -> Result<()> {
    let mut start = Vec::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.take(HEADER_PROBE_BYTES).read_to_end(&mut start))
        .with_context(|| format!("reading the header of {}", path.display()))?;
    let first = start.split(|&b| b == b'\n').next().unwrap_or_default();
    let expected = header_line()?;
    let expected = expected.strip_suffix(b"\n").unwrap_or(&expected);
    if first == expected {
        return Ok(());
    }
    if first.strip_suffix(b"\r") == Some(expected) {
        return Err(bad_input(anyhow!(
            "{} has Windows (CRLF) line endings (saved by a spreadsheet or Python's csv \
             module?): refusing to append densebench's LF lines to it; convert it first \
             (`sed -i 's/\\r$//' {}`) or write to a new file; the file was not changed",
            path.display(),
            path.display()
        )));
    }
    if let Some(rest) = first.strip_prefix(b"\xEF\xBB\xBF") {
        if rest.strip_suffix(b"\r").unwrap_or(rest) == expected {
            return Err(bad_input(anyhow!(
                "{} starts with a UTF-8 byte-order mark (saved by a spreadsheet or an editor on \
                 Windows?), invisible before its header: refusing to append to it; remove it \
                 first (`sed -i '1s/^\\xEF\\xBB\\xBF//' {}`{}) or write to a new file; the file \
                 was not changed",
                path.display(),
                path.display(),
                if rest.ends_with(b"\r") {
                    ", and its Windows (CRLF) line endings: `sed -i 's/\\r$//'`"
                } else {
                    ""
                }
            )));
        }
    }
    let shown = String::from_utf8_lossy(&first[..first.len().min(80)]).into_owned();
    let got: Vec<String> = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(first)
        .records()
        .next()
        .and_then(|r| r.ok())
        .map(|r| r.iter().map(str::to_string).collect())
        .unwrap_or_default();
    let want = Row::columns();
    let missing: Vec<&str> = want
        .iter()
        .filter(|c| !got.contains(c))
        .map(String::as_str)
        .collect();
    let extra: Vec<&str> = got
        .iter()
        .filter(|c| !want.contains(c))
        .map(String::as_str)
        .collect();
    // An older schema's file: its header is this one's less the columns later schemas added.
    if let Some(old) = row::header_schema(&got).filter(|&s| s < row::SCHEMA_VERSION) {
        return Err(bad_input(anyhow!(
            "{} was written by an older densebench (result schema {old}, without the columns \
             [{}]): refusing to append schema-{} rows to it; `densebench merge NEW.csv {}` \
             rewrites it in the current schema (or write to a new file); the file was not changed",
            path.display(),
            missing.join(", "),
            row::SCHEMA_VERSION,
            path.display()
        )));
    }
    let columns = if let Some(twice) = row::repeated_column(&got) {
        format!("it names {twice}")
    } else if missing.is_empty() && extra.is_empty() {
        "the same columns in another order".to_string()
    } else {
        format!(
            "missing columns [{}], extra columns [{}]",
            missing.join(", "),
            extra
                .iter()
                .map(|c| row::extra_column(&got, c))
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Err(bad_input(anyhow!(
        "{} is not a densebench schema-{} result CSV (its first line is `{shown}`{}: {columns}): \
         refusing to resume or append to it; the file was not changed",
        path.display(),
        row::SCHEMA_VERSION,
        if first.len() > 80 { "…" } else { "" }
    )))
}

/// Removes from the result CSV `path` the rows for which `drop` says true, given their `key` and
/// `status`, rewriting it atomically (a hidden sibling renamed over it) with the header and
/// every other row byte for byte. The caller holds the writer lock. Says what it removed (by
/// status); returns whether it removed anything.
fn drop_rows_where(path: &Path, drop: &RowFilter, note: &dyn Fn(&str)) -> Result<bool> {
    let (limit, from) = input::csv_limit()?;
    let bytes = input::read_bounded(path, "result CSV", limit, &from)?;
    let mut rdr = csv::Reader::from_reader(bytes.as_slice());
    let headers = rdr
        .headers()
        .with_context(|| format!("reading the header of {}", path.display()))?
        .clone();
    let column = |name: &str| {
        headers
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("{} has no `{name}` column", path.display()))
    };
    let (key, status) = (column("key")?, column("status")?);
    // (start byte, the status of a dropped row) of every record; a record ends where the next
    // starts.
    let mut records: Vec<(usize, Option<String>)> = Vec::new();
    for rec in rdr.records() {
        let rec = rec.with_context(|| format!("reading {}", path.display()))?;
        let start = rec.position().map_or(0, |p| p.byte() as usize);
        let (k, s) = (rec.get(key).unwrap_or(""), rec.get(status).unwrap_or(""));
        records.push((start, drop(k, s).then(|| s.to_string())));
    }
    let dropped: Vec<&str> = records.iter().filter_map(|(_, d)| d.as_deref()).collect();
    if dropped.is_empty() {
        note(&format!(
            "{}: no failed rows of this run to measure again",
            path.display()
        ));
        return Ok(false);
    }
    let mut kept = bytes[..records.first().map_or(bytes.len(), |r| r.0)].to_vec();
    for (i, (start, drop)) in records.iter().enumerate() {
        let end = records.get(i + 1).map_or(bytes.len(), |r| r.0);
        if drop.is_none() {
            kept.extend_from_slice(&bytes[*start..end]);
        }
    }
    let tmp = sibling(path, &format!(".tmp{}", std::process::id()))?;
    let unchanged = format!("{} is unchanged", path.display());
    let made = File::create(&tmp)
        .and_then(|mut f| f.write_all(&kept).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| io_failure(e, "removing the failed rows of", path, &unchanged));
    if let Err(e) = made {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir(path);
    let mut counts = std::collections::BTreeMap::<&str, usize>::new();
    for s in dropped {
        *counts.entry(s).or_default() += 1;
    }
    note(&format!(
        "{}: removed {} rows to measure them again ({})",
        path.display(),
        counts.values().sum::<usize>(),
        row::join_counts(&counts)
    ));
    Ok(true)
}

/// What to do with the last line of a file that does not end in a newline: a complete row is
/// kept (its newline is added), anything else is a row torn by a kill and is cut off.
fn repair_last_line(path: &Path, file: &mut File, note: &dyn Fn(&str)) -> Result<()> {
    let len = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))
        .and_then(|_| file.read_exact(&mut last))
        .with_context(|| format!("reading {}", path.display()))?;
    if last[0] == b'\n' {
        return Ok(());
    }
    let mut bytes = Vec::new();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut bytes))
        .with_context(|| format!("reading {}", path.display()))?;
    let start = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    let kept = format!("{} is unchanged", path.display());
    if start == 0 {
        // The only line is the header, which `check_header` has accepted: a file of no rows
        // whose header lost its newline (written by hand, or by a tool that strips the last
        // one). Cutting it as a torn row emptied the file.
        file.seek(SeekFrom::End(0))
            .and_then(|_| file.write_all(b"\n"))
            .and_then(|()| file.sync_data())
            .map_err(|e| io_failure(e, "completing the header of", path, &kept))?;
        note(&format!(
            "{}: its header had no newline; added one",
            path.display()
        ));
        return Ok(());
    }
    let tail = &bytes[start..];
    let mut probe = header_line()?;
    probe.extend_from_slice(tail);
    probe.push(b'\n');
    let complete = csv::Reader::from_reader(probe.as_slice())
        .deserialize::<Row>()
        .next()
        .is_some_and(|r| r.is_ok());
    if complete {
        file.seek(SeekFrom::End(0))
            .and_then(|_| file.write_all(b"\n"))
            .and_then(|()| file.sync_data())
            .map_err(|e| io_failure(e, "completing the last row of", path, &kept))?;
        note(&format!(
            "{}: its last row had no newline; kept it and added one",
            path.display()
        ));
    } else {
        file.set_len(start as u64)
            .and_then(|()| file.sync_data())
            .map_err(|e| io_failure(e, "cutting the torn last line of", path, &kept))?;
        note(&format!(
            "{}: cut off a torn last line (a row interrupted by a kill)",
            path.display()
        ));
    }
    Ok(())
}

/// Which rows to remove from a file before resuming it, given a row's `key` and `status`.
pub type RowFilter<'a> = dyn Fn(&str, &str) -> bool + 'a;

/// The result CSV a sweep writes: locked for this process, every row appended as one write.
pub struct Output {
    file: File,
    path: PathBuf,
    _lock: WriterLock,
}

impl Output {
    /// Opens `path` for a sweep. Returns the output and the rows it already holds (with
    /// `resume`; none otherwise), so the caller can skip their keys and count them in its
    /// verdict. Errs, before any work and without changing the file, when another process is
    /// writing it, when it exists without `resume`/`force`, when it is not a result CSV of this
    /// schema, or cannot be written.
    ///
    /// `rerun` (with `resume`): rows for which it says true, given their key and status, are
    /// removed from the file first (rewritten atomically, every other byte kept), so their keys
    /// run again.
    ///
    /// `check` (with `resume`) is given every row the file holds before any is removed; its
    /// error is returned with the file unchanged (but for a torn last line cut off).
    pub fn open(
        path: &Path,
        resume: bool,
        force: bool,
        rerun: Option<&RowFilter>,
        check: &dyn Fn(&[Row]) -> Result<()>,
        note: &dyn Fn(&str),
    ) -> Result<(Output, Vec<Row>)> {
        if path.is_dir() {
            return Err(bad_input(anyhow!(
                "output {} is a folder, not a CSV file",
                path.display()
            )));
        }
        refuse_non_regular_output(path, "--out")?;
        create_parent(path)?;
        let lock = WriterLock::acquire(path)?;
        refuse_non_regular_output(path, "--out")?;
        let existing = path.metadata().map(|m| m.len() > 0).unwrap_or(false);
        let mut done = Vec::new();
        let file = if existing && resume {
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .with_context(|| format!("cannot open the output file {}", path.display()))?;
            check_header(path, &mut f)?;
            repair_last_line(path, &mut f, note)?;
            // Read and checked as a whole before any row is removed (`rerun`): a file that does
            // not read, or that `check` refuses, is left as it is.
            done = row::read_rows(path)?;
            check(&done)?;
            if let Some(rerun) = rerun {
                if drop_rows_where(path, rerun, note)? {
                    // the rename replaced the file this handle has open
                    f = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(path)
                        .with_context(|| {
                            format!("cannot open the output file {}", path.display())
                        })?;
                    done = row::read_rows(path)?;
                }
            }
            f.seek(SeekFrom::End(0))
                .with_context(|| format!("cannot append to {}", path.display()))?;
            f
        } else {
            if existing && !force {
                return Err(bad_input(anyhow!(
                    "output file {} already exists: pass --resume to continue it (skipping the \
                     configurations it holds) or --force to overwrite it",
                    path.display()
                )));
            }
            // A new file (or `--force`): the header replaces whatever was there atomically, so
            // a failure leaves the old file, and the lock is already ours.
            let header = header_line()?;
            let was = snapshot(path)?;
            let tmp = sibling(path, &format!(".tmp{}", std::process::id()))?;
            let kept = format!("{} is unchanged", path.display());
            let made = File::create(&tmp)
                .and_then(|mut f| f.write_all(&header).and_then(|()| f.sync_all()))
                .map_err(|e| io_failure(e, "writing the header of", path, &kept))
                .and_then(|()| rename_if_unchanged(&tmp, path, was, &kept));
            match made {
                Ok(Ok(())) => {}
                Ok(Err(changed)) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(changed.context("nothing was measured"));
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
            }
            sync_dir(path);
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .with_context(|| format!("cannot open the output file {}", path.display()))?;
            f.seek(SeekFrom::End(0))
                .with_context(|| format!("cannot append to {}", path.display()))?;
            f
        };
        Ok((
            Output {
                file,
                path: path.to_path_buf(),
                _lock: lock,
            },
            done,
        ))
    }

    /// Appends one row as a single write, flushed and synced: a kill leaves whole rows, and a
    /// write that fails (a full disk) is cut back so the file still ends with a whole row.
    pub fn append(&mut self, row: &Row) -> Result<()> {
        let line = csv_line(row)?;
        let before = self
            .file
            .seek(SeekFrom::End(0))
            .with_context(|| format!("appending a row to {}", self.path.display()))?;
        let written = self
            .file
            .write_all(&line)
            .and_then(|()| self.file.flush())
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            let _ = self.file.set_len(before);
            let _ = self.file.seek(SeekFrom::Start(before));
            return Err(io_failure(
                e,
                "appending a row to",
                &self.path,
                "the rows before it are intact; free space and continue with --resume",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_writer_is_refused_with_the_holders_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("r.csv");
        let held = WriterLock::acquire(&out).expect("first lock");
        // A second descriptor in the same process conflicts like another process would.
        let e = WriterLock::acquire(&out).err().map(|e| e.to_string());
        let pid = std::process::id().to_string();
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("being written by densebench") && e.contains(&pid)),
            "{e:?}"
        );
        drop(held);
        assert!(WriterLock::acquire(&out).is_ok(), "released on drop");
        assert!(
            !dir.path().join(".r.csv.lock").exists(),
            "lock file removed"
        );
    }

    /// A lock still held after its recorded writer died (a descriptor kept by a child it was
    /// forking when it was killed) is waited for, briefly, instead of refusing a `--resume`;
    /// one held past [`DEAD_WRITER_GRACE`] is still refused, naming the dead pid.
    #[test]
    fn a_lock_held_past_its_writers_death_is_waited_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("r.csv");
        let held = WriterLock::acquire(&out).expect("first lock");
        // a pid that existed and is gone: a reaped child's
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let dead = child.id();
        child.wait().expect("reap");
        held.file.set_len(0).expect("truncate");
        std::os::unix::fs::FileExt::write_all_at(&held.file, dead.to_string().as_bytes(), 0)
            .expect("write pid");
        let release = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            let _ = held.file.unlock();
            held
        });
        let start = std::time::Instant::now();
        let second = WriterLock::acquire(&out);
        assert!(second.is_ok(), "{:?}", second.err().map(|e| e.to_string()));
        assert!(
            start.elapsed() >= std::time::Duration::from_millis(250),
            "it waited"
        );
        drop(second);
        drop(release.join().expect("join"));

        // never released: refused after the grace, naming the dead pid
        let out2 = dir.path().join("s.csv");
        let held = WriterLock::acquire(&out2).expect("lock");
        held.file.set_len(0).expect("truncate");
        std::os::unix::fs::FileExt::write_all_at(&held.file, dead.to_string().as_bytes(), 0)
            .expect("write pid");
        let e = WriterLock::acquire(&out2).err().map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains(&dead.to_string())),
            "{e:?}"
        );
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_through_any_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let input = dir.path().join("in.csv");
        std::fs::write(&input, "x").expect("write");
        let link = dir.path().join("link.csv");
        std::os::unix::fs::symlink(&input, &link).expect("symlink");
        let dotted = dir.path().join(".").join("in.csv");
        for out in [&input, &link, &dotted] {
            assert!(
                refuse_input_as_output(out, "--out", &[&input]).is_err(),
                "{out:?}"
            );
        }
        let other = dir.path().join("other.csv");
        assert!(refuse_input_as_output(&other, "--out", &[&input]).is_ok());
    }

    #[test]
    fn atomic_writes_leave_the_old_file_when_the_writer_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().join("report.md");
        std::fs::write(&out, "old").expect("write");
        let e = write_atomic(&out, |tmp| {
            std::fs::write(tmp, "half").expect("write tmp");
            bail!("the renderer failed")
        });
        assert!(e.is_err());
        assert_eq!(std::fs::read_to_string(&out).ok().as_deref(), Some("old"));
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("report.md")],
            "no temporaries left"
        );
        write_bytes_atomic(&out, b"new").expect("replaced");
        assert_eq!(std::fs::read_to_string(&out).ok().as_deref(), Some("new"));
    }
}
