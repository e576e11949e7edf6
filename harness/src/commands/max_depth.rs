//! `densebench max-depth`: the question users actually ask — how deep a block fits in a memory
//! budget — answered per variant ([`crate::measure::capacity`]: the analytic model, confirmed by
//! measured runs at the answer and one layer deeper), printed as a table and optionally a CSV.

use crate::measure::capacity::{self, Answer, Searcher};
use crate::measure::device::{DeviceOps, DeviceSpec};
use crate::measure::estimates::overhead_margin;
use crate::measure::interrupt;
use crate::plan::bounds::{self, ResultExt};
use crate::plan::job::{self, normalize, OnOff, Settings};
use crate::results::replace::{csv_header, refuse_foreign, Kind};
use crate::results::store::Reserved;
use anyhow::{anyhow, bail, Context, Result};
use impls::{Config, Family, Spatial, Variant};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// `densebench max-depth` arguments. Sizes default to the family's canonical block:
/// DenseNet-BC-100's (N=64, C0=24, k=12, bn_size 4, 32×32) for bc, the forum's
/// (N=4096, C0=256, k=64) for mlp.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Block family: `mlp` or `bc`.
    #[arg(long)]
    pub family: String,
    /// Variants to answer for (comma-separated); default every variant that applies.
    #[arg(long, value_delimiter = ',')]
    pub variants: Vec<String>,
    /// Memory budget in bytes (suffixes K, M, G or KiB, MiB, GiB), e.g. `1GiB`.
    #[arg(long, value_parser = job::parse_bytes)]
    pub budget: u64,
    /// Batch size N [default: bc 64, mlp 4096].
    #[arg(long)]
    pub batch: Option<usize>,
    /// Input channels C0 [default: bc 24, mlp 256].
    #[arg(long)]
    pub channels: Option<usize>,
    /// Growth rate k [default: bc 12, mlp 64].
    #[arg(long)]
    pub growth: Option<usize>,
    /// Bottleneck factor (bc) [default: 4].
    #[arg(long)]
    pub bn_size: Option<usize>,
    /// Spatial size of the feature maps (bc): `32` (32×32) or `HxW`, height first [default: 32].
    #[arg(long, value_parser = job::parse_size)]
    pub size: Option<Spatial>,
    /// ReLU after each Linear (mlp).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub activation: OnOff,
    /// f32, f64 or bf16 (mixed precision: bf16 features, f32 parameters and statistics; on the
    /// CPU and on CUDA), or several, comma-separated (`f32,bf16`): one table per dtype, every
    /// answer in one CSV (its `dtype` column says which).
    #[arg(long, value_delimiter = ',', default_value = "f32")]
    pub dtype: Vec<String>,
    /// Deepest block considered. A variant that fits this deep is shown as `≥N` (the search
    /// stopped there: a lower bound, said in the CSV's note); raise it to look deeper (at most
    /// 10000).
    #[arg(long, default_value_t = 1024, value_parser = bounds::flags::search_depth)]
    pub max_depth: usize,
    /// Answer from the model only, without measured confirmation runs.
    #[arg(long)]
    pub no_confirm: bool,
    /// Also write the table as CSV to this file. An existing file is replaced only when it is an
    /// earlier max-depth CSV (or empty), unless --force.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace --out even when it is not a max-depth CSV (e.g. a result CSV).
    #[arg(long, requires = "out")]
    pub force: bool,
    /// Compute threads of each measured run (0: all physical cores; at most 1024).
    #[arg(long, default_value_t = 0, value_parser = bounds::flags::threads)]
    pub threads: usize,
    /// Time limit of each measured run in seconds (1 to 604800, one week).
    #[arg(long, default_value_t = 1800, value_parser = bounds::flags::timeout)]
    pub timeout: u64,
    /// Device of the measured runs: `cpu` or `cuda:N` (needs a `--features cuda` build). On a
    /// GPU the measured totals are the memory pool's high watermark plus the baseline.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

fn block(a: &Args, dtype: &str) -> Result<Config> {
    let family = Family::parse(&a.family).map_err(|e| anyhow!("--family: {e}"))?;
    let dtype = impls::config::parse_dtype(dtype).map_err(|e| anyhow!("--dtype: {e}"))?;
    let base = match family {
        Family::Bc => Config::bc100_block(),
        Family::Mlp => Config {
            family: Family::Mlp,
            batch: 4096,
            channels: 256,
            growth: 64,
            depth: 1,
            bn_size: 1,
            size: Spatial::square(1),
            activation: true,
            dtype,
            seed: 0,
        },
    };
    crate::plan::job::check_activation(family, a.activation)?;
    crate::plan::job::check_bc_only(family, a.bn_size, a.size)?;
    let cfg = normalize(Config {
        batch: a.batch.unwrap_or(base.batch),
        channels: a.channels.unwrap_or(base.channels),
        growth: a.growth.unwrap_or(base.growth),
        bn_size: a.bn_size.unwrap_or(base.bn_size),
        size: a.size.unwrap_or(base.size),
        activation: a.activation.is_on(),
        dtype,
        depth: 1,
        ..base
    });
    cfg.validate().map_err(|e| anyhow!("{e}"))?;
    Ok(cfg)
}

/// Whether a file is a CSV `max-depth --out` wrote: its header is [`Answer`]'s columns (or
/// those of an earlier one, [`crate::results::replace::is_max_depth_header`]).
fn is_max_depth_csv(start: &[u8], _len: u64) -> bool {
    csv_header(start).is_some_and(|h| crate::results::replace::is_max_depth_header(&h))
}

/// A variant's depth over naive's, and how far it can be trusted: the search stops at
/// `--max-depth`, so a depth that reached it is only a lower bound.
enum Ratio {
    /// Neither depth reached the bound (or the variant is naive itself).
    Exact(f64),
    /// The variant reached the bound, naive did not.
    AtLeast(f64),
    /// Naive reached the bound, the variant did not.
    AtMost(f64),
    /// Both reached the bound: nothing is known.
    Unknown,
}

fn ratio(x: &Answer, naive: Option<&Answer>) -> Option<Ratio> {
    let n = naive.filter(|n| n.max_depth > 0)?;
    let r = x.max_depth as f64 / n.max_depth as f64;
    Some(match (x.bound_reached, n.bound_reached) {
        _ if x.variant == n.variant => Ratio::Exact(r),
        (false, false) => Ratio::Exact(r),
        (true, false) => Ratio::AtLeast(r),
        (false, true) => Ratio::AtMost(r),
        (true, true) => Ratio::Unknown,
    })
}

fn mib(b: Option<u64>) -> String {
    b.map_or_else(
        || "-".to_string(),
        |b| format!("{:.1}", b as f64 / (1 << 20) as f64),
    )
}

/// The block in each dtype asked for and its variants, validated (every error is the user's
/// input).
fn validate(a: &Args) -> Result<Vec<(Config, Vec<Variant>)>> {
    if let Some((i, d)) = a
        .dtype
        .iter()
        .enumerate()
        .find(|(i, d)| a.dtype[..*i].contains(d))
    {
        bail!(
            "--dtype: `{d}` is named twice (entries {} and {}): name each dtype once",
            a.dtype[..i]
                .iter()
                .position(|x| x == d)
                .map_or(0, |p| p + 1),
            i + 1
        );
    }
    a.dtype.iter().map(|d| validate_one(a, d)).collect()
}

/// The block in one dtype and the variants asked for in it.
fn validate_one(a: &Args, dtype: &str) -> Result<(Config, Vec<Variant>)> {
    let cfg = block(a, dtype)?;
    anyhow::ensure!(a.max_depth >= 1, "--max-depth must be at least 1");
    anyhow::ensure!(a.budget > 0, "--budget must be positive");
    let variants: Vec<Variant> = if a.variants.is_empty() {
        Variant::for_config(&cfg)
    } else {
        a.variants
            .iter()
            .map(|n| {
                let v = Variant::parse(n).map_err(|e| anyhow!("--variants: {e}"))?;
                v.check(&cfg).map_err(|e| anyhow!("--variants: {e}"))?;
                Ok(v)
            })
            .collect::<Result<_>>()?
    };
    // A variant named twice would be searched and written twice (and its naive ratio twice).
    if let Some((i, v)) = variants
        .iter()
        .enumerate()
        .find(|(i, v)| variants[..*i].contains(v))
    {
        bail!(
            "--variants: `{}` is named twice (as `{}` and `{}`): name each variant once",
            v.name(),
            a.variants
                .iter()
                .find(|n| Variant::parse(n).ok() == Some(*v))
                .map_or("", |n| n.as_str()),
            a.variants.get(i).map_or("", |n| n.as_str())
        );
    }
    Ok((cfg, variants))
}

/// `densebench max-depth`.
pub fn run(a: Args) -> Result<ExitCode> {
    interrupt::install()?;
    let blocks = validate(&a).bad_input()?;
    if let Some(out) = &a.out {
        let kind = Kind {
            name: "a max-depth CSV",
            recognise: is_max_depth_csv,
        };
        refuse_foreign(out, "--out", &kind, a.force)?;
    }
    let device: DeviceSpec = a.device.parse().context("--device").bad_input()?;
    if !a.no_confirm {
        device.check_available().bad_input()?;
    }
    // Reserved before the search (its folder made, its writer lock taken): an --out that cannot
    // be written fails now, not after every measured run, and a second writer fails at once.
    let reserved = a.out.as_deref().map(Reserved::new).transpose()?;
    let settings = Settings {
        device,
        math: crate::plan::job::Math::Ieee,
        execution: crate::plan::job::Execution::Eager,
        threads: job::resolve_threads(a.threads),
        steps: 1,
        warmup: 1,
        mem_limit: Some(a.budget.saturating_add(overhead_margin(a.budget))),
        timeout: Duration::from_secs(a.timeout),
    };
    // --no-confirm is the model alone: a variant without one (autograd) would need measured
    // runs, so it is left out, and said so; refused when no variant of any dtype is left.
    let mut searches: Vec<(Config, Vec<Variant>)> = Vec::new();
    let mut unmodelled: Vec<String> = Vec::new();
    for (cfg, variants) in blocks {
        let (kept, left): (Vec<Variant>, Vec<Variant>) = variants
            .into_iter()
            .partition(|v| !a.no_confirm || capacity::has_model(*v, &cfg, &settings));
        for v in left {
            if !unmodelled.contains(&v.name()) {
                unmodelled.push(v.name());
            }
        }
        searches.push((cfg, kept));
    }
    if !unmodelled.is_empty() {
        if searches.iter().all(|(_, v)| v.is_empty()) {
            return Err(anyhow!(
                "--no-confirm answers from the memory model, and {} has none (only measured runs \
                 answer it): drop --no-confirm",
                unmodelled.join(", ")
            ))
            .bad_input();
        }
        crate::say!(
            "densebench max-depth: {} left out: no memory model, only measured runs answer it \
             (drop --no-confirm)",
            unmodelled.join(", ")
        );
    }
    let mut s = Searcher::new(&settings, a.budget);
    let mut all = Vec::new();
    // A closed stdout (`max-depth … | head`) must not end the search, nor lose the --out CSV.
    let mut out = Lenient(Some(std::io::stdout().lock()));
    for (i, (cfg, variants)) in searches.iter().enumerate() {
        if variants.is_empty() {
            continue;
        }
        if i > 0 {
            writeln!(out)?;
        }
        all.extend(search(&a, &settings, &mut s, cfg, variants, &mut out)?);
    }
    if let (Some(path), Some(reserved)) = (&a.out, &reserved) {
        let mut w = csv::Writer::from_writer(Vec::new());
        for x in &all {
            w.serialize(x)
                .with_context(|| format!("serialising a row for {}", path.display()))?;
        }
        let bytes = w
            .into_inner()
            .map_err(|e| anyhow!("serialising {}: {e}", path.display()))?;
        reserved.write_bytes(&bytes)?;
        writeln!(out, "wrote {}", path.display())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Standard output that stops writing at its first error (a reader that went away, `| head`)
/// instead of failing: the table is a view of the answers, the CSV is the record.
struct Lenient<W: Write>(Option<W>);

impl<W: Write> Write for Lenient<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(w) = &mut self.0 {
            if w.write_all(buf).is_err() {
                self.0 = None;
            }
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(w) = &mut self.0 {
            if w.flush().is_err() {
                self.0 = None;
            }
        }
        Ok(())
    }
}

/// One dtype's search: every variant's answer, printed as a table (`s` counts the measured runs
/// of every dtype so far), each with its ratio to naive and notes as the CSV has them.
fn search(
    a: &Args,
    settings: &Settings,
    s: &mut Searcher,
    cfg: &Config,
    variants: &[Variant],
    out: &mut impl Write,
) -> Result<Vec<Answer>> {
    let runs_before = s.runs;
    let mut answers = Vec::new();
    for v in variants {
        answers.push(s.answer(*v, cfg, a.max_depth, !a.no_confirm)?);
    }
    let naive = answers
        .iter()
        .find(|x| x.variant == Variant::NAIVE.name())
        .cloned();
    let ratios: Vec<Option<Ratio>> = answers.iter().map(|x| ratio(x, naive.as_ref())).collect();
    writeln!(
        out,
        "max depth of {} within {} on {} ({} measured runs)",
        crate::results::row::Row {
            family: cfg.family.name().to_string(),
            batch: cfg.batch,
            channels: cfg.channels,
            growth: cfg.growth,
            bn_size: cfg.bn_size,
            size: cfg.size,
            activation: cfg.activation,
            dtype: cfg.dtype.as_str().to_string(),
            ..Default::default()
        }
        .config_label(),
        crate::progress::human_bytes(Some(a.budget)),
        settings.device,
        s.runs - runs_before
    )?;
    writeln!(
        out,
        "{:<26} {:>9} {:>8} {:>14} {:>14} {:>14}  method",
        "variant", "max depth", "×naive", "predicted MiB", "measured MiB", "L+1 MiB"
    )?;
    for (x, r) in answers.iter().zip(&ratios) {
        writeln!(
            out,
            "{:<26} {:>9} {:>8} {:>14} {:>14} {:>14}  {}{}",
            x.variant,
            if x.bound_reached {
                format!("≥{}", x.max_depth)
            } else {
                x.max_depth.to_string()
            },
            match r {
                None => "-".to_string(),
                Some(Ratio::Exact(r)) => format!("{r:.2}"),
                Some(Ratio::AtLeast(r)) => format!("≥{r:.2}"),
                Some(Ratio::AtMost(r)) => format!("≤{r:.2}"),
                Some(Ratio::Unknown) => "?".to_string(),
            },
            mib(x.predicted_total_bytes),
            mib(x.measured_total_bytes),
            // L+1 is measured only below the search bound: past it, nothing ran there
            match (x.measured_next_total_bytes, x.bound_reached) {
                (None, true) => "not run".to_string(),
                (None, false) if x.method != "model" => "oom".to_string(),
                (next, _) => mib(next),
            },
            x.method,
            if x.note.is_empty() {
                String::new()
            } else {
                format!(" ({})", x.note)
            }
        )?;
    }
    if answers.iter().any(|x| x.bound_reached) {
        writeln!(
            out,
            "≥{}: the search stops at --max-depth {}: these variants fit at least that deep, how \
             much deeper is not known (×naive: ≥ at least, ≤ at most, ? unknown); raise \
             --max-depth to find out",
            a.max_depth, a.max_depth
        )?;
    }
    // The CSV's ratio is exact or empty; the note says which bound was reached and why.
    for (x, r) in answers.iter_mut().zip(&ratios) {
        let mut notes: Vec<String> = Vec::new();
        if !x.note.is_empty() {
            notes.push(std::mem::take(&mut x.note));
        }
        if x.bound_reached {
            notes.push(format!(
                "{}: fits at least up to L={}; raise --max-depth",
                capacity::BOUND_NOTE,
                x.max_depth
            ));
        }
        x.depth_ratio_to_naive = match r {
            Some(Ratio::Exact(r)) => Some(*r),
            _ => None,
        };
        match r {
            Some(Ratio::AtLeast(r)) => notes.push(format!(
                "depth_ratio_to_naive left empty: at least {r:.2} (naive's depth is exact, this \
                 one a lower bound)"
            )),
            Some(Ratio::AtMost(r)) => notes.push(format!(
                "depth_ratio_to_naive left empty: at most {r:.2} (naive reached the search bound)"
            )),
            Some(Ratio::Unknown) => notes.push(
                "depth_ratio_to_naive left empty: this variant and naive both reached the search \
                 bound"
                    .to_string(),
            ),
            None | Some(Ratio::Exact(_)) => {}
        }
        x.note = notes.join("; ");
    }
    if answers.iter().all(|x| x.max_depth == 0) {
        crate::say!(
            "densebench max-depth: nothing fits: even one layer of every variant needs more than \
             {} (a larger --budget, or a smaller --batch or map?)",
            crate::progress::human_bytes(Some(a.budget))
        );
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    use super::is_max_depth_csv;

    /// `--out` replaces a max-depth CSV of today's columns and one written before the `dtype`
    /// column existed (the committed results/max-depth-bc-1GiB.csv), never a result CSV.
    #[test]
    fn max_depth_csvs_with_and_without_the_dtype_column_are_recognised() {
        let before = "variant,family,budget_bytes,max_depth,predicted_total_bytes,\
                      measured_total_bytes,measured_next_total_bytes,depth_ratio_to_naive,method,\
                      note\ncat-store-copy,bc,1073741824,12,,,,1.0,model,\n";
        let with_dtype = before.replacen("method,note\n", "method,note,dtype\n", 1);
        let now = before.replacen("method,note\n", "method,note,dtype,block\n", 1);
        assert!(is_max_depth_csv(before.as_bytes(), 0));
        assert!(is_max_depth_csv(with_dtype.as_bytes(), 0));
        assert!(is_max_depth_csv(now.as_bytes(), 0));
        // block without dtype never was a header
        let skipped = before.replacen("method,note\n", "method,note,block\n", 1);
        assert!(!is_max_depth_csv(skipped.as_bytes(), 0));
        let result_csv = "schema,key,variant,family\n3,k,cat-store-copy,bc\n";
        assert!(!is_max_depth_csv(result_csv.as_bytes(), 0));
        // the dtype anywhere but last is not a header max-depth ever wrote
        let moved = before.replacen("family,", "family,dtype,", 1);
        assert!(!is_max_depth_csv(moved.as_bytes(), 0));
    }
}
