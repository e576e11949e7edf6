//! Every figure of a result set, as SVG and PNG, rendered in parallel; one file per figure
//! beside this one, their shared frame, legend and styling in `style.rs`.
//!
//! Figures (file stems are deterministic, built from the configuration):
//! 1. `memory-vs-depth-<config>`: peak memory against depth, one line per variant, with the
//!    fitted growth exponent (Pleiss et al.'s quadratic-vs-linear figure); a configuration's
//!    bf16 rows are drawn on its f32 figure (same stem, the bf16 lines in short dashes with
//!    hollow markers, each legend entry naming its dtype), a bf16 configuration without f32
//!    rows on its own `…-bf16` figure, f64 always on its own (`data::memory_figure_set`);
//! 2. `time-vs-depth-<config>`: median step time against depth with min–max whiskers;
//! 3. `memory-vs-time-<config>-L<depth>`: each variant a point, the Pareto front marked, at
//!    every depth of one headline configuration per family and device;
//! 4. `timeline-<config>-L<depth>`: live bytes through forward and backward, layer by layer
//!    (the PyTorch peer's comparable rows beside them, forward only);
//! 5. `measured-vs-predicted-<family>`: measured against predicted peak (when predicted);
//! 6. `grad-error-<family>`: the worst relative gradient error of each row, log scale.
//!
//! Every figure but the first is drawn per dtype. Figures 5 and 6 are drawn per family, dtype
//! and math mode, never mixing them (an f64 error and an f32 one have tolerances eight decades
//! apart): their stems take the per-configuration figures' suffixes, `-f64` for f64 and `-tf32`
//! for tf32 (`grad-error-mlp-f64`).
//!
//! PNG text is drawn with DejaVu Sans, embedded from `harness/assets/` (licence beside it), so
//! rendering needs no system fonts. Rows whose status is not `ok` are left out and listed: in
//! the footers of their configuration's figures, and by `plots` ([`footer_listed`] says which
//! of them some footer shows).

pub mod data;
mod grad_error;
mod measured_vs_predicted;
mod memory_vs_depth;
mod memory_vs_time;
mod style;
mod time_vs_depth;
mod timeline;

use crate::measure::reference::content_hash;
use crate::plan::input;
use crate::results::row::Row;
use crate::results::store::write_atomic;
use anyhow::{bail, Context, Result};
use data::Group;
use plotters::coord::Shift;
use plotters::prelude::*;
use rayon::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// DejaVu Sans (Bitstream Vera licence, `harness/assets/LICENSE-DejaVu.txt`).
static FONT_TTF: &[u8] = include_bytes!("../../../assets/DejaVuSans.ttf");

/// What a figure shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    MemoryVsDepth,
    TimeVsDepth,
    MemoryVsTime,
    Timeline,
    MeasuredVsPredicted,
    GradError,
}

/// The rows a figure is drawn from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// All depths of one configuration (an index into the groups).
    Group(usize),
    /// All depths of the configurations drawn on one memory-vs-depth figure: one, or an f32
    /// one and its bf16 twin, f32's first ([`data::memory_figure_set`]).
    Groups(Vec<usize>),
    /// One depth of one configuration.
    GroupDepth(usize, usize),
    /// Every ok row of one family in one dtype and math mode.
    Family(FamilyKey),
}

/// What a family-level figure (measured vs predicted, gradient errors) is drawn from: one
/// family in one dtype and one math mode, so that f32 and f64 rows are never one series.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FamilyKey {
    pub family: String,
    pub dtype: String,
    pub math: String,
    /// `eager` or `graph` ([`data::execution_class`]).
    pub execution: String,
}

impl FamilyKey {
    pub fn of(key: &data::ConfigKey) -> Self {
        Self {
            family: key.family.clone(),
            dtype: key.dtype.clone(),
            math: key.math.clone(),
            execution: key.execution.clone(),
        }
    }

    /// `mlp`, `mlp-f64`, `bc-tf32`: the suffixes of [`data::ConfigKey::slug`] (the dtype when
    /// not f32, the math when not ieee).
    pub fn slug(&self) -> String {
        let mut s = data::sanitize(&self.family);
        data::push_slug_suffixes(&mut s, &self.dtype, None, &self.math);
        if self.execution == "graph" {
            s.push_str("-graph");
        }
        s
    }

    /// `mlp f64`, `bc f32 tf32`: always naming the dtype.
    pub fn label(&self) -> String {
        let mut s = format!("{} {}", self.family, self.dtype);
        if self.math != "ieee" {
            s.push(' ');
            s.push_str(&self.math);
        }
        if self.execution == "graph" {
            s.push_str(" graph");
        }
        s
    }
}

/// One planned figure: written as `<stem>.svg` and `<stem>.png`.
#[derive(Debug, Clone)]
pub struct Figure {
    pub kind: Kind,
    pub stem: String,
    /// A one-line description (for stdout and the report).
    pub title: String,
    pub target: Target,
    /// One of the few figures a reader should see first (embedded in the report): memory vs
    /// depth, memory vs time at the headline depth, gradient errors.
    pub key: bool,
}

/// The file `plots` writes beside the figures, naming the CSV they were drawn from and a hash
/// of its bytes, so that `report` never embeds figures of another CSV as this one's.
pub const SOURCE_FILE: &str = "figures-source.txt";
const SOURCE_LINE: &str = "drawn from: ";
const HASH_LINE: &str = "content hash (FNV-1a 64): ";

/// The text of [`SOURCE_FILE`] for figures drawn from `csvs` (their bytes, one after the
/// other, `bytes`: [`csv_bytes`]).
pub fn source_text(csvs: &[PathBuf], bytes: &[u8]) -> String {
    format!(
        "{SOURCE_LINE}{}\n{HASH_LINE}{}\n",
        shown(csvs),
        content_hash(bytes)
    )
}

/// The result CSVs a figure set or a report is drawn from, as a command line names them.
pub fn shown(csvs: &[PathBuf]) -> String {
    csvs.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The bytes of `csvs`, one file after the other: what [`SOURCE_FILE`]'s hash is of (for one
/// CSV, its bytes).
pub fn csv_bytes(csvs: &[PathBuf]) -> Result<Vec<u8>> {
    let mut all = Vec::new();
    for p in csvs {
        let (limit, from) = input::csv_limit()?;
        all.extend(input::read_bounded(p, "result CSV", limit, &from)?);
    }
    Ok(all)
}

/// Whether a [`SOURCE_FILE`]'s `text` records the CSV whose bytes are `bytes`; else the CSV it
/// names (or `another CSV`).
pub fn drawn_from(text: &str, bytes: &[u8]) -> std::result::Result<(), String> {
    let field = |prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .map(str::trim)
    };
    if field(HASH_LINE) == Some(content_hash(bytes).as_str()) {
        return Ok(());
    }
    Err(field(SOURCE_LINE).unwrap_or("another CSV").to_string())
}

/// The figures a set of groups yields, in a stable order: per configuration memory and time
/// against depth (when it has two depths or more), then per family the memory/time and
/// timeline figures at the headline configuration, measured vs predicted and gradient errors.
pub fn plan(groups: &[Group]) -> Vec<Figure> {
    let mut figs = Vec::new();
    for (gi, g) in groups.iter().enumerate() {
        if let Some(set) = data::memory_figure_set(groups, gi) {
            let members: Vec<&Group> = set.iter().map(|&j| &groups[j]).collect();
            let mut depths: Vec<usize> = members.iter().flat_map(|m| m.depths()).collect();
            depths.sort_unstable();
            depths.dedup();
            if depths.len() >= 2
                && members
                    .iter()
                    .any(|m| m.ok.iter().any(|r| r.peak_bytes.is_some()))
            {
                // the stem and label of the figure's first group: f32's when it has f32 rows
                let lead = members[0];
                let label = if members.len() > 1 {
                    let dtypes: Vec<&str> = members.iter().map(|m| m.key.dtype.as_str()).collect();
                    data::label_with_dtypes(&lead.label, &lead.key.dtype, &dtypes)
                } else {
                    lead.label.clone()
                };
                figs.push(Figure {
                    kind: Kind::MemoryVsDepth,
                    stem: format!("memory-vs-depth-{}", lead.slug),
                    title: format!("Peak memory vs depth, {label}"),
                    target: Target::Groups(set),
                    key: true,
                });
            }
        }
        if g.depths().len() < 2 {
            continue;
        }
        if g.ok.iter().any(|r| r.median_ns.is_some()) {
            figs.push(Figure {
                kind: Kind::TimeVsDepth,
                stem: format!("time-vs-depth-{}", g.slug),
                title: format!("Step time vs depth, {}", g.label),
                target: Target::Group(gi),
                key: false,
            });
        }
    }
    for (gi, depth) in data::headline(groups) {
        let g = &groups[gi];
        for d in g.depths() {
            let complete = g
                .at_depth(d)
                .iter()
                .filter(|r| r.peak_bytes.is_some() && r.median_ns.is_some())
                .count();
            if complete >= 2 {
                figs.push(Figure {
                    kind: Kind::MemoryVsTime,
                    stem: format!("memory-vs-time-{}-L{d}", g.slug),
                    title: format!("Memory vs time (Pareto front), {} L={d}", g.label),
                    target: Target::GroupDepth(gi, d),
                    key: d == depth,
                });
            }
        }
        if g.at_depth(depth).iter().any(|r| !r.timeline.is_empty()) {
            figs.push(Figure {
                kind: Kind::Timeline,
                stem: format!("timeline-{}-L{depth}", g.slug),
                title: format!("Memory timeline, {} L={depth}", g.label),
                target: Target::GroupDepth(gi, depth),
                key: false,
            });
        }
    }
    let mut families: Vec<FamilyKey> = groups.iter().map(|g| FamilyKey::of(&g.key)).collect();
    families.sort_unstable();
    families.dedup();
    for fam in families {
        let rows = family_rows(groups, &fam);
        let (slug, label) = (fam.slug(), fam.label());
        if rows
            .iter()
            .any(|r| r.predicted_peak_bytes.is_some() && r.peak_bytes.is_some())
        {
            figs.push(Figure {
                kind: Kind::MeasuredVsPredicted,
                stem: format!("measured-vs-predicted-{slug}"),
                title: format!("Measured vs predicted peak memory, {label}"),
                target: Target::Family(fam.clone()),
                key: false,
            });
        }
        if rows.iter().any(|r| r.max_rel_err.is_some()) {
            figs.push(Figure {
                kind: Kind::GradError,
                stem: format!("grad-error-{slug}"),
                title: format!("Gradient error per variant, {label}"),
                target: Target::Family(fam),
                key: true,
            });
        }
    }
    figs
}

/// The groups of a [`Target::Groups`].
fn members<'a>(groups: &'a [Group], set: &[usize]) -> Vec<&'a Group> {
    set.iter().map(|&j| &groups[j]).collect()
}

/// Every ok row of one family in one dtype and math mode, across configurations.
fn family_rows<'a>(groups: &'a [Group], fam: &FamilyKey) -> Vec<&'a Row> {
    groups
        .iter()
        .filter(|g| FamilyKey::of(&g.key) == *fam)
        .flat_map(|g| g.ok.iter())
        .collect()
}

/// The footer notes of one figure, as its frame gets them (before [`style::shown_footer`]
/// cuts them to what fits).
fn footer_of(fig: &Figure, groups: &[Group]) -> Vec<String> {
    match (&fig.kind, &fig.target) {
        (Kind::MemoryVsDepth, Target::Groups(set)) => {
            memory_vs_depth::footer(&members(groups, set))
        }
        (Kind::TimeVsDepth, Target::Group(gi)) => time_vs_depth::footer(&groups[*gi]),
        (Kind::MemoryVsTime, Target::GroupDepth(gi, d)) => memory_vs_time::footer(&groups[*gi], *d),
        _ => Vec::new(),
    }
}

/// For each group, for each of its `skipped` rows (status not ok), whether the footer of some
/// figure of `figs` shows it: a row whose configuration has no figure (every row failed, one
/// depth only), or that a full footer's `… and n more` stands for, is shown by none, and
/// `plots` must list it itself.
pub fn footer_listed(groups: &[Group], figs: &[Figure]) -> Vec<Vec<bool>> {
    // each figure's groups, whether its notes name the dtype (it draws two), its footer lines
    let footers: Vec<(Vec<usize>, bool, Vec<String>)> = figs
        .iter()
        .filter_map(|f| {
            let (set, dtyped) = match &f.target {
                Target::Group(gi) | Target::GroupDepth(gi, _) => (vec![*gi], false),
                Target::Groups(set) => (set.clone(), set.len() > 1),
                Target::Family(_) => return None,
            };
            Some((set, dtyped, style::shown_footer(&footer_of(f, groups))))
        })
        .collect();
    groups
        .iter()
        .enumerate()
        .map(|(gi, g)| {
            g.skipped
                .iter()
                .map(|r| {
                    footers.iter().any(|(set, dtyped, lines)| {
                        let note = if *dtyped {
                            data::skipped_note_dtyped(r)
                        } else {
                            data::skipped_note(r)
                        };
                        set.contains(&gi) && lines.contains(&style::skipped_line(&note))
                    })
                })
                .collect()
        })
        .collect()
}

/// Registers the embedded font as plotters' `sans-serif` family, once per process.
fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT_TTF).is_ok()
    });
    if !ok {
        bail!("the embedded font harness/assets/DejaVuSans.ttf is not a valid TrueType font");
    }
    Ok(())
}

fn draw_figure<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    fig: &Figure,
    groups: &[Group],
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    match (&fig.kind, &fig.target) {
        (Kind::MemoryVsDepth, Target::Groups(set)) => {
            memory_vs_depth::memory_vs_depth(root, &members(groups, set))
        }
        (Kind::TimeVsDepth, Target::Group(gi)) => time_vs_depth::time_vs_depth(root, &groups[*gi]),
        (Kind::MemoryVsTime, Target::GroupDepth(gi, d)) => {
            memory_vs_time::memory_vs_time(root, &groups[*gi], *d)
        }
        (Kind::Timeline, Target::GroupDepth(gi, d)) => timeline::timeline(root, &groups[*gi], *d),
        (Kind::MeasuredVsPredicted, Target::Family(f)) => {
            measured_vs_predicted::measured_vs_predicted(root, f, &family_rows(groups, f))
        }
        (Kind::GradError, Target::Family(f)) => {
            grad_error::grad_error(root, f, &family_rows(groups, f))
        }
        (k, t) => bail!("figure {}: kind {k:?} cannot be drawn from {t:?}", fig.stem),
    }
}

/// Writes one figure as SVG and PNG; returns both paths.
fn render(fig: &Figure, groups: &[Group], out: &Path) -> Result<Vec<PathBuf>> {
    let svg = out.join(format!("{}.svg", fig.stem));
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, style::SIZE).into_drawing_area();
        draw_figure(&root, fig, groups).with_context(|| format!("drawing {}", svg.display()))?;
        root.present()
            .with_context(|| format!("drawing {}", svg.display()))?;
    }
    let text = preserve_spaces(&text);
    write_atomic(&svg, |tmp| {
        std::fs::write(tmp, &text).with_context(|| format!("writing {}", svg.display()))
    })?;
    let png = out.join(format!("{}.png", fig.stem));
    let encoded =
        rasterise(text.as_bytes()).with_context(|| format!("rasterising {}", svg.display()))?;
    write_atomic(&png, |tmp| {
        std::fs::write(tmp, &encoded).with_context(|| format!("writing {}", png.display()))
    })?;
    Ok(vec![svg, png])
}

/// `svg` with `xml:space="preserve"` on its root: the figures' texts carry meaningful spaces
/// (`forward ` and ` backward` either side of a line, indented legend notes, two spaces before
/// a ratio), which SVG renderers, browsers and resvg alike, otherwise strip and collapse
/// ("forwardbackward").
fn preserve_spaces(svg: &str) -> String {
    match svg.find("<svg ") {
        Some(i) => format!("{}<svg xml:space=\"preserve\" {}", &svg[..i], &svg[i + 5..]),
        None => svg.to_string(),
    }
}

/// The PNG of an SVG figure, at the figure's size: the SVG rasterised by resvg with the embedded
/// font as its sans-serif, so the PNG's text is shaped as the SVG's is (one drawing, two
/// encodings, never two drawings that could differ).
fn rasterise(svg: &[u8]) -> Result<Vec<u8>> {
    pixmap_of(svg)?
        .encode_png()
        .map_err(|e| anyhow::anyhow!("encoding the PNG: {e}"))
}

/// The pixels of an SVG figure ([`rasterise`]), on white.
fn pixmap_of(svg: &[u8]) -> Result<resvg::tiny_skia::Pixmap> {
    use resvg::{tiny_skia, usvg};
    static FONTS: std::sync::OnceLock<std::sync::Arc<usvg::fontdb::Database>> =
        std::sync::OnceLock::new();
    let fonts = FONTS.get_or_init(|| {
        let mut db = usvg::fontdb::Database::new();
        db.load_font_data(FONT_TTF.to_vec());
        db.set_sans_serif_family("DejaVu Sans");
        std::sync::Arc::new(db)
    });
    let opt = usvg::Options {
        font_family: "DejaVu Sans".to_string(),
        fontdb: fonts.clone(),
        ..usvg::Options::default()
    };
    let tree = usvg::Tree::from_data(svg, &opt).map_err(|e| anyhow::anyhow!("{e}"))?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| anyhow::anyhow!("a {}×{} image", size.width(), size.height()))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    Ok(pixmap)
}

/// Renders every planned figure of `rows` into `out` (in parallel); returns the files written,
/// in plan order. Rows whose status is not `ok` are left out.
pub fn render_all(rows: &[Row], out: &Path) -> Result<Vec<PathBuf>> {
    register_font()?;
    let (groups, _) = data::group_rows(rows);
    let figs = plan(&groups);
    std::fs::create_dir_all(out)
        .with_context(|| format!("creating the plots folder {}", out.display()))?;
    let files: Vec<Vec<PathBuf>> = figs
        .par_iter()
        .map(|f| render(f, &groups, out))
        .collect::<Result<_>>()?;
    Ok(files.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    /// The PNG is the SVG's drawing, its text drawn with the embedded font: a word in
    /// `sans-serif` (the family every figure's SVG names) darkens pixels where it stands and
    /// nowhere else, at the SVG's size. Without a font for the family, text would silently
    /// vanish from every PNG.
    #[test]
    fn pngs_draw_the_svgs_text_with_the_embedded_font() {
        let svg = br##"<svg xmlns="http://www.w3.org/2000/svg" width="200" height="60"><rect width="200" height="60" fill="#FFFFFF"/><text x="10" y="40" font-family="sans-serif" font-size="24" fill="#000000">densebench</text></svg>"##;
        let p = super::pixmap_of(svg).expect("rasterised");
        assert_eq!((p.width(), p.height()), (200, 60));
        let dark = |x0: u32, x1: u32| {
            (x0..x1)
                .flat_map(|x| (0..60).map(move |y| (x, y)))
                .filter(|&(x, y)| p.pixel(x, y).is_some_and(|c| c.red() < 128))
                .count()
        };
        assert!(
            dark(10, 130) > 200,
            "the word is drawn: {} dark pixels",
            dark(10, 130)
        );
        assert_eq!(dark(160, 200), 0, "nothing right of it");
        let png = super::rasterise(svg).expect("encoded");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // a text's own spaces are kept ("forward " | " backward" either side of a line): the
        // space before "b" leaves a gap left of where "b" alone would start
        let word = |t: &str| {
            let svg = format!(
                r##"<svg width="200" height="60" xmlns="http://www.w3.org/2000/svg"><text x="10" y="40" font-family="sans-serif" font-size="24">{t}</text></svg>"##
            );
            let p = super::pixmap_of(super::preserve_spaces(&svg).as_bytes()).expect("drawn");
            (0..200)
                .find(|&x| (0..60).any(|y| p.pixel(x, y).is_some_and(|c| c.red() < 128)))
                .unwrap_or(200)
        };
        assert!(
            word(" b") > word("b") + 4,
            "{} vs {}",
            word(" b"),
            word("b")
        );
    }

    use super::{data, footer_listed, footer_of, plan, Figure, Kind, Target};
    use crate::results::row::Row;

    fn row(dtype: &str, device: &str, depth: usize, status: &str) -> Row {
        Row {
            variant: data::NAIVE.to_string(),
            framework: "densebench".to_string(),
            family: "mlp".to_string(),
            dtype: dtype.to_string(),
            device: device.to_string(),
            math: "ieee".to_string(),
            status: status.to_string(),
            depth,
            threads: 1,
            peak_bytes: Some(1 << 20),
            predicted_peak_bytes: Some(1 << 20),
            median_ns: Some(1_000_000),
            max_rel_err: Some(1e-7),
            ..Row::default()
        }
    }

    /// f32 and f64 rows of a family get figures of their own, the f64 ones with the `-f64`
    /// suffix of per-configuration figures.
    #[test]
    fn family_figures_are_per_dtype() {
        let rows = [
            row("f32", "cpu", 1, "ok"),
            row("f64", "cpu", 1, "ok"),
            row("f64", "cpu", 2, "ok"),
        ];
        let (groups, _) = data::group_rows(&rows);
        let stems: Vec<String> = plan(&groups)
            .into_iter()
            .filter(|f| matches!(f.target, Target::Family(_)))
            .map(|f| f.stem)
            .collect();
        assert_eq!(
            stems,
            [
                "measured-vs-predicted-mlp",
                "grad-error-mlp",
                "measured-vs-predicted-mlp-f64",
                "grad-error-mlp-f64"
            ]
        );
        let titles: Vec<String> = plan(&groups)
            .into_iter()
            .filter(|f| f.kind == Kind::GradError)
            .map(|f| f.title)
            .collect();
        assert_eq!(
            titles,
            [
                "Gradient error per variant, mlp f32",
                "Gradient error per variant, mlp f64"
            ]
        );
    }

    /// `row` of an mlp configuration of batch `batch`, C0 = 4, k = 2 with its ReLUs.
    fn mlp(dtype: &str, batch: usize, depth: usize, status: &str) -> Row {
        Row {
            batch,
            channels: 4,
            growth: 2,
            activation: true,
            ..row(dtype, "cpu", depth, status)
        }
    }

    /// The memory-vs-depth figures of a plan: each stem with the dtypes of the groups drawn on
    /// it, in drawing order.
    fn memory_figures(groups: &[data::Group]) -> Vec<(String, Vec<String>)> {
        plan(groups)
            .into_iter()
            .filter(|f| f.kind == Kind::MemoryVsDepth)
            .map(|f| {
                let Target::Groups(set) = &f.target else {
                    panic!("{}: a memory-vs-depth figure of {:?}", f.stem, f.target);
                };
                let dtypes = set.iter().map(|&j| groups[j].key.dtype.clone()).collect();
                (f.stem, dtypes)
            })
            .collect()
    }

    /// A configuration's f32 and bf16 rows are one memory-vs-depth figure, under the f32
    /// figure's name (f32's lines first); its f64 rows are a figure of their own; a bf16
    /// configuration without f32 rows keeps its `-bf16` figure. Every other figure stays one
    /// dtype: time against depth is drawn for each of the three.
    #[test]
    fn bf16_is_drawn_on_its_f32_memory_figure_and_f64_is_not() {
        let mut rows = Vec::new();
        for dtype in ["f32", "bf16", "f64"] {
            for depth in [1, 2] {
                rows.push(mlp(dtype, 8, depth, "ok"));
            }
        }
        // another configuration (batch 16), in bf16 only
        rows.push(mlp("bf16", 16, 1, "ok"));
        rows.push(mlp("bf16", 16, 2, "ok"));
        let (groups, _) = data::group_rows(&rows);
        assert_eq!(
            groups.len(),
            4,
            "f32, bf16, f64 of batch 8; bf16 of batch 16"
        );
        let figs = memory_figures(&groups);
        let want: Vec<(String, Vec<String>)> = [
            ("memory-vs-depth-mlp-N8-C4-k2-relu", vec!["f32", "bf16"]),
            ("memory-vs-depth-mlp-N8-C4-k2-relu-f64", vec!["f64"]),
            ("memory-vs-depth-mlp-N16-C4-k2-relu-bf16", vec!["bf16"]),
        ]
        .into_iter()
        .map(|(s, d)| (s.to_string(), d.into_iter().map(String::from).collect()))
        .collect();
        assert_eq!(figs, want);
        let titles: Vec<String> = plan(&groups)
            .into_iter()
            .filter(|f| f.kind == Kind::MemoryVsDepth)
            .map(|f| f.title)
            .collect();
        assert_eq!(
            titles[0],
            "Peak memory vs depth, mlp N=8 C0=4 k=2 relu=on f32 and bf16"
        );
        let mut times: Vec<String> = plan(&groups)
            .into_iter()
            .filter(|f| f.kind == Kind::TimeVsDepth)
            .map(|f| f.stem)
            .collect();
        times.sort();
        assert_eq!(
            times,
            [
                "time-vs-depth-mlp-N16-C4-k2-relu-bf16",
                "time-vs-depth-mlp-N8-C4-k2-relu",
                "time-vs-depth-mlp-N8-C4-k2-relu-bf16",
                "time-vs-depth-mlp-N8-C4-k2-relu-f64",
            ]
        );
    }

    /// One depth in f32 and another in bf16 are two depths of one figure (neither dtype alone
    /// has a line to draw); a failed bf16 row is named with its dtype in that figure's footer,
    /// and counted as shown there.
    #[test]
    fn a_shared_memory_figure_spans_both_dtypes_depths_and_footers() {
        let rows = [
            mlp("f32", 8, 1, "ok"),
            mlp("bf16", 8, 2, "ok"),
            mlp("bf16", 8, 3, "oom"),
        ];
        let (groups, _) = data::group_rows(&rows);
        let figs = plan(&groups);
        let mem: Vec<&Figure> = figs
            .iter()
            .filter(|f| f.kind == Kind::MemoryVsDepth)
            .collect();
        assert_eq!(mem.len(), 1, "{figs:?}");
        assert_eq!(mem[0].stem, "memory-vs-depth-mlp-N8-C4-k2-relu");
        let footer = footer_of(mem[0], &groups);
        assert!(
            footer
                .iter()
                .any(|l| l.contains("cat-store-copy bf16 L=3: oom")),
            "{footer:?}"
        );
        let listed = footer_listed(&groups, &figs);
        let by_dtype: Vec<(&str, Vec<bool>)> = groups
            .iter()
            .map(|g| g.key.dtype.as_str())
            .zip(listed)
            .collect();
        assert_eq!(by_dtype, [("bf16", vec![true]), ("f32", vec![])]);
    }

    /// The shared figure's legend names each line's dtype, f32's and bf16's of one variant
    /// side by side; a figure of one dtype names none.
    #[test]
    fn the_shared_figure_legend_names_each_dtype() {
        use plotters::prelude::*;
        super::register_font().expect("the embedded font");
        let mut rows = Vec::new();
        for dtype in ["f32", "bf16", "f64"] {
            for depth in [1, 2] {
                rows.push(mlp(dtype, 8, depth, "ok"));
            }
        }
        let (groups, _) = data::group_rows(&rows);
        // the texts of a figure's SVG, in drawing order
        let texts = |fig: &Figure| -> Vec<String> {
            let mut svg = String::new();
            {
                let root =
                    SVGBackend::with_string(&mut svg, super::style::SIZE).into_drawing_area();
                super::draw_figure(&root, fig, &groups).expect("drawn");
                root.present().expect("presented");
            }
            svg.split("<text")
                .skip(1)
                .filter_map(|t| {
                    Some(
                        t.split_once('>')?
                            .1
                            .split_once("</text>")?
                            .0
                            .trim()
                            .to_string(),
                    )
                })
                .collect()
        };
        let figs = plan(&groups);
        let mem: Vec<&Figure> = figs
            .iter()
            .filter(|f| f.kind == Kind::MemoryVsDepth)
            .collect();
        let shared = texts(mem[0]);
        let at = |prefix: &str| shared.iter().position(|t| t.starts_with(prefix));
        let (f32_at, bf16_at) = (
            at("cat-store-copy f32  p = "),
            at("cat-store-copy bf16  p = "),
        );
        assert!(
            matches!((f32_at, bf16_at), (Some(a), Some(b)) if b == a + 1),
            "f32's entry, then bf16's: {shared:?}"
        );
        assert!(at("short dashes, hollow: bf16").is_some(), "{shared:?}");
        let alone = texts(mem[1]);
        assert!(
            alone.iter().any(|t| t.starts_with("cat-store-copy  p = ")),
            "no dtype named: {alone:?}"
        );
        assert!(alone
            .iter()
            .all(|t| !t.contains("bf16") && !t.contains("cat-store-copy f")));
    }

    /// A failed row of a configuration with figures is in their footers; one of a
    /// configuration without any (every row failed) is in none.
    #[test]
    fn footer_listed_marks_rows_no_figure_shows() {
        let rows = [
            row("f32", "cpu", 1, "ok"),
            row("f32", "cpu", 2, "ok"),
            row("f32", "cpu", 3, "oom"),
            row("f32", "cuda:0", 1, "error"),
        ];
        let (groups, _) = data::group_rows(&rows);
        let listed = footer_listed(&groups, &plan(&groups));
        let by_device: Vec<(&str, Vec<bool>)> = groups
            .iter()
            .map(|g| g.key.device.as_str())
            .zip(listed)
            .collect();
        assert_eq!(by_device, [("cpu", vec![true]), ("cuda:0", vec![false])]);
    }
}
