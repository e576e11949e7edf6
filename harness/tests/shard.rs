//! Sharding, planning and merging: the split of a sweep into shards (every key in exactly one
//! shard, balanced, deterministic), `bench-all --shard` end to end on the quick sweep, `merge`
//! (conflicts refused, identical rows deduplicated, `--prefer newest`, missing keys reported,
//! idempotent, OUT protected) and `--devices` on a build or machine without CUDA.

use densebench::measure::device::{DeviceOps, DeviceSpec};
use densebench::plan::shard::{self, ShardSpec};
use densebench::plan::sweep::{self, Job};
use densebench::results::merge::{self, Input, Prefer};
use densebench::results::row::{read_rows, Row};
use densebench::results::store::write_rows;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{densebench, path_str as s, stderr};

fn jobs(text: &str) -> Vec<Job> {
    sweep::parse(text, "test", Some(1 << 30)).expect("the sweep parses")
}

/// Many configurations of very different cost: what a research group's sweep looks like.
const WIDE_SWEEP: &str = r#"
[[group]]
family = "mlp"
batch = [64, 256, 1024]
channels = [16, 64]
growth = 16
depth = [2, 4, 8, 16, 24]
[[group]]
family = "bc"
batch = [2, 8]
channels = 8
growth = 4
size = [8, 16]
depth = [2, 4, 8]
"#;

#[test]
fn every_key_is_in_exactly_one_shard() {
    for text in [sweep::DEFAULT_SWEEP, sweep::QUICK_SWEEP, WIDE_SWEEP] {
        let all = jobs(text);
        let keys: BTreeSet<String> = all.iter().map(|j| j.key.clone()).collect();
        for n in 1..=7 {
            let mut seen: BTreeMap<String, usize> = BTreeMap::new();
            for i in 1..=n {
                let spec = ShardSpec { index: i, count: n };
                for j in shard::select(all.clone(), spec) {
                    *seen.entry(j.key).or_default() += 1;
                }
            }
            assert_eq!(
                seen.keys().cloned().collect::<BTreeSet<_>>(),
                keys,
                "{n} shards lose or invent keys"
            );
            assert!(seen.values().all(|&c| c == 1), "{n} shards duplicate keys");
        }
    }
}

#[test]
fn shards_are_balanced_by_predicted_cost() {
    for text in [sweep::DEFAULT_SWEEP, sweep::QUICK_SWEEP, WIDE_SWEEP] {
        let all = jobs(text);
        let groups = shard::groups(&all);
        let largest = groups.iter().map(|g| g.cost).fold(0.0, f64::max);
        for n in 1..=7 {
            let parts = shard::partition(&all, n);
            let costs: Vec<f64> = parts.iter().map(|p| p.cost).collect();
            let mean = costs.iter().sum::<f64>() / n as f64;
            let max = costs.iter().copied().fold(0.0, f64::max);
            // Graham's bound for greedy list scheduling: when the largest shard got its last
            // item it was the least loaded (≤ the final mean), and an item costs at most one
            // whole configuration with its reference.
            assert!(
                max <= mean + largest * (1.0 + 1e-12),
                "{n} shards: max {max:e} > mean {mean:e} + largest config {largest:e}"
            );
            // The shard costs add up to the jobs' costs plus one reference per (shard, config).
            let jobs_cost: f64 = all.iter().map(|j| j.cost).sum();
            let refs: f64 = parts
                .iter()
                .flat_map(|p| p.configs.iter())
                .map(|&g| shard::reference_cost(&all, &groups[g].jobs))
                .sum();
            let total: f64 = costs.iter().sum();
            assert!(
                (total - jobs_cost - refs).abs() <= 1e-9 * total,
                "shard costs do not add up"
            );
        }
    }
    // With many configurations, LPT is close to perfect: within 6% of the mean for up to 6
    // shards on the wide sweep (30 mlp + 12 bc configs), where splitting by count is far off.
    // (Measured: 5.2% at 6 shards since the reference is one f64 step, no f32 noise step.)
    let all = jobs(WIDE_SWEEP);
    for n in 2..=6 {
        let parts = shard::partition(&all, n);
        let mean = parts.iter().map(|p| p.cost).sum::<f64>() / n as f64;
        let max = parts.iter().map(|p| p.cost).fold(0.0, f64::max);
        assert!(max <= 1.06 * mean, "{n} shards: max {max:e}, mean {mean:e}");
    }
}

#[test]
fn shards_are_deterministic_and_independent_of_the_machine() {
    for text in [sweep::DEFAULT_SWEEP, WIDE_SWEEP] {
        // The memory limit (machine-dependent by default) and a retarget to another device do
        // not change which configurations a shard holds.
        let a = sweep::parse(text, "a", Some(1 << 30)).expect("parses");
        let b = sweep::parse(text, "b", Some(7 << 20)).expect("parses");
        let c = sweep::retarget(a.clone(), DeviceSpec::Cuda(0));
        for n in [1, 2, 3, 5] {
            let pa = shard::partition(&a, n);
            assert_eq!(pa, shard::partition(&a, n), "not deterministic");
            let jobs_of = |p: &[shard::Part]| p.iter().map(|p| p.jobs.clone()).collect::<Vec<_>>();
            assert_eq!(jobs_of(&pa), jobs_of(&shard::partition(&b, n)));
            assert_eq!(jobs_of(&pa), jobs_of(&shard::partition(&c, n)));
            // Within a shard, jobs keep sweep order.
            for p in &pa {
                assert!(p.jobs.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}

/// The full key of a short test label `NAME/DEPTH` (e.g. `x/1`): a small mlp config whose
/// variant is NAME, so that the row's fields give its key as every reader checks.
fn k(label: &str) -> String {
    let (v, d) = label.split_once('/').unwrap_or((label, "1"));
    format!("{v}/mlp/4/3/2/{d}/1/1/on/f32/0/cpu")
}

/// A synthetic row of a full key or a short label (only the cells merge looks at, and the
/// config fields its key is made of).
fn row(key: &str, ts: &str, median_ns: u64) -> Row {
    let full = if key.split('/').count() == 12 {
        key.to_string()
    } else {
        k(key)
    };
    let p: Vec<&str> = full.split('/').collect();
    let n = |i: usize| p[i].parse::<usize>().expect("a number in the key");
    Row {
        schema: densebench::results::row::SCHEMA_VERSION,
        framework: "densebench".to_string(),
        math: "ieee".to_string(),
        execution: "eager".to_string(),
        key: full.clone(),
        variant: p[0].to_string(),
        family: p[1].to_string(),
        batch: n(2),
        channels: n(3),
        growth: n(4),
        depth: n(5),
        bn_size: n(6),
        size: p[7].parse().expect("a size in the key"),
        activation: p[8] == "on",
        dtype: p[9].to_string(),
        seed: n(10) as u64,
        device: p[11].to_string(),
        timestamp: ts.to_string(),
        status: "ok".to_string(),
        median_ns: Some(median_ns),
        ..Row::default()
    }
}

fn csv(dir: &Path, name: &str, rows: &[Row]) -> PathBuf {
    let p = dir.join(name);
    write_rows(&p, rows).expect("writing a test CSV");
    p
}

fn keys_of(p: &Path) -> Vec<String> {
    read_rows(p)
        .expect("a valid result CSV")
        .into_iter()
        .map(|r| r.key)
        .collect()
}

const T1: &str = "2025-01-01T10:00:00Z";
const T2: &str = "2025-01-01T11:00:00Z";

#[test]
fn merge_refuses_conflicts_dedups_identical_rows_and_prefers_newest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let a = csv(d, "a.csv", &[row("x/1", T1, 10), row("y/1", T1, 20)]);
    // y/1 copied identically, z/1 new.
    let b = csv(d, "b.csv", &[row("y/1", T1, 20), row("z/1", T1, 30)]);
    let out = d.join("out.csv");
    let o = densebench(&["merge", s(&out), s(&a), s(&b)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(keys_of(&out), [k("x/1"), k("y/1"), k("z/1")]);
    assert!(
        stderr(&o).contains("1 identical duplicates"),
        "{}",
        stderr(&o)
    );

    // x/1 measured again, later, with another value: refused, naming the key and column.
    let c = csv(d, "c.csv", &[row("x/1", T2, 11)]);
    let out2 = d.join("out2.csv");
    let o = densebench(&["merge", s(&out2), s(&a), s(&c)]);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains(&k("x/1")) && e.contains("median_ns") && e.contains("--prefer newest"),
        "{e}"
    );
    assert!(!out2.exists(), "a refused merge wrote its output");

    // --prefer newest keeps the later row, whichever file comes first.
    for order in [[&a, &c], [&c, &a]] {
        let o = densebench(&[
            "merge",
            s(&out2),
            s(order[0]),
            s(order[1]),
            "--prefer",
            "newest",
            "--force",
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
        let rows = read_rows(&out2).expect("valid");
        let x = rows.iter().find(|r| r.key == k("x/1")).map(|r| r.median_ns);
        assert_eq!(x, Some(Some(11)), "the newest x/1 (T2, 11 ns) wins");
        assert_eq!(rows.len(), 2);
    }

    // The library API says the same.
    let inputs = [
        Input {
            name: "a".into(),
            rows: vec![row("k", T2, 1)],
        },
        Input {
            name: "b".into(),
            rows: vec![row("k", T1, 2), row("k", T2, 1)],
        },
    ];
    assert!(merge::merge_rows(&inputs, None).is_err());
    let m = merge::merge_rows(&inputs, Some(Prefer::Newest)).expect("resolves");
    assert_eq!(
        (m.rows.len(), m.identical_duplicates, m.resolved.len()),
        (1, 1, 1)
    );
}

#[test]
fn merge_is_idempotent_and_protects_its_output() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let a = csv(d, "a.csv", &[row("x/1", T1, 10), row("y/1", T1, 20)]);
    let b = csv(d, "b.csv", &[row("z/1", T1, 30), row("x/1", T2, 12)]);
    let out = d.join("merged.csv");
    let o = densebench(&["merge", s(&out), s(&a), s(&b), "--prefer", "newest"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let first = std::fs::read(&out).expect("merged");
    // OUT exists and is not an input: refused, untouched.
    let o = densebench(&["merge", s(&out), s(&a)]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--force"), "{}", stderr(&o));
    assert_eq!(std::fs::read(&out).expect("still there"), first);
    // OUT as an input, in any position: the same bytes again.
    for args in [
        vec![s(&out), s(&out), s(&a), s(&b)],
        vec![s(&out), s(&a), s(&b), s(&out)],
    ] {
        let mut full = vec!["merge"];
        full.extend(args);
        full.extend(["--prefer", "newest"]);
        let o = densebench(&full);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(
            std::fs::read(&out).expect("merged"),
            first,
            "not idempotent"
        );
    }
}

/// Status 2 is merge's "merged, keys missing" (a Slurm merge job plots what it merged then):
/// an input that cannot be read — missing, torn, not a result CSV — writes nothing and exits 1,
/// as `merge --help` says, never 2.
#[test]
fn merge_of_an_unreadable_input_exits_1() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let a = csv(d, "a.csv", &[row("x/1", T1, 10), row("y/1", T1, 20)]);
    let text = std::fs::read_to_string(&a).expect("a.csv");
    let torn = d.join("torn.csv");
    std::fs::write(&torn, &text[..text.len() - 20]).expect("torn.csv");
    let foreign = d.join("foreign.csv");
    std::fs::write(&foreign, "a,b\n1,2\n").expect("foreign.csv");
    let missing = d.join("missing.csv");
    let out = d.join("merged.csv");
    for bad in [&torn, &foreign, &missing] {
        let o = densebench(&["merge", s(&out), s(&a), s(bad)]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{}: {}",
            bad.display(),
            stderr(&o)
        );
        assert!(stderr(&o).contains(s(bad)), "{}", stderr(&o));
        assert!(!out.exists(), "{}: wrote {}", bad.display(), out.display());
    }
}

#[test]
fn merge_reports_missing_keys_per_shard() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let all = jobs(sweep::QUICK_SWEEP);
    let spec = ShardSpec { index: 2, count: 3 };
    let shard2: BTreeSet<String> = shard::select(all.clone(), spec)
        .into_iter()
        .map(|j| j.key)
        .collect();
    // Every key except shard 2's, in reverse order.
    let rows: Vec<Row> = all
        .iter()
        .rev()
        .filter(|j| !shard2.contains(&j.key))
        .map(|j| row(&j.key, T1, 1))
        .collect();
    let part = csv(d, "part.csv", &rows);
    let out = d.join("out.csv");
    let o = densebench(&["merge", s(&out), s(&part), "--quick", "--shards", "3"]);
    let e = stderr(&o);
    assert_eq!(
        o.status.code(),
        Some(i32::from(densebench::commands::merge::EXIT_INCOMPLETE)),
        "{e}"
    );
    assert!(
        e.contains(&format!("{} of the {} keys", shard2.len(), all.len())),
        "{e}"
    );
    assert!(e.contains("shard 2/3") && !e.contains("shard 1/3"), "{e}");
    for k in &shard2 {
        assert!(e.contains(k.as_str()), "missing key {k} not reported");
    }
    // Rows are written in the sweep's order whatever order the inputs had.
    let want: Vec<String> = all
        .iter()
        .filter(|j| !shard2.contains(&j.key))
        .map(|j| j.key.clone())
        .collect();
    assert_eq!(keys_of(&out), want);
}

fn bench(dir: &Path, out: &str, extra: &[&str]) -> (PathBuf, Output) {
    let out = dir.join(out);
    let cache = dir.join("cache");
    let mut args = vec!["bench-all", "--out", s(&out), "--cache-dir", s(&cache)];
    args.extend_from_slice(extra);
    let o = densebench(&args);
    (out, o)
}

fn key_status(p: &Path) -> BTreeMap<String, String> {
    read_rows(p)
        .expect("valid result CSV")
        .into_iter()
        .map(|r| (r.key, r.status))
        .collect()
}

#[test]
fn three_shards_merge_to_the_whole_quick_sweep() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let mut files = Vec::new();
    for i in 1..=3 {
        let shard = format!("{i}/3");
        let (out, o) = bench(d, &format!("shard{i}.csv"), &["--quick", "--shard", &shard]);
        assert!(o.status.success(), "shard {shard}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("shard {shard}")),
            "{}",
            stderr(&o)
        );
        files.push(out);
    }
    // A retried shard (--resume) adds nothing.
    let before = std::fs::read(&files[1]).expect("shard 2");
    let (_, o) = bench(d, "shard2.csv", &["--quick", "--shard", "2/3", "--resume"]);
    assert!(
        o.status.success() && stderr(&o).contains("0 to run"),
        "{}",
        stderr(&o)
    );
    assert_eq!(std::fs::read(&files[1]).expect("shard 2"), before);
    // Resuming a shard file with another shard's spec keeps its rows and says so.
    let (_, o) = bench(d, "shard2.csv", &["--quick", "--shard", "1/3", "--resume"]);
    assert!(
        stderr(&o).contains("not jobs of this run"),
        "{}",
        stderr(&o)
    );
    std::fs::write(&files[1], &before).expect("restoring shard 2");

    let merged = d.join("merged.csv");
    let mut args = vec!["merge", s(&merged)];
    args.extend(files.iter().map(|f| s(f)));
    args.extend(["--quick", "--shards", "3"]);
    let o = densebench(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("complete"), "{}", stderr(&o));
    let want: BTreeMap<String, String> = jobs(sweep::QUICK_SWEEP)
        .into_iter()
        .map(|j| (j.key, "ok".to_string()))
        .collect();
    assert_eq!(key_status(&merged), want);
}

#[test]
fn plan_lists_every_key_once_per_shard() {
    let o = densebench(&["plan", "--quick", "--shards", "3", "--format", "tsv"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let all = jobs(sweep::QUICK_SWEEP);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("shard\tkey\tcost_gflop_eq"));
    let listed: BTreeMap<String, usize> = lines
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[1].to_string(), f[0].parse().expect("shard number"))
        })
        .collect();
    assert_eq!(listed.len(), all.len());
    for i in 1..=3 {
        let spec = ShardSpec { index: i, count: 3 };
        for j in shard::select(all.clone(), spec) {
            assert_eq!(listed.get(&j.key), Some(&i), "{} not in shard {i}", j.key);
        }
    }
    let o = densebench(&["plan", "--quick", "--shards", "3"]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(text.matches("\nshard ").count(), 3, "{text}");
    let o = densebench(&["bench-all", "--quick", "--shard", "0/3"]);
    assert!(stderr(&o).contains("count from 1"), "{}", stderr(&o));
}

#[test]
fn devices_without_cuda_give_error_rows_keyed_by_the_first_device() {
    if DeviceSpec::Cuda(0).check_available().is_ok() {
        eprintln!("skipped: CUDA is available here, so cuda devices would measure, not fail");
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (out, o) = bench(
        dir.path(),
        "dev.csv",
        &["--quick", "--devices", "cuda:0,cuda:1"],
    );
    // every row written, and the run fails: nothing was measured
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("rows that failed (error: "),
        "{}",
        stderr(&o)
    );
    let rows = read_rows(&out).expect("valid CSV");
    let keys: BTreeSet<String> = rows.iter().map(|r| r.key.clone()).collect();
    let want: BTreeSet<String> = sweep::retarget(jobs(sweep::QUICK_SWEEP), DeviceSpec::Cuda(0))
        .into_iter()
        .map(|j| j.key)
        .collect();
    assert_eq!(keys.len(), rows.len(), "duplicate rows");
    assert_eq!(keys, want);
    for r in &rows {
        assert_eq!(
            (r.status.as_str(), r.device.as_str()),
            ("error", "cuda:0"),
            "{}",
            r.key
        );
    }
    let o = densebench(&["bench-all", "--quick", "--devices", "cpu,cuda:0"]);
    assert!(stderr(&o).contains("only be used alone"), "{}", stderr(&o));
    let o = densebench(&["bench-all", "--quick", "--devices", "cuda:1,cuda:1"]);
    assert!(stderr(&o).contains("twice"), "{}", stderr(&o));
}

/// Two tiny mlp configurations on the CPU (rows `ok`) and one on `cuda:0`, which a build or
/// machine without CUDA turns into `error` rows at once.
const FAIL_SWEEP: &str = r#"
name = "fail"
[defaults]
steps = 1
warmup = 0
[[group]]
family = "mlp"
batch = 4
channels = 3
growth = 2
depth = [1, 2]
variants = ["cat-store-copy", "autograd"]
[[group]]
family = "mlp"
batch = 4
channels = 3
growth = 2
depth = 1
variants = ["cat-store-copy", "autograd"]
device = "cuda:0"
"#;

fn cuda_available() -> bool {
    let yes = DeviceSpec::Cuda(0).check_available().is_ok();
    if yes {
        eprintln!("skipped: CUDA is available here, so cuda rows would measure, not fail");
    }
    yes
}

/// Removes the row of `key` from a result CSV (as a preemption before it was written would
/// have left the file).
fn drop_row(p: &Path, key: &str) {
    let text = std::fs::read_to_string(p).expect("a result CSV");
    let kept: String = text
        .split_inclusive('\n')
        .filter(|l| !l.contains(&format!("{key},")))
        .collect();
    assert_ne!(kept, text, "{key} not in {}", p.display());
    std::fs::write(p, kept).expect("rewriting the CSV");
}

/// A shard task retried with `--resume` (after a preemption) judges every row of its jobs in
/// its file, the kept ones too: it exits 1 while the file holds failed rows of this shard, as
/// the fresh run did (docs/slurm.md: such a task "ends with exit status 1"), and says how many
/// were kept from before.
#[test]
fn a_resumed_shard_still_fails_on_the_failed_rows_it_kept() {
    if cuda_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let sweep_file = d.join("fail.toml");
    std::fs::write(&sweep_file, FAIL_SWEEP).expect("sweep file");
    let all = jobs(FAIL_SWEEP);
    let shard_of = |i: usize| shard::select(all.clone(), ShardSpec { index: i, count: 2 });
    let is_cuda = |j: &Job| j.key.ends_with("/cuda:0");
    // The shard with both: error rows (cuda) and ok rows (cpu).
    let mixed = (1..=2)
        .find(|&i| {
            let js = shard_of(i);
            js.iter().any(is_cuda) && js.iter().any(|j| !is_cuda(j))
        })
        .expect("a shard holds cuda and cpu jobs");
    let spec = format!("{mixed}/2");
    let args = ["--sweep", s(&sweep_file), "--shard", &spec];
    let (out, o) = bench(d, "f.csv", &args);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let rows = read_rows(&out).expect("valid CSV");
    let errors = rows.iter().filter(|r| r.status == "error").count();
    assert!(errors > 0, "{}", stderr(&o));
    let ok_key = rows
        .iter()
        .find(|r| r.status == "ok")
        .map(|r| r.key.clone())
        .expect("an ok row");

    // Preempted before its last ok row was written: the retry measures it, and still fails.
    drop_row(&out, &ok_key);
    let mut resume = args.to_vec();
    resume.push("--resume");
    let (_, o) = bench(d, "f.csv", &resume);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("1 rows written") && e.contains("(ok: 1)"), "{e}");
    assert!(e.contains("kept from before"), "{e}");
    assert!(
        e.contains(&format!(
            "rows that failed (error: {errors}; {errors} of them kept from before (error: \
             {errors}))"
        )),
        "{e}"
    );
    // Nothing left to run: the file still holds them, the status says so.
    let (_, o) = bench(d, "f.csv", &resume);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("nothing to do") && e.contains(&format!("rows that failed (error: {errors}")),
        "{e}"
    );
    // (A shard whose rows are all ok resumes with status 0: three_shards_merge_to_the_whole_…)
}

/// A merge whose inputs hold failed rows says how many, by status, and which shards to rerun
/// with `--resume --rerun-failed`; "complete" (every key has a row) stays exit status 0.
#[test]
fn merge_counts_failed_rows_and_names_their_shards() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let text = r#"
name = "m"
[[group]]
family = "mlp"
batch = 4
channels = 3
growth = 2
depth = [1, 2, 3]
variants = ["cat-store-copy", "autograd"]
"#;
    let sweep_file = d.join("m.toml");
    std::fs::write(&sweep_file, text).expect("sweep file");
    let all = jobs(text);
    let shard2: BTreeSet<String> = shard::select(all.clone(), ShardSpec { index: 2, count: 2 })
        .into_iter()
        .map(|j| j.key)
        .collect();
    // Two failed rows, both of shard 2: an error and a crash.
    let mut failed = shard2.iter();
    let (e1, e2) = (
        failed.next().expect("a key"),
        failed.next().expect("two keys"),
    );
    let rows: Vec<Row> = all
        .iter()
        .map(|j| {
            let mut r = row(&j.key, T1, 1);
            if &j.key == e1 {
                r.status = "error".into();
                r.error = "built without CUDA support".into();
            } else if &j.key == e2 {
                r.status = "crashed".into();
                r.error = "crashed by SIGSEGV".into();
            }
            r
        })
        .collect();
    let input = csv(d, "all.csv", &rows);
    let out = d.join("out.csv");
    let o = densebench(&[
        "merge",
        s(&out),
        s(&input),
        "--sweep",
        s(&sweep_file),
        "--shards",
        "2",
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(e.contains("2 rows failed (crashed: 1, error: 1)"), "{e}");
    assert!(
        e.contains("rerun shard(s) 2 of 2 with --resume --rerun-failed"),
        "{e}"
    );
    assert!(
        e.contains("complete") && e.contains("2 of them failed"),
        "{e}"
    );
    // Without a sweep: counted all the same.
    let o = densebench(&["merge", s(&out), s(&input), "--force"]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(0), "{e}");
    assert!(e.contains("2 rows failed (crashed: 1, error: 1)"), "{e}");
    // All ok: no word of failures.
    let ok = csv(
        d,
        "ok.csv",
        &all.iter().map(|j| row(&j.key, T1, 1)).collect::<Vec<_>>(),
    );
    let o = densebench(&["merge", s(&out), s(&ok), "--force"]);
    assert!(
        o.status.success() && !stderr(&o).contains("failed"),
        "{}",
        stderr(&o)
    );
}

/// With several devices, jobs finish in another order than they start: each finish line
/// carries its start line's number and names the device it ran on, so the two can be matched.
/// Twelve configurations, and the runner starts no worker before all are ready: with three
/// instant ones, one worker once drained the queue before the other began (CI, under load).
#[test]
fn progress_lines_of_several_devices_match_start_and_finish() {
    if cuda_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let text = r#"
name = "dev"
[defaults]
steps = 1
warmup = 0
[[group]]
family = "mlp"
batch = 4
channels = 3
growth = 2
depth = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
variants = ["cat-store-copy", "autograd"]
"#;
    let sweep_file = d.join("dev.toml");
    std::fs::write(&sweep_file, text).expect("sweep file");
    let (_, o) = bench(
        d,
        "dev.csv",
        &["--sweep", s(&sweep_file), "--devices", "cuda:0,cuda:1"],
    );
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    // [n/N] <config> <variant> on <device> …
    let mut started: BTreeMap<usize, (String, String, String)> = BTreeMap::new();
    // [n/N] <key> on <device> <status>: …
    let mut finished: BTreeMap<usize, (String, String)> = BTreeMap::new();
    for line in e.lines().filter(|l| l.starts_with('[')) {
        let (n, rest) = line[1..].split_once('/').expect("[n/N]");
        let n: usize = n.parse().expect("a job number");
        let rest = rest.split_once("] ").expect("[n/N] ").1;
        if let Some(what) = rest.strip_suffix(" …") {
            let (what, dev) = what.rsplit_once(" on ").expect("a device named");
            let (config, variant) = what.rsplit_once(' ').expect("config and variant");
            let depth = config
                .split(' ')
                .find_map(|w| w.strip_prefix("L="))
                .expect("L=");
            let old = started.insert(n, (variant.into(), depth.into(), dev.into()));
            assert!(old.is_none(), "job {n} started twice:\n{e}");
        } else {
            let (key, rest) = rest.split_once(' ').expect("a key");
            let dev = rest
                .strip_prefix("on ")
                .and_then(|r| r.split(' ').next())
                .unwrap_or_else(|| panic!("no device on the finish line `{line}`"));
            let old = finished.insert(n, (key.into(), dev.into()));
            assert!(old.is_none(), "job {n} finished twice:\n{e}");
        }
    }
    assert_eq!(started.len(), 24, "{e}");
    assert_eq!(
        started.keys().collect::<Vec<_>>(),
        finished.keys().collect::<Vec<_>>(),
        "{e}"
    );
    let mut devices = BTreeSet::new();
    for (n, (variant, depth, dev)) in &started {
        let (key, fdev) = &finished[n];
        let f: Vec<&str> = key.split('/').collect();
        assert_eq!(
            (f[0], f[5], fdev.as_str()),
            (variant.as_str(), depth.as_str(), dev.as_str()),
            "job {n}: started as {variant} L={depth} on {dev}, finished as {key} on {fdev}\n{e}"
        );
        assert!(key.ends_with("/cuda:0"), "keyed by the first device: {key}");
        devices.insert(dev.clone());
    }
    assert_eq!(devices.len(), 2, "both devices ran jobs:\n{e}");
}

/// The costliest job of a sweep with its reference: no shard can be shorter than it.
fn floor(all: &[Job]) -> f64 {
    shard::groups(all)
        .iter()
        .flat_map(|g| {
            let reference = shard::reference_cost(all, &g.jobs);
            g.jobs.iter().map(move |&i| all[i].cost + reference)
        })
        .fold(0.0, f64::max)
}

fn longest_and_total(all: &[Job], n: usize) -> (f64, f64) {
    let parts = shard::partition(all, n);
    let longest = parts.iter().map(|p| p.cost).fold(0.0, f64::max);
    (longest, parts.iter().map(|p| p.cost).sum())
}

/// A configuration is split only when that shortens the longest shard: once the longest shard
/// is as short as it can be (the costliest job with its reference), more shards split nothing
/// more, and the total (each split pays its reference again) stays.
#[test]
fn more_shards_split_nothing_once_the_longest_cannot_shorten() {
    let all = jobs(sweep::DEFAULT_SWEEP);
    let floor = floor(&all);
    let (longest24, total24) = longest_and_total(&all, 24);
    assert!(
        longest24 <= floor * (1.0 + shard::WORTH_SPLITTING),
        "24 shards: longest {longest24:e}, the floor {floor:e}"
    );
    for n in [32, 48] {
        let (longest, total) = longest_and_total(&all, n);
        assert!(
            longest >= floor * (1.0 - 1e-12),
            "{n} shards below the floor?"
        );
        assert!(
            total <= total24 * (1.0 + 1e-12),
            "{n} shards: {total:e} in all against {total24:e} at 24, for a longest shard of \
             {longest:e} (24: {longest24:e}): splits that shorten nothing"
        );
    }
}

/// And where a split shortens the longest shard, it is made: four configurations of about the
/// same cost on three shards would put two whole ones together; one of them split shortens
/// that shard by about a job.
#[test]
fn a_split_is_made_where_it_shortens_the_longest_shard() {
    let text = r#"
[[group]]
family = "mlp"
batch = 4
channels = 3
growth = 2
depth = [1, 2, 3, 4]
variants = ["cat-store-copy", "autograd"]
"#;
    let all = jobs(text);
    let groups = shard::groups(&all);
    assert_eq!(groups.len(), 4);
    let least = groups.iter().map(|g| g.cost).fold(f64::INFINITY, f64::min);
    let (longest, _) = longest_and_total(&all, 3);
    assert!(
        longest < 1.9 * least,
        "3 shards: longest {longest:e}, two whole configurations cost {:e}",
        2.0 * least
    );
}

/// `merge` tells a torn input's user to rerun its shard with `--resume` (what repairs a row a
/// killed shard cut short), and only then: a NaN cell or an empty file is no torn row, and the
/// hint misled there (session 25).
#[test]
fn merge_hints_at_resume_only_for_a_torn_row() {
    let dir = tempfile::tempdir().expect("temp dir");
    let d = dir.path();
    let a = csv(d, "a.csv", &[row("x/1", T1, 10), row("y/1", T1, 20)]);
    let text = std::fs::read_to_string(&a).unwrap();
    let hint = "running it again with --resume";
    // the last row cut in the middle of a field
    let torn = d.join("torn.csv");
    std::fs::write(&torn, &text[..text.len() - 40]).unwrap();
    // a NaN in a byte count
    let nan = d.join("nan.csv");
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let at = lines[0].split(',').position(|c| c == "median_ns").unwrap();
    let mut cells: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(cells[at], "10");
    cells[at] = "NaN";
    lines[1] = cells.join(",");
    std::fs::write(&nan, lines.join("\n") + "\n").unwrap();
    let empty = d.join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    for (input, hinted) in [(&torn, true), (&nan, false), (&empty, false)] {
        let out = d.join("out.csv");
        let o = densebench(&["merge", s(&out), s(&a), s(input)]);
        let e = stderr(&o);
        assert!(!o.status.success(), "{}: {e}", input.display());
        assert_eq!(e.contains(hint), hinted, "{}: {e}", input.display());
        assert!(!out.exists());
    }
}
