//! The schedule a step runs with, picked by the model from predicted peaks ([`schedule_for`]):
//! the tap stack's chunking on a GPU's path, whether a recomputing bc variant remakes ReLU1's
//! output late, whether the bc layer's front is split (on the CPU's kernels and a GPU's path).

use crate::config::variant::{Intermediates, Variant};
use crate::config::{Config, Family};
use crate::layer::{with_front_pieces, FrontPieces};
use crate::model::trace::{exact, trace_with, Charge, Kernels, Trace};

/// How a manual step runs where the strategy leaves a choice, picked by the memory model for
/// the least predicted peak ([`schedule_for`]); [`crate::step::step()`] runs it. The default is the
/// plain one: the tap stack in one chunk, r kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Schedule {
    /// Columns per chunk of the tap-stack 3×3 convolution (a GPU's path; 0: one chunk), see
    /// [`crate::layer::tap_chunk_images`].
    pub tap_chunk_columns: usize,
    /// A recomputing bc variant remakes ReLU1's output r `[C_i, M]` for Conv1×1's weight
    /// gradient after BN2's backward instead of keeping the recomputed front's through the 3×3
    /// convolution's backward (`block::bc_backward`): C_i·M fewer there, one BN1 apply more per
    /// layer, bitwise the same values. Where the convolution's backward does not set the peak
    /// (or the remade r with a `copy` ReLU's second tensor would), it only costs time. A whole
    /// front's choice: the split front never keeps r whole, so with
    /// [`Schedule::split_front`] it is false.
    pub defer_r: bool,
    /// The bc layer's front is split ([`crate::layer::split_front`], either path): ReLU1's
    /// output made a column chunk at a time where it is not kept, the front's backward a
    /// column group, then a channel block at a time, so neither it nor its gradient `[C_i, M]`
    /// is ever whole; on the CPU's kernels bitwise the same values, on a GPU's path the same
    /// up to cuBLAS's summation order (for its time, see [`SPLIT_FRONT_MIN_GAIN`]).
    pub split_front: bool,
    /// How a split front is cut on a GPU's path ([`crate::layer::FrontPieces`]; `None`: the
    /// CPU's constants, which its kernels' bitwise equalities rest on): the fewest column
    /// chunks and channel blocks — the fewest launches — whose predicted peak is within
    /// [`FRONT_PIECES_PEAK_SLACK`] (or [`FRONT_SLACK_ENV`]'s fraction) of the peak with the
    /// CPU's finest ones (16 chunks of 4096 columns and blocks of 64 channels on BC-100's
    /// N = 64 block: some 60 launches per layer more than the whole front's); on the tap stack
    /// picked together with [`Schedule::tap_chunk_columns`] (`split_schedule`).
    pub front_pieces: Option<FrontPieces>,
}

/// How far above the finest split front's predicted peak a GPU's coarser cut may leave a
/// variant ([`Schedule::front_pieces`]): half the tap stack's [`TAP_CHUNK_PEAK_SLACK`], so
/// that the cut keeps BC-100's predicted peaks where the finest cut has them (L = 16 / 32 / 48
/// `buffer-recompute-inplace` on cuDNN's path 144.7 / 242.1 / 340.2 MiB, the CPU's 145.6 /
/// 243.0 / 341.0) in 4 / 4 / 8 column chunks instead of 16; at 1% L=16 took 2 chunks at
/// 145.6 MiB and L=48 on the tap stack 346.8 MiB, over the CPU's.
pub const FRONT_PIECES_PEAK_SLACK: f64 = 0.005;

/// The environment variable that replaces [`FRONT_PIECES_PEAK_SLACK`] for a run: a fraction
/// (`0.05`: a GPU's split front may be cut coarser, into fewer pieces and launches, up to 5 %
/// above the finest cut's predicted peak). Read by the schedule, so a step and its prediction
/// agree, and named with its cut in a row's `note`. For measuring what the cut costs in time
/// against what it saves in memory (issue 38 item 3; `scripts/gpu-session.sh front`). Unset or
/// empty: the constant.
pub const FRONT_SLACK_ENV: &str = "DENSEBENCH_FRONT_SLACK";

/// The slack in force: [`FRONT_SLACK_ENV`]'s fraction, else [`FRONT_PIECES_PEAK_SLACK`]. An
/// `Err` naming the variable for anything but a number from 0 to 10.
pub fn front_pieces_slack() -> crate::error::Result<f64> {
    if let Some(slack) = SLACK_HERE.with(std::cell::Cell::get) {
        return Ok(slack);
    }
    parse_front_slack(crate::config::switch::env_value(FRONT_SLACK_ENV).as_deref())
}

thread_local! {
    /// Set inside [`with_front_slack`].
    static SLACK_HERE: std::cell::Cell<Option<f64>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the front's slack `slack` on this thread, whatever [`FRONT_SLACK_ENV`] says
/// (tests compare slacks in one process without touching the environment).
pub fn with_front_slack<R>(slack: f64, f: impl FnOnce() -> R) -> R {
    crate::config::switch::scoped(&SLACK_HERE, Some(slack), f)
}

/// [`FRONT_SLACK_ENV`]'s value read.
fn parse_front_slack(value: Option<&str>) -> crate::error::Result<f64> {
    match value.map(str::trim) {
        None | Some("") => Ok(FRONT_PIECES_PEAK_SLACK),
        Some(v) => match v.parse::<f64>() {
            Ok(x) if (0.0..=10.0).contains(&x) => Ok(x),
            _ => Err(crate::error::Error::InvalidConfig {
                field: FRONT_SLACK_ENV,
                value: v.to_string(),
                reason: "expected a fraction from 0 to 10 (0.05: up to 5 % above the finest \
                         cut's predicted peak), or unset"
                    .to_string(),
            }),
        },
    }
}

/// The fewest pieces for a GPU's split front: columns per chunk `FRONT_CHUNK_COLUMNS · 2^j`
/// (up to one chunk of all `m`), the most whose peak (`peak`, with the CPU's block rows) is
/// within `slack` ([`front_pieces_slack`]) of `finest`'s; then channel rows per block
/// `GRAD_BLOCK_ROWS · 2^j` (up to one block of `c_max`, the widest layer input) the same way
/// with those columns. A peak that cannot be traced counts as over the limit. Returns the cut
/// and its peak (`None` where no cut was within: then the CPU's pieces).
fn fewest_pieces(
    m: usize,
    c_max: usize,
    finest: i128,
    slack: f64,
    peak: impl Fn(FrontPieces) -> Option<i128>,
) -> (FrontPieces, Option<i128>) {
    let limit = finest as f64 * (1.0 + slack);
    // the peak of the last cut found within the limit: the one returned (each loop ends with
    // the cut before it, which was within)
    let found = std::cell::Cell::new(None);
    let within = |p: FrontPieces| match peak(p) {
        Some(v) if v as f64 <= limit => {
            found.set(Some(v));
            true
        }
        _ => false,
    };
    let doublings = |first: usize, last: usize| {
        std::iter::successors(Some(first), move |&v| {
            (v < last).then(|| v.saturating_mul(2))
        })
        .collect::<Vec<_>>()
    };
    let mut pieces = FrontPieces::CPU;
    for columns in doublings(FrontPieces::CPU.columns, m).into_iter().rev() {
        if within(FrontPieces { columns, ..pieces }) {
            pieces.columns = columns;
            break;
        }
    }
    for rows in doublings(FrontPieces::CPU.rows, c_max).into_iter().rev() {
        if within(FrontPieces { rows, ..pieces }) {
            pieces.rows = rows;
            break;
        }
    }
    (pieces, found.get())
}

/// How much a split front ([`Schedule::split_front`]) must lower a variant's predicted peak,
/// as a fraction of the whole front's, for [`schedule_for`] to pick it. The split's `dr`
/// blocks each repack `dz` (a few ms a layer on BC-100's block); since Conv1×1's weight
/// gradient is summed in column chunks ([`crate::layer::conv1_bwd_weight`]), the split
/// `buffer-recompute-inplace` step measured ×0.97 (L = 16) and ×1.00 (L = 48) of the whole
/// front's, where the block-wise split had cost ×1.05 and ×1.17 (README). It runs where it
/// saves memory that matters — the recomputing variants at BC-100's scale — not where it trims
/// 1–2% off a store variant's saved state. On a GPU its time is not yet measured (more, smaller
/// launches: docs/gpu.md, "The split front on the GPU").
pub const SPLIT_FRONT_MIN_GAIN: f64 = 0.05;

/// The [`Schedule`] of `variant` on `cfg` for a device's kernels. With the front whole: for
/// each choice of [`Schedule::defer_r`] (only recomputing bc variants have one) the tap-stack
/// chunking (`tap_chunk_columns_given`, a GPU's path only), then the choice with the lower
/// predicted peak (a tie keeps r: no extra work). A bc variant's front split
/// ([`Schedule::split_front`], with its own tap-stack chunking on a GPU's path) where that
/// lowers the peak by at least
/// [`SPLIT_FRONT_MIN_GAIN`] (never inside [`crate::layer::with_whole_front`] or with
/// [`crate::layer::WHOLE_FRONT_ENV`] set). An `Err` for an unreadable chunking override.
pub fn schedule_for(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
) -> crate::error::Result<Schedule> {
    let manual_bc = matches!(variant, Variant::Manual(_)) && cfg.family == Family::Bc;
    let can_split = manual_bc && !crate::layer::whole_front_forced();
    let can_defer = matches!(variant, Variant::Manual(s)
            if s.intermediates == Intermediates::Recompute && cfg.family == Family::Bc);
    let mut best: Option<(i128, Schedule)> = None;
    for defer_r in [false, true] {
        if defer_r && !can_defer {
            continue;
        }
        let tap_chunk_columns = match path {
            Kernels::TapStack => tap_chunk_columns_given(variant, cfg, defer_r, false)?,
            Kernels::Cpu | Kernels::Cudnn(_) | Kernels::Direct => 0,
        };
        let Some(t) = trace_with(
            variant,
            cfg,
            path,
            &exact,
            tap_chunk_columns,
            defer_r,
            false,
        ) else {
            break; // autograd: nothing to pick
        };
        let s = Schedule {
            tap_chunk_columns,
            defer_r,
            ..Schedule::default()
        };
        if best.is_none_or(|(peak, _)| t.peak < peak) {
            best = Some((t.peak, s));
        }
    }
    if let (true, Some((whole, _))) = (can_split, best) {
        if let Some((split, schedule)) = split_schedule(variant, cfg, path)? {
            if (split as f64) <= whole as f64 * (1.0 - SPLIT_FRONT_MIN_GAIN) {
                best = Some((split, schedule));
            }
        }
    }
    Ok(best.map(|(_, s)| s).unwrap_or_default())
}

/// A bc variant's split front on `path` ([`Schedule::split_front`]) and its predicted peak,
/// or `None` where the trace has none. The CPU's kernels: the CPU's pieces, no tap stack.
/// cuDNN's path (or the tap stack with its chunking forced): the fewest front pieces within
/// the slack ([`front_pieces_slack`]) of the finest cut's peak ([`fewest_pieces`]). The tap
/// stack: the tap chunking and the cut picked together, within one limit — the least peak
/// the pair can reach (one image per tap chunk, the finest cut), raised by
/// [`split_tap_stack_slack`] — the fewest tap chunks first (three passes of two or three
/// launches each per chunk and layer), then the fewest front pieces with them. Picked one
/// after the other (the chunks for the finest cut, then the cut), the chunks were those the
/// finest cut needs whatever slack the cut was given: a
/// larger `DENSEBENCH_FRONT_SLACK` coarsened the cut but kept the 16 tap chunks of BC-100's
/// L=16, which cost most of the split front's 1.7× time on an H100.
fn split_schedule(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
) -> crate::error::Result<Option<(i128, Schedule)>> {
    let traced = |tap_chunk_columns: usize, pieces: FrontPieces| {
        with_front_pieces(pieces, || {
            trace_with(variant, cfg, path, &exact, tap_chunk_columns, false, true)
        })
        .map(|t| t.peak)
    };
    let schedule = |tap_chunk_columns, front_pieces| Schedule {
        tap_chunk_columns,
        split_front: true,
        front_pieces,
        ..Schedule::default()
    };
    if path.is_cpu() {
        return Ok(traced(0, FrontPieces::CPU).map(|peak| (peak, schedule(0, None))));
    }
    let (m, c_max) = (cfg.m(), cfg.c_in(cfg.depth.saturating_sub(1)));
    let slack = front_pieces_slack()?;
    // the fewest pieces for a tap chunking within `slack` of `base`
    let cut = |tap: usize, base: i128, slack: f64| {
        let (pieces, peak) = fewest_pieces(m, c_max, base, slack, |p| traced(tap, p));
        peak.map(|peak| (peak, schedule(tap, Some(pieces))))
    };
    let forced = crate::layer::tap_chunk_override()?;
    if matches!(path, Kernels::Cudnn(_) | Kernels::Direct) || forced.is_some() {
        let tap = forced.filter(|_| path == Kernels::TapStack).unwrap_or(0);
        return Ok(traced(tap, FrontPieces::CPU).and_then(|finest| cut(tap, finest, slack)));
    }
    let g = crate::layer::grid(cfg);
    let (plane, n) = (g.h.saturating_mul(g.w).max(1), g.n.max(1));
    let Some(least) = traced(plane, FrontPieces::CPU) else {
        return Ok(None);
    };
    let slack = split_tap_stack_slack(slack);
    let limit = least as f64 * (1.0 + slack);
    let columns = |images| chunk_columns(images, n, plane);
    let tap = fewest_chunk_images(n, |images| {
        traced(columns(images), FrontPieces::CPU).is_some_and(|p| p as f64 <= limit)
    })
    .map_or(plane, columns);
    Ok(cut(tap, least, slack))
}

/// [`Schedule::tap_chunk_columns`] for tap chunks of `images` of the `n` images of `plane`
/// columns each: 0 (one chunk) where they are all of them.
fn chunk_columns(images: usize, n: usize, plane: usize) -> usize {
    if images >= n {
        0
    } else {
        images * plane
    }
}

/// Images per tap chunk for the fewest chunks of whole images (q chunks of `⌈n/q⌉`, the most
/// even split, each split tried once) that `fits`, or `None` where not even one image a chunk
/// does.
fn fewest_chunk_images(n: usize, mut fits: impl FnMut(usize) -> bool) -> Option<usize> {
    let mut last = 0;
    for chunks in 1..=n {
        let images = n.div_ceil(chunks);
        if images == last {
            continue; // the same split as fewer chunks
        }
        last = images;
        if fits(images) {
            return Some(images);
        }
    }
    None
}

/// How far above the least peak of any tap chunking and cut a split front on the tap stack
/// may go (`split_schedule`, [`schedule_for`]'s split front): the larger of
/// [`TAP_CHUNK_PEAK_SLACK`] and the front's slack in force — 1% by default, so BC-100's
/// predicted peaks stay where the two picked one after the other had them (L = 48
/// `buffer-recompute-inplace` 343.6 MiB, under issue 38's 345; the two slacks compounded took
/// 345.7); `DENSEBENCH_FRONT_SLACK=0.05` lets both coarsen to 5%.
pub fn split_tap_stack_slack(front_slack: f64) -> f64 {
    TAP_CHUNK_PEAK_SLACK.max(front_slack)
}

/// [`schedule_for`], remembered per thread for the inputs it depends on — the variant, the
/// config, the kernels, the front, tap-chunk and front-slack overrides in force and the thread count (the
/// CPU's packing allowance is per thread) — so that [`crate::step::step()`] does not trace
/// the block again at the start of every step: on a GPU's tap-stack path the chunking search
/// traces it up to N times (0.26 ms of host time before a BC-100 L=16
/// `buffer-recompute-inplace` step's first launch, 0.72 ms at L=48). An unreadable override is
/// an `Err`, never remembered.
pub fn schedule_for_step(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
) -> crate::error::Result<Schedule> {
    type Key = (Variant, Config, Kernels, bool, Option<usize>, u64, usize);
    thread_local! {
        static SEEN: std::cell::RefCell<Vec<(Key, Schedule)>> =
            const { std::cell::RefCell::new(Vec::new()) };
    }
    /// Distinct keys kept per thread (a process steps one or two configs).
    const KEEP: usize = 16;
    let key: Key = (
        variant,
        cfg.clone(),
        path,
        crate::layer::whole_front_forced(),
        crate::layer::tap_chunk_override()?,
        front_pieces_slack()?.to_bits(),
        rayon::current_num_threads(),
    );
    if let Some(s) = SEEN.with(|seen| {
        seen.borrow()
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, s)| *s)
    }) {
        return Ok(s);
    }
    let s = schedule_for(variant, cfg, path)?;
    SEEN.with(|seen| {
        let mut seen = seen.borrow_mut();
        if seen.len() >= KEEP {
            seen.remove(0);
        }
        seen.push((key, s));
    });
    Ok(s)
}

/// How far above its least possible predicted peak a variant's tap-stack chunking may leave
/// it: `tap_chunk_columns_given` picks the fewest chunks whose peak is within this fraction
/// of the peak with one image per chunk (the least the tap stack can add).
pub const TAP_CHUNK_PEAK_SLACK: f64 = 0.01;

/// Columns per chunk of the tap-stack 3×3 convolution (a GPU's path) for `variant` on `cfg`,
/// what [`crate::step::step()`] runs it with ([`schedule_for`] on [`Kernels::TapStack`]).
pub fn tap_chunk_columns_for(variant: Variant, cfg: &Config) -> crate::error::Result<usize> {
    Ok(schedule_for(variant, cfg, Kernels::TapStack)?.tap_chunk_columns)
}

/// The tap-stack chunking of `variant` on `cfg` with r deferred or not: the override if one
/// is set ([`crate::layer::tap_chunk_override`]); else the fewest chunks of whole images (the
/// fewest launches, the longest GEMMs) whose predicted peak is within [`TAP_CHUNK_PEAK_SLACK`]
/// of the peak with one image per chunk, as `images · H · W` columns, or 0 where one chunk is
/// within it (the tap transients do not set the variant's peak). For q chunks the images per
/// chunk are `⌈N/q⌉`, the most even split. An `Err` for an unreadable override.
pub(crate) fn tap_chunk_columns_given(
    variant: Variant,
    cfg: &Config,
    defer_r: bool,
    split: bool,
) -> crate::error::Result<usize> {
    if let Some(columns) = crate::layer::tap_chunk_override()? {
        return Ok(columns);
    }
    if cfg.family != Family::Bc {
        return Ok(0);
    }
    let g = crate::layer::grid(cfg);
    let plane = g.h.saturating_mul(g.w).max(1);
    let peak = |images: usize| {
        let columns = images.saturating_mul(plane);
        trace_with(
            variant,
            cfg,
            Kernels::TapStack,
            &exact,
            columns,
            defer_r,
            split,
        )
        .map(|t| t.peak)
    };
    let Some(floor) = peak(1) else {
        return Ok(0);
    };
    let limit = floor as f64 * (1.0 + TAP_CHUNK_PEAK_SLACK);
    let n = g.n.max(1);
    Ok(
        fewest_chunk_images(n, |images| peak(images).is_some_and(|p| p as f64 <= limit))
            .map_or(plane, |images| chunk_columns(images, n, plane)),
    )
}

/// The predicted allocation trace of one step (see [`predict_peak_bytes`](super::predict_peak_bytes)), the tap stack
/// chunked as [`tap_chunk_columns_for`] says (an unreadable override fails the step before it
/// measures anything; the trace then assumes one chunk).
pub(crate) fn trace<'a>(
    variant: Variant,
    cfg: &Config,
    path: Kernels,
    charge: Charge<'a>,
) -> Option<Trace<'a>> {
    let s = schedule_for(variant, cfg, path).unwrap_or_default();
    let trace = || {
        trace_with(
            variant,
            cfg,
            path,
            charge,
            s.tap_chunk_columns,
            s.defer_r,
            s.split_front,
        )
    };
    match s.front_pieces {
        Some(p) => with_front_pieces(p, trace),
        None => trace(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `DENSEBENCH_FRONT_SLACK`: unset or empty is the constant, a fraction from 0 to 10 is
    /// taken as it is, anything else (a percent sign, a negative, NaN, a word) an error naming
    /// the variable and what it expects.
    #[test]
    fn the_front_slack_is_read_strictly() {
        assert_eq!(parse_front_slack(None).unwrap(), FRONT_PIECES_PEAK_SLACK);
        assert_eq!(
            parse_front_slack(Some(" ")).unwrap(),
            FRONT_PIECES_PEAK_SLACK
        );
        assert_eq!(parse_front_slack(Some("0")).unwrap(), 0.0);
        assert_eq!(parse_front_slack(Some(" 0.25 ")).unwrap(), 0.25);
        for bad in ["5%", "-0.1", "NaN", "inf", "11", "lots"] {
            let e = parse_front_slack(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains(FRONT_SLACK_ENV) && e.contains("fraction"),
                "{bad}: {e}"
            );
        }
    }

    /// A larger slack cuts a GPU's split front coarser, never over its limit: on a peak that
    /// grows with a piece's columns (10 000 B a doubling step) and rows (1 000 B), BC-100's
    /// L=16 shape (M = 65 536, widest input 216 channels); a cut whose peak cannot be traced
    /// counts as over.
    #[test]
    fn a_larger_slack_cuts_the_front_coarser() {
        let (m, c_max, finest) = (65_536, 216, 1_000_000i128);
        let cpu = FrontPieces::CPU;
        let peak = |p: FrontPieces| {
            let steps = |v: usize, first: usize| (v / first).trailing_zeros() as i128;
            Some(finest + steps(p.columns, cpu.columns) * 10_000 + steps(p.rows, cpu.rows) * 1_000)
        };
        let cut = |slack| {
            let (pieces, picked) = fewest_pieces(m, c_max, finest, slack, peak);
            // the peak returned is the picked cut's
            assert_eq!(picked, peak(pieces), "{slack}");
            pieces
        };
        assert_eq!(cut(0.0), cpu);
        let at = |columns, rows| FrontPieces { columns, rows };
        assert_eq!(cut(FRONT_PIECES_PEAK_SLACK), at(4096, 256));
        assert_eq!(cut(0.0125), at(8192, 256));
        // columns first, then the rows the rest of the slack allows
        assert_eq!(cut(0.0315), at(32_768, 128));
        assert_eq!(cut(0.035), at(32_768, 256));
        assert_eq!(cut(1.0), at(65_536, 256));
        for slack in [0.0, 0.005, 0.0125, 0.0315, 0.035, 1.0] {
            let p = peak(cut(slack)).unwrap();
            assert!(p as f64 <= finest as f64 * (1.0 + slack), "{slack}: {p}");
        }
        let untraceable = fewest_pieces(m, c_max, finest, 1.0, |p| (p == cpu).then_some(finest));
        assert_eq!(untraceable, (cpu, Some(finest)));
        let nothing = fewest_pieces(m, c_max, finest, 1.0, |_| None);
        assert_eq!(nothing, (cpu, None));
    }
}
