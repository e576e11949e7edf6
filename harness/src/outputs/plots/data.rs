//! Views of result rows shared by `plots` and `report`: grouping by configuration (densebench's
//! rows apart from the PyTorch peer's), the stable variant order and colours, peer labels and
//! the comparability of two rows, human units, the growth-exponent fit, the Pareto front and
//! the choice of one headline configuration per family.

use crate::plan::target::PeerVariant;
use crate::results::row::Row;
use std::collections::BTreeMap;

/// Bytes per MiB: every memory axis and table is in MiB.
pub const MIB: f64 = 1024.0 * 1024.0;
/// Nanoseconds per millisecond: every time axis and table is in ms.
pub const NS_PER_MS: f64 = 1e6;
/// The variant every ratio is taken against.
pub const NAIVE: &str = "cat-store-copy";
/// The PyTorch peer's variants in legend and table order ([`PeerVariant::ALL`]): its naive
/// block first, then its memory-saving one (`memory_efficient=True` for bc,
/// `torch.utils.checkpoint` for mlp), the bc blocks in `channels_last`; then the same blocks
/// under `torch.compile`.
pub fn peer_order() -> impl Iterator<Item = &'static str> {
    PeerVariant::ALL.into_iter().map(PeerVariant::name)
}

/// A peer variant as readers name it: `pytorch-memory-efficient` → `PyTorch memory-efficient`;
/// a `channels_last` one with ` CL` after it (`pytorch-channels-last-naive` → `PyTorch naive
/// CL`: short enough for a legend row; [`CHANNELS_LAST_NOTE`] says what it means).
pub fn peer_label(variant: &str) -> String {
    match variant.strip_prefix("pytorch-") {
        Some(rest) => match rest.split_once("channels-last-") {
            Some((before, block)) => format!("PyTorch {before}{block} CL"),
            None => format!("PyTorch {rest}"),
        },
        None => variant.to_string(),
    }
}

/// The PyTorch trade-off lines of a figure among peer rows `variants` (in the peer order): for
/// each configuration (eager or compiled, contiguous or `channels_last`) the indices of its
/// rows, its naive block first, in the order the configurations first appear. A name that is
/// no [`PeerVariant`] is a line of its own.
pub fn peer_lines<'a>(variants: impl Iterator<Item = &'a str>) -> Vec<Vec<usize>> {
    // (compiled, channels_last) of the line's rows (None: a line of its own), and the rows
    type Line = (Option<(bool, bool)>, Vec<usize>);
    let mut lines: Vec<Line> = Vec::new();
    for (i, v) in variants.enumerate() {
        let key = PeerVariant::ALL
            .iter()
            .find(|p| p.name() == v)
            .map(|p| (p.is_compiled(), p.is_channels_last()));
        match lines.iter_mut().find(|(k, _)| key.is_some() && *k == key) {
            Some((_, line)) => line.push(i),
            None => lines.push((key, vec![i])),
        }
    }
    lines.into_iter().map(|(_, line)| line).collect()
}

/// What ` CL` in a [`peer_label`] means, for a figure's or table's notes.
pub const CHANNELS_LAST_NOTE: &str = "CL: PyTorch in channels_last memory format";

/// Whether a row's numbers are a result: its gradients were checked and are within tolerance.
/// A row out of tolerance or unchecked is drawn and tabled, marked [`UNTRUSTED`], but never on a
/// Pareto front or picked as the best of anything (README: a faster row with wrong gradients is
/// no improvement).
pub fn trusted(r: &Row) -> bool {
    r.grad_ok == Some(true)
}

/// The mark of a row (or a variant with such a row) that is not [`trusted`]: the peer's mark,
/// one meaning in every figure and table.
pub const UNTRUSTED: &str = "†";

/// `label` with `  †` when any of `rows` is not [`trusted`].
pub fn marked(label: String, rows: &[&Row]) -> String {
    if rows.iter().all(|r| trusted(r)) {
        label
    } else {
        format!("{label}  {UNTRUSTED}")
    }
}

/// The legend notes of a figure whose densebench `rows` include any not [`trusted`].
pub fn untrusted_notes(rows: &[&Row]) -> Vec<String> {
    if rows.iter().all(|r| trusted(r)) {
        Vec::new()
    } else {
        vec![
            format!("{UNTRUSTED}: gradients out of tolerance"),
            "  or unchecked: not a result".to_string(),
        ]
    }
}

/// Why two rows of one configuration (same [`ConfigKey`]) must not be set against each other,
/// or `None` when they may: times and peaks are comparable only on the same device with the same
/// dtype, compute threads and math mode.
pub fn incomparable(a: &Row, b: &Row) -> Option<String> {
    let mut why = Vec::new();
    if a.device != b.device {
        why.push(format!("{} vs {}", a.device, b.device));
    }
    if a.dtype != b.dtype {
        why.push(format!("{} vs {}", a.dtype, b.dtype));
    }
    if a.threads != b.threads {
        why.push(format!("{} vs {} threads", a.threads, b.threads));
    }
    if a.math != b.math {
        why.push(format!("{} vs {} math", a.math, b.math));
    }
    if !executions_comparable(a.execution(), b.execution()) {
        why.push(format!("{} vs {} execution", a.execution(), b.execution()));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// Whether steps run as `a` and as `b` may be set side by side: like with like (eager with
/// eager, CUDA graphs with CUDA graphs), and an eager step with a compiled one (kernels still
/// launched one by one: PyTorch's `torch.compile` default mode, the CPU's strongest PyTorch,
/// beside densebench's eager step, labelled as such). Never a graph replay with a step that
/// launches its kernels from the host.
pub fn executions_comparable(a: &str, b: &str) -> bool {
    a == b || matches!((a, b), ("eager", "compiled") | ("compiled", "eager"))
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB
}

pub fn ms(ns: u64) -> f64 {
    ns as f64 / NS_PER_MS
}

/// Everything that identifies a configuration except the depth and the variant: rows with equal
/// keys belong on one memory-vs-depth line chart.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConfigKey {
    pub family: String,
    pub batch: usize,
    pub channels: usize,
    pub growth: usize,
    pub bn_size: usize,
    pub size: impls::Spatial,
    pub activation: bool,
    pub dtype: String,
    pub seed: u64,
    pub device: String,
    /// The device's model ([`device_model`]: `NVIDIA H200`, `AMD EPYC`): rows of one device
    /// name on two machines (an H100's and an H200's `cuda:0`) are two groups, never one series.
    pub model: String,
    /// `ieee` or `tf32`: rows of the two math modes are never one series (a tf32 time is not an
    /// ieee one), so they are separate groups, figures and tables.
    pub math: String,
    /// [`execution_class`]: `eager` (the host launches the step's kernels: eager rows, and
    /// PyTorch's compiled-without-graphs rows beside them) or `graph` (CUDA-graph replays:
    /// densebench's graph rows with PyTorch's `reduce-overhead` rows). A graph time is never on
    /// an eager series.
    pub execution: String,
}

/// The class of a row's `execution` that figures and tables group by: `graph` for a CUDA-graph
/// replay, `eager` otherwise (`compiled` included: its kernels are launched by the host, as
/// an eager step's are; [`executions_comparable`]).
pub fn execution_class(r: &Row) -> &'static str {
    if r.execution() == "graph" {
        "graph"
    } else {
        "eager"
    }
}

impl ConfigKey {
    pub fn of(row: &Row) -> Self {
        Self {
            family: row.family.clone(),
            batch: row.batch,
            channels: row.channels,
            growth: row.growth,
            bn_size: row.bn_size,
            size: row.size,
            activation: row.activation,
            dtype: row.dtype.clone(),
            seed: row.seed,
            device: row.device.clone(),
            model: device_model(&row.device_desc).to_string(),
            math: if row.math.is_empty() {
                "ieee".to_string()
            } else {
                row.math.clone()
            },
            execution: execution_class(row).to_string(),
        }
    }

    /// A file-name fragment, e.g. `bc-N64-C24-k12-bn4-32` or `mlp-N4096-C256-k64-relu`; the
    /// dtype and device are appended only when they are not the defaults (`f32`, `cpu`).
    pub fn slug(&self) -> String {
        let mut s = if self.family == "bc" {
            format!(
                "bc-N{}-C{}-k{}-bn{}-{}",
                self.batch, self.channels, self.growth, self.bn_size, self.size
            )
        } else {
            format!(
                "{}-N{}-C{}-k{}-{}",
                sanitize(&self.family),
                self.batch,
                self.channels,
                self.growth,
                if self.activation { "relu" } else { "linear" }
            )
        };
        push_slug_suffixes(&mut s, &self.dtype, Some(&self.device), &self.math);
        if self.execution == "graph" {
            s.push_str("-graph");
        }
        s
    }
}

/// The dtype drawn beside f32 on one memory-vs-depth figure: mixed precision (autocast
/// semantics: bf16 features, f32 parameters and statistics) is the f32 block's memory-saving
/// twin, so its peaks belong beside f32's. f64 is never drawn with either.
pub const BESIDE_F32: &str = "bf16";

/// The dtype whose memory-vs-depth figure rows of `dtype` are drawn on: [`BESIDE_F32`] on f32's,
/// every other dtype on its own.
pub fn memory_figure_dtype(dtype: &str) -> &str {
    if dtype == BESIDE_F32 {
        "f32"
    } else {
        dtype
    }
}

impl ConfigKey {
    /// The key of the memory-vs-depth figure this configuration is drawn on: the key with its
    /// dtype as [`memory_figure_dtype`] gives it (a bf16 configuration's is its f32 twin's).
    pub fn memory_figure_key(&self) -> ConfigKey {
        ConfigKey {
            dtype: memory_figure_dtype(&self.dtype).to_string(),
            ..self.clone()
        }
    }
}

/// The indices of the groups drawn on one memory-vs-depth figure with group `gi`, f32's first,
/// when `gi` is the first of them (its figure is planned once, at its first group); else `None`.
/// A group alone on its figure (f64, or f32 or bf16 without the other) is a set of one.
pub fn memory_figure_set(groups: &[Group], gi: usize) -> Option<Vec<usize>> {
    let key = groups[gi].key.memory_figure_key();
    let mut set: Vec<usize> = (0..groups.len())
        .filter(|&j| groups[j].key.memory_figure_key() == key)
        .collect();
    // the figure's own dtype first (f32), then the one beside it (bf16)
    set.sort_by_key(|&j| (groups[j].key.dtype != key.dtype, j));
    (set.first() == Some(&gi)).then_some(set)
}

/// A group's label with its dtype named as those of a figure drawing several: `bc N=16 …
/// 8x8 f32` → `bc N=16 … 8x8 f32 and bf16` (the dtype is the config label's last word; what
/// follows it, the math, the device, stays).
pub fn label_with_dtypes(label: &str, dtype: &str, dtypes: &[&str]) -> String {
    let shown = and_list(&dtypes.iter().map(|d| d.to_string()).collect::<Vec<_>>());
    let word = format!(" {dtype}");
    let at = label
        .match_indices(&word)
        .map(|(i, _)| i)
        .find(|&i| label[i + word.len()..].is_empty() || label[i + word.len()..].starts_with(' '));
    match at {
        Some(i) => format!("{} {shown}{}", &label[..i], &label[i + word.len()..]),
        None => format!("{label} ({shown})"),
    }
}

/// The suffixes of a figure's file name, in this order, each only when not the default: the
/// dtype (not `f32`), the device (not `cpu`; `None` for figures over every device) and the math
/// (not `ieee`). One rule for [`ConfigKey::slug`] and the family figures' slug.
pub fn push_slug_suffixes(s: &mut String, dtype: &str, device: Option<&str>, math: &str) {
    for (part, default) in [(Some(dtype), "f32"), (device, "cpu"), (Some(math), "ieee")] {
        if let Some(p) = part.filter(|p| *p != default) {
            s.push('-');
            s.push_str(&sanitize(p));
        }
    }
}

/// Keeps `[A-Za-z0-9_-]`, drops everything else (`cuda:0` → `cuda0`).
pub fn sanitize(s: &str) -> String {
    s.chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .collect()
}

/// One configuration with all its rows (every depth, every variant).
#[derive(Debug, Clone)]
pub struct Group {
    pub key: ConfigKey,
    /// A unique file-name fragment (the slug, plus the device's model when two machines' groups
    /// share a slug, then `-s{seed}` when two groups still share it).
    pub slug: String,
    /// `bc N=64 C0=24 k=12 bn=4 32x32 f32`.
    pub label: String,
    /// `cpu: AMD EPYC …, 2 threads`.
    pub device_label: String,
    /// densebench's rows with status `ok`, one per (depth, variant): the last one in file
    /// order wins. Never a peer row: every densebench table and figure is drawn from these.
    pub ok: Vec<Row>,
    /// The PyTorch peer's rows with status `ok` ([`Row::is_peer`]), one per (depth, variant)
    /// likewise; drawn and tabulated as PyTorch, never as a densebench variant.
    pub peers: Vec<Row>,
    /// Every row whose status is not `ok`, densebench's and the peer's.
    pub skipped: Vec<Row>,
}

impl Group {
    /// Depths with at least one ok row, ascending.
    pub fn depths(&self) -> Vec<usize> {
        self.depths_with(&[])
    }

    /// [`Group::depths`] and the depths of the `peers` drawn beside them, sorted, each once.
    pub fn depths_with(&self, peers: &[&Row]) -> Vec<usize> {
        let mut d: Vec<usize> = self
            .ok
            .iter()
            .chain(peers.iter().copied())
            .map(|r| r.depth)
            .collect();
        d.sort_unstable();
        d.dedup();
        d
    }

    /// The ok rows of one variant, by ascending depth.
    pub fn variant_rows(&self, variant: &str) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self.ok.iter().filter(|r| r.variant == variant).collect();
        rows.sort_by_key(|r| r.depth);
        rows
    }

    /// The ok rows at one depth, in variant order.
    pub fn at_depth(&self, depth: usize) -> Vec<&Row> {
        let order = variant_order(self.ok.iter().map(|r| r.variant.as_str()));
        let mut rows: Vec<&Row> = self.ok.iter().filter(|r| r.depth == depth).collect();
        rows.sort_by_key(|r| order.iter().position(|v| *v == r.variant));
        rows
    }

    /// The variants with ok rows, in the stable order.
    pub fn variants(&self) -> Vec<String> {
        variant_order(self.ok.iter().map(|r| r.variant.as_str()))
    }

    pub fn row(&self, variant: &str, depth: usize) -> Option<&Row> {
        self.ok
            .iter()
            .find(|r| r.variant == variant && r.depth == depth)
    }

    /// `variant L=depth (status: error)` for each skipped row.
    pub fn skipped_notes(&self) -> Vec<String> {
        self.skipped.iter().map(skipped_note).collect()
    }

    /// The peer variants with ok rows, in [`peer_order`].
    pub fn peer_variants(&self) -> Vec<String> {
        variant_order(self.peers.iter().map(|r| r.variant.as_str()))
    }

    /// The ok peer rows a figure of this group may draw beside densebench's rows: those measured
    /// with the threads and math of some densebench row of the group (a time at 1 thread beside
    /// one at 2 would mislead). The rest are returned as footer notes saying why they are left
    /// out, each with its row.
    pub fn drawable_peers(&self) -> (Vec<&Row>, Vec<(&Row, String)>) {
        let mut drawn = Vec::new();
        let mut notes = Vec::new();
        for p in &self.peers {
            if self.ok.iter().any(|r| incomparable(r, p).is_none()) {
                drawn.push(p);
            } else {
                let why = self
                    .ok
                    .first()
                    .and_then(|r| incomparable(p, r))
                    .unwrap_or_else(|| "no densebench row".to_string());
                let note = format!(
                    "{} L={} not drawn: PyTorch vs densebench {why}",
                    peer_label(&p.variant),
                    p.depth
                );
                notes.push((p, note));
            }
        }
        (drawn, notes)
    }
}

/// `cat-store-copy bc N=64 … L=48: oom (error text)`.
pub fn skipped_note(r: &Row) -> String {
    skipped_note_as(r, &r.variant)
}

/// [`skipped_note`] with the row's dtype after its variant (`cat-store-copy bf16 L=48: oom`):
/// a figure that draws two dtypes says which row failed.
pub fn skipped_note_dtyped(r: &Row) -> String {
    skipped_note_as(r, &format!("{} {}", r.variant, r.dtype))
}

fn skipped_note_as(r: &Row, name: &str) -> String {
    let mut s = format!("{name} L={}: {}", r.depth, r.status);
    if !r.error.is_empty() {
        s.push_str(&format!(" ({})", r.error.trim()));
    }
    s
}

/// Groups rows by configuration, sorted by key. Rows with a duplicate (config, depth, variant)
/// replace the earlier one; the number replaced is returned for a warning.
pub fn group_rows(rows: &[Row]) -> (Vec<Group>, usize) {
    // Per configuration: densebench's ok rows, the peer's ok rows, every row not ok.
    type Rows = (Vec<Row>, Vec<Row>, Vec<Row>);
    let mut map: BTreeMap<ConfigKey, Rows> = BTreeMap::new();
    let mut replaced = 0;
    for r in rows {
        let entry = map.entry(ConfigKey::of(r)).or_default();
        if r.is_ok() {
            let list = if r.is_peer() {
                &mut entry.1
            } else {
                &mut entry.0
            };
            if let Some(pos) = list
                .iter()
                .position(|o| o.variant == r.variant && o.depth == r.depth)
            {
                list.remove(pos);
                replaced += 1;
            }
            list.push(r.clone());
        } else {
            entry.2.push(r.clone());
        }
    }
    let mut groups: Vec<Group> = map
        .into_iter()
        .map(|(key, (ok, peers, skipped))| {
            let first = ok.first().or(skipped.first()).or(peers.first());
            let mut label = first.map(Row::config_label).unwrap_or_default();
            if key.math != "ieee" {
                label.push(' ');
                label.push_str(&key.math);
            }
            if key.execution == "graph" {
                label.push_str(" (CUDA graph replays)");
            }
            let mut device_label = first.map(device_label).unwrap_or_default();
            // densebench rows at several thread counts: their times are not one series; say so
            // wherever the group's device is shown (subtitles, the report)
            let mut threads: Vec<usize> = ok.iter().map(|r| r.threads).collect();
            threads.sort_unstable();
            threads.dedup();
            if threads.len() > 1 {
                let list: Vec<String> = threads.iter().map(ToString::to_string).collect();
                // the device without the first row's "(1 threads)": the rows are at several
                device_label = format!(
                    "{} — rows at {} threads: times are not comparable across them",
                    first
                        .map(|r| device_name(&r.device, bare_desc(&r.device_desc)))
                        .unwrap_or_default(),
                    and_list(&list)
                );
            }
            Group {
                slug: key.slug(),
                key,
                label,
                device_label,
                ok,
                peers,
                skipped,
            }
        })
        .collect();
    // Make slugs unique: configs of one device name on two machines get the model
    // (`-nvidia-h100-80gb-hbm3`), then configs that differ only in seed get `-s{seed}`.
    let shared = |groups: &[Group]| {
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for g in groups {
            *counts.entry(g.slug.clone()).or_default() += 1;
        }
        counts
    };
    let counts = shared(&groups);
    let models: std::collections::BTreeSet<&str> =
        groups.iter().map(|g| g.key.model.as_str()).collect();
    if models.len() > 1 {
        for g in &mut groups {
            if counts.get(&g.slug).copied().unwrap_or(0) > 1 && !g.key.model.is_empty() {
                g.slug = format!(
                    "{}-{}",
                    g.slug,
                    sanitize(&g.key.model.replace(' ', "-")).to_lowercase()
                );
            }
        }
    }
    let counts = shared(&groups);
    for g in &mut groups {
        if counts.get(&g.slug).copied().unwrap_or(0) > 1 {
            g.slug = format!("{}-s{}", g.slug, g.key.seed);
        }
    }
    // Rows of several devices (a CPU and a GPU reference read together, or two GPUs): each
    // label names its device, so that two groups of one configuration never share a heading
    // or a figure title.
    let devices: std::collections::BTreeSet<(&str, &str)> = groups
        .iter()
        .map(|g| (g.key.device.as_str(), g.key.model.as_str()))
        .collect();
    if devices.len() > 1 {
        for g in &mut groups {
            g.label = if g.key.model.is_empty() {
                format!("{} on {}", g.label, g.key.device)
            } else {
                format!("{} on {} ({})", g.label, g.key.device, g.key.model)
            };
        }
    }
    (groups, replaced)
}

/// The model a device description names, without what follows it in parentheses (thread
/// count, memory, driver, the framework that ran it): `NVIDIA H200 (sm_90, …)` → `NVIDIA H200`,
/// `AMD EPYC (2 threads)` → `AMD EPYC`. densebench's and PyTorch's rows of one GPU agree.
pub fn device_model(desc: &str) -> &str {
    let desc = desc.trim();
    desc.split_once(" (").map_or(desc, |(m, _)| m).trim_end()
}

/// A device description without the thread count a CPU's carries: `AMD EPYC (2 threads)` →
/// `AMD EPYC` (other descriptions unchanged).
pub fn bare_desc(desc: &str) -> &str {
    let desc = desc.trim();
    if let Some(head) = desc.strip_suffix(" threads)") {
        if let Some((name, n)) = head.rsplit_once(" (") {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                return name.trim_end();
            }
        }
    }
    desc
}

/// `1`, `1 and 2`, `1, 2 and 4`.
pub fn and_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// A row for a listing outside any figure: its configuration, device (and math when not
/// ieee), variant, depth and status, e.g. `mlp N=8 C0=4 k=2 relu=on f32 on cuda:0:
/// cat-store-copy L=2: error (…)`; the device always, since rows of one label on two devices are
/// two configurations.
pub fn row_listing(r: &Row) -> String {
    let math = if r.math.is_empty() || r.math == "ieee" {
        String::new()
    } else {
        format!(" {}", r.math)
    };
    format!(
        "{}{math} on {}: {}",
        r.config_label(),
        r.device,
        skipped_note(r)
    )
}

/// `cpu: AMD EPYC 7B13` (a device and its description).
fn device_name(device: &str, desc: &str) -> String {
    let mut s = device.to_string();
    if !desc.trim().is_empty() {
        s.push_str(": ");
        s.push_str(desc.trim());
    }
    s
}

/// `cpu: AMD EPYC 7B13, 2 threads`.
pub fn device_label(r: &Row) -> String {
    let mut s = device_name(&r.device, &r.device_desc);
    // Some descriptions already say "(2 threads)": do not repeat it.
    if r.threads > 0 && !r.device_desc.contains("thread") {
        s.push_str(&format!(
            ", {} thread{}",
            r.threads,
            if r.threads == 1 { "" } else { "s" }
        ));
    }
    s
}

/// The stable variant order (that of `impls::Variant::all()`, i.e. legends and tables), then
/// the peer's in [`peer_order`], then any unknown names alphabetically. Deduplicated.
pub fn variant_order<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let known: Vec<String> = impls::Variant::all()
        .iter()
        .map(|v| v.name())
        .chain(peer_order().map(str::to_string))
        .collect();
    let mut present: Vec<String> = names.into_iter().map(str::to_string).collect();
    present.sort_by(|a, b| {
        let ia = known.iter().position(|k| k == a).unwrap_or(usize::MAX);
        let ib = known.iter().position(|k| k == b).unwrap_or(usize::MAX);
        ia.cmp(&ib).then_with(|| a.cmp(b))
    });
    present.dedup();
    present
}

/// True when the variant's memory grows linearly in depth for this family (by its axes, see
/// `impls::Variant::is_linear_memory`); unknown names are treated as not linear.
pub fn is_linear_memory(variant: &str, family: &str) -> bool {
    match (impls::Variant::parse(variant), impls::Family::parse(family)) {
        (Ok(v), Ok(f)) => v.is_linear_memory(f),
        _ => false,
    }
}

/// A colour per variant, the same in every figure: reds for `cat-store`, purples for
/// `cat-recompute`, blues for `buffer-store`, greens for `buffer-recompute`, grey for `autograd`;
/// the PyTorch peer near-black (naive) and brown (its memory-saving block), dark teal and dark
/// orange in `channels_last`, lighter under `torch.compile`; no densebench
/// variant's colour.
pub fn variant_rgb(variant: &str) -> (u8, u8, u8) {
    match variant {
        "pytorch-naive" => (20, 20, 20),
        "pytorch-memory-efficient" | "pytorch-checkpoint" => (140, 86, 75),
        "pytorch-compiled-naive" => (90, 90, 130),
        "pytorch-compiled-memory-efficient" | "pytorch-compiled-checkpoint" => (196, 156, 148),
        "pytorch-channels-last-naive" => (0, 90, 90),
        // a hue of its own: the brown of `memory_efficient` beside it read as the same series
        "pytorch-channels-last-memory-efficient" => (150, 30, 90),
        "pytorch-compiled-channels-last-naive" => (90, 150, 150),
        "pytorch-compiled-channels-last-memory-efficient" => (205, 150, 90),
        "autograd" => (100, 100, 100),
        "cat-store-copy" => (214, 39, 40),
        "cat-store-inplace" => (255, 127, 14),
        "cat-recompute-copy" => (148, 103, 189),
        "cat-recompute-inplace" => (227, 119, 194),
        "buffer-store-copy" => (31, 119, 180),
        "buffer-store-inplace" => (23, 190, 207),
        "buffer-recompute-copy" => (44, 160, 44),
        "buffer-recompute-inplace" => (150, 150, 20),
        _ => {
            // Unknown variants: a colour from a hash of the name, stable across runs.
            let h = variant
                .bytes()
                .fold(17u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
            (
                (h & 0x7f) as u8 + 40,
                ((h >> 8) & 0x7f) as u8 + 40,
                ((h >> 16) & 0x7f) as u8 + 40,
            )
        }
    }
}

/// The growth exponent p of `peak ≈ c·L^p`: least-squares slope of ln(peak) on ln(L). `None`
/// with fewer than two distinct depths or any non-positive value.
pub fn growth_exponent(points: &[(f64, f64)]) -> Option<f64> {
    if points.iter().any(|&(x, y)| x <= 0.0 || y <= 0.0) {
        return None;
    }
    let logs: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x.ln(), y.ln())).collect();
    let n = logs.len() as f64;
    if logs.len() < 2 {
        return None;
    }
    let mx = logs.iter().map(|p| p.0).sum::<f64>() / n;
    let my = logs.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx) * (p.0 - mx)).sum();
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    // Relative tolerance: all depths equal means no slope to fit.
    if sxx <= f64::EPSILON * n {
        return None;
    }
    Some(sxy / sxx)
}

/// The growth exponent of one variant's peak memory over the depths of a group.
pub fn variant_exponent(group: &Group, variant: &str) -> Option<f64> {
    let pts: Vec<(f64, f64)> = group
        .variant_rows(variant)
        .iter()
        .filter_map(|r| r.peak_bytes.map(|p| (r.depth as f64, p as f64)))
        .collect();
    growth_exponent(&pts)
}

/// Indices of the points on the Pareto front when both coordinates are to be minimised,
/// sorted by the first coordinate. A point is on the front when no other point is at least as
/// good in both and better in one.
pub fn pareto_front(points: &[(f64, f64)]) -> Vec<usize> {
    let mut front: Vec<usize> = (0..points.len())
        .filter(|&i| {
            let (a, b) = points[i];
            !points
                .iter()
                .any(|&(x, y)| x <= a && y <= b && (x < a || y < b))
        })
        .collect();
    front.sort_by(|&i, &j| {
        points[i]
            .0
            .total_cmp(&points[j].0)
            .then(points[i].1.total_cmp(&points[j].1))
    });
    front
}

/// The published shape of DenseNet-BC-100's dense block and the forum's mlp, which the
/// headline figures and the published comparison prefer when the CSV has them.
fn is_canonical(key: &ConfigKey, depth: usize) -> bool {
    match key.family.as_str() {
        "bc" => {
            key.batch == 64
                && key.channels == 24
                && key.growth == 12
                && key.bn_size == 4
                && key.size == impls::Spatial::square(32)
                && depth == 16
        }
        "mlp" => key.batch == 4096 && key.channels == 256 && key.growth == 64 && depth == 32,
        _ => false,
    }
}

/// The one configuration (group and depth) per family shown in the memory/time and timeline
/// figures and the published comparison: the canonical shape when present (DenseNet-BC-100's
/// block, L=16; the forum's mlp, L=32), else the (group, depth) with the most variants that have
/// both peak and time, the deepest on a tie. One per family and device (a CPU and a GPU reference
/// drawn together each keep theirs), in sorted order.
pub fn headline(groups: &[Group]) -> Vec<(usize, usize)> {
    // Per family and device: (canonical, variants with peak and time, depth) and the (group,
    // depth) it won.
    type Score = (bool, usize, usize);
    let mut best: BTreeMap<(String, String, String), (Score, usize, usize)> = BTreeMap::new();
    for (gi, g) in groups.iter().enumerate() {
        for d in g.depths() {
            let complete = g
                .at_depth(d)
                .iter()
                .filter(|r| r.peak_bytes.is_some() && r.median_ns.is_some())
                .count();
            if complete == 0 {
                continue;
            }
            let score = (is_canonical(&g.key, d), complete, d);
            let e = best
                .entry((
                    g.key.family.clone(),
                    g.key.device.clone(),
                    g.key.model.clone(),
                ))
                .or_insert((score, gi, d));
            if score > e.0 {
                *e = (score, gi, d);
            }
        }
    }
    best.into_values().map(|(_, gi, d)| (gi, d)).collect()
}

/// `12.3` with a precision that suits the magnitude (3 significant digits at least).
pub fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".to_string()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.2e}")
    }
}

/// `1.2e-7`, for errors.
pub fn fmt_err(v: f64) -> String {
    if v == 0.0 {
        "0".to_string()
    } else {
        format!("{v:.1e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_labels_are_short_and_distinct() {
        let labels: Vec<String> = peer_order().map(peer_label).collect();
        assert_eq!(labels[0], "PyTorch naive");
        assert!(labels.contains(&"PyTorch memory-efficient CL".to_string()));
        assert!(labels.contains(&"PyTorch compiled-naive CL".to_string()));
        let distinct: std::collections::BTreeSet<&String> = labels.iter().collect();
        assert_eq!(distinct.len(), labels.len(), "{labels:?}");
        // a legend row holds about 46 characters at its full size (longer ones are drawn
        // smaller): the label, ` bf16`, `  p = 1.66`
        for l in labels.iter().filter(|l| !l.contains("compiled")) {
            assert!(l.len() + " bf16  p = 1.66".len() <= 46, "{l}");
        }
        assert_eq!(peer_label("cat-store-copy"), "cat-store-copy");
    }

    /// One dashed line per PyTorch configuration: the channels_last and compiled twins are
    /// never joined to the contiguous eager block (the figure drew one zigzag through all four).
    #[test]
    fn peer_lines_join_only_one_configuration() {
        let v = [
            "pytorch-naive",
            "pytorch-memory-efficient",
            "pytorch-channels-last-naive",
            "pytorch-channels-last-memory-efficient",
            "pytorch-compiled-naive",
            "pytorch-something-new",
            "pytorch-compiled-memory-efficient",
            "pytorch-other-new",
        ];
        assert_eq!(
            peer_lines(v.into_iter()),
            vec![vec![0, 1], vec![2, 3], vec![4, 6], vec![5], vec![7]]
        );
        assert!(peer_lines(std::iter::empty()).is_empty());
    }

    #[test]
    fn exponent_of_exact_powers() {
        // y = 3·x² exactly: the log-log slope is 2 up to rounding.
        let pts: Vec<(f64, f64)> = [8.0, 16.0, 32.0]
            .iter()
            .map(|&x| (x, 3.0 * x * x))
            .collect();
        let p = growth_exponent(&pts).unwrap_or(f64::NAN);
        assert!((p - 2.0).abs() < 1e-12, "p = {p}");
        assert_eq!(growth_exponent(&pts[..1]), None, "one depth has no slope");
    }

    #[test]
    fn pareto_drops_dominated_points() {
        // (2,2) is dominated by (1,1); (1,3) is dominated by (1,1) (equal time, more memory).
        let pts = [(1.0, 1.0), (2.0, 2.0), (0.5, 4.0), (1.0, 3.0), (3.0, 0.5)];
        assert_eq!(pareto_front(&pts), vec![2, 0, 4]);
    }

    #[test]
    fn order_is_stable_and_unknown_last() {
        let o = variant_order(["zeta", "buffer-store-copy", "autograd", "cat-store-copy"]);
        assert_eq!(
            o,
            vec!["autograd", "cat-store-copy", "buffer-store-copy", "zeta"]
        );
        // Peers after densebench's variants, naive before the memory-saving one.
        let o = variant_order([
            "pytorch-memory-efficient",
            "zeta",
            "pytorch-naive",
            "autograd",
        ]);
        assert_eq!(
            o,
            vec![
                "autograd",
                "pytorch-naive",
                "pytorch-memory-efficient",
                "zeta"
            ]
        );
    }

    fn row(variant: &str, framework: &str, status: &str) -> Row {
        Row {
            variant: variant.to_string(),
            framework: framework.to_string(),
            status: status.to_string(),
            family: "bc".to_string(),
            depth: 16,
            threads: 1,
            math: "ieee".to_string(),
            device: "cpu".to_string(),
            dtype: "f32".to_string(),
            ..Row::default()
        }
    }

    #[test]
    fn peers_are_grouped_apart_from_densebench_rows() {
        let rows = [
            row(NAIVE, "densebench", "ok"),
            row("pytorch-naive", "pytorch", "ok"),
            row("pytorch-naive", "pytorch", "oom"),
        ];
        let (groups, _) = group_rows(&rows);
        assert_eq!(groups.len(), 1, "one configuration");
        let g = &groups[0];
        // The peer must never count as a densebench variant (tables, exponents, the front).
        assert_eq!(g.variants(), vec![NAIVE]);
        assert_eq!(g.peer_variants(), vec!["pytorch-naive"]);
        assert_eq!(
            g.skipped.len(),
            1,
            "the oom peer row is listed, not dropped"
        );
        assert_eq!(g.drawable_peers().0.len(), 1);
    }

    /// Only a trailing `(N threads)` goes; the label of a group at several thread counts names
    /// none of them as the device's.
    #[test]
    fn bare_desc_drops_only_a_thread_count() {
        assert_eq!(bare_desc("AMD EPYC (2 threads)"), "AMD EPYC");
        assert_eq!(bare_desc("NVIDIA H100 (80 GiB)"), "NVIDIA H100 (80 GiB)");
        assert_eq!(bare_desc("cpu (x threads)"), "cpu (x threads)");
        assert_eq!(
            and_list(&["1".into(), "2".into(), "4".into()]),
            "1, 2 and 4"
        );
        let mut one = row(NAIVE, "densebench", "ok");
        one.device_desc = "AMD EPYC (1 threads)".to_string();
        let mut two = one.clone();
        two.threads = 2;
        two.depth = 32;
        let (groups, _) = group_rows(&[one, two]);
        assert_eq!(
            groups[0].device_label,
            "cpu: AMD EPYC — rows at 1 and 2 threads: times are not comparable across them"
        );
    }

    #[test]
    fn peers_at_other_threads_are_not_drawn() {
        let mut peer = row("pytorch-naive", "pytorch", "ok");
        peer.threads = 2;
        let rows = [row(NAIVE, "densebench", "ok"), peer];
        let (groups, _) = group_rows(&rows);
        let (drawn, notes) = groups[0].drawable_peers();
        assert!(drawn.is_empty());
        let notes: Vec<&str> = notes.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(
            notes,
            vec!["PyTorch naive L=16 not drawn: PyTorch vs densebench 2 vs 1 threads"]
        );
    }
}
