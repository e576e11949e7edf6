//! The result CSV schema: one flat, self-describing row per measurement, shared by the writer
//! (run, bench-all) and every reader (compare, plots, report). Documented in results/README.md.

use crate::progress::{human_bytes, human_ns};
use anyhow::{anyhow, bail, Context, Result};
use impls::Spatial;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// Bumped whenever a column is added, removed or changes meaning. Schema 2 added `framework`,
/// `framework_version`, `math`, `tolerance` and `note` (after `timeline`); schema 3 added
/// `execution` and `compile_ns` (after `note`). Older files are still read: schema-1 rows take
/// `densebench`, their `densebench_version`, `ieee`, an empty tolerance and an empty note;
/// schema-1 and schema-2 rows take `eager` and an empty `compile_ns` (every row before schema 3
/// was an eager step).
pub const SCHEMA_VERSION: u32 = 3;

/// The columns schema 2 added, in order, at the end of the row.
pub const SCHEMA_2_COLUMNS: [&str; 5] = [
    "framework",
    "framework_version",
    "math",
    "tolerance",
    "note",
];

/// The note a GPU peer row of a schema-2 file reads with: the peer then synchronised the device
/// and read its memory at every layer boundary inside its timed steps (a forward hook per layer,
/// for the timeline), so its times are too slow (issue 36 measured ×1.04–×1.91 against a bare
/// loop on an H100). On the CPU the hook's synchronisation was a no-op and its reads cost
/// microseconds against seconds: CPU rows carry no such note.
pub const OLD_PEER_TIMING_NOTE: &str = "timed by the peer before schema 3, whose timed steps \
     synchronised the device at every layer (issue 36): this time is too slow";

/// The columns schema 3 added, in order, at the end of the row.
pub const SCHEMA_3_COLUMNS: [&str; 2] = ["execution", "compile_ns"];

/// `framework` of densebench's own rows.
pub const DENSEBENCH: &str = "densebench";
/// `framework` of the PyTorch peer's rows.
pub const PYTORCH: &str = "pytorch";

/// One measurement. Units are in the column names; `None` is an empty cell (e.g. the timings of
/// a row whose status is not `ok`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub schema: u32,
    /// Stable identity of (variant, config): `variant/family/N/C0/k/L/bn/size/act/dtype/seed/device`.
    pub key: String,
    pub variant: String,
    pub family: String,
    pub batch: usize,
    pub channels: usize,
    pub growth: usize,
    pub depth: usize,
    pub bn_size: usize,
    /// Spatial size of the feature maps: `32` for 32×32 (an integer cell, as every file before
    /// non-square maps has), `HxW` otherwise (`360x480`, height first); 1 for mlp.
    pub size: Spatial,
    pub activation: bool,
    pub dtype: String,
    pub seed: u64,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// CPU model or GPU name (and driver/CUDA versions on GPU).
    pub device_desc: String,
    /// Compute threads the child ran with.
    pub threads: usize,
    pub densebench_version: String,
    pub git_rev: String,
    /// RFC 3339, UTC, when the row was measured.
    pub timestamp: String,
    /// `ok`, `oom`, `timeout` or `error`.
    pub status: String,
    /// Why the status is not `ok` (empty when it is).
    pub error: String,
    pub steps: usize,
    pub warmup: usize,
    /// Live bytes before the step: parameters, input, upstream gradient (after warm-up).
    pub baseline_bytes: Option<u64>,
    /// Peak live bytes during one training step above `baseline_bytes`.
    pub peak_bytes: Option<u64>,
    /// Live bytes at the end of forward above `baseline_bytes` (what is kept for backward,
    /// including the output).
    pub saved_bytes: Option<u64>,
    /// Bytes the variant declares it keeps for backward (empty for `autograd`).
    pub declared_saved_bytes: Option<u64>,
    /// Analytic prediction of `peak_bytes` from the config.
    pub predicted_peak_bytes: Option<u64>,
    /// Peak resident set size of the child process.
    pub peak_rss_bytes: Option<u64>,
    pub fwd_median_ns: Option<u64>,
    pub fwd_min_ns: Option<u64>,
    pub fwd_max_ns: Option<u64>,
    pub bwd_median_ns: Option<u64>,
    pub bwd_min_ns: Option<u64>,
    pub bwd_max_ns: Option<u64>,
    /// Whole step (forward + backward).
    pub median_ns: Option<u64>,
    pub min_ns: Option<u64>,
    pub max_ns: Option<u64>,
    /// Floating-point operations of one step (matmuls and convolutions, forward and backward).
    pub flops: Option<u64>,
    /// `flops / median_ns`.
    pub gflops_per_s: Option<f64>,
    /// This machine's measured matmul rate, for comparison.
    pub machine_gflops: Option<f64>,
    /// The variant the errors are measured against.
    pub reference: String,
    /// Worst over output, input gradient, parameter gradients and running stats.
    pub max_abs_err: Option<f64>,
    /// Norm-wise: max |a − b| / max |ref|, worst over the same tensors.
    pub max_rel_err: Option<f64>,
    pub output_max_abs_err: Option<f64>,
    pub grad_input_max_abs_err: Option<f64>,
    pub grad_params_max_abs_err: Option<f64>,
    pub running_max_abs_err: Option<f64>,
    /// Every compared tensor bitwise equal to the reference.
    pub bitwise_equal: Option<bool>,
    /// Errors within the tolerance for the dtype.
    pub grad_ok: Option<bool>,
    /// Live bytes above baseline at layer boundaries: `f0=…;f1=…;…;b15=…;…;b0=…`
    /// (`fI`: after layer I's forward, `bI`: after layer I's backward).
    pub timeline: String,
    /// Who ran the step: `densebench` or `pytorch` (a peer row, issue 12).
    #[serde(default)]
    pub framework: String,
    /// That framework's version (`0.1.0`; `torch 2.15.0, torchvision 0.29.2`).
    #[serde(default)]
    pub framework_version: String,
    /// Floating-point math of the matmuls and convolutions: `ieee` (full precision) or `tf32`.
    #[serde(default)]
    pub math: String,
    /// The bound on `max_rel_err` that `grad_ok` was judged against (empty when not checked).
    #[serde(default)]
    pub tolerance: Option<f64>,
    /// What a reader of an `ok` row must know (a framework's known deviation, …); empty mostly.
    #[serde(default)]
    pub note: String,
    /// How the timed step ran: `eager` (ops launched as the step runs), `graph` (the whole step
    /// replayed as CUDA graphs: PyTorch's `torch.compile(mode="reduce-overhead")`) or
    /// `compiled` (`torch.compile`'s default mode: compiled kernels, no graphs). Ratios pair
    /// like with like.
    #[serde(default)]
    pub execution: String,
    /// A compiled row's warm-up beyond running steps: compiling, autotuning, recording graphs
    /// (ns; outside the timed step). Empty for eager rows.
    #[serde(default)]
    pub compile_ns: Option<u64>,
    /// What the row's progress line says beyond its columns (where a peer's process spent its
    /// seconds); not a column, not read back, no part of a row's equality.
    #[serde(skip)]
    pub aside: Aside,
}

/// A progress-only remark on a row ([`Row::aside`]): any two are equal, so that a row read back
/// from its CSV equals the row that was written.
#[derive(Debug, Clone, Default)]
pub struct Aside(pub Option<String>);

impl PartialEq for Aside {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Row {
    /// One line summarising a finished row (progress output); `ran_on` follows the key (" on
    /// cuda:1" where a sweep over several devices ran it elsewhere than its key says).
    pub fn summary(&self, ran_on: &str) -> String {
        let row = self;
        let mut s = format!(
            "{}{ran_on} {}: peak {} median {}",
            row.key,
            row.status,
            human_bytes(row.peak_bytes),
            human_ns(row.median_ns)
        );
        if let (Some(e), Some(ok)) = (row.max_rel_err, row.grad_ok) {
            s.push_str(&format!(
                " rel_err {e:.1e} vs {}{}",
                row.reference,
                if ok { "" } else { " (OUT OF TOLERANCE)" }
            ));
        }
        if !row.error.is_empty() {
            s.push_str(&format!(" — {}", row.error));
        }
        if let Aside(Some(a)) = &row.aside {
            s.push_str(&format!("  [{a}]"));
        }
        s
    }

    /// The column names, in order.
    pub fn columns() -> Vec<String> {
        csv_columns::<Row>()
    }

    pub fn is_ok(&self) -> bool {
        self.status == "ok"
    }

    /// The median of the whole step replayed as one CUDA graph, from the row's `note`
    /// (`cuda_graph_median_ns=N;…`, written by a GPU child only when the replayed results were
    /// checked bitwise against the eager step's); `None` where there is none.
    pub fn cuda_graph_median_ns(&self) -> Option<u64> {
        self.note
            .split(crate::measure::graph::MEDIAN_KEY)
            .nth(1)?
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    }

    /// Whether this row was measured by a peer framework (PyTorch), not by densebench.
    pub fn is_peer(&self) -> bool {
        !self.framework.is_empty() && self.framework != DENSEBENCH
    }

    /// Fills the columns a schema-1 row lacks with what schema 1 meant: densebench's own row,
    /// full-precision math, an eager step.
    fn upgrade_from_schema_1(&mut self) {
        self.framework = DENSEBENCH.to_string();
        self.framework_version = self.densebench_version.clone();
        self.math = "ieee".to_string();
        self.upgrade_from_schema_2();
    }

    /// Fills the columns a schema-2 row lacks with what schema 2 meant: an eager step. A GPU
    /// peer row of schema 2 was timed with the peer's instrumentation inside its timed steps
    /// (issue 36): its note says so ([`OLD_PEER_TIMING_NOTE`]).
    fn upgrade_from_schema_2(&mut self) {
        self.execution = EAGER.to_string();
        self.compile_ns = None;
        self.schema = SCHEMA_VERSION;
        if self.is_peer() && self.device.starts_with("cuda") && self.is_ok() {
            self.note = if self.note.is_empty() {
                OLD_PEER_TIMING_NOTE.to_string()
            } else {
                format!("{}; {OLD_PEER_TIMING_NOTE}", self.note)
            };
        }
    }

    /// The `execution` column, `eager` where it is empty (a row built in code).
    pub fn execution(&self) -> &str {
        if self.execution.is_empty() {
            EAGER
        } else {
            &self.execution
        }
    }

    /// The timeline as (label, bytes) pairs in recorded order.
    pub fn timeline_points(&self) -> Result<Vec<(String, i64)>> {
        timeline_points(&self.timeline)
    }

    /// The block configuration the row measured (its family, sizes, dtype and seed columns).
    pub fn config(&self) -> Result<impls::Config> {
        Ok(impls::Config {
            family: impls::Family::parse(&self.family)
                .map_err(|e| anyhow!("{}: family: {e}", self.key))?,
            batch: self.batch,
            channels: self.channels,
            growth: self.growth,
            depth: self.depth,
            bn_size: self.bn_size,
            size: self.size,
            activation: self.activation,
            dtype: impls::config::parse_dtype(&self.dtype)
                .map_err(|e| anyhow!("{}: dtype: {e}", self.key))?,
            seed: self.seed,
        })
    }

    /// A short config label without the variant, e.g. `bc N=64 C0=24 k=12 bn=4 32x32 f32`
    /// (`360x480`: H × W, height first).
    pub fn config_label(&self) -> String {
        if self.family == "bc" {
            format!(
                "bc N={} C0={} k={} bn={} {} {}",
                self.batch,
                self.channels,
                self.growth,
                self.bn_size,
                self.size.label(),
                self.dtype
            )
        } else {
            format!(
                "mlp N={} C0={} k={} relu={} {}",
                self.batch,
                self.channels,
                self.growth,
                if self.activation { "on" } else { "off" },
                self.dtype
            )
        }
    }
}

/// A `timeline` cell as (label, bytes) pairs in recorded order ([`Row::timeline_points`]); an
/// error names the item that does not read. Every reader of a result CSV checks it.
pub fn timeline_points(timeline: &str) -> Result<Vec<(String, i64)>> {
    if timeline.is_empty() {
        return Ok(Vec::new());
    }
    timeline
        .split(';')
        .map(|item| {
            let (label, bytes) = item
                .split_once('=')
                .with_context(|| format!("timeline item `{item}` is not label=bytes"))?;
            let bytes = bytes
                .parse::<i64>()
                .with_context(|| format!("timeline item `{item}`: bytes is not an integer"))?;
            Ok((label.to_string(), bytes))
        })
        .collect()
}

/// The key a row's own fields give: `variant/family/N/C0/k/L/bn/size/act/dtype/seed/device`
/// (what `plan::job::key` writes for the config the row was measured on).
pub fn key_of_fields(r: &Row) -> String {
    let key = format!(
        "{}/{}/{}/{}/{}/{}/{}/{}/{}/{}/{}/{}",
        r.variant,
        r.family,
        r.batch,
        r.channels,
        r.growth,
        r.depth,
        r.bn_size,
        r.size,
        if r.activation { "on" } else { "off" },
        r.dtype,
        r.seed,
        r.device
    );
    // `tf32` rows carry their math after the device (`plan::job::Math::key_suffix`), then
    // graph and compiled rows their execution (`plan::job::Execution::key_suffix`).
    let math = if r.math == "tf32" { "/tf32" } else { "" };
    let execution = match r.execution() {
        EAGER => String::new(),
        other => format!("/{other}"),
    };
    format!("{key}{math}{execution}")
}

/// `execution` of an eager step.
pub const EAGER: &str = "eager";

impl Row {
    /// The gradient-error columns, by name.
    pub fn error_columns(&self) -> [(&'static str, Option<f64>); 6] {
        [
            ("max_abs_err", self.max_abs_err),
            ("max_rel_err", self.max_rel_err),
            ("output_max_abs_err", self.output_max_abs_err),
            ("grad_input_max_abs_err", self.grad_input_max_abs_err),
            ("grad_params_max_abs_err", self.grad_params_max_abs_err),
            ("running_max_abs_err", self.running_max_abs_err),
        ]
    }

    /// Whether any gradient error is NaN (or infinite): such a row's gradients are not within
    /// any tolerance, whatever its `grad_ok` cell says.
    pub fn has_non_finite_error(&self) -> bool {
        self.error_columns()
            .iter()
            .any(|(_, v)| v.is_some_and(|v| !v.is_finite()))
    }
}

/// The CSV header of a record type: its serde field names in order, from serializing its
/// default (which cannot fail for records of plain values; an empty list if it did).
pub fn csv_columns<T: Serialize + Default>() -> Vec<String> {
    let mut w = csv::Writer::from_writer(Vec::new());
    if w.serialize(T::default()).is_err() {
        return Vec::new();
    }
    let bytes = w.into_inner().unwrap_or_default();
    String::from_utf8_lossy(&bytes)
        .lines()
        .next()
        .map(|h| h.split(',').map(str::to_string).collect())
        .unwrap_or_default()
}

/// Counts by name as `a: 1, b: 2`, in the map's order (row statuses in summaries).
pub fn join_counts<K: std::fmt::Display>(counts: &std::collections::BTreeMap<K, usize>) -> String {
    counts
        .iter()
        .map(|(k, n)| format!("{k}: {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// How far the csv crate's line numbers lag the file's: in a file with CRLF line endings a
/// record's position is taken before the `\n` of the line above it is read, so its line is one
/// too low (1 for a CRLF file, 0 otherwise; a file that mixes both may still be off by one).
fn crlf_line_lag(path: &Path) -> u64 {
    let mut start = Vec::new();
    let read = std::fs::File::open(path)
        .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 1 << 16), &mut start));
    if read.is_err() {
        return 0;
    }
    match start.iter().position(|&b| b == b'\n') {
        Some(i) if i > 0 && start[i - 1] == b'\r' => 1,
        _ => 0,
    }
}

/// A row with fewer (or more) fields than the header: what a process killed in the middle of
/// writing a row leaves. A read error of this type (`plan::bounds::carries` finds it through
/// context and the bad-input mark) is one that `--resume` repairs; its text is the error's
/// words.
#[derive(Debug)]
pub struct TornRow(pub String);

impl std::fmt::Display for TornRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TornRow {}

/// The line of `bytes` (1 for the first) on which the record the csv crate places at byte
/// `byte` starts. The csv crate takes a record's position where the record before it stopped:
/// after a CRLF line's `\r`, before its `\n`, and before any blank lines, so its own line count
/// is one low after a CRLF line, whatever the lines before it end with. Here the line breaks
/// before the record's first byte are counted: `\n`, `\r\n` and a lone `\r` each once.
pub fn line_in(bytes: &[u8], byte: u64) -> u64 {
    let at = usize::try_from(byte).unwrap_or(usize::MAX).min(bytes.len());
    let start = at
        + bytes[at..]
            .iter()
            .take_while(|&&b| b == b'\r' || b == b'\n')
            .count();
    let before = &bytes[..start];
    let breaks = before.iter().filter(|&&b| b == b'\n').count()
        + before
            .iter()
            .enumerate()
            .filter(|&(i, &b)| b == b'\r' && before.get(i + 1) != Some(&b'\n'))
            .count();
    1 + breaks as u64
}

/// [`line_in`] of the file `path` (read again: an error's place only); `None` when it cannot
/// be read.
fn line_in_file(path: &Path, byte: u64) -> Option<u64> {
    let mut bytes = Vec::new();
    // as it was opened to be read: a regular file only, without blocking
    let (f, _) = crate::plan::input::open_regular(path, "result CSV").ok()?;
    // past the position: the line breaks between it and the record's first byte
    std::io::Read::read_to_end(
        &mut std::io::Read::take(f, byte.saturating_add(1 << 16)),
        &mut bytes,
    )
    .ok()?;
    Some(line_in(&bytes, byte))
}

/// The line of a record of the result CSV `path` at `pos`, for messages: [`line_in_file`], or
/// the csv crate's count corrected by `lag` ([`crlf_line_lag`]) where the file cannot be read
/// again. Counted only when shown.
struct LineAt<'a> {
    path: &'a Path,
    pos: Option<csv::Position>,
    lag: u64,
}

impl LineAt<'_> {
    fn get(&self) -> Option<u64> {
        let p = self.pos.as_ref()?;
        Some(line_in_file(self.path, p.byte()).unwrap_or(p.line() + self.lag))
    }
}

impl std::fmt::Display for LineAt<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.get().unwrap_or(0))
    }
}

/// A CSV error in words: the line and the column by name, never "field 24". `lag`: how many
/// lines `csv` counts too low (1 for a CRLF file, 0 otherwise; `crlf_line_lag`).
pub fn csv_error(path: &Path, headers: &[String], e: &csv::Error, lag: u64) -> anyhow::Error {
    csv_error_at(path, headers, e, e.position().map(|p| p.line() + lag))
}

/// [`csv_error`] with the error's line given (`None`: no line known), e.g. counted exactly by
/// [`line_in`].
pub fn csv_error_at(
    path: &Path,
    headers: &[String],
    e: &csv::Error,
    line: Option<u64>,
) -> anyhow::Error {
    let at = match line {
        Some(l) => format!("{} line {l}", path.display()),
        None => path.display().to_string(),
    };
    match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => {
            let column = err
                .field()
                .and_then(|i| headers.get(i as usize))
                .map_or_else(String::new, |c| format!(", column `{c}`"));
            let what = match err.kind() {
                csv::DeserializeErrorKind::ParseInt(e) => format!("expected an integer ({e})"),
                csv::DeserializeErrorKind::ParseFloat(e) => format!("expected a number ({e})"),
                csv::DeserializeErrorKind::ParseBool(_) => "expected true or false".to_string(),
                csv::DeserializeErrorKind::UnexpectedEndOfRow => {
                    return anyhow::Error::new(TornRow(format!(
                        "{at}{column}: the row ends before this column"
                    )));
                }
                other => other.to_string(),
            };
            anyhow!("{at}{column}: {what}")
        }
        csv::ErrorKind::UnequalLengths {
            expected_len, len, ..
        } => anyhow::Error::new(TornRow(format!(
            "{at}: the row has {len} fields, the header has {expected_len} (a torn or edited \
             line?)"
        ))),
        csv::ErrorKind::Utf8 { .. } => anyhow!("{at}: not UTF-8 text"),
        _ => anyhow!("{at}: {e}"),
    }
}

/// What is wrong with a `size` cell that does not read, where the error does not name its
/// column: `Spatial`'s own parser fails without the csv crate knowing which column it read
/// (`line 5: size -5 is negative`). `None` for any other error.
fn unplaced_size_error(
    headers: &[String],
    record: &csv::StringRecord,
    e: &csv::Error,
) -> Option<String> {
    let csv::ErrorKind::Deserialize { err, .. } = e.kind() else {
        return None;
    };
    let bad_size = headers
        .iter()
        .position(|h| h == "size")
        .and_then(|i| record.get(i))
        .is_some_and(|cell| cell.parse::<Spatial>().is_err());
    (err.field().is_none() && bad_size).then(|| err.kind().to_string())
}

/// The header of a schema-2 file: every column but those schema 3 added.
pub fn schema_2_columns() -> Vec<String> {
    Row::columns()
        .into_iter()
        .filter(|c| !SCHEMA_3_COLUMNS.contains(&c.as_str()))
        .collect()
}

/// The header of a schema-1 file: every schema-2 column but those schema 2 added.
fn schema_1_columns() -> Vec<String> {
    schema_2_columns()
        .into_iter()
        .filter(|c| !SCHEMA_2_COLUMNS.contains(&c.as_str()))
        .collect()
}

/// The schema whose header `headers` is, column for column: [`SCHEMA_VERSION`], 2 or 1 (the
/// schemas [`read_rows`] reads); `None` for any other header.
pub fn header_schema(headers: &[String]) -> Option<u32> {
    if headers == Row::columns().as_slice() {
        Some(SCHEMA_VERSION)
    } else if headers == schema_2_columns().as_slice() {
        Some(2)
    } else if headers == schema_1_columns().as_slice() {
        Some(1)
    } else {
        None
    }
}

/// A header's extra column `c` as an error lists it: its name, or what would read as nothing in
/// a list: an unnamed column (a comma at the end of every line, as a spreadsheet may leave) or
/// one with spaces around its name.
pub fn extra_column(headers: &[String], c: &str) -> String {
    match headers.iter().position(|h| h == c) {
        Some(i) if c.trim().is_empty() => format!(
            "an unnamed column {} (a comma at the end of every line?)",
            i + 1
        ),
        _ if c.trim() != c => format!("`{c}` (spaces around the name)"),
        _ => c.to_string(),
    }
}

/// The first named column a header names twice, in words (`` the column `x` twice (columns 3
/// and 9) ``); `None` when none is (unnamed columns are [`extra_column`]'s).
pub fn repeated_column(headers: &[String]) -> Option<String> {
    let (i, c) = headers
        .iter()
        .enumerate()
        .find(|(i, c)| !c.trim().is_empty() && headers[..*i].contains(c))?;
    let first = headers.iter().position(|h| h == c).unwrap_or(i);
    Some(format!(
        "the column `{c}` twice (columns {} and {})",
        first + 1,
        i + 1
    ))
}

/// Whether `headers` is the header of a densebench result CSV: of a schema this densebench reads
/// ([`header_schema`]), or of any other (an older or newer densebench, columns reordered or
/// edited) that still has the two columns every schema has, `schema` and `key`. Commands that
/// replace a file test it first (`crate::results::replace`).
pub fn is_result_header(headers: &[String]) -> bool {
    header_schema(headers).is_some()
        || (headers.iter().any(|c| c == "schema") && headers.iter().any(|c| c == "key"))
}

/// What the tf32 rows' `note` says of the tf32 step's own error (`results::record` writes it,
/// followed by the error as `1.36e-1`, `NaN` or `inf`).
pub const TF32_OWN_ERROR: &str = "the tf32 step's own error against f64 is ";

/// The largest `tolerance` the documented rule gives a row of `dtype` (results/README.md,
/// "Tolerance"): [`F64_REL_TOLERANCE`](crate::measure::step::F64_REL_TOLERANCE) for f64,
/// [`F32_REL_BOUND`](crate::measure::step::F32_REL_BOUND) for f32 in either math (a tf32 row
/// is checked on an ieee step against the f32 tolerance). A peer-derived tolerance is at most
/// this, never above.
pub fn tolerance_cap(dtype: &str) -> std::result::Result<f64, String> {
    impls::config::parse_dtype(dtype)
        .map(crate::measure::step::documented_tolerance)
        .map_err(|e| e.to_string())
}

/// The tf32 step's own error from a tf32 row's `note`, `None` when the note does not give it.
fn tf32_own_error(note: &str) -> Option<f64> {
    let rest = note.split(TF32_OWN_ERROR).nth(1)?;
    let end = rest.find([',', ';', ' ']).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The verdict of a row, recomputed from its own errors and the documented tolerance rule,
/// never taken from its `grad_ok` cell: a file's claim that a row passed is not evidence.
///
/// - `tolerance` must be finite, ≥ 0 and at most [`tolerance_cap`] of the row's dtype (a
///   peer-derived tolerance is below the cap, so a smaller one is accepted as it is);
/// - `grad_ok` becomes `max_rel_err ≤ tolerance` (the cap where the tolerance is empty: schema-1
///   rows), false when any error column is NaN or infinite, and false for a tf32 row whose note
///   puts the tf32 step past [`TF32_REL_BOUND`](crate::measure::step::TF32_REL_BOUND);
/// - a stored `false` stands (the writer fails rows for reasons beyond `max_rel_err`, e.g. that
///   TF32 bound): reading never turns a failed row into a passed one;
/// - a stored `true` that the numbers contradict (`max_rel_err` empty, or finite and above the
///   tolerance) is refused: an edited row.
///
/// Errors are (column, why), for the caller to place at the file's line.
fn judge(row: &mut Row) -> std::result::Result<(), (&'static str, String)> {
    let cap = tolerance_cap(&row.dtype).map_err(|e| ("dtype", e))?;
    // An error is a magnitude (max |a − b|, or that over max |ref|): a negative one is no
    // measurement, and would pass any tolerance.
    if let Some((column, v)) = row
        .error_columns()
        .into_iter()
        .find_map(|(c, v)| Some((c, v?)).filter(|(_, v)| *v < 0.0))
    {
        return Err((
            column,
            format!("{v:e} is negative: an error is a magnitude, 0 or more (an edited row?)"),
        ));
    }
    if let Some(t) = row.tolerance {
        if !(t.is_finite() && (0.0..=cap).contains(&t)) {
            return Err((
                "tolerance",
                format!(
                    "{t:e} is not a tolerance of a {} row: the documented rule gives a finite \
                     value between 0 and {cap:e} (results/README.md, \"Tolerance\"; an edited \
                     row?)",
                    row.dtype
                ),
            ));
        }
    }
    let Some(err) = row.max_rel_err else {
        if row.grad_ok == Some(true) {
            return Err((
                "grad_ok",
                "`true`, but max_rel_err is empty: no check gives that verdict (an edited \
                 row?)"
                    .to_string(),
            ));
        }
        return Ok(());
    };
    let tol = row.tolerance.unwrap_or(cap);
    // A NaN or infinite error is no claim to refuse: it makes the verdict false below (as
    // results/README.md says of every reader).
    if row.grad_ok == Some(true) && err.is_finite() && err > tol {
        return Err((
            "grad_ok",
            format!(
                "`true`, but its max_rel_err {err:e} is above its tolerance {tol:e} (grad_ok \
                 is max_rel_err ≤ tolerance: an edited row?)"
            ),
        ));
    }
    let tf32_sane = row.math != "tf32"
        || tf32_own_error(&row.note).is_none_or(|e| e <= crate::measure::step::TF32_REL_BOUND);
    let within = err <= tol && !row.has_non_finite_error() && tf32_sane;
    row.grad_ok = Some(within && row.grad_ok != Some(false));
    Ok(())
}

/// Rows that repeat a measurement, for every reader of several rows at once (`report`,
/// `plots`; `compare` does the same by its own pairing key): the same `key` on the same machine
/// (`device_desc`), within a file or across files. The **last** row of each is kept, in the
/// place of the first, and the repeated keys are returned for the caller's warning. Rows of one
/// key from different machines (an H100's and an H200's `cuda:0`) are different measurements
/// and all kept. Counting one measurement twice would skew every count and mean.
pub fn last_of_each_key(rows: Vec<Row>) -> (Vec<Row>, Vec<String>) {
    let mut at: std::collections::HashMap<(String, String), usize> =
        std::collections::HashMap::new();
    let mut kept: Vec<Row> = Vec::with_capacity(rows.len());
    let mut repeated = Vec::new();
    for r in rows {
        let id = (r.key.clone(), r.device_desc.clone());
        match at.get(&id) {
            Some(&i) => {
                repeated.push(r.key.clone());
                kept[i] = r;
            }
            None => {
                at.insert(id, kept.len());
                kept.push(r);
            }
        }
    }
    (kept, repeated)
}

/// The warning for [`last_of_each_key`]'s repeated keys (the first three named), `None` when
/// there are none.
pub fn repeated_keys_warning(repeated: &[String]) -> Option<String> {
    if repeated.is_empty() {
        return None;
    }
    let mut seen = std::collections::HashSet::new();
    let names: Vec<&str> = repeated
        .iter()
        .map(String::as_str)
        .filter(|k| seen.insert(*k))
        .collect();
    let more = match names.len().saturating_sub(3) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Some(format!(
        "{} row(s) repeat the key of an earlier row of the same machine ({}{more}): the last \
         row of each is used, each measurement counted once",
        repeated.len(),
        names[..names.len().min(3)].join(", ")
    ))
}

/// Reads a result CSV and checks it (`read_rows_unmarked`); every error is the user's input
/// (exit status 2).
pub fn read_rows(path: &Path) -> Result<Vec<Row>> {
    read_rows_unmarked(path).map_err(crate::plan::bounds::bad_input)
}

/// Reads a result CSV and checks it: the header against the schema (missing or extra columns
/// are named), every row's `schema` against this densebench's, every row's `key` against its own
/// fields, and every verdict recomputed ([`judge`]: `tolerance` within the documented rule,
/// `grad_ok` from `max_rel_err`; a NaN in any gradient error makes it false). Errors name the
/// file, the line and the column.
fn read_rows_unmarked(path: &Path) -> Result<Vec<Row>> {
    let mut rdr = csv::Reader::from_reader(crate::plan::input::open_csv(path)?);
    let lag = crlf_line_lag(path);
    let headers: Vec<String> = rdr
        .headers()
        .map_err(|e| csv_error(path, &[], &e, 0))
        .with_context(|| format!("reading the header of {}", path.display()))?
        .iter()
        .map(str::to_string)
        .collect();
    let expected = Row::columns();
    let file_schema = match header_schema(&headers) {
        Some(old @ (1 | 2)) => old,
        _ => SCHEMA_VERSION,
    };
    if headers.iter().all(|h| h.trim().is_empty()) {
        bail!(
            "{}: empty file (no header line): not a densebench result CSV (a run that wrote \
             nothing yet, or the wrong file?)",
            path.display()
        );
    }
    let missing: Vec<&String> = expected.iter().filter(|c| !headers.contains(c)).collect();
    let extra: Vec<&String> = headers.iter().filter(|c| !expected.contains(c)).collect();
    // Most columns missing: not a result CSV at all; naming 56 columns would bury that.
    if file_schema == SCHEMA_VERSION && missing.len() > expected.len() / 2 {
        bail!(
            "{}: not a densebench result CSV: {} of its {} columns are missing (its header \
             starts `{}`)",
            path.display(),
            missing.len(),
            expected.len(),
            headers
                .iter()
                .take(4)
                .cloned()
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    // A column named twice: every row would be refused for it ("line 2: duplicate field"),
    // though it is the header that is wrong.
    if let Some(twice) = repeated_column(&headers) {
        bail!(
            "{}: its header names {twice}: not a densebench result CSV as written (an edited \
             header?)",
            path.display()
        );
    }
    if file_schema == SCHEMA_VERSION && (!missing.is_empty() || !extra.is_empty()) {
        bail!(
            "{}: not a densebench result CSV of schema {SCHEMA_VERSION}, 2 or 1: missing columns [{}], extra columns [{}]",
            path.display(),
            missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            extra
                .iter()
                .map(|c| extra_column(&headers, c))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let mut rows = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        match rdr.read_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = LineAt {
                    path,
                    pos: e.position().cloned(),
                    lag,
                };
                return Err(csv_error_at(path, &headers, &e, line.get()));
            }
        }
        let line = LineAt {
            path,
            pos: record.position().cloned(),
            lag,
        };
        let mut row: Row = record
            .deserialize(Some(&csv::StringRecord::from(headers.clone())))
            .map_err(|e| match unplaced_size_error(&headers, &record, &e) {
                Some(what) => anyhow!("{} line {line}, column `size`: {what}", path.display()),
                None => csv_error_at(path, &headers, &e, line.get()),
            })?;
        if row.schema != file_schema {
            bail!(
                "{} line {line}, column `schema`: {} is not the schema of this file's header \
                 (schema {file_schema}; this densebench reads schemas 1 to {SCHEMA_VERSION})",
                path.display(),
                row.schema
            );
        }
        if file_schema == 1 {
            row.upgrade_from_schema_1();
        } else if file_schema == 2 {
            row.upgrade_from_schema_2();
        }
        if row.framework != DENSEBENCH && row.framework != PYTORCH {
            bail!(
                "{} line {line}, column `framework`: `{}` is not `{DENSEBENCH}` or `{PYTORCH}`",
                path.display(),
                row.framework
            );
        } else if row.math != "ieee" && row.math != "tf32" {
            bail!(
                "{} line {line}, column `math`: `{}` is not `ieee` or `tf32`",
                path.display(),
                row.math
            );
        }
        check_execution(&row).map_err(|e| anyhow!("{} line {line}, {e}", path.display()))?;
        check_measures(&row).map_err(|(column, why)| {
            anyhow!("{} line {line}, column `{column}`: {why}", path.display())
        })?;
        // An empty cell is an eager step (as the key without a suffix says).
        row.execution = row.execution().to_string();
        let own = key_of_fields(&row);
        if row.key != own {
            bail!(
                "{} line {line}, column `key`: `{}` disagrees with the row's own fields, which \
                 give `{own}` (an edited or mixed-up row?)",
                path.display(),
                row.key
            );
        }
        judge(&mut row).map_err(|(column, why)| {
            anyhow!("{} line {line}, column `{column}`: {why}", path.display())
        })?;
        // Checked here, where the file and line are known: `plots` draws it much later.
        row.timeline_points().map_err(|e| {
            anyhow!(
                "{} line {line}, column `timeline`: {e:#} (expected `label=bytes;…`, e.g. \
                 `f0=1024;b0=0`; an edited row?)",
                path.display()
            )
        })?;
        rows.push(row);
    }
    Ok(rows)
}

/// Relative slack of `gflops_per_s` against `flops / median_ns`: the writer stores the quotient
/// exactly (shortest round-trip), so only a rounded or edited cell differs, and 1e-6 lets a
/// cell rounded to 7 significant digits through.
const GFLOPS_SLACK: f64 = 1e-6;

/// A row's status and timings against what a measurement can be (errors are (column, why)):
///
/// - `status` is one a run writes (`ok`, `oom`, `timeout`, `error`, `killed`, `crashed`): a
///   reader that met `passed` would count it as neither a result nor a failure;
/// - every `min`, `median`, `max` triple (forward, backward, whole step) is ordered
///   min ≤ median ≤ max (a time of 0 ns, or none, on an `ok` row is read as no measurement:
///   `compare` calls it missing, `report` shows "–");
/// - `gflops_per_s` is `flops / median_ns` (its definition), so a cell without both, or that
///   disagrees with them, is an edited row;
/// - `machine_gflops` is a finite rate above 0.
fn check_measures(row: &Row) -> std::result::Result<(), (&'static str, String)> {
    use crate::measure::child::{FAILED_STATUSES, RESULT_STATUSES};
    let status = row.status.as_str();
    if !RESULT_STATUSES.contains(&status) && !FAILED_STATUSES.contains(&status) {
        return Err((
            "status",
            format!(
                "`{status}` is not a status a run writes ({})",
                RESULT_STATUSES
                    .iter()
                    .chain(FAILED_STATUSES.iter())
                    .map(|s| format!("`{s}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let triples: [(&'static str, [Option<u64>; 3]); 3] = [
        (
            "fwd_median_ns",
            [row.fwd_min_ns, row.fwd_median_ns, row.fwd_max_ns],
        ),
        (
            "bwd_median_ns",
            [row.bwd_min_ns, row.bwd_median_ns, row.bwd_max_ns],
        ),
        ("median_ns", [row.min_ns, row.median_ns, row.max_ns]),
    ];
    for (column, [min, median, max]) in triples {
        let prefix = column.trim_end_matches("median_ns");
        if let (Some(lo), Some(m)) = (min, median) {
            if lo > m {
                return Err((
                    column,
                    format!("{m} is below its {prefix}min_ns {lo}: a median is at least the minimum (an edited row?)"),
                ));
            }
        }
        if let (Some(m), Some(hi)) = (median, max) {
            if m > hi {
                return Err((
                    column,
                    format!("{m} is above its {prefix}max_ns {hi}: a median is at most the maximum (an edited row?)"),
                ));
            }
        }
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo > hi {
                return Err((
                    column,
                    format!(
                        "its {prefix}min_ns {lo} is above its {prefix}max_ns {hi} (an edited row?)"
                    ),
                ));
            }
        }
    }
    if let Some(g) = row.gflops_per_s {
        // the writer's own derivation (`record`), so that reader and writer cannot disagree
        let Some(own) = crate::measure::estimates::gflops_per_s(row.flops, row.median_ns) else {
            return Err((
                "gflops_per_s",
                format!(
                    "{g}, but flops and median_ns do not give a rate (the rate is flops / \
                     median_ns; an edited row?)"
                ),
            ));
        };
        if !(g.is_finite() && (g - own).abs() <= GFLOPS_SLACK * own.abs().max(f64::MIN_POSITIVE)) {
            return Err((
                "gflops_per_s",
                format!(
                    "{g} is not its flops / median_ns ({} / {} = {own}): the rate is derived \
                     from them (an edited row?)",
                    row.flops.unwrap_or_default(),
                    row.median_ns.unwrap_or_default()
                ),
            ));
        }
    }
    if let Some(g) = row.machine_gflops {
        if !(g.is_finite() && g > 0.0) {
            return Err((
                "machine_gflops",
                format!("{g} is not a machine's rate: a finite GFLOP/s above 0 (an edited row?)"),
            ));
        }
    }
    Ok(())
}

/// A row's `execution` against what its framework can run: densebench's steps are `eager` or
/// `graph`; PyTorch's compiled variants `graph` or `compiled`, its eager ones `eager`; a
/// `compile_ns` only on a compiled row.
fn check_execution(row: &Row) -> Result<()> {
    let e = row.execution();
    let compiled_variant = row.variant.starts_with("pytorch-compiled-");
    let allowed: &[&str] = match (row.framework.as_str(), compiled_variant) {
        (DENSEBENCH, _) => &["eager", "graph"],
        (_, true) => &["graph", "compiled"],
        (_, false) => &["eager"],
    };
    if !allowed.contains(&e) {
        bail!(
            "column `execution`: `{e}` is not {} for a {} row of `{}`",
            allowed
                .iter()
                .map(|a| format!("`{a}`"))
                .collect::<Vec<_>>()
                .join(" or "),
            row.framework,
            row.variant
        );
    }
    if row.compile_ns.is_some() && !compiled_variant {
        bail!(
            "column `compile_ns`: a compile time on `{}`, which compiles nothing",
            row.variant
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(framework: &str, variant: &str, execution: &str) -> Row {
        Row {
            framework: framework.to_string(),
            variant: variant.to_string(),
            execution: execution.to_string(),
            ..Row::default()
        }
    }

    #[test]
    fn execution_is_checked_against_what_the_framework_runs() {
        let ok = [
            (DENSEBENCH, "cat-store-copy", "eager"),
            (DENSEBENCH, "cat-store-copy", "graph"),
            (DENSEBENCH, "cat-store-copy", ""),
            (PYTORCH, "pytorch-naive", "eager"),
            (PYTORCH, "pytorch-compiled-naive", "graph"),
            (PYTORCH, "pytorch-compiled-checkpoint", "compiled"),
        ];
        for (f, v, e) in ok {
            assert!(check_execution(&row(f, v, e)).is_ok(), "{f} {v} {e}");
        }
        let bad = [
            (DENSEBENCH, "cat-store-copy", "compiled"),
            (DENSEBENCH, "cat-store-copy", "jit"),
            (PYTORCH, "pytorch-naive", "graph"),
            (PYTORCH, "pytorch-compiled-naive", "eager"),
        ];
        for (f, v, e) in bad {
            let err = check_execution(&row(f, v, e)).expect_err(e).to_string();
            assert!(err.contains("column `execution`"), "{err}");
        }
        let mut timed = row(PYTORCH, "pytorch-naive", "eager");
        timed.compile_ns = Some(1);
        assert!(
            check_execution(&timed).is_err(),
            "an eager row has no compile time"
        );
    }

    #[test]
    fn keys_carry_math_then_execution() {
        let mut r = row(PYTORCH, "pytorch-compiled-naive", "graph");
        r.family = "bc".to_string();
        r.device = "cuda:0".to_string();
        r.math = "tf32".to_string();
        assert!(
            key_of_fields(&r).ends_with("/cuda:0/tf32/graph"),
            "{}",
            key_of_fields(&r)
        );
        r.math = "ieee".to_string();
        assert!(key_of_fields(&r).ends_with("/cuda:0/graph"));
        r.execution = "eager".to_string();
        assert!(key_of_fields(&r).ends_with("/cuda:0"));
        r.execution = String::new();
        assert!(key_of_fields(&r).ends_with("/cuda:0"), "empty is eager");
    }

    #[test]
    fn a_schema_2_gpu_peer_row_says_its_time_was_instrumented() {
        let old = |device: &str, framework: &str| {
            let mut r = row(framework, "pytorch-naive", "");
            r.device = device.to_string();
            r.status = "ok".to_string();
            r.upgrade_from_schema_2();
            r
        };
        assert_eq!(old("cuda:0", PYTORCH).note, OLD_PEER_TIMING_NOTE);
        assert_eq!(old("cuda:0", PYTORCH).execution, "eager");
        assert_eq!(
            old("cpu", PYTORCH).note,
            "",
            "the CPU hook cost microseconds"
        );
        assert_eq!(
            old("cuda:0", DENSEBENCH).note,
            "",
            "densebench's rows had no hook"
        );
        let mut noted = row(PYTORCH, "pytorch-memory-efficient", "");
        noted.device = "cuda:0".into();
        noted.status = "ok".into();
        noted.note = "double update".into();
        noted.upgrade_from_schema_2();
        assert_eq!(noted.note, format!("double update; {OLD_PEER_TIMING_NOTE}"));
    }

    #[test]
    fn header_schemas_are_told_apart() {
        assert_eq!(header_schema(&Row::columns()), Some(SCHEMA_VERSION));
        assert_eq!(header_schema(&schema_2_columns()), Some(2));
        assert_eq!(header_schema(&schema_1_columns()), Some(1));
        let mut odd = schema_2_columns();
        odd.push("compile_ns".to_string());
        assert_eq!(header_schema(&odd), None);
    }

    #[test]
    fn the_cuda_graph_median_is_read_from_the_note() {
        let mut r = Row::default();
        assert_eq!(r.cuda_graph_median_ns(), None);
        r.note = "predicted with the memory pool's rounding (+1.0% over request sizes); \
                  cuda_graph_median_ns=1234;cuda_graph_min_ns=1200;cuda_graph_max_ns=1300 (…)"
            .to_string();
        assert_eq!(r.cuda_graph_median_ns(), Some(1234));
        r.note = "CUDA graph timing not reported: the capture panicked".to_string();
        assert_eq!(r.cuda_graph_median_ns(), None);
        r.note = "cuda_graph_median_ns=;x".to_string();
        assert_eq!(r.cuda_graph_median_ns(), None, "an empty number is none");
        // what the GPU child writes reads back
        r.note = crate::measure::graph::note(987, 900, 1000);
        assert_eq!(r.cuda_graph_median_ns(), Some(987));
    }
}
