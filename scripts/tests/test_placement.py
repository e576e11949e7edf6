#!/usr/bin/env python3
"""Tests of scripts/placement.py (does a step's time depend on the CPU its process runs on):
the verdict from per-CPU process medians, the `--cpus` reading, and one end-to-end round on the
CPU device against the densebench binary (`DENSEBENCH_BIN`, else target/release, else
target/debug; skipped without one): every process pinned where it was asked to be, one CSV row
per process. Standard library only:

    python3 scripts/tests/test_placement.py
"""

import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "placement.py")
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import placement  # noqa: E402
from test_peer_fidelity import binary  # noqa: E402  (the same binary the fidelity tests use)


class Verdict(unittest.TestCase):
    def test_steady_placement_and_process(self):
        tol = 0.05
        # every process alike
        self.assertEqual(placement.verdict({0: [100, 101], 2: [100, 102]}, tol), "steady")
        # each CPU steady, the CPUs 20 % apart: where the process runs decides
        self.assertEqual(placement.verdict({0: [100, 101], 2: [120, 121]}, tol), "placement")
        # processes on one CPU 25 % apart: something per process, not per CPU
        self.assertEqual(placement.verdict({0: [100, 125], 2: [100, 101]}, tol), "process")

    def test_spread_is_range_over_median(self):
        self.assertAlmostEqual(placement.spread([90, 100, 110]), 0.2)
        self.assertEqual(placement.spread([7]), 0.0)

    def test_cpus_are_read_strictly(self):
        allowed = sorted(os.sched_getaffinity(0))
        self.assertEqual(placement.cpus_of("all"), allowed)
        self.assertEqual(placement.cpus_of("half"), allowed[::2])
        self.assertEqual(placement.cpus_of(str(allowed[0])), [allowed[0]])
        for bad in ("x", "100000", ""):
            with self.assertRaises(SystemExit) as e:
                placement.cpus_of(bad)
            self.assertEqual(e.exception.code, 2)


@unittest.skipIf(binary() is None, "no densebench binary (cargo build)")
class EndToEnd(unittest.TestCase):
    def test_one_round_on_the_cpu_pins_each_process(self):
        bin_path = binary()
        with tempfile.TemporaryDirectory(prefix="placement-test-") as d:
            case = os.path.join(d, "case.st")
            made = subprocess.run(
                [bin_path, "case", "--family", "mlp", "--batch", "16", "--channels", "8",
                 "--growth", "4", "--depth", "3", "--out", case],
                capture_output=True, text=True)
            self.assertEqual(made.returncode, 0, made.stderr)
            out = os.path.join(d, "placement.csv")
            cpu = sorted(os.sched_getaffinity(0))[0]
            r = subprocess.run(
                [sys.executable, SCRIPT, "--densebench", bin_path, "--case", case,
                 "--variant", "cat-store-copy", "--device", "cpu", "--cpus", str(cpu),
                 "--steps", "2", "--warmup", "0", "--repeat", "2", "--csv", out],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn(f"cpu {cpu:>3}: median", r.stdout)
            self.assertIn("unpinned: median", r.stdout)
            self.assertRegex(r.stdout, r"verdict: (steady|placement|process)")
            with open(out) as f:
                rows = list(csv.DictReader(f))
            self.assertEqual(len(rows), 4)
            self.assertEqual(sorted(row["cpu"] for row in rows), ["", "", str(cpu), str(cpu)])
            self.assertTrue(all(int(row["median_ns"]) > 0 for row in rows))
            # a step that fails is an exit 2 naming it, not a number
            bad = subprocess.run(
                [sys.executable, SCRIPT, "--densebench", bin_path, "--case", case,
                 "--variant", "no-such-variant", "--device", "cpu", "--cpus", str(cpu),
                 "--steps", "1", "--repeat", "1"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(bad.returncode, 2, bad.stdout + bad.stderr)
            self.assertIn("placement: step on cpu", bad.stderr)


if __name__ == "__main__":
    unittest.main()
