//! The measuring side driven with hostile flags, files and environment (audit of `run`, `step`,
//! `case`, `bench-all`, `max-depth`, `merge`): each test failed before its fix.

mod common;

use common::{bin, densebench, path_str, stderr, tiny_case, TINY_MLP, TINY_RUN};
use std::path::Path;
use std::process::{Command, Output};

/// Exit status of bad input and usage mistakes.
const BAD_INPUT: i32 = 2;

/// A one-job sweep of the smallest mlp block.
const TINY_SWEEP: &str = "name = \"tiny\"\n\n[[group]]\nfamily = \"mlp\"\nbatch = 2\n\
                          channels = 2\ngrowth = 2\ndepth = 2\nvariants = [\"cat-store-copy\"]\n\
                          steps = 1\nwarmup = 0\n";

/// `densebench ARGS` with the environment variable `name` set to `value`.
fn with_env(name: &str, value: &str, args: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .env(name, value)
        .output()
        .expect("the densebench binary runs")
}

/// Defect: `step --bare-loop` had no bound (`run --steps` has 1..=10000): `--bare-loop
/// 99999999999` aborted with "memory allocation of 799999999992 bytes failed" (exit 1, the flag
/// unnamed), and `--warmup` ran as many unmeasured steps as asked. Both are now refused as
/// `run` refuses them, with status 2, before the case is read; a loop within them still runs.
#[test]
fn step_bare_loop_and_its_warmup_are_bounded_as_run_steps() {
    let dir = tempfile::tempdir().expect("temp dir");
    let case = tiny_case(dir.path());
    let out = dir.path().join("out.safetensors");
    let step = |extra: &[&str]| {
        let mut a = vec![
            "step",
            "--case",
            path_str(&case),
            "--variant",
            "cat-store-copy",
            "--out",
            path_str(&out),
        ];
        a.extend_from_slice(extra);
        densebench(&a)
    };
    for (extra, needles) in [
        (
            &["--bare-loop", "99999999999"][..],
            &["--bare-loop", "between 1 and 10000", "99999999999"][..],
        ),
        (
            &["--bare-loop", "0"][..],
            &["--bare-loop", "between 1 and 10000"][..],
        ),
        (
            &["--bare-loop", "2", "--warmup", "10001"][..],
            &["--warmup", "at most 10000", "10001"][..],
        ),
    ] {
        let o = step(extra);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(BAD_INPUT), "{extra:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{extra:?}: `{n}` not in: {err}");
        }
        assert!(!err.contains("memory allocation"), "{extra:?}: {err}");
        assert!(!out.exists(), "{extra:?} wrote {}", out.display());
    }
    let o = step(&["--bare-loop", "2", "--warmup", "0"]);
    assert!(o.status.success(), "a bounded loop runs: {}", stderr(&o));
    let line = String::from_utf8_lossy(&o.stdout);
    assert!(line.contains("\"steps\":2"), "{line}");
}

/// Defect: `bench-all --sweep S --out S --force` (the refusal of an existing --out suggests
/// `--force`) measured the sweep and replaced the sweep file with its rows; `merge S IN --sweep S
/// --force` replaced it with the merged rows. The sweep is an input: refused as one (`bench-all`
/// status 2, `merge` 1, its "nothing written"), the file left byte for byte.
#[test]
fn the_sweep_file_is_never_the_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(&sweep, TINY_SWEEP).expect("sweep");
    let cache = dir.path().join("cache");
    for extra in [&["--force"][..], &[][..]] {
        let mut a = vec![
            "bench-all",
            "--sweep",
            path_str(&sweep),
            "--out",
            path_str(&sweep),
            "--cache-dir",
            path_str(&cache),
        ];
        a.extend_from_slice(extra);
        let o = densebench(&a);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(BAD_INPUT), "{extra:?}: {err}");
        assert!(
            err.contains("is the input") && err.contains(path_str(&sweep)),
            "{extra:?}: {err}"
        );
        assert_eq!(
            std::fs::read_to_string(&sweep).expect("sweep"),
            TINY_SWEEP,
            "{extra:?} changed the sweep file"
        );
    }
    // Through another path to the same file too.
    let other = dir.path().join(".").join("sweep.toml");
    let o = densebench(&[
        "bench-all",
        "--sweep",
        path_str(&other),
        "--out",
        path_str(&sweep),
        "--force",
        "--cache-dir",
        path_str(&cache),
    ]);
    assert_eq!(o.status.code(), Some(BAD_INPUT), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&sweep).expect("sweep"), TINY_SWEEP);
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let o = densebench(&[
        "merge",
        path_str(&sweep),
        path_str(&input),
        "--sweep",
        path_str(&sweep),
        "--force",
    ]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("is the input"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&sweep).expect("sweep"),
        TINY_SWEEP,
        "merge changed the sweep file"
    );
}

/// Defect: `merge`'s usage mistakes caught by the argument parser (an unknown flag, two sweeps,
/// no input, a non-number) exited 2, which for `merge` means "merged, but keys of the sweep are
/// missing" (`merge --help`): a script took nothing written for a merged file. Now 1, as its
/// other usage mistakes; `--help` still exits 0, and other commands' usage mistakes still 2.
#[test]
fn merge_usage_mistakes_of_the_parser_exit_1_nothing_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("merged.csv");
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let (out_s, input_s) = (path_str(&out), path_str(&input));
    for args in [
        &["merge", out_s, input_s, "--bogus"][..],
        &["merge", out_s, input_s, "--quick", "--default-sweep"][..],
        &["merge", out_s, input_s, "--quick", "--shards", "x"][..],
        &["merge", out_s][..],
        &["merge"][..],
    ] {
        let o = densebench(args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("error"), "{args:?}: {err}");
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    let o = densebench(&["merge", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("Exit status"));
    let o = densebench(&["compare", "--bogus"]);
    assert_eq!(o.status.code(), Some(BAD_INPUT), "{}", stderr(&o));
}

/// Defect: a malformed `DENSEBENCH_WHOLE_FRONT` or `DENSEBENCH_FRONT_SLACK` was refused only by
/// the step, inside each child (an `error` row per job of a sweep, `run` exit 1), and the memory
/// model took a malformed `DENSEBENCH_WHOLE_FRONT` for unset: `DENSEBENCH_WHOLE_FRONT=yes
/// max-depth --no-confirm` answered BC-100's buffer-recompute-inplace with the split front's
/// 103 layers where `=1` answers 81, silently. Both are now bad input for every measuring
/// command, refused before any child starts, as `DENSEBENCH_TAP_CHUNK_COLUMNS` was.
#[test]
fn malformed_front_variables_are_refused_before_any_work() {
    let dir = tempfile::tempdir().expect("temp dir");
    let depth = [
        "max-depth",
        "--family",
        "bc",
        "--budget",
        "1GiB",
        "--no-confirm",
        "--variants",
        "buffer-recompute-inplace",
    ];
    let sweep = dir.path().join("sweep.toml");
    std::fs::write(&sweep, TINY_SWEEP).expect("sweep");
    let out = dir.path().join("out.csv");
    let cache = dir.path().join("cache");
    let bench = [
        "bench-all",
        "--sweep",
        path_str(&sweep),
        "--out",
        path_str(&out),
        "--cache-dir",
        path_str(&cache),
    ];
    for (name, value) in [
        ("DENSEBENCH_WHOLE_FRONT", "yes"),
        ("DENSEBENCH_WHOLE_FRONT", "2"),
        ("DENSEBENCH_FRONT_SLACK", "abc"),
        ("DENSEBENCH_FRONT_SLACK", "-1"),
    ] {
        for args in [&depth[..], TINY_RUN, &bench[..]] {
            let o = with_env(name, value, args);
            let err = stderr(&o);
            let at = format!("{name}={value} {}", args[0]);
            assert_eq!(o.status.code(), Some(BAD_INPUT), "{at}: {err}");
            assert!(err.contains(name), "{at}: {err}");
            assert!(o.stdout.is_empty(), "{at} printed a result");
            assert!(!out.exists(), "{at} wrote {}", out.display());
        }
    }
    // Well-formed values are taken: the whole front is modelled shallower than the split one.
    let answer = |o: &Output| -> String {
        assert!(o.status.success(), "{}", stderr(o));
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.starts_with("buffer-recompute-inplace"))
            .map(|l| l.split_whitespace().nth(1).unwrap_or_default().to_string())
            .unwrap_or_default()
    };
    let whole = answer(&with_env("DENSEBENCH_WHOLE_FRONT", "1", &depth));
    let split = answer(&with_env("DENSEBENCH_WHOLE_FRONT", "0", &depth));
    assert!(
        !whole.is_empty() && !split.is_empty(),
        "{whole:?} {split:?}"
    );
    assert_ne!(whole, split, "DENSEBENCH_WHOLE_FRONT=1 changed nothing");
    let o = with_env("DENSEBENCH_FRONT_SLACK", "0.05", TINY_RUN);
    assert!(o.status.success(), "{}", stderr(&o));
    // `max-depth` on the small mlp block reads neither (no bc front): still refused, as the
    // tap-stack variable is, so that a typo never waits for the first bc job.
    let mut mlp = vec!["max-depth", "--budget", "1MiB", "--no-confirm"];
    mlp.extend_from_slice(TINY_MLP);
    let o = with_env("DENSEBENCH_WHOLE_FRONT", "on", &mlp);
    assert_eq!(o.status.code(), Some(BAD_INPUT), "{}", stderr(&o));
}

/// Defect: `bench-all --resume --rerun-failed` removed the failed rows from the file before it
/// checked the rows it would resume against `DENSEBENCH_CONV`; a refusal ("… the file was not
/// changed") then left the file without them, their `error` lost. The check now comes first: a
/// refused resume leaves the file byte for byte.
#[test]
fn a_refused_rerun_of_failed_rows_leaves_the_file_unchanged() {
    use densebench::results::row::read_rows;
    use densebench::results::store::write_rows;
    let dir = tempfile::tempdir().expect("temp dir");
    let sweep = dir.path().join("gpu.toml");
    std::fs::write(
        &sweep,
        "[[group]]\nfamily = \"bc\"\nbatch = 2\nchannels = 3\ngrowth = 2\nbn_size = 2\nsize = 5\n\
         depth = [2, 3]\nvariants = [\"cat-store-copy\"]\ndevice = \"cuda:0\"\nsteps = 1\n\
         warmup = 0\n",
    )
    .expect("sweep");
    let out = dir.path().join("gpu.csv");
    let cache = dir.path().join("cache");
    // Two rows of the sweep's keys: one measured with the direct kernels, one that failed.
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("../results/reference-cpu.csv");
    let mut rows = read_rows(&reference).expect("reference rows");
    rows.truncate(2);
    for (r, depth) in rows.iter_mut().zip([2, 3]) {
        r.variant = "cat-store-copy".to_string();
        r.family = "bc".to_string();
        (r.batch, r.channels, r.growth, r.depth, r.bn_size) = (2, 3, 2, depth, 2);
        r.size = impls::Spatial::square(5);
        r.activation = true;
        r.dtype = "f32".to_string();
        r.seed = 0;
        r.device = "cuda:0".to_string();
        r.framework = "densebench".to_string();
        r.key = densebench::results::row::key_of_fields(r);
    }
    rows[0].note = "3×3 convolution in densebench's direct kernels (TF32 tensor cores, \
                    weight-gradient partials 663552 B)"
        .to_string();
    rows[1].status = "error".to_string();
    rows[1].error = "the first attempt failed".to_string();
    rows[1].grad_ok = None;
    write_rows(&out, &rows).expect("writing the CSV");
    let before = std::fs::read(&out).expect("csv");
    let o = Command::new(bin())
        .args([
            "bench-all",
            "--sweep",
            path_str(&sweep),
            "--out",
            path_str(&out),
            "--resume",
            "--rerun-failed",
            "--cache-dir",
            path_str(&cache),
        ])
        .env_remove("DENSEBENCH_CONV")
        .output()
        .expect("the densebench binary runs");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(BAD_INPUT), "{err}");
    assert!(
        err.contains("direct kernels") && err.contains("the file was not changed"),
        "{err}"
    );
    assert!(
        std::fs::read(&out).expect("csv") == before,
        "the refused resume changed {}: {err}",
        out.display()
    );
}

/// Defect: a cached f64 reference (or case file) cut short — a full disk, a copy of a cache
/// directory interrupted — was used as it was: every row of its configuration an `error`
/// ("loading the reference result: …") on every run, `--rerun-failed` included, until someone
/// found and deleted the file. A cached file whose header does not read within the file is now
/// said and computed again.
#[test]
fn a_cached_reference_cut_short_is_computed_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sweep = dir.path().join("tiny.toml");
    std::fs::write(&sweep, TINY_SWEEP).expect("sweep");
    let cache = dir.path().join("cache");
    let run = |out: &str| {
        let out = dir.path().join(out);
        let o = densebench(&[
            "bench-all",
            "--sweep",
            path_str(&sweep),
            "--out",
            path_str(&out),
            "--cache-dir",
            path_str(&cache),
        ]);
        let csv = std::fs::read_to_string(&out).unwrap_or_default();
        (o, csv)
    };
    let (o, csv) = run("first.csv");
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(csv.contains(",ok,"), "{csv}");
    // every cached safetensors file (in the cache's folder per build) cut to half its length
    let mut cut = 0;
    let mut folders = vec![cache.clone()];
    while let Some(d) = folders.pop() {
        for e in std::fs::read_dir(&d).expect("the cache") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                folders.push(p);
            } else if p.extension().is_some_and(|x| x == "safetensors") {
                let bytes = std::fs::read(&p).expect("cached file");
                std::fs::write(&p, &bytes[..bytes.len() / 2]).expect("cut");
                cut += 1;
            }
        }
    }
    assert!(cut >= 1, "no cached file in {}", cache.display());
    let (o, csv) = run("second.csv");
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        csv.contains(",ok,") && csv.contains(",true,"),
        "{csv}\n{err}"
    );
    assert!(
        err.contains("does not read") && err.contains("computing it again"),
        "{err}"
    );
}
