//! Replacing an existing output: `report --out`, `case --out` and `max-depth --out` replace an
//! earlier output of their own kind (an empty file too), and refuse anything else — a
//! densebench result CSV above all — unless `--force`, so a mistyped `--out` cannot destroy
//! results (results/README.md). `bench-all` and `merge` write result CSVs and have their own
//! rules (`--resume` / `--force`, merging into OUT).

use crate::measure::capacity::{Answer, ADDED_COLUMNS};
use crate::plan::bounds::bad_input;
use crate::results::row::{header_schema, is_result_header};
use crate::results::store::refuse_non_regular_output;
use anyhow::{anyhow, Result};
use std::io::Read;
use std::path::Path;

/// How much of an existing file is read to tell what it is.
const PROBE_BYTES: u64 = 64 * 1024;

/// What a command writes, to tell an earlier output of its own from any other file.
pub struct Kind {
    /// In words, with its article, e.g. `a densebench report (Markdown)`.
    pub name: &'static str,
    /// Whether a file is one, given its first bytes (at most 64 KiB) and its whole length.
    pub recognise: fn(&[u8], u64) -> bool,
}

/// Refuses, as bad input (exit status 2) and before any work, to replace `out` (given as
/// `flag`) when it exists and is neither empty nor a file of `kind`: a folder, a FIFO, a device
/// or a socket always; any other file (a result CSV, a case file, a note) unless `force`. The message names the file, what it
/// looks like and how to go on.
pub fn refuse_foreign(out: &Path, flag: &str, kind: &Kind, force: bool) -> Result<()> {
    // A path that cannot be inspected (missing, or a folder we may not read) is the writer's to
    // report.
    let Ok(meta) = std::fs::metadata(out) else {
        return Ok(());
    };
    if meta.is_dir() {
        return Err(bad_input(anyhow!(
            "{flag} {} is a folder, not {}: give the path of the file to write",
            out.display(),
            kind.name
        )));
    }
    // Never a FIFO, a device or a socket, --force included.
    refuse_non_regular_output(out, flag)?;
    if force || (meta.is_file() && meta.len() == 0) {
        return Ok(());
    }
    let mut start = Vec::new();
    if let Err(e) = std::fs::File::open(out)
        .and_then(|f| f.take(PROBE_BYTES).read_to_end(&mut start).map(|_| ()))
    {
        return Err(anyhow!(
            "{flag} {} exists and cannot be read to tell what it is: {e}",
            out.display()
        ));
    }
    if (kind.recognise)(&start, meta.len()) {
        return Ok(());
    }
    let what = describe(&start, meta.len());
    Err(bad_input(anyhow!(
        "{flag} {} already exists and is {what}, not {}: refusing to replace it; write to \
         another {flag} path, or pass --force to replace it",
        out.display(),
        kind.name
    )))
}

/// Whether `header` is that of a CSV `max-depth --out` wrote: [`Answer`]'s columns, or those of
/// an earlier one (without the last of [`ADDED_COLUMNS`]).
pub fn is_max_depth_header(header: &[String]) -> bool {
    let now = crate::results::row::csv_columns::<Answer>();
    (0..=ADDED_COLUMNS.len()).any(|dropped| header == &now[..now.len() - dropped])
}

/// The columns of a CSV file's first line, from its first bytes (a UTF-8 byte-order mark and a
/// CR before the newline ignored); `None` when that line is not CSV text.
pub fn csv_header(start: &[u8]) -> Option<Vec<String>> {
    let start = start.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(start);
    let line = start.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let record = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(line)
        .records()
        .next()?
        .ok()?;
    Some(record.iter().map(str::to_string).collect())
}

/// Whether a file is safetensors, from its first bytes and its length: an 8-byte little-endian
/// header length that fits in the file, then the header's JSON object.
pub fn is_safetensors(start: &[u8], len: u64) -> bool {
    let Some(n) = start.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
        return false;
    };
    let n = u64::from_le_bytes(n);
    n >= 2 && n.checked_add(8).is_some_and(|end| end <= len) && start.get(8) == Some(&b'{')
}

/// What a file looks like, for the refusal: a densebench result CSV (by its header, as the
/// readers tell one), safetensors, or its first line.
fn describe(start: &[u8], len: u64) -> String {
    if let Some(h) = csv_header(start).filter(|h| is_result_header(h)) {
        return match header_schema(&h) {
            Some(s) => format!("a densebench result CSV (schema {s})"),
            None => "a densebench result CSV (a header with `schema` and `key` columns)".into(),
        };
    }
    if is_safetensors(start, len) {
        return "a safetensors file".to_string();
    }
    let line = start.split(|&b| b == b'\n').next().unwrap_or_default();
    match std::str::from_utf8(line) {
        Ok(text) if !text.contains('\0') => {
            let text = text.trim_end_matches('\r');
            let shown: String = text.chars().take(60).collect();
            let more = if shown.len() < text.len() { "…" } else { "" };
            format!("a file starting `{shown}{more}`")
        }
        _ => "a binary file".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::row::Row;

    #[test]
    fn result_csvs_safetensors_and_text_are_told_apart() {
        let header = Row::columns().join(",");
        let csv = format!("{header}\n2,x\n");
        let schema = format!("schema {}", crate::results::row::SCHEMA_VERSION);
        assert_eq!(
            describe(csv.as_bytes(), csv.len() as u64),
            format!("a densebench result CSV ({schema})")
        );
        let crlf = format!("{header}\r\n");
        assert!(describe(crlf.as_bytes(), 9).contains(&schema));
        assert!(describe(b"key,schema,x\n", 13).contains("`schema` and `key`"));
        assert!(!describe(b"variant,max_depth\n", 18).contains("result CSV"));
        let mut st = 2u64.to_le_bytes().to_vec();
        st.extend(b"{}");
        assert!(is_safetensors(&st, st.len() as u64));
        assert!(
            !is_safetensors(&st, st.len() as u64 - 1),
            "a header past the end"
        );
        assert!(!is_safetensors(b"# densebench report\n", 20));
        assert_eq!(describe(&st, st.len() as u64), "a safetensors file");
        assert_eq!(describe(b"notes\r\nmore", 11), "a file starting `notes`");
        assert_eq!(describe(b"\xff\xfe\0", 3), "a binary file");
    }
}
