//! The Slurm path on a real Slurm: runs scripts/slurm/single-node-test.sh (a private
//! single-node cluster on loopback: the quick sweep as a 3-task array merged and compared with a
//! single-machine run, then a task cancelled mid-run and resubmitted) with this build's binary,
//! and checks the CSVs it leaves behind once more with the harness's own reader.
//!
//! Skipped, with the reason printed, when the script cannot run a cluster here (exit 77: not
//! root, no apt-get, Slurm not installable or not starting) or when `DENSEBENCH_SKIP_SLURM=1`.
//! As root with apt access (CI) it installs slurm-wlm and munge and runs: about 40 s.

use densebench::results::row::read_rows;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// The script's "cannot run here" exit status (the automake convention for a skipped test).
const SKIPPED: i32 = 77;

fn key_status(p: &Path) -> BTreeMap<String, String> {
    let rows = read_rows(p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
    let n = rows.len();
    let map: BTreeMap<String, String> = rows.into_iter().map(|r| (r.key, r.status)).collect();
    assert_eq!(map.len(), n, "{}: duplicated keys", p.display());
    map
}

#[test]
fn sweep_on_a_single_node_slurm_cluster() {
    if std::env::var("DENSEBENCH_SKIP_SLURM").is_ok_and(|v| v == "1") {
        eprintln!("skipped: DENSEBENCH_SKIP_SLURM=1");
        return;
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let keep = tempfile::tempdir().expect("temp dir");
    let out = Command::new("bash")
        .arg(repo.join("scripts/slurm/single-node-test.sh"))
        .env("DENSEBENCH_BIN", env!("CARGO_BIN_EXE_densebench"))
        .env("DENSEBENCH_SLURM_TEST_KEEP", keep.path())
        .output()
        .expect("bash runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.code() == Some(SKIPPED) {
        eprintln!("skipped: no Slurm cluster here:\n{text}");
        return;
    }
    assert!(out.status.success(), "the Slurm test failed:\n{text}");
    eprintln!("{text}");

    // The 3-task array, merged, has the single-machine run's keys and statuses, all ok.
    let single = key_status(&keep.path().join("single.csv"));
    let merged = key_status(&keep.path().join("quick/merged.csv"));
    assert_eq!(merged, single);
    assert!(merged.values().all(|s| s == "ok"), "{merged:?}");
    // After the cancel and the resubmission: every key of the slow sweep once, all ok, and the
    // two shard files partition it.
    let slow = key_status(&keep.path().join("slow/merged.csv"));
    let s1 = key_status(&keep.path().join("slow/shard-1-of-2.csv"));
    let s2 = key_status(&keep.path().join("slow/shard-2-of-2.csv"));
    assert!(slow.values().all(|s| s == "ok"), "{slow:?}");
    let k1: BTreeSet<&String> = s1.keys().collect();
    let k2: BTreeSet<&String> = s2.keys().collect();
    assert!(k1.is_disjoint(&k2), "a key in both shards");
    assert_eq!(
        k1.union(&k2).copied().collect::<BTreeSet<_>>(),
        slow.keys().collect()
    );
}
