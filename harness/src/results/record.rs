//! One result row: its identity columns from the job, the analytic columns from the model and
//! the measured ones from the isolated child ([`measure_row`], the whole pipeline of one row,
//! shared by `run`, `bench-all` and the sweep runner), rerun when the child was killed or
//! crashed and the user asked for retries ([`measure_row_retrying`]). A peer's row
//! ([`Target::Peer`]) comes from the peer's child instead: its JSON line for the measured
//! columns, its RESULT file compared here with the same f64 reference.

use crate::measure::child::{self, Outcome};
use crate::measure::device::{DeviceOps, DeviceSpec};
use crate::measure::estimates;
use crate::measure::peer;
use crate::measure::reference::{Cache, Reference};
use crate::measure::step as measure;
use crate::plan::job::{git_rev, job_key, Math, Peer, PeerVariant, Settings, Target, VERSION};
use crate::results::row::{Aside, Row, DENSEBENCH, EAGER, PYTORCH, SCHEMA_VERSION, TF32_OWN_ERROR};
use anyhow::{bail, Context, Result};
use impls::{Config, Variant};

/// The row of `variant` (densebench's or a peer's) on `cfg` with every identity column filled
/// and no measurement yet (status `error`, "not measured", until the measurement fills it in).
/// A peer row's `framework_version` is the one the `--check` probe reported (the peer's JSON
/// line replaces it when it ran).
pub fn identity_row(variant: impl Into<Target>, cfg: &Config, s: &Settings) -> Row {
    let target = variant.into();
    let (framework, framework_version) = match target {
        Target::Densebench(_) => (DENSEBENCH, VERSION.to_string()),
        Target::Peer(_) => (
            PYTORCH,
            peer::probed_version().unwrap_or_default().to_string(),
        ),
    };
    Row {
        schema: SCHEMA_VERSION,
        key: job_key(target, cfg, s.device, s.math, s.execution),
        variant: target.name(),
        family: cfg.family.name().to_string(),
        batch: cfg.batch,
        channels: cfg.channels,
        growth: cfg.growth,
        depth: cfg.depth,
        bn_size: cfg.bn_size,
        size: cfg.size,
        activation: cfg.activation,
        dtype: cfg.dtype.as_str().to_string(),
        seed: cfg.seed,
        device: s.device.to_string(),
        device_desc: s.device.describe(s.threads),
        threads: if s.device == DeviceSpec::Cpu {
            s.threads
        } else {
            0
        },
        densebench_version: VERSION.to_string(),
        git_rev: git_rev().to_string(),
        timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        status: "error".to_string(),
        error: "not measured".to_string(),
        steps: s.steps,
        warmup: s.warmup,
        framework: framework.to_string(),
        framework_version,
        math: s.math.name().to_string(),
        execution: target.execution(s.device, s.execution).name().to_string(),
        ..Row::default()
    }
}

/// [`identity_row`] with the columns every row of `target` on `cfg` shares whoever runs it:
/// densebench's FLOP count of the step and, on the CPU, this machine's matmul rate.
fn rated_row(target: Target, cfg: &Config, s: &Settings) -> Row {
    let mut row = identity_row(target, cfg, s);
    row.flops = estimates::flops(cfg);
    row.machine_gflops = if s.device == DeviceSpec::Cpu {
        estimates::machine_gflops(cfg.dtype, s.threads)
    } else {
        None
    };
    row
}

/// Measures `target` on `cfg` under `s` and returns its complete row, whatever happens to the
/// child: failures become the row's status. `peer`: the peer framework the config is compared
/// with in this run (the f32 tolerance of densebench rows comes from it, [`Cache::tolerance`]).
/// Errs only when no child can be started at all.
pub fn measure_row(
    target: Target,
    cfg: &Config,
    s: &Settings,
    peer: Option<Peer>,
    refs: &mut Cache,
) -> Result<Row> {
    // A CPU job that cannot hold even its parameters, input, output and their gradients within
    // its memory limit is an `oom` row at once: no child grows towards the limit for minutes
    // (issue 37), and the sweep goes on (an out-of-memory is a result, not a dead sweep).
    if s.device == DeviceSpec::Cpu {
        if let Err(e) = estimates::check_fits(
            cfg,
            estimates::min_step_bytes(cfg),
            estimates::STEP_BYTES,
            s.mem_limit,
            "its memory limit",
        ) {
            let mut row = rated_row(target, cfg, s);
            row.status = "oom".to_string();
            row.error = format!("not run: {e:#}");
            return Ok(finish(row));
        }
    }
    match target {
        Target::Densebench(v) => measure_densebench_row(v, cfg, s, peer, refs),
        Target::Peer(p) => measure_peer_row(p, cfg, s, refs),
    }
}

fn measure_densebench_row(
    variant: Variant,
    cfg: &Config,
    s: &Settings,
    peer: Option<Peer>,
    refs: &mut Cache,
) -> Result<Row> {
    let mut row = rated_row(variant.into(), cfg, s);
    row.declared_saved_bytes = estimates::declared_saved_bytes(variant, cfg);
    row.predicted_peak_bytes =
        estimates::predicted_peak_bytes(variant, cfg, s.device == DeviceSpec::Cpu, s.threads);
    if let Err(e) = s.device.check_available() {
        row.error = e.to_string();
        return Ok(row);
    }
    let reference = refs.get(cfg, s)?;
    let mut args = child::flags(variant, cfg, s);
    if let Ok(r) = &reference {
        // A tf32 row's gradients are checked on an ieee step (`measure::measure`): the
        // tolerance is the one of ieee math (a peer's error measured in ieee, too).
        let checked = Settings {
            math: Math::Ieee,
            ..s.clone()
        };
        let (tolerance, note) = refs.tolerance(cfg, &checked, peer, r)?;
        row.note = note;
        args.extend([
            "--reference".to_string(),
            r.path.display().to_string(),
            "--reference-variant".to_string(),
            r.variant.name(),
            "--tolerance".to_string(),
            tolerance.to_string(),
        ]);
    }
    // a GPU row's notes of its kernels (cuDNN or the tap stack's chunks, split fronts) come
    // from the child, which asks its device (`Measurement::notes`)
    if s.device == DeviceSpec::Cpu && cfg.dtype == candle_core::DType::BF16 {
        // which kernel the child's bf16 products take: its bits depend on it (the child runs
        // on this CPU with this environment, so it decides as this process does)
        add_note(&mut row, impls::ops::cpu::bf16_dot::describe().to_string());
        if crate::measure::device::cpu_has_amx() {
            add_note(&mut row, crate::measure::device::AMX_NOTE.to_string());
        }
    }
    let started = std::time::Instant::now();
    let outcome = child::spawn(&args, s)?;
    row.aside = Aside(Some(process_aside(started.elapsed(), &[])));
    row.status = outcome.status().to_string();
    row.error = match &outcome {
        Outcome::Ok(stdout) => {
            let no_graph = fill(&mut row, stdout)?;
            let checked = checked_message(&mut row, reference.as_ref().map(|_| ()));
            match no_graph {
                // A graph row without a verified replay timing is no result.
                Some(why) => {
                    row.status = "error".to_string();
                    why
                }
                None => checked,
            }
        }
        other => failure_message(other),
    };
    Ok(finish(row))
}

/// The `error` cell of a measured row: why it is unchecked (the status becomes `error`), why
/// its gradients are out of tolerance, or nothing.
fn checked_message(row: &mut Row, reference: std::result::Result<(), &String>) -> String {
    match (reference, row.grad_ok) {
        (Err(why), _) => {
            row.status = "error".to_string();
            format!("measured, but unchecked: {why}")
        }
        (Ok(()), Some(false)) => format!(
            "gradients differ from {}: max_rel_err {:e} > tolerance {:e}",
            row.reference,
            row.max_rel_err.unwrap_or(f64::NAN),
            row.tolerance.unwrap_or(f64::NAN)
        ),
        _ => String::new(),
    }
}

/// The `error` cell of a child that did not end with a measurement.
fn failure_message(o: &Outcome) -> String {
    match o {
        Outcome::Ok(_) => String::new(),
        Outcome::Oom(m) | Outcome::Killed(m) | Outcome::Crashed(m) => m.clone(),
        Outcome::Timeout(t) => format!("killed after the {} s time limit", t.as_secs()),
        Outcome::Error(m) => m.clone(),
    }
}

/// What every row gets last: a NaN or infinite error is never within tolerance, whatever the
/// child concluded; one line per cell (a message with newlines would still be valid CSV, but
/// not greppable).
fn finish(mut row: Row) -> Row {
    if row.has_non_finite_error() {
        row.grad_ok = Some(false);
    }
    row.error = row.error.replace(['\n', '\r'], " | ");
    row.note = row.note.replace(['\n', '\r'], " | ");
    row
}

/// The `note` of a peer row whose BatchNorm running stats PyTorch updated twice per step.
pub const DOUBLE_UPDATE_NOTE: &str = "torchvision's memory_efficient=True updates norm1's \
     running stats twice per step (recomputed in backward by the checkpoint, \
     https://github.com/pytorch/pytorch/issues/96136); running stats were compared as they are \
     after forward.";

/// A peer row: the case file written (once per config, in the reference cache), the peer run
/// in its own child on it, its JSON line copied into the row and its RESULT compared with the
/// config's f64 reference. Peer rows are judged against a tolerance derived from densebench's
/// own f32 error on the case ([`Cache::peer_row_tolerance`]); the naive peer's error is
/// recorded for the config's densebench rows ([`Cache::tolerance`]). A peer that exits 0 but
/// prints garbage or writes a malformed or no RESULT gives an `error` row naming the peer's
/// command and the file; the sweep goes on.
fn measure_peer_row(
    variant: PeerVariant,
    cfg: &Config,
    s: &Settings,
    refs: &mut Cache,
) -> Result<Row> {
    let mut row = rated_row(Target::Peer(variant), cfg, s);
    if let Err(e) = s.device.check_available() {
        row.error = e.to_string();
        return Ok(row);
    }
    let reference = refs.get(cfg, s)?;
    let case = refs.case(cfg, s)?;
    let out = refs.dir().join(format!(
        "{}.result.tmp{}",
        row.key.replace('/', "_"),
        std::process::id()
    ));
    let started = std::time::Instant::now();
    let outcome = peer::run(variant, cfg, s, &case, &out);
    let process = started.elapsed();
    let result = outcome.and_then(|outcome| {
        row.status = outcome.status().to_string();
        row.error = match &outcome {
            Outcome::Ok(stdout) => {
                // What the peer printed and wrote is its own: garbage or a malformed RESULT is
                // this row's `error`, naming the peer and the file, and the sweep goes on.
                let checking = std::time::Instant::now();
                let judged = fill_peer(&mut row, stdout, process).and_then(|()| match &reference {
                    Ok(r) => judge_peer(&mut row, variant, cfg, s, refs, r, &out),
                    Err(_) => Ok(()),
                });
                if let Aside(Some(a)) = &mut row.aside {
                    a.push_str(&format!("; check {}", seconds(checking.elapsed())));
                }
                match judged {
                    Ok(()) => checked_message(&mut row, reference.as_ref().map(|_| ())),
                    Err(e) if crate::measure::interrupt::interrupted(&e).is_some() => {
                        return Err(e)
                    }
                    Err(e) => {
                        row.status = "error".to_string();
                        row.grad_ok = None;
                        format!(
                            "the peer `{}` ({}) exited 0, but: {e:#}",
                            peer::command_line(),
                            peer::interpreter()
                        )
                    }
                }
            }
            other => failure_message(other),
        };
        Ok(())
    });
    let _ = std::fs::remove_file(&out);
    result?;
    Ok(finish(row))
}

/// `d` in seconds for a progress line: `12.3 s`, `0.42 s`.
fn seconds(d: std::time::Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.2} s")
    }
}

/// Where a peer's `process` (its child's whole run, start to exit) spent its time, from the
/// phases its JSON line reports: `process 12.3 s: import 3.10 s, setup 0.96 s, …` (the
/// process alone from a peer that reports none).
fn process_aside(process: std::time::Duration, phases: &[(String, u64)]) -> String {
    let mut s = format!("process {}", seconds(process));
    let named: Vec<String> = phases
        .iter()
        .map(|(name, ns)| format!("{name} {}", seconds(std::time::Duration::from_nanos(*ns))))
        .collect();
    if !named.is_empty() {
        s.push_str(&format!(": {}", named.join(", ")));
    }
    s
}

/// Copies the peer's JSON line into the row; `process` is how long its child ran (for the
/// row's progress line, with the phases the peer reports).
fn fill_peer(row: &mut Row, stdout: &str, process: std::time::Duration) -> Result<()> {
    let m = peer::parse(stdout)?;
    // Every reader of the file (`--resume` included) refuses a row whose timeline does not read.
    crate::results::row::timeline_points(&m.timeline).context("the peer's timeline")?;
    row.aside = Aside(Some(process_aside(process, &m.phases_ns)));
    let execution = m.execution.as_deref().unwrap_or(EAGER);
    if execution != row.execution {
        bail!(
            "the peer says its step ran `{execution}`, but `{}` on {} runs `{}`: the peer \
             script and this densebench disagree (rebuild or update both)",
            row.variant,
            row.device,
            row.execution
        );
    }
    // the key says the math asked for: a peer that ran another would put its time under it
    if m.math != row.math {
        bail!(
            "the peer says its step ran in `{}` math, but `{}` asked for `{}`: the peer script \
             and this densebench disagree (rebuild or update both)",
            m.math,
            row.key,
            row.math
        );
    }
    row.framework_version = m.framework_version.clone();
    row.device_desc = m.device_desc.clone();
    row.compile_ns = m.compile_ns;
    if let Some(w) = m.warmup {
        row.warmup = w;
    }
    let stats = |median_ns, min_ns, max_ns| measure::Stats {
        median_ns,
        min_ns,
        max_ns,
    };
    fill_measured(
        row,
        Measured {
            threads: m.threads,
            baseline: m.baseline_bytes,
            peak: m.peak_bytes,
            saved: m.saved_bytes,
            rss: m.peak_rss_bytes,
            forward: stats(m.fwd_median_ns, m.fwd_min_ns, m.fwd_max_ns),
            backward: stats(m.bwd_median_ns, m.bwd_min_ns, m.bwd_max_ns),
            total: stats(m.median_ns, m.min_ns, m.max_ns),
            timeline: m.timeline.clone(),
        },
    );
    if !m.updated_twice().is_empty() {
        row.note = DOUBLE_UPDATE_NOTE.to_string();
    }
    Ok(())
}

/// Compares the peer's RESULT `out` with the reference and fills the error columns; records
/// the naive peer's error for the config's densebench rows.
fn judge_peer(
    row: &mut Row,
    variant: PeerVariant,
    cfg: &Config,
    s: &Settings,
    refs: &Cache,
    reference: &Reference,
    out: &std::path::Path,
) -> Result<()> {
    let c = peer::compare(cfg, &refs.case(cfg, s)?, out, &reference.path)?;
    let label = measure::reference_label(reference.variant);
    let (tolerance, note) = refs.peer_row_tolerance(cfg, s, reference)?;
    let e = measure::Errors::from_comparison(&c, label.clone(), tolerance);
    if variant == PeerVariant::NAIVE && e.max_rel.is_finite() {
        refs.record_peer_error(cfg, s, variant, &label, e.max_rel)?;
    }
    fill_errors(row, e);
    if !note.is_empty() {
        add_note(row, note);
    }
    Ok(())
}

/// What a measuring child reports, densebench's or a peer's.
struct Measured {
    threads: usize,
    baseline: u64,
    peak: u64,
    saved: Option<u64>,
    rss: Option<u64>,
    forward: measure::Stats,
    backward: measure::Stats,
    total: measure::Stats,
    timeline: String,
}

/// The measured columns, the same for every child: threads (a CPU row's; a GPU row's compute
/// is the GPU's, 0 as documented), bytes, the three timing statistics, the rate, the timeline.
fn fill_measured(row: &mut Row, m: Measured) {
    row.threads = if row.device == DeviceSpec::Cpu.to_string() {
        m.threads
    } else {
        0
    };
    row.baseline_bytes = Some(m.baseline);
    row.peak_bytes = Some(m.peak);
    row.saved_bytes = m.saved;
    row.peak_rss_bytes = m.rss;
    row.fwd_median_ns = Some(m.forward.median_ns);
    row.fwd_min_ns = Some(m.forward.min_ns);
    row.fwd_max_ns = Some(m.forward.max_ns);
    row.bwd_median_ns = Some(m.backward.median_ns);
    row.bwd_min_ns = Some(m.backward.min_ns);
    row.bwd_max_ns = Some(m.backward.max_ns);
    row.median_ns = Some(m.total.median_ns);
    row.min_ns = Some(m.total.min_ns);
    row.max_ns = Some(m.total.max_ns);
    row.gflops_per_s = estimates::gflops_per_s(row.flops, row.median_ns);
    row.timeline = m.timeline;
}

/// The error columns from a comparison.
fn fill_errors(row: &mut Row, e: measure::Errors) {
    row.reference = e.reference;
    row.max_abs_err = Some(e.max_abs);
    row.max_rel_err = Some(e.max_rel);
    row.output_max_abs_err = Some(e.output_max_abs);
    row.grad_input_max_abs_err = Some(e.grad_input_max_abs);
    row.grad_params_max_abs_err = Some(e.grad_params_max_abs);
    row.running_max_abs_err = Some(e.running_max_abs);
    row.bitwise_equal = Some(e.bitwise_equal);
    row.grad_ok = Some(e.grad_ok);
    row.tolerance = Some(e.tolerance);
}

/// [`measure_row`], rerun up to `retries` times while its status is one of
/// [`child::RETRIED_STATUSES`] (`killed`, `crashed`: the next run may well end otherwise).
/// `on_retry(row, n)` is told before rerun `n` (from 1) with the row that failed. A row that
/// still fails says how many times it ran.
pub fn measure_row_retrying(
    target: Target,
    cfg: &Config,
    s: &Settings,
    peer: Option<Peer>,
    refs: &mut Cache,
    retries: usize,
    on_retry: &mut dyn FnMut(&Row, usize),
) -> Result<Row> {
    let mut attempt = 0;
    loop {
        let mut row = measure_row(target, cfg, s, peer, refs)?;
        if !child::RETRIED_STATUSES.contains(&row.status.as_str()) {
            return Ok(row);
        }
        if attempt == retries {
            if retries > 0 {
                row.error = format!("{} (ran {} times)", row.error, retries + 1);
            }
            return Ok(row);
        }
        attempt += 1;
        on_retry(&row, attempt);
    }
}

/// Copies the child's measurement into the row.
/// Appends `text` to the row's `note` (`; ` between notes).
fn add_note(row: &mut Row, text: String) {
    row.note = if row.note.is_empty() {
        text
    } else {
        format!("{}; {text}", row.note)
    };
}

/// Fills a densebench row from its child's measurement; returns why a graph row has no graph
/// timing, if it has none.
fn fill(row: &mut Row, stdout: &str) -> Result<Option<String>> {
    let m = child::parse_measurement(stdout)?;
    fill_measured(
        row,
        Measured {
            threads: m.threads,
            baseline: m.baseline_bytes,
            peak: m.peak_bytes,
            saved: Some(m.saved_bytes),
            rss: m.peak_rss_bytes,
            forward: m.forward,
            backward: m.backward,
            total: m.total,
            timeline: m.timeline,
        },
    );
    for note in m.notes {
        add_note(row, note);
    }
    if let Some(p) = m.predicted_peak_bytes {
        // The child measured the pool's charge per allocation size (GPU): its prediction
        // replaces the parent's. Two things can part them, each said by itself: the kernels'
        // workspaces as the device plans them (cuDNN's; the parent predicts them at 0 bytes)
        // and the pool's rounding of each request.
        let parent = row.predicted_peak_bytes.filter(|&e| e > 0);
        let percent = |new: u64, old: u64| (new as f64 / old as f64 - 1.0) * 100.0;
        let request = m.predicted_request_bytes.filter(|&r| r > 0);
        if let (Some(old), Some(r)) = (parent, request) {
            if r != old {
                add_note(
                    row,
                    format!(
                        "predicted with the workspaces the device planned ({:+.1}% over the \
                         prediction without the device)",
                        percent(r, old)
                    ),
                );
            }
        }
        // An older child reports no request-size prediction: its difference is all rounding.
        if let Some(exact) = request.or(parent).filter(|&e| e != p) {
            let rounding = format!(
                "predicted with the memory pool's rounding ({:+.1}% over request sizes)",
                percent(p, exact)
            );
            add_note(row, rounding);
        }
        row.predicted_peak_bytes = Some(p);
    }
    if let Some(w) = m.warning {
        // No schema column for it: the device description carries it, next to the device.
        row.device_desc = format!("{} [warning: {w}]", row.device_desc);
    }
    if let Some(e) = m.errors {
        fill_errors(row, e);
    }
    if let Some(e) = m.tf32_max_rel_err {
        // A tf32 row: the check columns are its ieee check step's (see `measure::measure`).
        let e: f64 = e.parse().unwrap_or(f64::NAN);
        let sane = e <= measure::TF32_REL_BOUND; // false for NaN
        let tf32 = format!(
            "gradients checked on an ieee step of the same code; {TF32_OWN_ERROR}{e:.2e}{}",
            if sane {
                String::new()
            } else {
                format!(", beyond the TF32 sanity bound {}", measure::TF32_REL_BOUND)
            }
        );
        if !sane {
            row.grad_ok = Some(false);
        }
        add_note(row, tf32);
    }
    if row.execution == "graph" {
        return Ok(graph_columns(row, m.graph, m.cuda_graph));
    }
    if let Some(g) = m.cuda_graph {
        add_note(row, g);
    }
    Ok(None)
}

/// A graph row's timing columns: the CUDA-graph replays' (the whole step is one graph: no
/// forward/backward split), the eager steps' median kept in the note. Without a verified replay
/// timing the row is no result: returns the child's reason (the row becomes an `error`).
fn graph_columns(
    row: &mut Row,
    graph: Option<measure::Stats>,
    why: Option<String>,
) -> Option<String> {
    let Some(g) = graph else {
        return Some(why.unwrap_or_else(|| "the child reported no CUDA graph timing".to_string()));
    };
    let eager = row.median_ns;
    row.median_ns = Some(g.median_ns);
    row.min_ns = Some(g.min_ns);
    row.max_ns = Some(g.max_ns);
    for c in [
        &mut row.fwd_median_ns,
        &mut row.fwd_min_ns,
        &mut row.fwd_max_ns,
        &mut row.bwd_median_ns,
        &mut row.bwd_min_ns,
        &mut row.bwd_max_ns,
    ] {
        *c = None;
    }
    row.gflops_per_s = estimates::gflops_per_s(row.flops, row.median_ns);
    add_note(
        row,
        format!(
            "the whole step replayed as one CUDA graph (median of {} replays after an untimed \
             one; results bitwise those of the checked eager step{}); memory columns are the \
             eager step's",
            row.steps,
            eager.map_or(String::new(), |e| format!(", whose median was {e} ns"))
        ),
    );
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::measure::step::Stats;

    fn measurement(predicted: Option<u64>) -> String {
        let stats = Stats::of(&[10]);
        serde_json::to_string(&crate::measure::step::Measurement {
            threads: 1,
            baseline_bytes: 0,
            peak_bytes: 1000,
            saved_bytes: 0,
            peak_rss_bytes: None,
            forward: stats,
            backward: stats,
            total: stats,
            timeline: String::new(),
            errors: None,
            warning: None,
            predicted_peak_bytes: predicted,
            predicted_request_bytes: None,
            notes: Vec::new(),
            tf32_max_rel_err: None,
            cuda_graph: None,
            graph: None,
        })
        .unwrap()
    }

    #[test]
    fn a_peer_rows_progress_line_says_where_its_process_spent_its_time_and_the_csv_does_not() {
        let line = |phases: &str| {
            format!(
                r#"{{"framework":"pytorch","framework_version":"torch 2.15.0","device_desc":"cpu (1 threads)","threads":1,"math":"ieee","peak_bytes":10,"baseline_bytes":5,"saved_bytes":3,"peak_rss_bytes":null,"median_ns":9,"min_ns":8,"max_ns":10,"fwd_median_ns":4,"fwd_min_ns":4,"fwd_max_ns":4,"bwd_median_ns":5,"bwd_min_ns":5,"bwd_max_ns":5{phases}}}"#
            )
        };
        let mut row = Row {
            key: "pytorch-naive/k".into(),
            status: "ok".into(),
            execution: EAGER.into(),
            math: "ieee".into(),
            ..Row::default()
        };
        let phases = r#","phases_ns":[["import",2470000000],["setup",6000000],["warm-up",31000000],["probe",8000000],["steps",41000000],["result",3000000]]"#;
        fill_peer(
            &mut row,
            &line(phases),
            std::time::Duration::from_millis(12_345),
        )
        .unwrap();
        let summary = row.summary("");
        assert!(
            summary.ends_with(
                "[process 12.3 s: import 2.47 s, setup 0.01 s, warm-up 0.03 s, probe 0.01 s, \
                 steps 0.04 s, result 0.00 s]"
            ),
            "{summary}"
        );
        // not a column: the row written and read back is the same row, without it
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.csv");
        let mut w = csv::Writer::from_path(&path).unwrap();
        w.serialize(&row).unwrap();
        w.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("import") && !text.contains("aside"),
            "{text}"
        );
        let back: Row = csv::Reader::from_path(&path)
            .unwrap()
            .deserialize()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(back, row);
        assert!(!back.summary("").contains("process"));
        // a peer whose math is not the row's: an error, not a row filed under another key
        let mut tf32 = Row {
            key: "pytorch-naive/k".into(),
            execution: EAGER.into(),
            math: "tf32".into(),
            ..Row::default()
        };
        let e = fill_peer(&mut tf32, &line(phases), std::time::Duration::ZERO).unwrap_err();
        assert!(format!("{e:#}").contains("`ieee` math"), "{e:#}");
        // an older peer that reports no phases: the process alone
        let mut older = Row {
            execution: EAGER.into(),
            math: "ieee".into(),
            ..Row::default()
        };
        fill_peer(
            &mut older,
            &line(""),
            std::time::Duration::from_millis(2_500),
        )
        .unwrap();
        assert!(older.summary("").ends_with("[process 2.50 s]"));
    }

    #[test]
    fn a_graph_row_is_timed_by_its_replays_and_is_an_error_without_them() {
        let with_graph = |graph: Option<Stats>, why: Option<&str>| {
            let mut json: serde_json::Value = serde_json::from_str(&measurement(None)).unwrap();
            json["graph"] = serde_json::to_value(graph).unwrap();
            json["cuda_graph"] = serde_json::to_value(why).unwrap();
            let mut row = Row {
                execution: "graph".into(),
                steps: 5,
                ..Row::default()
            };
            let no_graph = fill(&mut row, &json.to_string()).unwrap();
            (row, no_graph)
        };
        let replays = Stats {
            median_ns: 4,
            min_ns: 3,
            max_ns: 6,
        };
        let (row, no_graph) = with_graph(Some(replays), None);
        assert_eq!(no_graph, None);
        // The eager steps' median was 10 ns (measurement()); the replays' 4 ns are the row's.
        assert_eq!(
            (row.median_ns, row.min_ns, row.max_ns),
            (Some(4), Some(3), Some(6))
        );
        assert_eq!((row.fwd_median_ns, row.bwd_median_ns), (None, None));
        assert!(row.note.contains("median was 10 ns"), "{}", row.note);
        let (_, no_graph) = with_graph(None, Some("CUDA graph timing not reported: refused"));
        assert_eq!(
            no_graph.as_deref(),
            Some("CUDA graph timing not reported: refused")
        );
        // An eager row keeps its own times.
        let mut row = Row::default();
        assert_eq!(fill(&mut row, &measurement(None)).unwrap(), None);
        assert_eq!(row.median_ns, Some(10));
    }

    #[test]
    fn a_childs_pool_charged_prediction_replaces_the_request_size_one_and_says_so() {
        let mut row = Row {
            predicted_peak_bytes: Some(800),
            note: "tolerance from the peer".into(),
            ..Row::default()
        };
        fill(&mut row, &measurement(Some(1000))).unwrap();
        assert_eq!(row.predicted_peak_bytes, Some(1000));
        assert_eq!(
            row.note,
            "tolerance from the peer; predicted with the memory pool's rounding \
             (+25.0% over request sizes)"
        );
        // cuDNN's workspaces, which the parent predicted at 0 bytes, are named as such, apart
        // from the rounding (here none: the pool charged each request exactly).
        let with_request = |request: u64, pool: u64| {
            let mut json: serde_json::Value =
                serde_json::from_str(&measurement(Some(pool))).unwrap();
            json["predicted_request_bytes"] = serde_json::json!(request);
            let mut row = Row {
                predicted_peak_bytes: Some(800),
                ..Row::default()
            };
            fill(&mut row, &json.to_string()).unwrap();
            row
        };
        let row = with_request(1000, 1000);
        assert_eq!(row.predicted_peak_bytes, Some(1000));
        assert_eq!(
            row.note,
            "predicted with the workspaces the device planned (+25.0% over the prediction \
             without the device)"
        );
        // Both: the rounding is over the device's request sizes, not the parent's.
        let row = with_request(1000, 1100);
        assert_eq!(
            row.note,
            "predicted with the workspaces the device planned (+25.0% over the prediction \
             without the device); predicted with the memory pool's rounding (+10.0% over \
             request sizes)"
        );
        // Rounding alone (the tap stack: the parent's request sizes are the device's).
        let row = with_request(800, 1000);
        assert_eq!(
            row.note,
            "predicted with the memory pool's rounding (+25.0% over request sizes)"
        );
        // A child that measured no pool (CPU) leaves the parent's prediction and note alone.
        let mut row = Row {
            predicted_peak_bytes: Some(800),
            ..Row::default()
        };
        fill(&mut row, &measurement(None)).unwrap();
        assert_eq!(
            (row.predicted_peak_bytes, row.note.as_str()),
            (Some(800), "")
        );
    }

    #[test]
    fn a_tf32_rows_own_error_goes_in_its_note_and_fails_it_only_beyond_the_sanity_bound() {
        let with_tf32 = |e: f64| {
            let mut json: serde_json::Value = serde_json::from_str(&measurement(None)).unwrap();
            json["tf32_max_rel_err"] = serde_json::json!(e.to_string());
            let mut row = Row {
                grad_ok: Some(true),
                ..Row::default()
            };
            fill(&mut row, &json.to_string()).unwrap();
            row
        };
        let row = with_tf32(0.139);
        assert_eq!(row.grad_ok, Some(true));
        assert_eq!(
            row.note,
            "gradients checked on an ieee step of the same code; the tf32 step's own error \
             against f64 is 1.39e-1"
        );
        let row = with_tf32(3.0);
        assert_eq!(row.grad_ok, Some(false));
        assert!(
            row.note.ends_with("beyond the TF32 sanity bound 1"),
            "{}",
            row.note
        );
        // A NaN survives the JSON line (as text) and fails the row.
        let row = with_tf32(f64::NAN);
        assert_eq!(row.grad_ok, Some(false), "{}", row.note);
        assert!(row.note.contains("is NaN, beyond"), "{}", row.note);
    }

    #[test]
    fn a_measurement_from_an_older_child_without_the_prediction_still_parses() {
        let mut json: serde_json::Value = serde_json::from_str(&measurement(None)).unwrap();
        json.as_object_mut().unwrap().remove("predicted_peak_bytes");
        let m = crate::measure::child::parse_measurement(&json.to_string()).unwrap();
        assert_eq!(m.predicted_peak_bytes, None);
    }
}
