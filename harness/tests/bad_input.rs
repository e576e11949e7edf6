//! Hostile input and hostile events, through the real `densebench` binary: out-of-range flags
//! and sweep values, huge shard counts and sweeps, malformed sweep values (each: exit status 2,
//! one line naming the flag or key and the bound, no output file created); a parent stopped by
//! SIGTERM (children killed, no temporary file left, whole rows, `--resume` completes it); a
//! child killed by SIGKILL from outside (`killed`, not `oom`, and rerun by `--retries`); and a
//! bounded property test of the sweep parser (random and mutated files never panic).

use densebench::plan::sweep;
use densebench::results::row::read_rows;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{bin, densebench, path_str, stderr};

/// Exit status for bad input and usage (README, "Exit status").
const BAD_INPUT: i32 = 2;
/// A hostile input must fail at once: well under this, on 2 busy cores.
const AT_ONCE: Duration = Duration::from_secs(20);

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("writing a test file");
    p
}

/// Runs `densebench ARGS`, asserting it fails at once with status 2 and a message containing
/// every one of `needles`, on one line after clap's or densebench's prefix.
/// How `report`/`step` name a result CSV they refuse to replace: its own schema, read from its
/// first row (the committed reference is rewritten in the newest schema when it is rerun).
fn result_csv_kind(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("result CSV");
    let schema = text
        .lines()
        .nth(1)
        .and_then(|row| row.split(',').next())
        .expect("a result CSV with a row");
    format!("a densebench result CSV (schema {schema})")
}

fn refused(args: &[&str], needles: &[&str]) -> String {
    let start = Instant::now();
    let o = densebench(args);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(BAD_INPUT), "{args:?}: {err}");
    assert!(
        start.elapsed() < AT_ONCE,
        "{args:?} took {:?}",
        start.elapsed()
    );
    for n in needles {
        assert!(err.contains(n), "{args:?}: `{n}` not in: {err}");
    }
    assert!(o.stdout.is_empty(), "{args:?} printed a result");
    err
}

/// `run` on a tiny block with `extra` flags (`--variant cat-store-copy` unless given).
fn run_args(extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "run",
        "--family",
        "mlp",
        "--depth",
        "2",
        "--batch",
        "4",
        "--growth",
        "2",
        "--channels",
        "2",
    ];
    if !extra.contains(&"--variant") {
        a.extend(["--variant", "cat-store-copy"]);
    }
    a.extend_from_slice(extra);
    a.into_iter().map(str::to_string).collect()
}

/// `report` and `plots` refuse an output of the wrong kind (a folder for the report's file, a
/// file for the figures' folder) before any work, with status 2, writing nothing.
#[test]
fn report_and_plots_refuse_outputs_of_the_wrong_kind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let csv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../results/reference-cpu.csv")
        .to_string_lossy()
        .into_owned();
    let folder = dir.path().join("f");
    std::fs::create_dir(&folder).expect("folder");
    let file = write(dir.path(), "a-file.txt", "not a folder\n");
    let (folder, file) = (path_str(&folder), path_str(&file));
    refused(
        &["report", &csv, "--out", folder],
        &["--out", "is a folder", "REPORT.md"],
    );
    refused(
        &[
            "report",
            &csv,
            "--out",
            &format!("{folder}/R.md"),
            "--plots",
            file,
        ],
        &["--plots", "is a file"],
    );
    refused(&["plots", &csv, "--out", file], &["--out", "is a file"]);
    refused(&["plots", &csv, "--out", &csv], &["--out", "is a file"]);
    assert_eq!(
        std::fs::read_to_string(file).expect("file"),
        "not a folder\n",
        "untouched"
    );
    assert!(
        std::fs::read_dir(folder).expect("folder").next().is_none(),
        "nothing written"
    );
}

/// A command line built from an `--out` path and extra flags.
type Args<'a> = dyn Fn(&str, &[&str]) -> Vec<String> + 'a;

/// `report --out`, `case --out` and `max-depth --out` replace an earlier output of their own
/// kind (or an empty file), and refuse any other file — a result CSV above all — with status 2,
/// naming it and the way on, leaving it byte for byte; `--force` replaces it. (They used to
/// overwrite a result CSV silently, exit 0.)
/// `step --out` and `criterion-import --out` refuse a result CSV too (exit 2, unchanged);
/// `step` replaces an earlier result file, and a result CSV with `--force`.
#[test]
fn step_and_criterion_import_refuse_to_replace_a_result_csv() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let reference =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let results = std::fs::read(&reference).expect("the reference CSV");
    let victim = d.join("v.csv");
    std::fs::write(&victim, &results).expect("v.csv");
    let case = common::tiny_case(d);
    let step = |out: &std::path::Path, force: bool| {
        let mut a = vec![
            "step",
            "--case",
            path_str(&case),
            "--variant",
            "cat-store-copy",
            "--out",
            path_str(out),
        ];
        if force {
            a.push("--force");
        }
        densebench(&a)
    };
    let o = step(&victim, false);
    assert_eq!(o.status.code(), Some(BAD_INPUT), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&result_csv_kind(&victim)),
        "{}",
        stderr(&o)
    );
    let empty = d.join("criterion");
    std::fs::create_dir(&empty).expect("folder");
    let o = densebench(&[
        "criterion-import",
        "--dir",
        path_str(&empty),
        "--out",
        path_str(&victim),
    ]);
    assert_eq!(o.status.code(), Some(BAD_INPUT), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("not a criterion companion CSV"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&victim).expect("v.csv"), results, "replaced");
    let out = d.join("result.safetensors");
    for _ in 0..2 {
        let o = step(&out, false);
        assert!(o.status.success(), "an earlier result file: {}", stderr(&o));
    }
    let o = step(&victim, true);
    assert!(o.status.success(), "--force: {}", stderr(&o));
    // The case file does not record its seed: step does not print one (it said seed=0).
    let said = stderr(&o);
    assert!(
        said.contains("densebench step: cat-store-copy on mlp N=2"),
        "{said}"
    );
    assert!(!said.contains("seed="), "{said}");
}

/// `--bn-size` and `--size` on an mlp block are refused (exit 2) by `run`, `case` and
/// `max-depth`: an mlp layer has neither, and the flags were silently dropped (a row keyed
/// `size 1` for `--size 8`). The values the key records (1, which `run` passes its child) are
/// accepted, and the row says them.
#[test]
fn bc_only_flags_are_refused_for_mlp_blocks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mlp = "--family mlp --depth 1 --batch 2 --growth 2 --channels 2";
    let with = |cmd: &str, extra: &[&str]| {
        let mut a = vec![cmd.to_string()];
        a.extend(
            mlp.split(' ')
                .chain(extra.iter().copied())
                .map(str::to_string),
        );
        a
    };
    let case = dir.path().join("mlp.safetensors");
    for (flag, value, says) in [
        ("--size", "8", "--size 8 applies to bc blocks only"),
        ("--size", "2x3", "--size 2x3 applies to bc blocks only"),
        ("--bn-size", "4", "--bn-size 4 applies to bc blocks only"),
    ] {
        let run = with("run", &["--variant", "cat-store-copy", flag, value]);
        let make = with("case", &["--out", path_str(&case), flag, value]);
        let fits: Vec<String> = "max-depth --family mlp --budget 1GiB --no-confirm"
            .split(' ')
            .chain([flag, value])
            .map(str::to_string)
            .collect();
        for args in [run, make, fits] {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            refused(&args, &[says, "leave the flag out for mlp"]);
        }
        assert!(!case.exists());
    }
    let canonical = with(
        "run",
        &[
            "--variant",
            "cat-store-copy",
            "--bn-size",
            "1",
            "--size",
            "1",
        ],
    );
    let o = densebench(&canonical.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains(",cat-store-copy/mlp/2/2/2/1/1/1/on/f32/0/cpu,"),
        "{out}"
    );
}

/// `--activation off` on a bc block is refused (exit 2) by `run`, `case` and `step`: a bc layer
/// always has its ReLUs, and the flag was silently dropped (a `relu=on` row for it).
#[test]
fn activation_off_is_refused_for_bc_blocks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bc = [
        "--family",
        "bc",
        "--depth",
        "1",
        "--batch",
        "1",
        "--growth",
        "2",
        "--channels",
        "2",
        "--size",
        "3",
    ];
    let with = |cmd: &str, extra: &[&str]| {
        let mut a = vec![cmd];
        a.extend_from_slice(&bc);
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let case = dir.path().join("bc.safetensors");
    let run = with(
        "run",
        &["--variant", "cat-store-copy", "--activation", "off"],
    );
    let make = with("case", &["--out", path_str(&case), "--activation", "off"]);
    let fits: Vec<String> = [
        "max-depth",
        "--family",
        "bc",
        "--budget",
        "1GiB",
        "--no-confirm",
        "--activation",
        "off",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    for args in [run, make, fits] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, &["--activation off applies to mlp blocks only"]);
    }
    assert!(!case.exists());
    let made = with("case", &["--out", path_str(&case)]);
    let o = densebench(&made.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", stderr(&o));
    let out = dir.path().join("r.safetensors");
    refused(
        &[
            "step",
            "--case",
            path_str(&case),
            "--variant",
            "cat-store-copy",
            "--out",
            path_str(&out),
            "--activation",
            "off",
        ],
        &["--activation off applies to mlp cases only"],
    );
    assert!(!out.exists());
    // The bare loop's math and execution (the fidelity check's densebench side, issue 36) are
    // `run`'s, refused as `run` refuses them: a GPU's alone.
    let step = |extra: &[&str]| {
        let mut a = vec![
            "step",
            "--case",
            path_str(&case),
            "--variant",
            "cat-store-copy",
            "--out",
            path_str(&out),
            "--bare-loop",
            "2",
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    for (extra, needle) in [
        (&["--math", "tf32"][..], "--math: math `tf32` is a GPU mode"),
        (
            &["--execution", "graph"][..],
            "execution `graph` replays the step as a CUDA graph",
        ),
        (
            &["--execution", "compiled"][..],
            "execution `compiled` is torch.compile's",
        ),
    ] {
        let args = step(extra);
        refused(
            &args.iter().map(String::as_str).collect::<Vec<_>>(),
            &[needle],
        );
        assert!(!out.exists(), "{extra:?}");
    }
}

#[test]
fn outputs_refuse_to_replace_a_result_csv_or_a_file_of_another_kind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let reference =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let results = std::fs::read(&reference).expect("the reference CSV");
    let victim = d.join("v.csv");
    std::fs::write(&victim, &results).expect("v.csv");
    let notes = write(d, "notes.md", "my notes\n");
    let plots = d.join("plots");
    let (csv, plots) = (path_str(&reference), path_str(&plots));
    let report = |out: &str, extra: &[&str]| {
        let mut a = vec!["report", csv, "--out", out, "--plots", plots];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let case = |out: &str, extra: &[&str]| {
        let mut a = common::TINY_CASE.to_vec();
        a.extend(["--out", out]);
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let max_depth = |out: &str, extra: &[&str]| {
        let mut a = vec![
            "max-depth",
            "--family",
            "mlp",
            "--batch",
            "128",
            "--channels",
            "16",
            "--growth",
            "8",
            "--budget",
            "6MiB",
            "--no-confirm",
            "--variants",
            "cat-store-copy",
            "--out",
            out,
        ];
        a.extend_from_slice(extra);
        a.into_iter().map(str::to_string).collect::<Vec<_>>()
    };
    let commands: [(&Args<'_>, &str); 3] = [
        (&report, "r.md"),
        (&case, "c.safetensors"),
        (&max_depth, "md.csv"),
    ];
    let ok = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = densebench(&args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    };
    for (command, own) in commands {
        let refuse = |out: &std::path::Path, needles: &[&str]| {
            let args = command(path_str(out), &[]);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut all = vec!["--out", path_str(out), "--force", "another --out path"];
            all.extend_from_slice(needles);
            refused(&args, &all);
        };
        refuse(&victim, &[&result_csv_kind(&victim)]);
        assert_eq!(std::fs::read(&victim).expect("v.csv"), results, "replaced");
        refuse(&notes, &["a file starting `my notes`"]);
        assert_eq!(
            std::fs::read_to_string(&notes).expect("notes"),
            "my notes\n"
        );
        // Its own kind is replaced, and an empty file is taken.
        let own = d.join(own);
        std::fs::write(&own, "").expect("empty file");
        ok(&command(path_str(&own), &[]));
        let first = std::fs::read(&own).expect("written");
        assert!(!first.is_empty());
        ok(&command(path_str(&own), &[]));
    }
    // Each kind refuses the others' files.
    refuse_kind(&case(path_str(&d.join("r.md")), &[]), "not a case file");
    refuse_kind(
        &report(path_str(&d.join("md.csv")), &[]),
        "not a densebench report",
    );
    refuse_kind(
        &max_depth(path_str(&d.join("c.safetensors")), &[]),
        "a safetensors file, not a max-depth CSV",
    );
    // --force replaces a result CSV.
    ok(&max_depth(path_str(&victim), &["--force"]));
    let text = std::fs::read_to_string(&victim).expect("v.csv");
    assert!(
        text.starts_with("variant,family,budget_bytes,max_depth"),
        "{text}"
    );
}

fn refuse_kind(args: &[String], needle: &str) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(&args, &[needle]);
}

/// An existing folder as `case --out` is a usage mistake, exit 2 like every other command's
/// (it was 1), nothing written. `merge`'s usage mistakes (`--shards 0`, a missing `--sweep`
/// file, `--shards` without a sweep) exit 1, nothing written: its status 2 means "merged, keys
/// missing", and a script must tell that apart from nothing written.
#[test]
fn usage_mistakes_of_case_exit_2_and_of_merge_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let folder = d.join("folder");
    std::fs::create_dir(&folder).expect("folder");
    let mut case = common::TINY_CASE.to_vec();
    case.extend(["--out", path_str(&folder)]);
    refused(&case, &["--out", path_str(&folder), "is a folder"]);
    assert!(std::fs::read_dir(&folder).expect("folder").next().is_none());
    let input =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let (input, out) = (path_str(&input), d.join("merged.csv"));
    let missing = d.join("missing.toml");
    // merge's status 2 is "merged, keys missing": its usage mistakes exit 1, nothing written.
    let merge = |extra: &[&str], needles: &[&str]| {
        let mut a = vec!["merge", path_str(&out), input];
        a.extend_from_slice(extra);
        let o = densebench(&a);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{a:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{a:?}: `{n}` not in: {err}");
        }
        assert!(!out.exists(), "{a:?} wrote {}", out.display());
    };
    merge(
        &["--quick", "--shards", "0"],
        &["--shards must be at least 1"],
    );
    merge(&["--sweep", path_str(&missing)], &[path_str(&missing)]);
    merge(
        &["--shards", "3"],
        &["--shards and --devices describe a sweep"],
    );
}

#[test]
fn out_of_range_flags_fail_with_status_2_naming_the_flag_and_bound() {
    let run = run_args;
    let cases: Vec<(Vec<String>, Vec<&str>)> = vec![
        (run(&["--threads", "100000"]), vec!["--threads", "1024"]),
        (
            run(&["--timeout", "0"]),
            vec!["--timeout", "between 1 and 604800"],
        ),
        (run(&["--timeout", "700000"]), vec!["--timeout", "604800"]),
        (run(&["--mem-limit", "0"]), vec!["--mem-limit", "1 MiB"]),
        (run(&["--mem-limit", "1000K"]), vec!["--mem-limit", "1 MiB"]),
        (
            run(&["--steps", "0"]),
            vec!["--steps", "between 1 and 10000"],
        ),
        (run(&["--steps", "10001"]), vec!["--steps", "10000"]),
        (run(&["--warmup", "10001"]), vec!["--warmup", "10000"]),
        (run(&["--retries", "101"]), vec!["--retries", "100"]),
        // densebench's own bad input (not clap's) exits 2 as well.
        (run(&["--device", "tpu:0"]), vec!["--device"]),
        (
            run(&["--variant", "cat-store-kopy"]),
            vec!["--variant", "cat-store-kopy"],
        ),
        // TF32 is a GPU mode: refused on the CPU before any work, naming the flag.
        (run(&["--math", "tf32"]), vec!["--math", "GPU mode"]),
        (run(&["--math", "fast"]), vec!["--math"]),
        // a search past 10000 layers ran silently for minutes (the model's replay)
        (
            [
                &["max-depth"][..],
                common::TINY_MLP,
                &["--budget", "3MiB", "--max-depth", "100000000"],
            ]
            .concat()
            .into_iter()
            .map(str::to_string)
            .collect(),
            vec!["--max-depth", "between 1 and 10000"],
        ),
    ];
    for (args, needles) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        refused(&args, needles);
    }
}

/// A malformed `DENSEBENCH_TAP_CHUNK_COLUMNS` (the GPU path's 3×3 tap-stack chunking) is bad
/// input for every measuring command, refused before any child starts; a number is taken, and
/// commands that measure nothing do not read it.
#[test]
fn a_malformed_tap_chunk_variable_fails_with_status_2_naming_it() {
    let with_env = |value: &str, args: &[String]| {
        Command::new(bin())
            .args(args)
            .env("DENSEBENCH_TAP_CHUNK_COLUMNS", value)
            .output()
            .expect("the densebench binary runs")
    };
    let run = run_args(&["--variant", "cat-store-copy"]);
    let bad = ["abc", "-1", "1.5", ""];
    for value in bad {
        let o = with_env(value, &run);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(BAD_INPUT), "{value:?}: {err}");
        assert!(
            err.contains("DENSEBENCH_TAP_CHUNK_COLUMNS") && err.contains("whole number"),
            "{value:?}: {err}"
        );
        assert!(o.stdout.is_empty(), "{value:?} printed a result");
    }
    let o = with_env("1024", &run);
    assert!(o.status.success(), "a number is taken: {}", stderr(&o));
    let o = with_env("abc", &["plan".to_string(), "--quick".to_string()]);
    assert!(o.status.success(), "plan measures nothing: {}", stderr(&o));
}

/// Defect: the same bad input exited 2 from one subcommand and 1 from another: a reference
/// cache that is a file (`run` 1, `bench-all` 2), a criterion folder that does not exist
/// (`criterion-import` 1, a missing CSV 2 for `compare`, `plots`, `report`). Now 2 everywhere.
#[test]
fn missing_or_unusable_inputs_exit_2_in_every_subcommand() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = write(dir.path(), "a-file", "not a folder");
    let mut args = run_args(&[]);
    args.extend(["--cache-dir".to_string(), path_str(&file).to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    refused(&args, &["reference cache", "a-file"]);
    refused(
        &[
            "bench-all",
            "--quick",
            "--out",
            path_str(&dir.path().join("o.csv")),
            "--cache-dir",
            path_str(&file),
        ],
        &["reference cache", "a-file"],
    );
    let missing = dir.path().join("no-criterion");
    refused(
        &[
            "criterion-import",
            "--dir",
            path_str(&missing),
            "--out",
            path_str(&dir.path().join("c.csv")),
        ],
        &["does not exist", "no-criterion"],
    );
}

/// An empty file, or another tool's CSV, given as a result CSV: one short line saying so (it
/// was a list of all 56 missing columns, for an empty file too).
#[test]
fn an_empty_or_foreign_csv_is_named_as_such() {
    let dir = tempfile::tempdir().expect("temp dir");
    let empty = write(dir.path(), "empty.csv", "");
    let foreign = write(dir.path(), "foreign.csv", "a,b,c\n1,2,3\n");
    let figs = dir.path().join("figs");
    let err = refused(
        &["plots", path_str(&empty), "--out", path_str(&figs)],
        &["empty file"],
    );
    assert!(!err.contains("peak_bytes"), "{err}");
    let err = refused(
        &["compare", path_str(&foreign), path_str(&foreign)],
        &[
            "not a densebench result CSV",
            "columns are missing",
            "`a,b,c`",
        ],
    );
    assert!(!err.contains("peak_bytes"), "{err}");
}

/// Defect: `--resume` without `--out` was accepted and, the default output being a new file on
/// every run, measured everything again into a new file. Refused now, naming `--out`.
#[test]
fn resume_without_out_is_refused() {
    refused(&["bench-all", "--quick", "--resume"], &["--out"]);
}

#[test]
fn huge_shard_counts_fail_at_once_and_create_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("shard.csv");
    let o = path_str(&out);
    // Was: 212 s and 10.9 GB before anything ran.
    refused(
        &["bench-all", "--quick", "--out", o, "--shard", "1/100000000"],
        &["--shard", "at most 10000"],
    );
    // More shards than jobs: most shards would run nothing.
    let jobs = sweep::parse(sweep::QUICK_SWEEP, "quick", Some(1 << 30))
        .expect("quick sweep")
        .len();
    let spec = format!("1/{}", jobs + 1);
    refused(
        &["bench-all", "--quick", "--out", o, "--shard", &spec],
        &["--shard", &format!("only {jobs} jobs")],
    );
    assert!(!out.exists(), "an output file was created");
    // Was: a panic (capacity overflow).
    refused(
        &["plan", "--quick", "--shards", "10000000000000000000"],
        &["--shards", "between 1 and 10000"],
    );
    refused(&["plan", "--quick", "--shards", "1e19"], &["--shards"]);
    refused(
        &["plan", "--quick", "--shards", &(jobs + 1).to_string()],
        &["--shards", &format!("only {jobs} jobs")],
    );
}

const GROUP: &str = "[[group]]\nname = 'g'\nfamily = 'mlp'\nbatch = 2\nchannels = 2\ngrowth = 2\n";

#[test]
fn hostile_sweep_files_fail_with_status_2_naming_key_group_and_line() {
    let dir = tempfile::tempdir().expect("temp dir");
    let hundred = format!(
        "[{}]",
        (1..=100)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "threads.toml",
            format!("{GROUP}depth = 1\nthreads = 100000\n"),
            vec!["line 8", "`threads`", "group 1 (`g`)", "1024", "100000"],
        ),
        (
            "timeout.toml",
            format!("[defaults]\ntimeout_secs = 0\n{GROUP}depth = 1\n"),
            vec!["line 2 in [defaults]", "`timeout_secs`", "604800"],
        ),
        (
            "mem.toml",
            format!("{GROUP}depth = 1\nmem_limit = 0\n"),
            vec!["`mem_limit`", "1 MiB"],
        ),
        (
            "steps.toml",
            format!("{GROUP}depth = 1\nsteps = 0\n"),
            vec!["`steps`", "between 1 and 10000"],
        ),
        (
            "warmup.toml",
            format!("{GROUP}depth = 1\nwarmup = 100000\n"),
            vec!["`warmup`", "10000"],
        ),
        // 100 × 100 × 100 × 100 configurations × 7 variants (every one that applies to mlp
        // with its activation on): refused before expansion.
        (
            "huge.toml",
            format!(
                "[[group]]\nname = 'big'\nfamily = 'mlp'\nbatch = {hundred}\nchannels = \
                 {hundred}\ngrowth = {hundred}\ndepth = {hundred}\n"
            ),
            vec![
                "expands to 700000000 jobs",
                "limit of 100000",
                "group 1 (`big`)",
                "100 batch × 100 channels × 100 growth × 100 depth × 7 variants",
            ],
        ),
        (
            "string.toml",
            format!("{GROUP}depth = 'deep'\n"),
            vec![
                "line 7",
                "`depth`",
                "group 1 (`g`)",
                "expected an integer or a list of integers, got the string \"deep\"",
            ],
        ),
        (
            "item.toml",
            format!("{GROUP}depth = [1, 2.5]\n"),
            vec![
                "`depth`",
                "item 2 of the list",
                "expected an integer",
                "2.5",
            ],
        ),
        (
            "negative.toml",
            format!("{GROUP}depth = -3\n"),
            vec!["`depth`", "negative integer -3"],
        ),
        (
            "bool.toml",
            format!("{GROUP}depth = 1\nactivation = 'yes'\n"),
            vec!["`activation`", "a boolean (true or false)"],
        ),
        (
            "group.toml",
            "group = 3\n".to_string(),
            vec!["line 1", "`[[group]]` tables"],
        ),
        (
            "empty-list.toml",
            format!("{GROUP}depth = []\n"),
            vec!["`depth`", "empty list"],
        ),
    ];
    for (name, text, needles) in &cases {
        let f = write(dir.path(), name, text);
        let out = dir.path().join(format!("{name}.csv"));
        let err = refused(
            &[
                "bench-all",
                "--sweep",
                path_str(&f),
                "--out",
                path_str(&out),
            ],
            needles,
        );
        assert!(err.contains(name), "{name}: the file is not named: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: one line: {err}");
        for internal in ["untagged", "OneOrMany", "variant of", "struct "] {
            assert!(!err.contains(internal), "{name}: serde wording: {err}");
        }
        assert!(!out.exists(), "{name}: output written before validation");
    }
    // A file far larger than any sweep (a result CSV by mistake) is refused unread.
    let big = write(dir.path(), "big.toml", &"# x\n".repeat(300_000));
    refused(
        &["plan", "--sweep", path_str(&big)],
        &["big.toml", "larger than 1024 KiB"],
    );
}

/// The pids of the live (not zombie) processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| stat(pid).is_some_and(|(state, ppid)| ppid == parent && state != 'Z'))
        .collect()
}

/// State and parent pid of `pid` from /proc/PID/stat (after the command name's closing paren).
fn stat(pid: u32) -> Option<(char, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = text.get(text.rfind(')')? + 1..)?.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Whether `pid` still runs (a zombie does not) as a `densebench child` whose command line
/// names `cache` (a test's own directory: its references are there).
fn child_alive(pid: u32, cache: &str) -> bool {
    child_alive_once(pid, cache) || child_alive_reread(pid, cache)
}

/// [`child_alive`] from one read of /proc (to scan every process for strays).
fn child_alive_once(pid: u32, cache: &str) -> bool {
    let cmd = cmdline(pid);
    stat(pid).is_some_and(|(state, _)| state != 'Z')
        && cmd.contains(" child ")
        && cmd.contains(cache)
}

fn child_alive_reread(pid: u32, cache: &str) -> bool {
    // A live process whose command line does not read back as expected is read again, for
    // 100 ms: twice in some twenty runs of this file a live child was taken for dead or for one
    // without the cache argument (not reproduced since; a transient /proc read is the suspect),
    // and a test must not call a child dead on one read.
    for attempt in 0..5 {
        if stat(pid).is_none_or(|(state, _)| state == 'Z') {
            return false;
        }
        let cmd = cmdline(pid);
        if cmd.contains(" child ") && cmd.contains(cache) {
            return true;
        }
        if attempt < 4 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    false
}

/// Waits (up to `limit`) for a `densebench child` of `parent` for which `pick` holds.
/// Returns its pid and command line.
fn wait_for_child(
    parent: u32,
    limit: Duration,
    pick: impl Fn(&str) -> bool,
) -> Option<(u32, String)> {
    let start = Instant::now();
    while start.elapsed() < limit {
        for c in children_of(parent) {
            let cmd = cmdline(c);
            if cmd.contains(" child ") && pick(&cmd) {
                return Some((c, cmd));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

fn signal(pid: u32, sig: i32) {
    let pid = i32::try_from(pid).expect("pid fits i32");
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(rc, 0, "kill({pid}, {sig})");
}

/// Every file under `dir` (two levels: the cache keeps one directory per build).
fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out
}

fn wait_with_limit(child: std::process::Child, limit: Duration) -> Output {
    let pid = child.id();
    let start = Instant::now();
    let watchdog = std::thread::spawn(move || {
        while start.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(50));
            if stat(pid).is_none_or(|(s, _)| s == 'Z') {
                return;
            }
        }
        // Past the limit: make the test fail below instead of hanging.
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    });
    let o = child.wait_with_output().expect("waiting for densebench");
    let _ = watchdog.join();
    o
}

#[test]
fn sigterm_to_the_parent_kills_its_children_and_resume_completes_the_sweep() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("quick.csv");
    let cache = dir.path().join("cache");
    let args = [
        "bench-all",
        "--quick",
        "--out",
        path_str(&out),
        "--cache-dir",
        path_str(&cache),
    ];
    let parent = Command::new(bin())
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bench-all");
    let pid = parent.id();
    // Every child of the quick sweep names the test's cache (its reference is there): one
    // that did not would never be seen here.
    let cache_str = path_str(&cache);
    let running = wait_for_child(pid, Duration::from_secs(60), |cmd| cmd.contains(cache_str));
    let Some((running, _)) = running else {
        let o = wait_with_limit(parent, Duration::from_secs(60));
        panic!("no child naming the cache ever ran: {}", stderr(&o));
    };
    // The parent alone, as a scheduler or a closed terminal would.
    signal(pid, libc::SIGTERM);
    let o = wait_with_limit(parent, Duration::from_secs(30));
    let err = stderr(&o);
    // 128 + SIGTERM (15), and one line saying what happened and how to continue.
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{err}");
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.contains("stopped by SIGTERM") && last.contains("--resume"),
        "{err}"
    );
    // No child of it survives it: the parent kills and reaps its children before it exits, so
    // they are gone the moment it is (an orphan would still be finishing its job).
    assert!(
        !child_alive(running, cache_str),
        "child {running} outlived its parent"
    );
    let strays: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&p| child_alive_once(p, cache_str))
        .collect();
    assert!(
        strays.is_empty(),
        "children of the stopped sweep: {strays:?}"
    );
    let temporaries: Vec<String> = files_under(&cache)
        .into_iter()
        .filter(|f| f.contains(".tmp"))
        .collect();
    assert!(temporaries.is_empty(), "left behind: {temporaries:?}");
    // Whole rows only, fewer than the sweep's (it was stopped while a child ran).
    let text = std::fs::read_to_string(&out).expect("the output exists");
    assert!(text.ends_with('\n'), "a torn last row: {text}");
    let before = read_rows(&out).expect("a valid CSV after the stop");
    let expected: BTreeSet<String> = sweep::parse(sweep::QUICK_SWEEP, "quick", Some(1 << 30))
        .expect("quick sweep")
        .into_iter()
        .map(|j| j.key)
        .collect();
    assert!(before.len() < expected.len(), "stopped after every row");
    // The command the last line prints completes it (run as printed): every key once, the
    // rows from before kept as they were.
    let printed = last
        .split("to continue, run: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no command to continue in: {last}"));
    let words: Vec<&str> = printed.split_whitespace().collect();
    assert_eq!(words.first(), Some(&"densebench"), "{last}");
    let resume = &words[1..];
    assert!(resume.contains(&"--resume"), "{last}");
    let o = densebench(resume);
    assert!(o.status.success(), "resume failed: {}", stderr(&o));
    let rows = read_rows(&out).expect("a valid CSV after the resume");
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let unique: BTreeSet<String> = keys.iter().map(|k| k.to_string()).collect();
    assert_eq!(keys.len(), unique.len(), "a key twice: {keys:?}");
    assert_eq!(unique, expected);
    assert_eq!(&rows[..before.len()], &before[..]);
}

/// One job whose measuring child runs for a few seconds (many steps of a tiny block), so a
/// test can find it and kill it.
const SLOW_SWEEP: &str = r#"
[[group]]
family = "mlp"
batch = 64
channels = 16
growth = 8
depth = 2
variants = ["cat-store-copy"]
steps = 4000
warmup = 0
"#;

/// Runs the slow sweep with `retries`, killing its first measuring child with SIGKILL from
/// outside; returns the process output and the one row.
fn kill_measuring_child(
    dir: &Path,
    name: &str,
    retries: &str,
) -> (Output, densebench::results::row::Row) {
    let sweep_file = write(dir, "slow.toml", SLOW_SWEEP);
    let out = dir.join(name);
    let cache = dir.join("cache");
    let parent = Command::new(bin())
        .args([
            "bench-all",
            "--sweep",
            path_str(&sweep_file),
            "--out",
            path_str(&out),
            "--cache-dir",
            path_str(&cache),
            "--retries",
            retries,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bench-all");
    // The measuring child, not the reference's (which saves a result file).
    let measuring = wait_for_child(parent.id(), Duration::from_secs(60), |cmd| {
        !cmd.contains("--save-result")
    });
    if let Some((c, _)) = &measuring {
        signal(*c, libc::SIGKILL);
    }
    let o = wait_with_limit(parent, Duration::from_secs(120));
    assert!(
        measuring.is_some(),
        "no measuring child seen: {}",
        stderr(&o)
    );
    let rows = read_rows(&out).expect("a valid CSV");
    assert_eq!(rows.len(), 1, "one job, one row");
    let row = rows.into_iter().next().expect("one row");
    (o, row)
}

#[test]
fn a_child_killed_from_outside_is_killed_not_oom_and_retried() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (o, row) = kill_measuring_child(dir.path(), "once.csv", "0");
    assert_eq!(row.status, "killed", "{}", row.error);
    assert!(row.error.starts_with("killed by SIGKILL"), "{}", row.error);
    assert!(row.peak_bytes.is_none(), "a killed child measured nothing");
    assert!(!stderr(&o).contains("retrying"), "{}", stderr(&o));
    // The row is written and the run fails: it did not measure what it was asked to.
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("rows that failed (killed: 1)"),
        "{}",
        stderr(&o)
    );
    // With one retry the row is measured again, says so, and this time is a result.
    let (o, row) = kill_measuring_child(dir.path(), "retried.csv", "1");
    let err = stderr(&o);
    assert!(
        err.contains("killed by SIGKILL") && err.contains("retrying (1 of 1)"),
        "{err}"
    );
    assert!(o.status.success(), "{err}");
    assert_eq!(
        (row.status.as_str(), row.grad_ok),
        ("ok", Some(true)),
        "{}",
        row.error
    );
}

/// Starts the slow sweep made slower (a measuring child of 10000 steps of about 1.4 ms lives
/// about 14 s on its own) with stderr piped; returns the parent, the measuring child (if one was
/// seen within 60 s), the output path and the cache path.
fn start_slower_sweep(dir: &Path) -> (std::process::Child, Option<u32>, PathBuf, PathBuf) {
    let slower = SLOW_SWEEP
        .replace("batch = 64", "batch = 512")
        .replace("channels = 16", "channels = 64")
        .replace("growth = 8", "growth = 32")
        .replace("depth = 2", "depth = 4")
        .replace("steps = 4000", "steps = 10000");
    let sweep_file = write(dir, "slower.toml", &slower);
    let out = dir.join("slow.csv");
    let cache = dir.join("cache");
    let parent = Command::new(bin())
        .args([
            "bench-all",
            "--sweep",
            path_str(&sweep_file),
            "--out",
            path_str(&out),
            "--cache-dir",
            path_str(&cache),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn bench-all");
    let measuring = wait_for_child(parent.id(), Duration::from_secs(60), |cmd| {
        !cmd.contains("--save-result")
    })
    .map(|(c, _)| c);
    (parent, measuring, out, cache)
}

#[test]
fn children_die_with_a_parent_killed_by_sigkill() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (parent, measuring, _, cache) = start_slower_sweep(dir.path());
    // No handler runs for SIGKILL: only PR_SET_PDEATHSIG can take the child along.
    signal(parent.id(), libc::SIGKILL);
    let o = wait_with_limit(parent, Duration::from_secs(30));
    assert_eq!(o.status.code(), None, "the parent was killed by the signal");
    let Some(child) = measuring else {
        panic!("no measuring child seen");
    };
    let cache_str = path_str(&cache);
    let start = Instant::now();
    while child_alive(child, cache_str) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Orphaned, it would run its 10000 steps on for about 14 s.
    assert!(
        !child_alive(child, cache_str),
        "child {child} outlived its SIGKILLed parent"
    );
}

/// A scheduler cancelling a job (Slurm's `scancel`) sends SIGTERM to every process of it, the
/// measuring child as well as densebench. The child must not die of it first and be written as
/// a `killed` row (a later `--resume` would keep it): it ignores the signal, and the parent
/// stops as it does for a SIGTERM of its own, with no row for the job it stopped.
#[test]
fn sigterm_to_every_process_of_a_cancelled_job_writes_no_killed_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (parent, measuring, out, cache) = start_slower_sweep(dir.path());
    let Some(child) = measuring else {
        let o = wait_with_limit(parent, Duration::from_secs(60));
        panic!("no measuring child seen: {}", stderr(&o));
    };
    let cache_str = path_str(&cache);
    // The child alone first: it lives on.
    signal(child, libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(500));
    let child_survived = child_alive(child, cache_str);
    // Then both, child first, as the scheduler's signal reaches them.
    if child_survived {
        signal(child, libc::SIGTERM);
    }
    signal(parent.id(), libc::SIGTERM);
    let o = wait_with_limit(parent, Duration::from_secs(30));
    let err = stderr(&o);
    assert!(child_survived, "the child died of SIGTERM: {err}");
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{err}");
    assert!(
        !child_alive(child, cache_str),
        "child {child} outlived its parent"
    );
    let rows = read_rows(&out).expect("a valid CSV after the stop");
    assert!(rows.is_empty(), "a row for the stopped job: {rows:?}");
}

/// Pieces of TOML to build or break sweep files with; numbers stay small, so a mutated file
/// asks for small blocks (the property is about the parser, not about running them).
const TOKENS: &[&str] = &[
    "[[group]]",
    "[defaults]",
    "[group]",
    "\n",
    "=",
    "[",
    "]",
    ",",
    "\"",
    "'",
    "#",
    "{",
    "}",
    ".",
    "-1",
    "0",
    "3",
    "2.5",
    "true",
    "\"all\"",
    "\"mlp\"",
    "\"bc\"",
    "depth = ",
    "batch = ",
    "variants = ",
    "mem_limit = \"2GiB\"",
    "threads = ",
    "family = ",
    "1979-05-27",
    "x",
    " ",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    /// Random TOML-ish text: an error or jobs, never a panic.
    #[test]
    fn random_text_never_panics(tokens in proptest::collection::vec(0..TOKENS.len(), 0..40)) {
        let text: String = tokens.iter().map(|&i| TOKENS[i]).collect();
        let _ = sweep::parse(&text, "random.toml", Some(1 << 30));
    }

    /// The quick sweep with bytes cut out, tokens put in and lines repeated: an error naming
    /// the file, or jobs; never a panic.
    #[test]
    fn mutated_sweep_files_never_panic(
        edits in proptest::collection::vec((0..3usize, any::<prop::sample::Index>(), 0..TOKENS.len(), 0..8usize), 1..6)
    ) {
        let mut text = sweep::QUICK_SWEEP.to_string();
        for (op, at, token, len) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            match op {
                0 => {
                    let mut end = (i + len).min(text.len());
                    while !text.is_char_boundary(end) {
                        end -= 1;
                    }
                    text.replace_range(i..end, "");
                }
                1 => text.insert_str(i, TOKENS[token]),
                _ => {
                    let start = text[..i].rfind('\n').map_or(0, |n| n + 1);
                    let end = text[i..].find('\n').map_or(text.len(), |n| i + n + 1);
                    let line = text[start..end].to_string();
                    text.insert_str(start, &line);
                }
            }
        }
        if let Err(e) = sweep::parse(&text, "mutated.toml", Some(1 << 30)) {
            let msg = format!("{e:#}");
            prop_assert!(msg.contains("mutated.toml"), "{}", msg);
            prop_assert!(!msg.contains("untagged") && !msg.contains("OneOrMany"), "{}", msg);
        }
    }
}

/// A negative number given to a flag that takes a value reaches the flag's own parser, in every
/// command, which names the flag (`invalid value '-1' for '--batch <BATCH>': not a whole
/// number`); before, clap said "unexpected argument '-1' found", naming no flag, everywhere but
/// `max-depth`, `compare --max-regression` and `plan --shards` (and a count's own parser said
/// "invalid digit found in string").
#[test]
fn a_negative_number_names_its_flag_in_every_command() {
    let tiny = [
        ("--family", "mlp"),
        ("--batch", "2"),
        ("--growth", "2"),
        ("--channels", "2"),
    ];
    let cases: [(&[&str], &str); 6] = [
        (
            &[
                "run",
                "--variant",
                "cat-store-copy",
                "--depth",
                "2",
                "--batch",
                "-1",
            ],
            "--batch",
        ),
        (
            &["case", "--out", "x.safetensors", "--depth", "-2"],
            "--depth",
        ),
        (&["bench-all", "--quick", "--retries", "-1"], "--retries"),
        (
            &[
                "step",
                "--case",
                "c",
                "--variant",
                "autograd",
                "--warmup",
                "-3",
            ],
            "--warmup",
        ),
        (
            &[
                "run",
                "--variant",
                "cat-store-copy",
                "--depth",
                "2",
                "--seed",
                "-7",
            ],
            "--seed",
        ),
        (
            &["max-depth", "--budget", "1GiB", "--threads", "-4"],
            "--threads",
        ),
    ];
    for (args, flag) in cases {
        let mut a = args.to_vec();
        // the block's flags where the command takes them
        if matches!(a[0], "run" | "case" | "max-depth") {
            for (f, v) in tiny.iter().filter(|(f, _)| !args.contains(f)) {
                a.extend([*f, *v]);
            }
        }
        let value = a[a.iter().position(|x| *x == flag).expect("the flag") + 1];
        let err = refused(&a, &[&format!("invalid value '{value}' for '{flag}")]);
        assert!(!err.contains("unexpected argument"), "{a:?}: {err}");
        // Rust's integer parser's words are not a user's
        assert!(!err.contains("invalid digit"), "{a:?}: {err}");
        if matches!(flag, "--batch" | "--depth" | "--seed") {
            assert!(
                err.contains("': not a whole number (0, 1, 2, …)"),
                "{a:?}: {err}"
            );
        }
    }
}
