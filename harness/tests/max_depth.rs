//! `densebench max-depth`: the depth it returns is confirmed by measured runs — the run at that
//! depth fits the budget and the run one layer deeper does not.

use std::process::Command;

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
