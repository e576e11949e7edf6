#!/usr/bin/env python3
"""Tests of scripts/peer_fidelity.py (the fidelity check, issue 36) that need no PyTorch: the
key parser, and the check itself on densebench's rows of a small CPU config, run end to end
against the densebench binary (`DENSEBENCH_BIN`, else target/release, else target/debug — the
one `cargo test` builds):

- honest: `densebench run`'s timed steps against `densebench step --bare-loop` of the same step
  agree within the CPU tolerance (±10 %), judged on the fastest step of each side over the
  repeats (load on a shared machine only ever slows a step);
- planted: the same with a delay of about half a step slept inside every timed step of the
  harness (`DENSEBENCH_PLANT_STEP_DELAY_US`, what a synchronisation or a probe in the timed step
  would cost) must fail the check — the check can fail.

Run after `cargo test` (CI: .ci/run), on a machine not busy with other work. Without a binary
the end-to-end tests say `skipped`. The last line is `N passed, N failed`.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "peer_fidelity.py")
sys.path.insert(0, os.path.dirname(HERE))
import peer_fidelity  # noqa: E402
from densebench_bin import binary  # noqa: E402

# A bc block whose step takes about ten milliseconds at -O1 on one thread: long enough that
# timer granularity, one allocation's jitter and the per-op hand-offs between the caller and
# rayon's pool are far below the 10 % tolerance, short enough for CI. (At 4 images of 8×8 a step
# took ~1.2 ms, and the hand-offs' wake-up latency, different from one process to the next,
# moved a whole row by −12 % in one CI run and +48 % in another, the same binary on both sides.)
CASE = {"batch": 8, "channels": 8, "growth": 4, "bn-size": 2, "size": 16, "depth": 4}
SWEEP = f"""
name = "fidelity-test"
[defaults]
peer = "none"
[[group]]
family = "bc"
batch = {CASE["batch"]}
channels = {CASE["channels"]}
growth = {CASE["growth"]}
bn_size = {CASE["bn-size"]}
size = {CASE["size"]}
depth = {CASE["depth"]}
variants = ["cat-store-copy", "buffer-recompute-inplace"]
"""


# Processes per side. On this project's shared 2-core hosts a whole process runs slow or fast (the
# steps inside one agree within a few per cent; one process's fastest step was 2.6 ms, the next
# one's, same binary, same side, 4.4–5.2 ms — other tenants' load on the core it landed on), so
# the fastest step of either side is only its true speed once some process of that side ran in a
# quiet spell. With 3 per side CI saw all three harness processes of both jobs slow (×1.42,
# ×1.68, stop 49); 8 per side cost ~10 s an attempt.
REPEAT = 8


def fidelity(bin_path: str, sweep: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, "--densebench", bin_path, "--sweep", sweep, "--peer", "none",
         "--steps", "10", "--warmup", "2", "--repeat", str(REPEAT), "--statistic", "min"],
        capture_output=True, text=True, env=env, timeout=900,
    )


class KeyParsing(unittest.TestCase):
    def test_plain_tf32_and_execution_suffixes(self):
        j = peer_fidelity.parse_key("cat-store-copy/bc/64/24/12/16/4/32/on/f32/0/cpu")
        self.assertEqual((j["variant"], j["depth"], j["math"], j["execution"]),
                         ("cat-store-copy", "16", "ieee", "eager"))
        j = peer_fidelity.parse_key("pytorch-compiled-naive/bc/64/24/12/16/4/32/on/f32/0/cuda:0/tf32/graph")
        self.assertEqual((j["device"], j["math"], j["execution"]), ("cuda:0", "tf32", "graph"))

    def test_the_malloc_tunables_are_the_harness_children_s(self):
        # The bare loops must run in the harness's process environment; a change in child.rs
        # must be made here too.
        with open(os.path.join(ROOT, "harness", "src", "measure", "child.rs")) as f:
            src = f.read()
        self.assertIn(f'"{peer_fidelity.HARNESS_GLIBC_TUNABLES}"', src.replace("\n    ", ""))

    def test_a_job_moved_to_a_gpu_names_it_and_a_compiled_peer_replays_graphs(self):
        cpu = peer_fidelity.parse_key("pytorch-compiled-naive/bc/64/24/12/16/4/32/on/f32/0/cpu/compiled")
        gpu = peer_fidelity.on_device(cpu, "cuda:0")
        self.assertEqual(gpu["key"], "pytorch-compiled-naive/bc/64/24/12/16/4/32/on/f32/0/cuda:0/graph")
        self.assertEqual((gpu["device"], gpu["execution"]), ("cuda:0", "graph"))
        self.assertEqual(peer_fidelity.on_device(gpu, "cpu")["key"], cpu["key"])
        own = peer_fidelity.parse_key("cat-store-copy/bc/64/24/12/16/4/32/on/f32/0/cpu")
        self.assertEqual(peer_fidelity.on_device(own, "cuda:1")["key"],
                         "cat-store-copy/bc/64/24/12/16/4/32/on/f32/0/cuda:1")

    def test_short_key_is_refused(self):
        with self.assertRaises(ValueError):
            peer_fidelity.parse_key("cat-store-copy/bc/64")


@unittest.skipIf(binary() is None, "no densebench binary (cargo build)")
class EndToEnd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = binary()
        cls.dir = tempfile.mkdtemp(prefix="fidelity-test-")
        cls.sweep = os.path.join(cls.dir, "sweep.toml")
        with open(cls.sweep, "w") as f:
            f.write(SWEEP)

    def test_honest_rows_agree_with_a_bare_loop(self):
        # Up to five attempts when the first is outside: another tenant's burst can slow every
        # process of one side of one pair, and for longer than one attempt (a fresh clone's run
        # on 2026-11-28: the harness side ×1.46–×1.53 in attempts 1 and 2, both pairs inside
        # in attempt 3; with three attempts a burst of three would have failed CI); a real
        # overhead in the timed step fails every attempt (the planted delay below fails all).
        # Judged one-sided here: what instrumentation in a timed step does is make the
        # harness's row slower than the bare loop. (On a smaller block, 1.2 ms a step, CI
        # measured the harness's buffer-recompute-inplace rows at ×0.88 of `step --bare-loop`'s
        # in one run and ×1.49 in another, every attempt of each: per-process wake-up latency of
        # rayon's hand-offs, see CASE; so the two-sided verdict is the script's, reported by it,
        # and this test asserts the side that matters.)
        for attempt in range(5):
            r = fidelity(self.bin, self.sweep)
            ratios = [float(line.split(", ×")[1].split(" ")[0])
                      for line in r.stdout.splitlines() if ", ×" in line]
            if len(ratios) == 2 and max(ratios) <= 1.10:
                break
            print(f"attempt {attempt + 1}:\n{r.stdout}", file=sys.stderr)
        self.assertEqual(len(ratios), 2, r.stdout + r.stderr)
        self.assertLessEqual(max(ratios), 1.10, r.stdout + r.stderr)

    def test_a_delay_planted_in_the_timed_step_fails_the_check(self):
        # Half the bare step's fastest time, slept inside every timed step of the harness.
        step = subprocess.run(
            [self.bin, "case", "--family", "bc"]
            + [a for k, v in CASE.items() for a in (f"--{k}", str(v))]
            + ["--out", os.path.join(self.dir, "case.st")], capture_output=True, text=True)
        self.assertEqual(step.returncode, 0, step.stderr)
        bare = subprocess.run(
            [self.bin, "step", "--case", os.path.join(self.dir, "case.st"), "--variant",
             "cat-store-copy", "--out", os.path.join(self.dir, "r.st"), "--force",
             "--bare-loop", "10", "--warmup", "2"],
            capture_output=True, text=True, env=dict(os.environ, RAYON_NUM_THREADS="1"))
        self.assertEqual(bare.returncode, 0, bare.stderr)
        fastest_us = json.loads(bare.stdout.strip().splitlines()[-1])["min_ns"] // 1000
        env = dict(os.environ, DENSEBENCH_PLANT_STEP_DELAY_US=str(max(1000, fastest_us // 2)))
        r = fidelity(self.bin, self.sweep, env)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("0 passed, 2 failed", r.stdout)

    @unittest.skipIf(peer_fidelity.torch_python() is None, "no PyTorch (just peer-setup)")
    def test_the_bare_peer_runs_a_bf16_job_under_autocast(self):
        # A bf16 job's bare loop as the peer runs it (f32 block, bf16 features, the forward
        # under autocast): on an H100 it failed with KeyError: 'bf16' before it knew the dtype.
        case = os.path.join(self.dir, "bf16.st")
        made = subprocess.run(
            [self.bin, "case", "--family", "bc", "--dtype", "bf16"]
            + [a for k, v in CASE.items() for a in (f"--{k}", str(v))]
            + ["--out", case], capture_output=True, text=True)
        self.assertEqual(made.returncode, 0, made.stderr)
        r = subprocess.run(
            [peer_fidelity.torch_python(), SCRIPT, "--bare-peer", case, "bc", "pytorch-naive",
             "cpu", "bf16", "on", "ieee", "1", "2", "1"],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        row = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(len(row["step_ns"]), 2)
        self.assertGreater(row["min_ns"], 0)

    def test_match_keeps_the_matching_jobs_and_the_csv_names_them(self):
        csv_path = os.path.join(self.dir, "match.csv")
        r = subprocess.run(
            [sys.executable, SCRIPT, "--densebench", self.bin, "--sweep", self.sweep, "--peer",
             "none", "--steps", "2", "--warmup", "0", "--repeat", "1", "--tolerance", "1000",
             "--match", "^buffer-recompute", "--csv", csv_path],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("fidelity: 1 jobs", r.stdout)
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([row["key"].split("/")[0] for row in rows], ["buffer-recompute-inplace"])
        self.assertEqual(rows[0]["verdict"], "ok")
        bad = subprocess.run(
            [sys.executable, SCRIPT, "--densebench", self.bin, "--sweep", self.sweep, "--peer",
             "none", "--match", "(unclosed"], capture_output=True, text=True, timeout=60)
        self.assertEqual(bad.returncode, 2, bad.stdout + bad.stderr)
        self.assertIn("--match: not a regular expression", bad.stderr)

    def test_a_check_stopped_by_sigterm_keeps_the_pairs_it_judged(self):
        # What a GPU call's `timeout` does to a check longer than the call: every finished
        # pair is in the CSV, which stays valid.
        csv_path = os.path.join(self.dir, "stopped.csv")
        p = subprocess.Popen(
            [sys.executable, SCRIPT, "--densebench", self.bin, "--sweep", self.sweep, "--peer",
             "none", "--steps", "2", "--warmup", "0", "--repeat", "60", "--tolerance", "1000",
             "--match", "^(cat-store-copy|buffer-recompute-inplace)/", "--csv", csv_path],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        judged = []
        while time.monotonic() < deadline and p.poll() is None:
            if os.path.exists(csv_path):
                with open(csv_path) as f:
                    judged = list(csv.DictReader(f))
            if judged:
                break
            time.sleep(0.2)
        self.assertEqual(len(judged), 1, "the first pair was never written")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 1, out + err)
        self.assertIn("stopped before every job ran", out)
        with open(csv_path) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual([r["key"].split("/")[0] for r in rows], ["cat-store-copy"], out)
        self.assertEqual(rows[0]["verdict"], "ok")


if __name__ == "__main__":
    result = unittest.main(verbosity=1, exit=False).result
    run = result.testsRun
    bad = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    print(f"{run - bad - skipped} passed, {bad} failed" + (f", {skipped} skipped" if skipped else ""))
    sys.exit(1 if bad else 0)
