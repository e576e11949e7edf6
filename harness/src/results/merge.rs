//! Merging result rows by key (`variant/family/N/C0/k/L/bn/size/act/dtype/seed/device`), the
//! library side of `densebench merge`:
//!
//! - Rows with the same key and identical cells (a row copied into two files) are kept once.
//! - Rows with the same key and different cells (two measurements of one configuration) are a
//!   conflict: an error naming the keys, files and differing columns, unless `--prefer newest`
//!   keeps the row with the latest `timestamp` (on a tie, the one whose CSV line sorts last, so
//!   the choice never depends on the order of the inputs).

use crate::results::row::Row;
use crate::results::store::csv_line;
use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use std::collections::HashMap;

/// How many conflicting keys an error message lists in full.
const CONFLICTS_SHOWN: usize = 10;

/// Which row wins when two rows of one key differ.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefer {
    /// The row with the latest `timestamp`.
    Newest,
}

/// The rows of one input file.
pub struct Input {
    /// The file, for messages.
    pub name: String,
    pub rows: Vec<Row>,
}

/// The result of [`merge_rows`].
#[derive(Debug, Clone, PartialEq)]
pub struct Merged {
    /// One row per key, in order of first appearance.
    pub rows: Vec<Row>,
    /// Rows dropped because an identical row of the same key was kept.
    pub identical_duplicates: usize,
    /// Keys whose rows differed and were resolved by `--prefer newest`.
    pub resolved: Vec<String>,
    /// Of those, the keys whose newest timestamp two differing rows share: the row kept is the
    /// one whose CSV line sorts last, a rule, not a measurement's age (said, never silent).
    pub tied: Vec<String>,
}

/// A candidate row of one key and where it came from.
struct Candidate {
    row: Row,
    line: Vec<u8>,
    source: String,
}

/// The columns in which two rows differ.
fn differing_columns(a: &Row, b: &Row) -> Vec<String> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(a), serde_json::to_value(b))
    else {
        return vec!["?".to_string()];
    };
    Row::columns()
        .into_iter()
        .filter(|c| a.get(c) != b.get(c))
        .collect()
}

fn timestamp(c: &Candidate) -> Result<chrono::DateTime<chrono::FixedOffset>> {
    chrono::DateTime::parse_from_rfc3339(&c.row.timestamp).with_context(|| {
        format!(
            "{}: row {}: timestamp `{}` is not RFC 3339",
            c.source, c.row.key, c.row.timestamp
        )
    })
}

/// Merges the inputs' rows by key (see the module docs). Errs on conflicting rows without
/// `prefer`, naming the keys, files and differing columns.
pub fn merge_rows(inputs: &[Input], prefer: Option<Prefer>) -> Result<Merged> {
    let mut order: Vec<String> = Vec::new();
    let mut by_key: HashMap<String, Vec<Candidate>> = HashMap::new();
    let mut identical_duplicates = 0;
    for input in inputs {
        for row in &input.rows {
            let line = csv_line(row).with_context(|| format!("{}: {}", input.name, row.key))?;
            let cands = by_key.entry(row.key.clone()).or_insert_with(|| {
                order.push(row.key.clone());
                Vec::new()
            });
            if cands.iter().any(|c| c.line == line) {
                identical_duplicates += 1;
                continue;
            }
            cands.push(Candidate {
                row: row.clone(),
                line,
                source: input.name.clone(),
            });
        }
    }
    let conflicts: Vec<&String> = order.iter().filter(|k| by_key[*k].len() > 1).collect();
    if !conflicts.is_empty() && prefer.is_none() {
        let mut msg = format!(
            "{} keys have rows with different values (two measurements of one configuration); \
             nothing written. Pass --prefer newest to keep the newest row of each, or remove \
             the stale file.",
            conflicts.len()
        );
        for k in conflicts.iter().take(CONFLICTS_SHOWN) {
            let cands = &by_key[*k];
            let files: Vec<String> = cands
                .iter()
                .map(|c| format!("{} ({})", c.source, c.row.timestamp))
                .collect();
            msg.push_str(&format!(
                "\n  {k}: in {}; columns differing: {}",
                files.join(", "),
                differing_columns(&cands[0].row, &cands[1].row).join(", ")
            ));
        }
        if conflicts.len() > CONFLICTS_SHOWN {
            msg.push_str(&format!(
                "\n  … and {} more",
                conflicts.len() - CONFLICTS_SHOWN
            ));
        }
        bail!(msg);
    }
    let mut rows = Vec::with_capacity(order.len());
    let mut resolved = Vec::new();
    let mut tied = Vec::new();
    for k in &order {
        let cands = by_key
            .remove(k)
            .ok_or_else(|| anyhow!("internal: key {k} lost while merging"))?;
        if cands.len() > 1 {
            resolved.push(k.clone());
        }
        let mut best: Option<(chrono::DateTime<chrono::FixedOffset>, Candidate)> = None;
        let mut by_time = Vec::with_capacity(cands.len());
        for c in cands {
            let t = timestamp(&c)?;
            by_time.push(t);
            let better = match &best {
                None => true,
                Some((bt, b)) => (t, &c.line) > (*bt, &b.line),
            };
            if better {
                best = Some((t, c));
            }
        }
        if let Some((t, c)) = best {
            if by_time.iter().filter(|&&x| x == t).count() > 1 {
                tied.push(k.clone());
            }
            rows.push(c.row);
        }
    }
    Ok(Merged {
        rows,
        identical_duplicates,
        resolved,
        tied,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, ts: &str, median: u64) -> Row {
        Row {
            key: key.to_string(),
            timestamp: ts.to_string(),
            status: "ok".to_string(),
            median_ns: Some(median),
            ..Row::default()
        }
    }

    fn input(name: &str, rows: Vec<Row>) -> Input {
        Input {
            name: name.to_string(),
            rows,
        }
    }

    #[test]
    fn newest_wins_whatever_the_input_order() {
        let old = row("a", "2024-01-01T00:00:00Z", 1);
        let new = row("a", "2024-01-02T00:00:00Z", 2);
        for inputs in [
            vec![input("x", vec![old.clone()]), input("y", vec![new.clone()])],
            vec![input("y", vec![new.clone()]), input("x", vec![old.clone()])],
        ] {
            let m = merge_rows(&inputs, Some(Prefer::Newest)).map_err(|e| e.to_string());
            assert_eq!(m.map(|m| m.rows), Ok(vec![new.clone()]));
        }
    }

    /// Two differing rows of one key with the same newest timestamp: one is kept by the
    /// documented rule, and the key is reported as a tie (not silently resolved); an older
    /// third row does not make a tie.
    #[test]
    fn a_tie_on_the_newest_timestamp_is_reported() {
        let a = row("a", "2024-01-02T00:00:00Z", 1);
        let b = row("a", "2024-01-02T00:00:00+00:00", 2);
        let old = row("b", "2024-01-01T00:00:00Z", 3);
        let new = row("b", "2024-01-02T00:00:00Z", 4);
        let inputs = [
            input("x", vec![a.clone(), old]),
            input("y", vec![b.clone(), new.clone()]),
        ];
        let m = merge_rows(&inputs, Some(Prefer::Newest)).map_err(|e| e.to_string());
        let m = m.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(m.resolved, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(m.tied, vec!["a".to_string()]);
        assert_eq!(m.rows.len(), 2);
        assert_eq!(m.rows[1], new);
    }

    #[test]
    fn conflicts_name_key_files_and_columns() {
        let inputs = [
            input("s1.csv", vec![row("a", "2024-01-01T00:00:00Z", 1)]),
            input("s2.csv", vec![row("a", "2024-01-01T00:00:00Z", 2)]),
        ];
        let e = merge_rows(&inputs, None).err().map(|e| e.to_string());
        let e = e.unwrap_or_default();
        assert!(
            e.contains("s1.csv") && e.contains("s2.csv") && e.contains("median_ns"),
            "{e}"
        );
    }
}
