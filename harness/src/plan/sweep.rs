//! Sweep files (TOML, format in harness/sweeps/README.md) and their expansion into jobs: every
//! list an axis of a cartesian product, every variant checked against its config, every job
//! keyed ([`crate::plan::job::key`]) and costed ([`crate::plan::shard::job_cost`]) before any
//! work. Also the built-in sweeps and `--devices` retargeting.
//!
//! Reading is in two steps so that no serde wording reaches the user: TOML's own parser checks
//! the syntax and the key names (its errors carry a line and column), then each value is typed
//! here, with a message naming the key, its table and its line ("line 7: `depth` in group 2:
//! expected an integer or a list of integers, got a string"). Every number is bounded
//! ([`crate::plan::bounds`]), and the sweep's size is counted before it is expanded: a sweep
//! that would expand to more than [`MAX_JOBS`] jobs fails at once, with the count.

use crate::plan::bounds::{self, ResultExt, MAX_JOBS, MAX_SWEEP_FILE_BYTES};
use crate::plan::device::DeviceSpec;
use crate::plan::input;
use crate::plan::job::{self, resolve_threads, Execution, Math, Peer, Settings, Target};
use crate::plan::shard;
use anyhow::{anyhow, bail, Context, Result};
use impls::{Config, Family, Spatial, Variant};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;
use toml::{Spanned, Value};

pub use crate::plan::job::Job;

/// The built-in sweeps (copies of harness/sweeps/*.toml), so the binary runs from anywhere.
pub const DEFAULT_SWEEP: &str = include_str!("../../sweeps/default.toml");
pub const QUICK_SWEEP: &str = include_str!("../../sweeps/quick.toml");

/// One value of a sweep file and where it was set, for messages: `line 9: `threads``, or
/// `line 3 in [defaults]: `threads`` when a group takes it from `[defaults]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Set<T> {
    pub value: T,
    pub at: String,
}

/// One table of a sweep file: `[defaults]` or a `[[group]]`, its values typed. Every field is
/// optional in the file; a group's missing fields come from `[defaults]`, then from the built-in
/// defaults. Lists are axes of the group's cartesian product (a scalar is a list of one).
#[derive(Debug, Clone, Default)]
pub struct Entry {
    pub name: Option<String>,
    pub family: Option<Set<String>>,
    pub batch: Option<Set<Vec<usize>>>,
    pub channels: Option<Set<Vec<usize>>>,
    pub growth: Option<Set<Vec<usize>>>,
    pub depth: Option<Set<Vec<usize>>>,
    pub bn_size: Option<Set<Vec<usize>>>,
    /// `32` (32×32) or `"HxW"`, height first.
    pub size: Option<Set<Vec<Spatial>>>,
    pub activation: Option<Set<Vec<bool>>>,
    pub dtype: Option<Set<Vec<String>>>,
    pub seed: Option<Set<Vec<u64>>>,
    /// `"all"` (every variant that applies) or a list of variant names.
    pub variants: Option<Set<Vec<String>>>,
    pub steps: Option<Set<usize>>,
    pub warmup: Option<Set<usize>>,
    pub threads: Option<Set<usize>>,
    pub device: Option<Set<String>>,
    pub timeout_secs: Option<Set<u64>>,
    /// An integer, or a string with a suffix (`"12GiB"`).
    pub mem_limit: Option<Set<u64>>,
    /// `"pytorch"`: every config also runs the peer's variants; `"none"`: it does not.
    pub peer: Option<Set<String>>,
    /// `"ieee"` (default) or `"tf32"` (GPU, f32), or a list of both (an axis: every job in
    /// each).
    pub math: Option<Set<Vec<String>>>,
    /// `"eager"` (default) or `"graph"` (densebench's step replayed as a CUDA graph; cuda:N
    /// only), or a list of both (an axis).
    pub execution: Option<Set<Vec<String>>>,
}

/// A table as TOML's parser gives it: known keys only, values untyped with their positions.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a table of sweep keys (`[defaults]` or `[[group]]`)"
)]
struct RawEntry {
    name: Option<Spanned<Value>>,
    family: Option<Spanned<Value>>,
    batch: Option<Spanned<Value>>,
    channels: Option<Spanned<Value>>,
    growth: Option<Spanned<Value>>,
    depth: Option<Spanned<Value>>,
    bn_size: Option<Spanned<Value>>,
    size: Option<Spanned<Value>>,
    activation: Option<Spanned<Value>>,
    dtype: Option<Spanned<Value>>,
    seed: Option<Spanned<Value>>,
    variants: Option<Spanned<Value>>,
    steps: Option<Spanned<Value>>,
    warmup: Option<Spanned<Value>>,
    threads: Option<Spanned<Value>>,
    device: Option<Spanned<Value>>,
    timeout_secs: Option<Spanned<Value>>,
    mem_limit: Option<Spanned<Value>>,
    peer: Option<Spanned<Value>>,
    math: Option<Spanned<Value>>,
    execution: Option<Spanned<Value>>,
}

/// A sweep file as TOML's parser gives it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a sweep file")]
struct RawSweep {
    #[serde(rename = "name")]
    _name: Option<String>,
    #[serde(rename = "description")]
    _description: Option<String>,
    #[serde(default)]
    defaults: RawEntry,
    #[serde(default, rename = "group", deserialize_with = "group_tables")]
    groups: Vec<RawEntry>,
}

/// `[[group]]` tables, with that as the expectation when `group` is something else.
fn group_tables<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<RawEntry>, D::Error> {
    struct Tables;
    impl<'de> serde::de::Visitor<'de> for Tables {
        type Value = Vec<RawEntry>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("`[[group]]` tables")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some(e) = seq.next_element()? {
                out.push(e);
            }
            Ok(out)
        }
    }
    d.deserialize_seq(Tables)
}

/// What a TOML value is, for "got …" in messages.
fn kind(v: &Value) -> String {
    match v {
        Value::String(s) => format!("the string \"{}\"", s.chars().take(40).collect::<String>()),
        Value::Integer(i) if *i < 0 => format!("the negative integer {i}"),
        Value::Integer(i) => format!("the integer {i}"),
        Value::Float(x) => format!("the number {x} (not an integer)"),
        Value::Boolean(b) => format!("the boolean {b}"),
        Value::Datetime(_) => "a date".to_string(),
        Value::Array(_) => "a list".to_string(),
        Value::Table(_) => "a table".to_string(),
    }
}

/// How one kind of value is read: its name in messages (one, many) and the conversion.
struct Kind<T> {
    one: &'static str,
    many: &'static str,
    read: fn(&Value) -> Option<T>,
}

const UINT: Kind<usize> = Kind {
    one: "an integer",
    many: "integers",
    read: |v| v.as_integer().and_then(|i| usize::try_from(i).ok()),
};
const U64: Kind<u64> = Kind {
    one: "an integer",
    many: "integers",
    read: |v| v.as_integer().and_then(|i| u64::try_from(i).ok()),
};
/// A spatial size: an integer (`32`, H = W = 32) or a string `"HxW"` (`"360x480"`).
const SIZE: Kind<Spatial> = Kind {
    one: "a size (an integer such as 32, or \"HxW\" such as \"360x480\", height first)",
    many: "sizes",
    read: |v| match v {
        Value::String(s) => Spatial::parse(s).ok(),
        v => v
            .as_integer()
            .and_then(|i| usize::try_from(i).ok())
            .map(Spatial::square),
    },
};
const BOOL: Kind<bool> = Kind {
    one: "a boolean (true or false)",
    many: "booleans",
    read: Value::as_bool,
};
const STRING: Kind<String> = Kind {
    one: "a string",
    many: "strings",
    read: |v| v.as_str().map(str::to_string),
};

/// Types the raw tables of one file, naming positions in `text`.
struct Reader<'a> {
    text: &'a str,
    /// `` in [defaults]`` for the defaults table, empty for a group (the group is named by the
    /// context around the message).
    table: &'static str,
}

impl Reader<'_> {
    fn at(&self, key: &str, v: &Spanned<Value>) -> String {
        let (line, _) = line_column(self.text, v.span().start);
        format!("line {line}{}: `{key}`", self.table)
    }

    fn one<T>(&self, key: &str, v: &Option<Spanned<Value>>, k: &Kind<T>) -> Result<Option<Set<T>>> {
        let Some(v) = v else { return Ok(None) };
        let at = self.at(key, v);
        match (k.read)(v.get_ref()) {
            Some(value) => Ok(Some(Set { value, at })),
            None => bail!("{at}: expected {}, got {}", k.one, kind(v.get_ref())),
        }
    }

    fn many<T>(
        &self,
        key: &str,
        v: &Option<Spanned<Value>>,
        k: &Kind<T>,
    ) -> Result<Option<Set<Vec<T>>>> {
        let Some(v) = v else { return Ok(None) };
        let at = self.at(key, v);
        let value = match v.get_ref() {
            Value::Array(items) if items.is_empty() => {
                bail!("{at}: an empty list (give at least one value)")
            }
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    (k.read)(item).with_context(|| {
                        format!(
                            "{at}: item {} of the list: expected {}, got {}",
                            i + 1,
                            k.one,
                            kind(item)
                        )
                    })
                })
                .collect::<Result<Vec<T>>>()?,
            scalar => match (k.read)(scalar) {
                Some(x) => vec![x],
                None => bail!(
                    "{at}: expected {} or a list of {}, got {}",
                    k.one,
                    k.many,
                    kind(scalar)
                ),
            },
        };
        Ok(Some(Set { value, at }))
    }

    fn bytes(&self, key: &str, v: &Option<Spanned<Value>>) -> Result<Option<Set<u64>>> {
        let Some(v) = v else { return Ok(None) };
        let at = self.at(key, v);
        let value = match v.get_ref() {
            Value::Integer(i) => u64::try_from(*i).ok().with_context(|| {
                format!("{at}: expected a byte count, got the negative integer {i}")
            })?,
            Value::String(s) => job::parse_bytes(s).with_context(|| at.clone())?,
            other => bail!(
                "{at}: expected a byte count (an integer, or a string such as \"2GiB\"), got {}",
                kind(other)
            ),
        };
        Ok(Some(Set { value, at }))
    }

    fn entry(&self, r: &RawEntry) -> Result<Entry> {
        Ok(Entry {
            name: self.one("name", &r.name, &STRING)?.map(|s| s.value),
            family: self.one("family", &r.family, &STRING)?,
            batch: self.many("batch", &r.batch, &UINT)?,
            channels: self.many("channels", &r.channels, &UINT)?,
            growth: self.many("growth", &r.growth, &UINT)?,
            depth: self.many("depth", &r.depth, &UINT)?,
            bn_size: self.many("bn_size", &r.bn_size, &UINT)?,
            size: self.many("size", &r.size, &SIZE)?,
            activation: self.many("activation", &r.activation, &BOOL)?,
            dtype: self.many("dtype", &r.dtype, &STRING)?,
            seed: self.many("seed", &r.seed, &U64)?,
            variants: self.many("variants", &r.variants, &STRING)?,
            steps: self.one("steps", &r.steps, &UINT)?,
            warmup: self.one("warmup", &r.warmup, &UINT)?,
            threads: self.one("threads", &r.threads, &UINT)?,
            device: self.one("device", &r.device, &STRING)?,
            timeout_secs: self.one("timeout_secs", &r.timeout_secs, &U64)?,
            mem_limit: self.bytes("mem_limit", &r.mem_limit)?,
            peer: self.one("peer", &r.peer, &STRING)?,
            math: self.many("math", &r.math, &STRING)?,
            execution: self.many("execution", &r.execution, &STRING)?,
        })
    }
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// A sweep file, its values typed: `[defaults]` and the groups.
#[derive(Debug, Clone, Default)]
pub struct SweepFile {
    pub defaults: Entry,
    pub groups: Vec<Entry>,
}

/// The name of group `index` (0-based) in messages: `group 2` or `group 2 (`fits`)`.
fn group_label(index: usize, g: &Entry) -> String {
    match &g.name {
        Some(n) => format!("group {} (`{n}`)", index + 1),
        None => format!("group {}", index + 1),
    }
}

/// Reads a sweep file's text: syntax and key names by TOML's parser, values typed here.
/// `source` names the file in messages.
pub fn read(text: &str, source: &str) -> Result<SweepFile> {
    let raw: RawSweep = toml::from_str(text).map_err(|e| toml_error(text, source, &e))?;
    let defaults = Reader {
        text,
        table: " in [defaults]",
    }
    .entry(&raw.defaults)
    .with_context(|| format!("sweep file {source}"))?;
    let groups = raw
        .groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            Reader { text, table: "" }.entry(g).with_context(|| {
                // The group's name, if it has a readable one, names it in the message.
                let name = g.name.as_ref().and_then(|n| n.get_ref().as_str());
                match name {
                    Some(n) => format!("sweep file {source}, group {} (`{n}`)", i + 1),
                    None => format!("sweep file {source}, group {}", i + 1),
                }
            })
        })
        .collect::<Result<Vec<Entry>>>()?;
    Ok(SweepFile { defaults, groups })
}

// Built-in defaults for fields neither a group nor `[defaults]` sets (bn_size and size are
// `run`'s: `job::DEFAULT_BN_SIZE`, `job::DEFAULT_SIZE`).
use super::job::{DEFAULT_BN_SIZE, DEFAULT_SIZE};
const DEFAULT_STEPS: usize = 3;
const DEFAULT_WARMUP: usize = 1;

macro_rules! merged {
    ($g:expr, $d:expr, $field:ident) => {
        $g.$field.clone().or_else(|| $d.$field.clone())
    };
}

/// The axes of a group's cartesian product with their lengths, variants last. `"all"` counts
/// the variants that apply to the family, with the activation that has the most (exact for one
/// activation value, an upper bound for mlp with both); an unknown family counts every variant.
fn axes(g: &Entry, d: &Entry) -> Vec<(&'static str, usize)> {
    fn len<T>(v: Option<Set<Vec<T>>>) -> usize {
        v.map_or(1, |s| s.value.len())
    }
    let all = || {
        let family = merged!(g, d, family).and_then(|f| Family::parse(&f.value).ok());
        let activations = merged!(g, d, activation).map_or(vec![true], |a| a.value);
        match family {
            Some(family) => [true, false]
                .into_iter()
                .filter(|a| activations.contains(a))
                .map(|activation| {
                    Variant::for_config(&Config {
                        activation,
                        ..Config::tiny(family)
                    })
                    .len()
                })
                .max()
                .unwrap_or(0),
            None => Variant::all().len(),
        }
    };
    // The peer's variants for the family (bc has channels_last twins); an unknown family the most.
    let peers = match merged!(g, d, peer).and_then(|p| p.value.parse::<Peer>().ok()) {
        Some(peer) => {
            let family = merged!(g, d, family).and_then(|f| Family::parse(&f.value).ok());
            Family::ALL
                .into_iter()
                .filter(|f| family.is_none_or(|family| family == *f))
                .map(|f| peer.variants(&Config::tiny(f)).len())
                .max()
                .unwrap_or(0)
        }
        None => 0,
    };
    let variants = peers
        + match merged!(g, d, variants) {
            Some(v) if v.value != ["all"] => v.value.len(),
            _ => all(),
        };
    vec![
        ("batch", len(merged!(g, d, batch))),
        ("channels", len(merged!(g, d, channels))),
        ("growth", len(merged!(g, d, growth))),
        ("depth", len(merged!(g, d, depth))),
        ("bn_size", len(merged!(g, d, bn_size))),
        ("size", len(merged!(g, d, size))),
        ("activation", len(merged!(g, d, activation))),
        ("dtype", len(merged!(g, d, dtype))),
        ("seed", len(merged!(g, d, seed))),
        ("math", len(merged!(g, d, math))),
        ("execution", len(merged!(g, d, execution))),
        ("variants", variants),
    ]
}

/// The number of jobs a group expands to at most (`None`: more than `u64` counts).
fn group_jobs(axes: &[(&str, usize)]) -> Option<u64> {
    axes.iter()
        .try_fold(1u64, |n, &(_, len)| n.checked_mul(u64::try_from(len).ok()?))
}

/// Counts the jobs of `file` before expanding it; errs above [`MAX_JOBS`], naming the largest
/// group and its axes.
fn check_size(file: &SweepFile, source: &str) -> Result<()> {
    let mut total: Option<u64> = Some(0);
    let mut largest: Option<(Option<u64>, usize)> = None;
    for (i, g) in file.groups.iter().enumerate() {
        let n = group_jobs(&axes(g, &file.defaults));
        total = total.and_then(|t| t.checked_add(n?));
        if largest.is_none_or(|(m, _)| n.is_none() || m.is_some_and(|m| n > Some(m))) {
            largest = Some((n, i));
        }
    }
    if total.is_some_and(|t| t <= MAX_JOBS) {
        return Ok(());
    }
    let count = |n: Option<u64>| n.map_or("more than 10^19".to_string(), |n| n.to_string());
    let detail = largest
        .map(|(n, i)| {
            let g = &file.groups[i];
            let product: Vec<String> = axes(g, &file.defaults)
                .into_iter()
                .filter(|&(_, len)| len > 1)
                .map(|(axis, len)| format!("{len} {axis}"))
                .collect();
            format!(
                "; {} alone has {} ({})",
                group_label(i, g),
                count(n),
                product.join(" × ")
            )
        })
        .unwrap_or_default();
    bail!(
        "sweep file {source} expands to {} jobs, over the limit of {MAX_JOBS} jobs per sweep{detail}: \
         split it into several sweep files",
        count(total)
    )
}

/// What the command line overrides in every group of a sweep file.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    /// `--mem-limit`: replaces every memory limit.
    pub mem_limit: Option<u64>,
    /// `--peer`: every config also runs this peer's variants, whatever the file says.
    pub peer: Option<Peer>,
    /// `--math`: every group's math mode, whatever the file says.
    pub math: Option<Math>,
    /// The first device of `--devices`: every group's device, whatever the file says, before
    /// anything is validated against it (`--math tf32` with `--devices cuda:0` on a CPU sweep
    /// is a GPU sweep in TF32, not a CPU sweep refused).
    pub device: Option<DeviceSpec>,
}

/// Parses a sweep file's text and expands it into jobs, validating everything. `source` names
/// the file in error messages; `mem_override` replaces every memory limit.
pub fn parse(text: &str, source: &str, mem_override: Option<u64>) -> Result<Vec<Job>> {
    parse_with(
        text,
        source,
        Overrides {
            mem_limit: mem_override,
            peer: None,
            math: None,
            device: None,
        },
    )
}

/// [`parse`] with the command line's [`Overrides`].
pub fn parse_with(text: &str, source: &str, over: Overrides) -> Result<Vec<Job>> {
    let mem_override = over.mem_limit;
    let file = read(text, source)?;
    if file.groups.is_empty() {
        bail!("sweep file {source} has no [[group]]: nothing to run");
    }
    check_size(&file, source)?;
    let d = &file.defaults;
    let mut jobs = Vec::new();
    let mut seen = HashSet::new();
    for (gi, g) in file.groups.iter().enumerate() {
        let label = format!("sweep file {source}, {}", group_label(gi, g));
        let group_jobs = expand(g, d, mem_override, over).with_context(|| label.clone())?;
        for j in group_jobs {
            // A key listed twice is measured once.
            if seen.insert(j.key.clone()) {
                jobs.push(j);
            }
        }
    }
    Ok(jobs)
}

/// A TOML error on one line: position and message (toml's own rendering spans several lines).
fn toml_error(text: &str, source: &str, e: &toml::de::Error) -> anyhow::Error {
    let at = e
        .span()
        .map(|span| {
            let (line, column) = line_column(text, span.start);
            format!(" at line {line}, column {column}")
        })
        .unwrap_or_default();
    let msg = e.message().trim().replace('\n', " ");
    anyhow!("sweep file {source} is malformed{at}: {msg}")
}

fn required<T>(v: Option<Set<Vec<T>>>, field: &str) -> Result<Vec<T>> {
    Ok(
        v.with_context(|| format!("`{field}` is missing (set it in the group or in [defaults])"))?
            .value,
    )
}

fn optional<T>(v: Option<Set<Vec<T>>>, default: T) -> Vec<T> {
    v.map_or_else(|| vec![default], |s| s.value)
}

/// A bounded scalar: `check(what, value)` with `what` naming the key and its line.
fn bounded<T: Copy>(v: Option<Set<T>>, default: T, check: fn(&str, T) -> Result<T>) -> Result<T> {
    match v {
        None => Ok(default),
        Some(s) => check(&s.at, s.value),
    }
}

/// Refuses what a group sets itself that its family does not have: `bn_size` or `size` other
/// than 1 in an mlp group, `activation = false` in a bc group (as `run` refuses the flags).
/// Without this they were normalised away in silence — `size = [8, 16]` in an mlp group made one
/// configuration keyed `size 1`. `[defaults]` may set them for every group: they apply to the
/// groups of the family that has them.
fn check_family_fields(family: Family, g: &Entry) -> Result<()> {
    match family {
        Family::Mlp => {
            if let Some(s) = g
                .bn_size
                .as_ref()
                .filter(|s| s.value.iter().any(|&b| b != 1))
            {
                bail!(
                    "{}: `bn_size` applies to bc groups only: an mlp layer (Linear → ReLU) has \
                     no bottleneck; leave it out of this group",
                    s.at
                );
            }
            let flat = Spatial::square(1);
            if let Some(s) = g
                .size
                .as_ref()
                .filter(|s| s.value.iter().any(|&z| z != flat))
            {
                bail!(
                    "{}: `size` applies to bc groups only: an mlp layer's features are vectors, \
                     not feature maps; leave it out of this group",
                    s.at
                );
            }
        }
        Family::Bc => {
            if let Some(s) = g.activation.as_ref().filter(|s| s.value.contains(&false)) {
                bail!(
                    "{}: `activation = false` applies to mlp groups only: a bc (DenseNet-BC) \
                     layer always has its BN → ReLU; leave it out of this group",
                    s.at
                );
            }
        }
    }
    Ok(())
}

fn expand(g: &Entry, d: &Entry, mem_override: Option<u64>, over: Overrides) -> Result<Vec<Job>> {
    let (peer_override, math_override) = (over.peer, over.math);
    let family_name = merged!(g, d, family).context("`family` is missing (`mlp` or `bc`)")?;
    let family =
        Family::parse(&family_name.value).map_err(|e| anyhow!("{}: {e}", family_name.at))?;
    let batches = required(merged!(g, d, batch), "batch")?;
    let channels = required(merged!(g, d, channels), "channels")?;
    let growths = required(merged!(g, d, growth), "growth")?;
    let depths = required(merged!(g, d, depth), "depth")?;
    check_family_fields(family, g)?;
    let bn_sizes = optional(merged!(g, d, bn_size), DEFAULT_BN_SIZE);
    let sizes = optional(merged!(g, d, size), DEFAULT_SIZE);
    let activations = optional(merged!(g, d, activation), true);
    let dtypes = optional(merged!(g, d, dtype), "f32".to_string());
    let seeds = optional(merged!(g, d, seed), 0);
    let variants = optional(merged!(g, d, variants), "all".to_string());
    let peer = match (peer_override, merged!(g, d, peer)) {
        (Some(p), _) => Some(p),
        (None, None) => None,
        (None, Some(s)) if s.value == "none" => None,
        (None, Some(s)) => Some(
            s.value
                .parse::<Peer>()
                .map_err(|e| anyhow!("{}: {e}, or `none`", s.at))?,
        ),
    };
    let device: DeviceSpec = match (over.device, merged!(g, d, device)) {
        (Some(device), _) => device,
        (None, None) => DeviceSpec::Cpu,
        (None, Some(s)) => s.value.parse().with_context(|| s.at.clone())?,
    };
    let (maths, math_at) = match (math_override, merged!(g, d, math)) {
        (Some(m), _) => (vec![m], "--math".to_string()),
        (None, None) => (vec![Math::Ieee], "`math`".to_string()),
        (None, Some(s)) => (
            s.value
                .iter()
                .map(|m| Math::parse(m).map_err(|e| anyhow!("{}: {e}", s.at)))
                .collect::<Result<Vec<_>>>()?,
            s.at.clone(),
        ),
    };
    let executions = match merged!(g, d, execution) {
        None => vec![Execution::Eager],
        Some(s) => s
            .value
            .iter()
            .map(|e| {
                let e = Execution::parse(e).map_err(|err| anyhow!("{}: {err}", s.at))?;
                e.check_densebench(device)
                    .map_err(|err| anyhow!("{}: {err}", s.at))?;
                Ok(e)
            })
            .collect::<Result<Vec<_>>>()?,
    };
    let mem_limit = match mem_override {
        Some(b) => Some(b),
        None => match merged!(g, d, mem_limit) {
            Some(s) => Some(bounds::check_mem_limit(&s.at, s.value)?),
            None => job::default_mem_limit(),
        },
    };
    let threads = bounded(merged!(g, d, threads), 0, bounds::check_threads)?;
    let timeout = bounded(
        merged!(g, d, timeout_secs),
        job::DEFAULT_TIMEOUT_SECS,
        bounds::check_timeout,
    )?;
    let settings = Settings {
        device,
        math: Math::Ieee,
        execution: Execution::Eager,
        threads: resolve_threads(threads),
        steps: bounded(merged!(g, d, steps), DEFAULT_STEPS, bounds::check_steps)?,
        warmup: bounded(merged!(g, d, warmup), DEFAULT_WARMUP, bounds::check_warmup)?,
        mem_limit,
        timeout: Duration::from_secs(timeout),
    };
    let explicit: Option<Vec<Variant>> = if variants == ["all"] {
        None
    } else {
        Some(
            variants
                .iter()
                .map(|v| Variant::parse(v).map_err(|e| anyhow!("`variants`: {e}")))
                .collect::<Result<_>>()?,
        )
    };
    let mut jobs = Vec::new();
    // Depth innermost (after variants): each configuration runs shallow to deep.
    for &batch in &batches {
        for &c0 in &channels {
            for &k in &growths {
                for &bn in &bn_sizes {
                    for &size in &sizes {
                        for &act in &activations {
                            for dt in &dtypes {
                                for &seed in &seeds {
                                    for &depth in &depths {
                                        let dtype = impls::config::parse_dtype(dt)
                                            .map_err(|e| anyhow!("`dtype`: {e}"))?;
                                        let cfg = job::normalize(Config {
                                            family,
                                            batch,
                                            channels: c0,
                                            growth: k,
                                            depth,
                                            bn_size: bn,
                                            size,
                                            activation: act,
                                            dtype,
                                            seed,
                                        });
                                        cfg.validate().map_err(|e| anyhow!("{e}"))?;
                                        let vs = match &explicit {
                                            None => Variant::for_config(&cfg),
                                            Some(list) => {
                                                for v in list {
                                                    v.check(&cfg)
                                                        .map_err(|e| anyhow!("`variants`: {e}"))?;
                                                }
                                                list.clone()
                                            }
                                        };
                                        // The peer's first: the naive peer's error is the
                                        // f32 tolerance of the densebench rows after it.
                                        let peers = peer
                                            .map(|p| p.variants(&cfg))
                                            .unwrap_or_default()
                                            .into_iter()
                                            .map(Target::Peer);
                                        let targets: Vec<Target> = peers
                                            .chain(vs.into_iter().map(Target::Densebench))
                                            .collect();
                                        for &math in &maths {
                                            math.check(device, cfg.dtype)
                                                .map_err(|e| anyhow!("{math_at}: {e}"))?;
                                            for &execution in &executions {
                                                let settings = Settings {
                                                    math,
                                                    execution,
                                                    ..settings.clone()
                                                };
                                                for &variant in &targets {
                                                    jobs.push(Job {
                                                        key: job::job_key(
                                                            variant, &cfg, device, math, execution,
                                                        ),
                                                        cost: shard::job_cost(
                                                            variant, &cfg, &settings,
                                                        ),
                                                        variant,
                                                        cfg: cfg.clone(),
                                                        peer,
                                                        settings: settings.clone(),
                                                    });
                                                }
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(jobs)
}

/// The sweep's text and its name for messages: `sweep` if given, else the built-in quick
/// (`quick`) or default sweep.
pub fn load_sweep(sweep: Option<&Path>, quick: bool) -> Result<(String, String)> {
    match (sweep, quick) {
        (Some(p), _) => Ok((read_sweep_file(p)?, p.display().to_string())),
        (None, true) => Ok((
            QUICK_SWEEP.to_string(),
            "harness/sweeps/quick.toml (built in)".to_string(),
        )),
        (None, false) => Ok((
            DEFAULT_SWEEP.to_string(),
            "harness/sweeps/default.toml (built in)".to_string(),
        )),
    }
}

/// A sweep file's text, refused unread beyond [`MAX_SWEEP_FILE_BYTES`] (a wrong path, such as
/// a result CSV or a case file, is not read whole), and refused unopened when it is not a
/// regular file (a FIFO would block, a device never end: [`input::read_bounded`]).
fn read_sweep_file(p: &Path) -> Result<String> {
    let limit = "a sweep is a few hundred bytes of TOML; see harness/sweeps/README.md";
    let bytes = input::read_bounded(p, "sweep file", MAX_SWEEP_FILE_BYTES, limit).map_err(|e| {
        if format!("{e:#}").contains("over the limit") {
            anyhow!(
                "sweep file {} is larger than {} KiB: not a sweep file ({limit})",
                p.display(),
                MAX_SWEEP_FILE_BYTES >> 10
            )
        } else {
            e
        }
    })?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow!(
            "sweep file {} is not UTF-8 text (invalid byte at offset {}): not a sweep file",
            p.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Moves every job to `device` (what `--devices` does with its first device): keys are
/// recomputed, and jobs that now share a key (the same config on two devices in the sweep file)
/// are measured once.
pub fn retarget(jobs: Vec<Job>, device: DeviceSpec) -> Vec<Job> {
    let mut seen = HashSet::new();
    jobs.into_iter()
        .filter_map(|mut j| {
            j.settings.device = device;
            j.key = job::job_key(
                j.variant,
                &j.cfg,
                device,
                j.settings.math,
                j.settings.execution,
            );
            seen.insert(j.key.clone()).then_some(j)
        })
        .collect()
}

/// A sweep's name and its keys in order, each with its shard (1-based) when a count was given.
pub type SweepKeys = (String, Vec<(String, Option<usize>)>);

/// The keys of a sweep in its order, and, with `shards`, each key's shard (1-based). Every
/// error is the user's input (a bad sweep, a shard count out of bounds: exit status 2).
pub fn sweep_keys(
    sweep_file: Option<&Path>,
    quick: bool,
    devices: &[DeviceSpec],
    shards: Option<usize>,
) -> Result<SweepKeys> {
    let (text, source) = load_sweep(sweep_file, quick).bad_input()?;
    let over = Overrides {
        device: devices.first().copied(),
        ..Overrides::default()
    };
    let mut jobs = parse_with(&text, &source, over).bad_input()?;
    if let Some(&first) = devices.first() {
        jobs = retarget(jobs, first);
    }
    let mut shard_of: HashMap<usize, usize> = HashMap::new();
    if let Some(n) = shards {
        bounds::check_shards("--shards", n).bad_input()?;
        for (i, part) in shard::partition(&jobs, n).iter().enumerate() {
            for &j in &part.jobs {
                shard_of.insert(j, i + 1);
            }
        }
    }
    let keys = jobs
        .into_iter()
        .enumerate()
        .map(|(i, j)| (j.key, shard_of.get(&i).copied()))
        .collect();
    Ok((source, keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse(text, "t.toml", Some(1 << 30)) {
            Ok(_) => "parsed".to_string(),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn built_in_sweeps_parse() {
        for (text, name) in [(DEFAULT_SWEEP, "default"), (QUICK_SWEEP, "quick")] {
            let jobs = parse(text, name, Some(1 << 30));
            assert!(
                jobs.is_ok_and(|j| !j.is_empty()),
                "{name} sweep does not parse"
            );
        }
    }

    /// Every sweep file shipped in harness/sweeps (gpu.toml included), not only the built-in
    /// ones, parses and expands.
    #[test]
    fn every_shipped_sweep_file_parses() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("harness/sweeps") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).expect("readable");
                let name = path.display().to_string();
                let jobs = parse(&text, &name, Some(1 << 30));
                assert!(
                    jobs.as_ref().is_ok_and(|j| !j.is_empty()),
                    "{name}: {:?}",
                    jobs.err().map(|e| format!("{e:#}"))
                );
                seen += 1;
            }
        }
        assert!(seen >= 3, "only {seen} sweep files in {}", dir.display());
    }

    /// gpu.toml's bf16 groups: every hand-written variant of the BC-100 block (autograd has no
    /// bf16) at its three depths, in bf16 and IEEE math only, eager and graph, on the GPU; L=16
    /// right after the shallow f32 blocks (after the f32 BC-100 L=16 rows issue 39 compares it
    /// with, before the mlp), L=32 and 48 after every f32 row.
    #[test]
    fn gpu_sweep_has_its_bf16_rows_after_the_f32_rows_they_are_compared_with() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sweeps/gpu.toml");
        let text = std::fs::read_to_string(&path).expect("harness/sweeps/gpu.toml");
        let jobs = parse(&text, "gpu.toml", Some(1 << 30))
            .map_err(|e| format!("{e:#}"))
            .expect("gpu.toml parses");
        let is_bf16 = |j: &&Job| j.cfg.dtype == candle_core::DType::BF16;
        let bf16: Vec<_> = jobs.iter().filter(is_bf16).collect();
        // 8 hand-written bc variants at L = 16, 32, 48, eager and graph
        assert_eq!(bf16.len(), 8 * 3 * 2);
        assert!(bf16.iter().all(|j| j.settings.math == Math::Ieee
            && j.variant.name() != "autograd"
            && j.cfg.family == impls::Family::Bc
            && j.settings.device != DeviceSpec::Cpu));
        let position = |f: &dyn Fn(&Job) -> bool| jobs.iter().position(f).expect("a row");
        let last = |f: &dyn Fn(&Job) -> bool| jobs.iter().rposition(f).expect("a row");
        let shallow_bf16 = |j: &Job| is_bf16(&j) && j.cfg.depth == 16;
        let f32_l16 =
            |j: &Job| !is_bf16(&j) && j.cfg.family == impls::Family::Bc && j.cfg.depth == 16;
        // L=16 in one run of 16 rows, after the f32 rows of its block, before the first mlp
        let first = position(&shallow_bf16);
        assert_eq!(last(&shallow_bf16), first + 15);
        assert!(last(&f32_l16) < first);
        assert!(first < position(&|j: &Job| j.cfg.family == impls::Family::Mlp));
        // L=32 and 48: the last rows of the sweep
        assert!(jobs[jobs.len() - 32..]
            .iter()
            .all(|j| is_bf16(&j) && j.cfg.depth > 16));
    }

    #[test]
    fn expands_lists_and_all_variants() {
        let text = r#"
            [defaults]
            steps = 2
            [[group]]
            family = "mlp"
            batch = 4
            channels = 3
            growth = 2
            depth = [1, 2]
            activation = [true, false]
        "#;
        let jobs = parse(text, "t.toml", Some(1 << 30)).map_err(|e| e.to_string());
        // mlp with the activation on: autograd + 6 manual variants (no buffer-recompute-*);
        // off: autograd + cat-store-copy, cat-recompute-copy, buffer-store-copy. Two depths.
        assert_eq!(jobs.map(|j| j.len()), Ok(2 * (7 + 4)));
    }

    #[test]
    fn sweep_size_is_counted_before_expansion_without_overflow() {
        // Nine axes of 150 values: 150^9 ≈ 3.8e19 configurations overflow u64; the count must
        // say so instead of wrapping to a small number (which would pass the limit).
        let list = |v: &str| format!("[{}]", vec![v; 150].join(", "));
        let text = format!(
            "[[group]]\nfamily = 'mlp'\nbatch = {b}\nchannels = {b}\ngrowth = {b}\ndepth = {b}\n\
             bn_size = {b}\nsize = {b}\nseed = {b}\nactivation = {a}\ndtype = {d}\n",
            b = list("1"),
            a = list("true"),
            d = list("'f32'")
        );
        let e = err(&text);
        assert!(
            e.contains("more than 10^19 jobs") && e.contains("100000"),
            "{e}"
        );
        // Two groups each under the limit whose sum is over it: the total counts.
        let depths = (1..=60_000).map(|i| i.to_string()).collect::<Vec<_>>();
        let half = |batch: usize| {
            format!(
                "[[group]]\nfamily = 'mlp'\nbatch = {batch}\nchannels = 1\ngrowth = 1\n\
                 depth = [{}]\nvariants = ['cat-store-copy']\n",
                depths.join(",")
            )
        };
        let e = err(&format!("{}{}", half(1), half(2)));
        assert!(e.contains("expands to 120000 jobs"), "{e}");
    }

    #[test]
    fn math_is_a_gpu_f32_setting_and_tf32_keys_say_so() {
        let group = "[[group]]\nfamily = \"mlp\"\nbatch = 2\nchannels = 3\ngrowth = 2\ndepth = 1\nvariants = [\"cat-store-copy\"]\n";
        // Default: ieee, keys as before.
        let jobs = parse(group, "t.toml", Some(1 << 30)).expect("parses");
        assert_eq!(jobs[0].settings.math, Math::Ieee);
        assert!(jobs[0].key.ends_with("/cpu"), "{}", jobs[0].key);
        // tf32 on a GPU, f32: the key ends in /tf32.
        let gpu = format!("{group}device = \"cuda:0\"\nmath = \"tf32\"\n");
        let jobs = parse(&gpu, "t.toml", Some(1 << 30)).expect("parses");
        assert_eq!(jobs[0].settings.math, Math::Tf32);
        assert!(jobs[0].key.ends_with("/cuda:0/tf32"), "{}", jobs[0].key);
        // --math overrides the file.
        let over = Overrides {
            mem_limit: Some(1 << 30),
            peer: None,
            math: Some(Math::Ieee),
            device: None,
        };
        let jobs = parse_with(&gpu, "t.toml", over).expect("parses");
        assert_eq!(jobs[0].settings.math, Math::Ieee);
        // --devices cuda:0 moves a CPU sweep to the GPU before its math is checked: --math
        // tf32 is then a TF32 GPU sweep, not a CPU one refused
        let on_gpu = Overrides {
            math: Some(Math::Tf32),
            device: Some(DeviceSpec::Cuda(0)),
            ..Overrides::default()
        };
        let jobs = parse_with(group, "t.toml", on_gpu).map_err(|e| format!("{e:#}"));
        assert_eq!(
            jobs.map(|j| j[0].key.clone()),
            Ok("cat-store-copy/mlp/2/3/2/1/1/1/on/f32/0/cuda:0/tf32".to_string())
        );
        // Refused: tf32 on the CPU, in f64, and an unknown mode, naming the line.
        let cpu = format!("{group}math = \"tf32\"\n");
        assert!(
            err(&cpu).contains("line 8") && err(&cpu).contains("GPU mode"),
            "{}",
            err(&cpu)
        );
        let f64_gpu = format!("{group}device = \"cuda:0\"\ndtype = \"f64\"\nmath = \"tf32\"\n");
        assert!(err(&f64_gpu).contains("f32 only"), "{}", err(&f64_gpu));
        let bad = format!("{group}math = \"fast\"\n");
        assert!(
            err(&bad).contains("`fast` is not `ieee` or `tf32`"),
            "{}",
            err(&bad)
        );
    }

    #[test]
    fn malformed_files_name_the_problem() {
        assert!(err("[[group]]\nfamily = 'mlp'\nbatch = ").contains("malformed"));
        assert!(err(
            "[[group]]\nfamily = 'mlp'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 1\ncolour = 3"
        )
        .contains("colour"));
        assert!(
            err("[[group]]\nfamily = 'mlp'\nchannels = 1\ngrowth = 1\ndepth = 1")
                .contains("`batch` is missing")
        );
        assert!(
            err("[[group]]\nfamily = 'cnn'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 1")
                .contains("cnn")
        );
        let e = err("[[group]]\nname = 'x'\nfamily = 'mlp'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 1\nvariants = ['cat-store-kopy']");
        assert!(
            e.contains("cat-store-kopy") && e.contains("group 1 (`x`)"),
            "{e}"
        );
        assert!(err("name = 'empty'").contains("no [[group]]"));
        assert!(
            err("[[group]]\nfamily = 'mlp'\nbatch = 1\nchannels = 1\ngrowth = 1\ndepth = 0")
                .contains("depth")
        );
    }

    #[test]
    fn a_group_setting_what_its_family_has_not_is_refused() {
        const MLP: &str = "[[group]]\nfamily = 'mlp'\nbatch = 2\nchannels = 3\ngrowth = 2\n\
                           depth = 1\nvariants = ['cat-store-copy']\n";
        for (extra, says) in [
            (
                "size = [8, 16]",
                "line 8: `size`: `size` applies to bc groups only",
            ),
            ("size = '1x2'", "`size` applies to bc groups only"),
            (
                "bn_size = 4",
                "line 8: `bn_size`: `bn_size` applies to bc groups only",
            ),
        ] {
            let e = err(&format!("{MLP}{extra}\n"));
            assert!(
                e.contains(says) && e.contains("leave it out"),
                "{extra}: {e}"
            );
        }
        let e = err(&format!("{BC}activation = [true, false]\n"));
        assert!(
            e.contains("`activation = false` applies to mlp groups only"),
            "{e}"
        );
        // What the key records anyway is accepted, and `[defaults]` applies to the family that
        // has the field: one mlp configuration, two bc sizes.
        let ok = |text: &str| {
            parse(text, "t.toml", Some(1 << 30))
                .map(|jobs| jobs.into_iter().map(|j| j.key).collect::<Vec<_>>())
                .map_err(|e| format!("{e:#}"))
        };
        assert_eq!(
            ok(&format!("{MLP}size = 1\nbn_size = 1\n")),
            Ok(vec![
                "cat-store-copy/mlp/2/3/2/1/1/1/on/f32/0/cpu".to_string()
            ])
        );
        let keys = ok(&format!(
            "[defaults]\nsize = [4, 5]\nbn_size = 2\nactivation = [true, false]\n{MLP}{BC}"
        ))
        .expect("defaults apply where they can");
        assert_eq!(
            keys.iter().filter(|k| k.contains("/mlp/")).count(),
            2,
            "{keys:?}"
        );
        assert_eq!(
            keys.iter().filter(|k| k.contains("/bc/")).count(),
            2,
            "{keys:?}"
        );
    }

    const BC: &str = "[[group]]\nfamily = 'bc'\nbatch = 2\nchannels = 3\ngrowth = 2\ndepth = 3\n\
                      bn_size = 2\nvariants = ['cat-store-copy']\n";

    #[test]
    fn sizes_are_integers_or_hxw_strings() {
        let keys = |size: &str| {
            parse(&format!("{BC}size = {size}\n"), "t.toml", Some(1 << 30))
                .map(|jobs| jobs.into_iter().map(|j| j.key).collect::<Vec<_>>())
                .map_err(|e| format!("{e:#}"))
        };
        let key = |s: &str| format!("cat-store-copy/bc/2/3/2/3/2/{s}/on/f32/0/cpu");
        assert_eq!(keys("32"), Ok(vec![key("32")]));
        // A string with one side is the same square; `5x5` too (one key per config).
        assert_eq!(keys("'32'"), Ok(vec![key("32")]));
        assert_eq!(keys("['5x5', 5]"), Ok(vec![key("5")]));
        assert_eq!(
            keys("['3x5', '5x3', 4]"),
            Ok(vec![key("3x5"), key("5x3"), key("4")])
        );
        let jobs = parse(&format!("{BC}size = '3x5'\n"), "t.toml", Some(1 << 30));
        let size = jobs.ok().and_then(|j| j.first().map(|j| j.cfg.size));
        assert_eq!(size, Some(Spatial::new(3, 5)), "H first");
    }

    #[test]
    fn bad_sizes_are_one_line_naming_the_key_and_its_line() {
        for (size, says) in [
            ("'5x'", "got the string \"5x\""),
            ("'axb'", "got the string \"axb\""),
            ("'99999999999999999999999x3'", "got the string"),
            ("-3", "got the negative integer -3"),
            ("3.5", "got the number 3.5"),
            ("['3x5', 'x']", "item 2 of the list"),
            // Syntax is right, a side is zero: validation names the side.
            ("'0x5'", "height = 0: must be at least 1"),
            ("'3x0'", "width = 0: must be at least 1"),
        ] {
            let e = err(&format!("{BC}size = {size}\n"));
            assert!(e.contains(says) && !e.contains('\n'), "size = {size}: {e}");
            if !size.contains("x0") && !size.contains("0x") {
                assert!(e.contains("line 9: `size`") && e.contains("HxW"), "{e}");
            }
        }
    }
}
