//! `densebench max-depth`: the depth it returns is confirmed by measured runs — the run at that
//! depth fits the budget and the run one layer deeper does not.

use std::process::Command;

mod common;
use common::{densebench, path_str, stderr};

#[derive(Debug, serde::Deserialize)]
struct Answer {
    variant: String,
    budget_bytes: u64,
    max_depth: usize,
    measured_total_bytes: Option<u64>,
    measured_next_total_bytes: Option<u64>,
    method: String,
}

#[test]
fn max_depth_fits_and_one_deeper_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("md.csv");
    let budget: u64 = 6 << 20;
    let status = Command::new(env!("CARGO_BIN_EXE_densebench"))
        .args([
            "max-depth",
            "--family",
            "mlp",
            "--batch",
            "128",
            "--channels",
            "16",
            "--growth",
            "8",
        ])
        .args(["--budget", &budget.to_string(), "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let mut rdr = csv::Reader::from_path(&out).unwrap();
    let answers: Vec<Answer> = rdr.deserialize().map(|r| r.unwrap()).collect();
    // autograd + 6 hand-written mlp variants.
    assert_eq!(answers.len(), 7, "{answers:?}");
    let depth = |name: &str| {
        answers
            .iter()
            .find(|a| a.variant == name)
            .unwrap()
            .max_depth
    };
    for a in &answers {
        assert_eq!(a.budget_bytes, budget);
        assert!(a.max_depth >= 1, "{a:?}");
        let at = a
            .measured_total_bytes
            .expect("a measured run at the answer");
        assert!(at <= budget, "{a:?}: the answer does not fit");
        // One deeper: measured above the budget, or out of memory at the allocator limit.
        if let Some(next) = a.measured_next_total_bytes {
            assert!(next > budget, "{a:?}: one deeper still fits");
        }
        let expected = if a.variant == "autograd" {
            "measured"
        } else {
            "model+measured"
        };
        assert_eq!(a.method, expected);
    }
    // Linear-memory variants go deeper than naive within the same budget.
    assert!(depth("buffer-store-copy") > depth("cat-store-copy"));
    assert!(depth("cat-recompute-copy") > depth("cat-store-copy"));
}

/// `--no-confirm` answers from the model alone: it makes no measured run, so `autograd`, which
/// has no model, is left out and said so (it used to be searched by measured runs anyway), and
/// asking for autograd alone is refused.
#[test]
fn no_confirm_runs_nothing_and_leaves_out_what_has_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("md.csv");
    let o = Command::new(env!("CARGO_BIN_EXE_densebench"))
        .args(["max-depth", "--family", "mlp", "--batch", "128"])
        .args(["--channels", "16", "--growth", "8", "--budget", "6MiB"])
        .args(["--no-confirm", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(stdout.contains("(0 measured runs)"), "{stdout}");
    assert!(stdout.contains("within 6.0 MiB"), "{stdout}");
    assert!(
        stderr.contains("autograd left out: no memory model"),
        "{stderr}"
    );
    let mut rdr = csv::Reader::from_path(&out).unwrap();
    let answers: Vec<Answer> = rdr.deserialize().map(|r| r.unwrap()).collect();
    assert_eq!(answers.len(), 6, "{answers:?}");
    assert!(answers.iter().all(|a| a.method == "model"), "{answers:?}");
    let o = Command::new(env!("CARGO_BIN_EXE_densebench"))
        .args(["max-depth", "--family", "mlp", "--budget", "6MiB"])
        .args(["--variants", "autograd", "--no-confirm"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("drop --no-confirm"), "{stderr}");
}

/// A row of the CSV as the bound test reads it.
#[derive(Debug, serde::Deserialize)]
struct Bounded {
    variant: String,
    max_depth: usize,
    depth_ratio_to_naive: Option<f64>,
    note: String,
}

/// `max-depth --no-confirm` on the small mlp block within 6 MiB (naive fits L = 47,
/// `buffer-store-copy` 129 by the model) with `--max-depth BOUND`: the table and the CSV.
fn bounded(dir: &std::path::Path, bound: &str, variants: &str) -> (String, Vec<Bounded>) {
    let out = dir.join(format!("bound-{bound}.csv"));
    let o = densebench(&[
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
        "--max-depth",
        bound,
        "--variants",
        variants,
        "--out",
        path_str(&out),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{stdout}{}", stderr(&o));
    let mut rdr = csv::Reader::from_path(&out).unwrap();
    let rows = rdr.deserialize().map(|r| r.unwrap()).collect();
    (stdout, rows)
}

/// The table line of `variant`.
fn line<'a>(table: &'a str, variant: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.starts_with(&format!("{variant} ")))
        .unwrap_or_else(|| panic!("no line for {variant} in:\n{table}"))
}

/// A depth equal to `--max-depth` is where the search stopped, not where the block stops
/// fitting: the table shows `≥N` and its ratio as a bound, the CSV leaves the ratio empty and
/// says why in `note` (it used to print `1024 1.76` and write the ratio as if exact).
#[test]
fn a_depth_at_the_search_bound_is_a_lower_bound_in_table_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let pick = "cat-store-copy,buffer-store-copy";
    // Bound 1024: nothing reaches it; exact depths and ratio, empty notes.
    let (table, rows) = bounded(dir.path(), "1024", pick);
    assert!(!table.contains('≥'), "{table}");
    let buffer = rows.iter().find(|r| r.variant == "buffer-store-copy");
    let buffer = buffer.unwrap();
    assert_eq!(buffer.max_depth, 129, "{rows:?}");
    assert!(buffer.depth_ratio_to_naive.is_some() && buffer.note.is_empty());

    // Bound 100: buffer-store-copy stops at it, naive (47) does not.
    let (table, rows) = bounded(dir.path(), "100", pick);
    assert!(
        line(&table, "buffer-store-copy").contains("≥100")
            && line(&table, "buffer-store-copy").contains("≥2.13"),
        "{table}"
    );
    assert!(
        line(&table, "cat-store-copy").contains(" 47 ")
            && !line(&table, "cat-store-copy").contains('≥'),
        "{table}"
    );
    assert!(table.contains("raise --max-depth"), "{table}");
    let (naive, buffer) = (&rows[0], &rows[1]);
    assert_eq!(
        (naive.variant.as_str(), naive.max_depth),
        ("cat-store-copy", 47)
    );
    assert_eq!(naive.depth_ratio_to_naive, Some(1.0));
    assert!(naive.note.is_empty(), "{naive:?}");
    assert_eq!(buffer.max_depth, 100);
    assert_eq!(
        buffer.depth_ratio_to_naive, None,
        "a lower bound written as exact"
    );
    assert!(
        buffer
            .note
            .contains("search bound reached: fits at least up to L=100; raise --max-depth")
            && buffer.note.contains("at least 2.13"),
        "{buffer:?}"
    );

    // Bound 5: both stop at it; naive against itself is still 1, the other ratio unknown.
    let (table, rows) = bounded(dir.path(), "5", pick);
    assert!(line(&table, "cat-store-copy").contains("≥5"), "{table}");
    assert!(line(&table, "buffer-store-copy").contains(" ? "), "{table}");
    assert_eq!(rows[1].depth_ratio_to_naive, None);
    assert!(
        rows.iter()
            .all(|r| r.max_depth == 5 && r.note.contains("search bound reached")),
        "{rows:?}"
    );
    assert!(rows[1].note.contains("both reached"), "{rows:?}");
}

/// Defect: a measured search that stopped at `--max-depth` printed `oom` in the L+1 column,
/// for a depth it never ran (the variant used a fraction of the budget there). Now `not run`.
#[test]
fn a_depth_past_the_search_bound_is_not_reported_as_oom() {
    let o = densebench(
        &[
            &["max-depth"][..],
            common::TINY_MLP,
            &[
                "--budget",
                "3MiB",
                "--variants",
                "buffer-store-inplace",
                "--max-depth",
                "40",
            ],
        ]
        .concat(),
    );
    let table = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{table}{}", stderr(&o));
    let l = line(&table, "buffer-store-inplace");
    assert!(l.contains("≥40") && l.contains("not run"), "{table}");
    assert!(!l.contains("oom"), "{table}");
}

/// `max-depth --no-confirm --family mlp` on a small block (`--batch`) in f32 and bf16, its CSV
/// written to `out`.
fn model_answers(batch: &str, out: &std::path::Path) {
    let o = densebench(&[
        "max-depth",
        "--family",
        "mlp",
        "--batch",
        batch,
        "--channels",
        "16",
        "--growth",
        "8",
        "--budget",
        "8MiB",
        "--variants",
        "cat-store-copy",
        "--dtype",
        "f32,bf16",
        "--no-confirm",
        "--max-depth",
        "300",
        "--out",
        path_str(out),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The answers of CSV `from` in `dtype` alone, written to `to`.
fn only(from: &std::path::Path, dtype: &str, to: &std::path::Path) {
    let text = std::fs::read_to_string(from).unwrap();
    let mut lines = text.lines();
    let mut kept = vec![lines.next().unwrap().to_string()];
    kept.extend(
        lines
            .filter(|l| l.split(',').nth(10) == Some(dtype))
            .map(str::to_string),
    );
    std::fs::write(to, kept.join("\n") + "\n").unwrap();
}

/// Defect (session 25): `report --max-depth` paired an f32 answer with a bf16 one by variant,
/// family and budget alone, so a BC-100 f32 answer and a tiny block's bf16 answer read as
/// "bf16 goes 79.83× deeper". max-depth CSVs now record the block (`block`), the report pairs
/// only answers of one block, and says when a file adds nothing or two answers disagree; a
/// result CSV given as a max-depth CSV is refused (status 2) as what it is, and a bad cell is
/// named by its line and column, not "field 3".
#[test]
fn report_pairs_max_depth_answers_only_of_one_block() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    model_answers("128", &p("big.csv"));
    model_answers("16", &p("small.csv"));
    let header = std::fs::read_to_string(p("big.csv")).unwrap();
    assert!(
        header.starts_with(
            "variant,family,budget_bytes,max_depth,predicted_total_bytes,measured_total_bytes,\
             measured_next_total_bytes,depth_ratio_to_naive,method,note,dtype,block\n"
        ),
        "{header}"
    );
    assert!(
        header.contains(",f32,mlp N=128 C0=16 k=8 relu=on on cpu ("),
        "{header}"
    );
    only(&p("big.csv"), "f32", &p("big-f32.csv"));
    only(&p("small.csv"), "bf16", &p("small-bf16.csv"));
    // a result CSV for the report itself
    let results = p("results.csv");
    let o = densebench(&[
        "run",
        "--family",
        "mlp",
        "--depth",
        "1",
        "--batch",
        "4",
        "--growth",
        "2",
        "--channels",
        "4",
        "--variant",
        "cat-store-copy",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--format",
        "csv",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&results, &o.stdout).unwrap();
    let report = |max_depth: &[&std::path::Path]| {
        let md = p("REPORT.md");
        let mut args = vec![
            "report".to_string(),
            path_str(&results).to_string(),
            "--out".to_string(),
            path_str(&md).to_string(),
        ];
        for f in max_depth {
            args.push("--max-depth".to_string());
            args.push(path_str(f).to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = densebench(&args);
        let text = std::fs::read_to_string(&md).unwrap_or_default();
        (o, text)
    };
    // two blocks: nothing paired, each file said to add nothing
    let (o, md) = report(&[&p("big-f32.csv"), &p("small-bf16.csv")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!md.contains("Max depth within a budget"), "{md}");
    assert_eq!(
        stderr(&o)
            .matches("none of its answers has a partner")
            .count(),
        2,
        "{}",
        stderr(&o)
    );
    // one block: paired, the table named by it
    let (o, md) = report(&[&p("big-f32.csv"), &p("big.csv")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(md.contains("`mlp N=128 C0=16 k=8 relu=on on cpu ("), "{md}");
    assert!(!stderr(&o).contains("disagree"), "{}", stderr(&o));
    // the same block answered twice with another depth: warned, the last one used
    let edited = std::fs::read_to_string(p("big-f32.csv")).unwrap();
    let mut rows: Vec<String> = edited.lines().map(str::to_string).collect();
    let mut cells: Vec<String> = rows[1].split(',').map(str::to_string).collect();
    cells[3] = (cells[3].parse::<usize>().unwrap() + 5).to_string();
    rows[1] = cells.join(",");
    std::fs::write(p("other-f32.csv"), rows.join("\n") + "\n").unwrap();
    let (o, _) = report(&[&p("big.csv"), &p("other-f32.csv")]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("disagree") && stderr(&o).contains("the last one given is used"),
        "{}",
        stderr(&o)
    );
    // a result CSV given as a max-depth CSV
    let (o, _) = report(&[&results]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("is a result CSV"), "{}", stderr(&o));
    // a bad cell: its line and column by name
    let bad =
        std::fs::read_to_string(p("big.csv"))
            .unwrap()
            .replacen(",mlp,8388608,", ",mlp,NaN,", 1);
    std::fs::write(p("bad.csv"), bad).unwrap();
    let (o, _) = report(&[&p("bad.csv")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("line 2, column `budget_bytes`") && !stderr(&o).contains("field "),
        "{}",
        stderr(&o)
    );
}

/// A run near the budget can land on either side of it from one process to the next (a bc
/// N=16 8×8 bf16 block at 16 MiB measured L=64 too big, then fitting): the confirmation measures
/// each depth once, so a depth found too big on the way down is the answer's "one deeper" and
/// the answer cannot contradict its own note ("L=64 does not fit" and "L=64 fits").
#[test]
fn confirmation_measures_each_depth_once() {
    use densebench::measure::capacity::{confirm_model_depth, Probe};
    // The model says 64; a flaky measurement says 64 is too big first, fits when asked again.
    let mut asked = Vec::new();
    let c = confirm_model_depth(64, 1024, |l| {
        asked.push(l);
        let again = asked.iter().filter(|&&a| a == l).count() > 1;
        Ok(match l {
            ..=63 => Probe::Fits(100 + l as u64),
            64 if again => Probe::Fits(164),
            _ => Probe::TooBig(Some(200 + l as u64)),
        })
    })
    .unwrap();
    assert_eq!(asked, [64, 63], "each depth measured once");
    assert_eq!(c.depth, 63);
    assert_eq!(c.measured_total_bytes, Some(163));
    assert_eq!(c.measured_next_total_bytes, Some(264));
    assert_eq!(c.notes, ["model said L=64 fits, measured it does not"]);

    // Walking up still measures each deeper depth once, and stops at the first that does not fit.
    let mut asked = Vec::new();
    let c = confirm_model_depth(10, 1024, |l| {
        asked.push(l);
        Ok(if l <= 12 {
            Probe::Fits(l as u64)
        } else {
            Probe::TooBig(None)
        })
    })
    .unwrap();
    assert_eq!(asked, [10, 11, 12, 13]);
    assert_eq!((c.depth, c.measured_total_bytes), (12, Some(12)));
    assert_eq!(c.measured_next_total_bytes, None);
    assert_eq!(c.notes.len(), 2);
}
