//! The command line: clap definitions and dispatch to each subcommand's file in `commands/`,
//! and the exit status of an error: 2 for bad input (clap's usage errors, and errors marked
//! [`BadInput`](crate::plan::bounds::BadInput)), 128 + the signal for a run stopped by one, 1
//! for everything else.

use crate::commands::{
    bench_all, case, child, compare, criterion_import, max_depth, merge, plan, plots, report, run,
    step,
};
use crate::measure::interrupt;
use crate::plan::bounds;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// densebench: dense-block memory strategies, measured on identical inputs and weights.
#[derive(Parser)]
#[command(name = "densebench", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Measure one configuration of one variant in an isolated child process; print one row.
    Run(run::Args),
    /// Run a sweep (default: harness/sweeps/default.toml) into a result CSV.
    BenchAll(bench_all::Args),
    /// Show how a sweep splits into shards (`bench-all --shard I/N`): keys and predicted costs.
    Plan(plan::Args),
    /// Combine result CSVs (shard files) by key; report keys of the sweep still missing.
    Merge(merge::Args),
    /// Write the case file of a config (parameters, input, upstream gradient) for another
    /// framework or `step`.
    Case(case::Args),
    /// One training step from a safetensors case file, results written to safetensors.
    Step(step::Args),
    /// Compare two result CSVs: ratios NEW/BASE per metric, regressions flagged.
    Compare(compare::Args),
    /// Regenerate every figure (SVG and PNG) from a result CSV.
    Plots(plots::Args),
    /// Write a markdown report from a result CSV.
    Report(report::Args),
    /// How deep a block fits in a memory budget, per variant (model, confirmed by measured runs).
    MaxDepth(max_depth::Args),
    /// Import criterion's estimates (target/criterion, from `cargo bench`) into a companion CSV.
    CriterionImport(criterion_import::Args),
    /// Internal: the measuring child process (spawned by `run` and `bench-all`).
    #[command(hide = true)]
    Child(child::Args),
}

/// Exit status for bad input and usage, as clap's own usage errors.
const BAD_INPUT: u8 = 2;

/// Makes this (the main) thread one of the compute threads of rayon's global pool, the pool
/// candle, `gemm` and densebench's kernels run on, in the processes that run steps (`child`,
/// `step`): `RAYON_NUM_THREADS` threads in all, this one included. Otherwise the main thread
/// only hands every parallel op to the pool's threads and sleeps until they are done — two
/// thread wake-ups per op, about a hundred per step of a small bc block, whose latency differs
/// from one process to the next: on a 6 ms step (1 thread) the same binary's rows came out
/// 4–11 ms, the `child` and `step --bare-loop` processes apart by up to ×1.5, and the fidelity
/// check failed on it. With the main thread in the pool, one thread runs a 1-thread step with
/// no hand-off at all, as PyTorch's intra-op pool runs its calling thread. A pool that already
/// exists (it cannot: nothing before this touches rayon) is kept.
fn join_compute_pool() {
    let _ = rayon::ThreadPoolBuilder::new()
        .use_current_thread()
        .build_global();
}

/// The command line, or the process ends with clap's message: status 2 for a usage mistake
/// (0 for `--help` and `--version`), but 1 for `merge`'s, whose status 2 means "merged, keys of
/// the sweep missing" and 1 "nothing written" (`merge --help`).
fn parse() -> Cli {
    let matches = negatives_reach_parsers(Cli::command()).try_get_matches();
    matches
        .and_then(|m| Cli::from_arg_matches(&m))
        .unwrap_or_else(|e| {
            let merge = std::env::args_os().nth(1).is_some_and(|a| a == "merge");
            let status = if merge { 1 } else { 2 };
            if let Some(text) = integer_error_in_words(&e) {
                eprint!("{text}");
                std::process::exit(status);
            }
            if merge && e.use_stderr() {
                let _ = e.print();
                std::process::exit(1);
            }
            e.exit()
        })
}

/// What Rust's integer parser says of a count flag's value, and what its user reads instead.
const INTEGER_ERRORS: [(&str, &str); 3] = [
    (
        "invalid digit found in string",
        "not a whole number (0, 1, 2, …)",
    ),
    (
        "number too large to fit in target type",
        "too large for this flag",
    ),
    (
        "cannot parse integer from empty string",
        "empty: a whole number is expected",
    ),
];

/// `e`'s message with the integer parser's words replaced ([`INTEGER_ERRORS`]): `--batch -1`
/// said "invalid digit found in string"; `None` for any other error.
fn integer_error_in_words(e: &clap::Error) -> Option<String> {
    if e.kind() != clap::error::ErrorKind::ValueValidation {
        return None;
    }
    let text = e.to_string();
    INTEGER_ERRORS
        .iter()
        .find(|(raw, _)| text.contains(raw))
        .map(|(raw, words)| text.replace(raw, words))
}

/// `cmd` with every option that takes a value, in every subcommand, taking a negative number
/// as its value: `--batch -1` then reaches the flag's own parser, which says what the flag
/// takes (`invalid value '-1' for '--batch'`), where clap said only "unexpected argument '-1'
/// found", naming no flag. No densebench flag is a number (a `-1` is never a flag).
fn negatives_reach_parsers(cmd: clap::Command) -> clap::Command {
    cmd.mut_args(|a| {
        if a.get_action().takes_values() {
            a.allow_negative_numbers(true)
        } else {
            a
        }
    })
    .mut_subcommands(negatives_reach_parsers)
}

/// The tuning variables a step reads (`DENSEBENCH_TAP_CHUNK_COLUMNS`, `DENSEBENCH_WHOLE_FRONT`,
/// `DENSEBENCH_FRONT_SLACK`), each read as the step reads it. A malformed one fails every step
/// that reads it (an `error` row per job), and the memory model, which takes a malformed
/// `DENSEBENCH_WHOLE_FRONT` for unset, would answer `max-depth --no-confirm` for the split front.
fn check_tuning_variables() -> anyhow::Result<()> {
    impls::layer::tap_chunk_override()?;
    impls::layer::whole_front_override()?;
    impls::model::schedule::front_pieces_slack()?;
    Ok(())
}

/// Parses the command line and runs it; errors are printed with their whole cause chain.
pub fn main() -> ExitCode {
    interrupt::ignore_file_size_signal();
    let cli = parse();
    let measures = matches!(
        cli.command,
        None | Some(
            Command::Run(_) | Command::BenchAll(_) | Command::MaxDepth(_) | Command::Step(_)
        )
    );
    // A malformed tuning variable is bad input, refused before any child starts.
    let environment = match measures {
        true => check_tuning_variables().map_err(bounds::bad_input),
        false => Ok(()),
    };
    if matches!(cli.command, Some(Command::Child(_) | Command::Step(_))) {
        join_compute_pool();
    }
    let result = environment.and_then(|()| match cli.command {
        // `cargo run --release` with no arguments runs the main job: the default sweep.
        None => bench_all::run(bench_all::Args::default_sweep()),
        Some(Command::Run(a)) => run::run(a),
        Some(Command::BenchAll(a)) => bench_all::run(a),
        Some(Command::Plan(a)) => plan::run(a),
        // Status 2 is merge's "merged, keys missing": an unreadable input is 1, "nothing written".
        Some(Command::Merge(a)) => merge::run(a).map_err(bounds::not_bad_input),
        Some(Command::Case(a)) => case::run(a),
        Some(Command::Step(a)) => step::run(a),
        Some(Command::Compare(a)) => compare::run(a),
        Some(Command::Plots(a)) => plots::run(a),
        Some(Command::Report(a)) => report::run(a),
        Some(Command::MaxDepth(a)) => max_depth::run(a),
        Some(Command::CriterionImport(a)) => criterion_import::run(a),
        Some(Command::Child(a)) => child::run(a),
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            if let Some(stop) = interrupt::interrupted(&e) {
                crate::say!("densebench: {stop}: its child processes were killed");
                return ExitCode::from(stop.exit_status());
            }
            crate::say!("densebench: error: {e:#}");
            if bounds::is_bad_input(&e) {
                ExitCode::from(BAD_INPUT)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
