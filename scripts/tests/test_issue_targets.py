#!/usr/bin/env python3
"""Tests of scripts/issue_targets.py (issues 38 and 39's targets read from a GPU reference): on
rows made here, a target met, one missed, one not measured because a row is missing or its
gradients are out of tolerance, like paired with like, and two rows far apart in time said so.
The last line is `N passed, N failed`."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "issue_targets.py")
COLS = ["schema", "key", "variant", "family", "batch", "channels", "growth", "depth", "bn_size",
        "size", "dtype", "device", "device_desc", "timestamp", "status", "peak_bytes",
        "predicted_peak_bytes", "median_ns", "grad_ok", "math", "execution"]
BC100 = dict(family="bc", batch=64, channels=24, growth=12, bn_size=4, size=32, dtype="f32",
             device="cuda:0", device_desc="NVIDIA H100 80GB HBM3", status="ok", grad_ok="true")


def row(variant, depth, math, execution, ms, peak=100 << 20, predicted=None, t="12:00:00", **kw):
    r = dict(BC100, variant=variant, depth=depth, math=math, execution=execution,
             median_ns=int(ms * 1e6), peak_bytes=peak, timestamp=f"2026-11-27T{t}Z", **kw)
    r["predicted_peak_bytes"] = "" if variant.startswith("pytorch") else (predicted or peak)
    r["key"] = f"{variant}/bc/64/24/12/{depth}/4/32/on/{r['dtype']}/0/cuda:0"
    return r


def run(rows, *args):
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS, restval="")
        w.writeheader()
        for r in rows:
            w.writerow(r)
    r = subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True, text=True)
    os.remove(f.name)
    return r


def line(out: str, target: str, where: str) -> str:
    hits = [x for x in out.splitlines() if x.startswith(target) and where in x]
    assert len(hits) == 1, f"{target} / {where}: {hits}\n{out}"
    return hits[0]


class Targets(unittest.TestCase):
    def test_met_missed_and_like_with_like(self):
        rows = [
            row("cat-store-copy", 16, "tf32", "graph", 3.9),
            row("buffer-recompute-inplace", 16, "tf32", "graph", 9.0),
            row("pytorch-compiled-naive", 16, "tf32", "graph", 10.0),
            row("pytorch-compiled-memory-efficient", 16, "tf32", "graph", 11.0),
            # slower than the contiguous blocks here: the contiguous ones are the opponent
            row("pytorch-compiled-channels-last-naive", 16, "tf32", "graph", 12.0),
            row("pytorch-compiled-channels-last-memory-efficient", 16, "tf32", "graph", 13.0),
            # an eager row of densebench must not pair with the compiled peer
            row("cat-store-copy", 16, "tf32", "eager", 1.0),
        ]
        r = run(rows)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout
        self.assertIn("×0.39 (3.90 / 10.00 ms)", line(out, "38 cat-store-copy / compiled naive", "BC-100 L=16 tf32"))
        self.assertTrue(line(out, "38 cat-store-copy / compiled naive", "BC-100 L=16 tf32").endswith("met"))
        self.assertIn("×0.82", line(out, "38 buffer-recompute-inplace / compiled frugal", "BC-100 L=16 tf32"))
        self.assertTrue(line(out, "38 buffer-recompute-inplace / compiled frugal", "BC-100 L=16 tf32").endswith("MISSED"))
        self.assertTrue(line(out, "38 buffer-recompute-inplace / compiled naive", "BC-100 L=16 tf32").endswith("met"))
        self.assertTrue(line(out, "38 graph step ≤ 4 ms", "BC-100 L=16 tf32 cat-store-copy").endswith("met"))
        self.assertTrue(line(out, "38 graph step ≤ 4 ms", "BC-100 L=16 tf32 buffer-recompute-inplace").endswith("MISSED"))
        # the eager densebench row has no eager PyTorch row beside it
        self.assertIn("not measured (PyTorch row missing)",
                      line(out, "(info) cat-store-copy / PyTorch naive (eager)", "BC-100 L=16 tf32"))

    def test_the_faster_memory_format_is_the_opponent_and_a_missing_one_is_said(self):
        rows = [
            row("cat-store-copy", 16, "tf32", "graph", 3.9),
            row("buffer-recompute-inplace", 16, "tf32", "graph", 4.0),
            row("pytorch-compiled-naive", 16, "tf32", "graph", 10.0),
            row("pytorch-compiled-channels-last-naive", 16, "tf32", "graph", 4.5),
            # the frugal pair without its channels_last twin
            row("pytorch-compiled-memory-efficient", 16, "tf32", "graph", 11.0),
        ]
        r = run(rows, "--strict")
        got = line(r.stdout, "38 cat-store-copy / compiled naive", "BC-100 L=16 tf32")
        self.assertIn("×0.87 (3.90 / 4.50 ms; PyTorch compiled-channels-last-naive)", got)
        self.assertTrue(got.endswith("MISSED"), got)
        got = line(r.stdout, "38 buffer-recompute-inplace / compiled frugal", "BC-100 L=16 tf32")
        self.assertIn("×0.36 (4.00 / 11.00 ms)", got)
        self.assertTrue(got.endswith("met (channels_last PyTorch not measured)"), got)
        self.assertIn("(1 of them against contiguous PyTorch only", r.stdout)
        # met only against contiguous PyTorch is not a clean pass
        self.assertEqual(r.returncode, 1)

    def test_a_row_out_of_tolerance_or_failed_is_not_a_result(self):
        rows = [
            row("cat-store-copy", 16, "ieee", "graph", 1.0, grad_ok="false"),
            row("pytorch-compiled-naive", 16, "ieee", "graph", 10.0),
            row("buffer-recompute-inplace", 16, "ieee", "graph", 1.0),
            row("pytorch-compiled-memory-efficient", 16, "ieee", "graph", 10.0, status="error"),
        ]
        out = run(rows, "--strict")
        self.assertEqual(out.returncode, 1)
        self.assertIn("not measured (densebench row not ok)",
                      line(out.stdout, "38 cat-store-copy / compiled naive", "BC-100 L=16 ieee"))
        self.assertIn("not measured (PyTorch row not ok)",
                      line(out.stdout, "38 buffer-recompute-inplace / compiled frugal", "BC-100 L=16 ieee"))
        self.assertTrue(line(out.stdout, "38/39 every row ok", "GPU rows").endswith("MISSED"))

    def test_the_model_target_counts_rows_off_by_more_than_a_per_mille(self):
        rows = [row("cat-store-copy", 16, "ieee", "eager", 5.0, peak=1002 << 10, predicted=1000 << 10),
                row("cat-store-inplace", 16, "ieee", "eager", 5.0, peak=1000 << 10, predicted=1000 << 10)]
        out = run(rows).stdout
        got = line(out, "38 measured / predicted", "2 modelled GPU rows")
        self.assertIn("1 outside (e.g. cat-store-copy/bc/64/24/12/16/", got)
        self.assertTrue(got.endswith("MISSED"))

    def test_bf16_peaks_against_f32_and_rows_far_apart_say_so(self):
        rows = [
            row("cat-store-copy", 48, "ieee", "eager", 10.0, peak=200 << 20),
            row("cat-store-copy", 48, "ieee", "eager", 7.0, peak=100 << 20, dtype="bf16"),
            row("buffer-recompute-inplace", 48, "ieee", "eager", 10.0, peak=100 << 20),
            row("buffer-recompute-inplace", 48, "ieee", "eager", 7.0, peak=60 << 20, dtype="bf16", t="13:00:00"),
            row("pytorch-memory-efficient", 48, "ieee", "eager", 10.0, dtype="bf16"),
        ]
        out = run(rows).stdout
        self.assertTrue(line(out, "39 bf16 peak", "BC-100 L=48 cat-store-copy").endswith("met"))
        self.assertIn("×0.600", line(out, "39 bf16 peak", "BC-100 L=48 buffer-recompute-inplace"))
        self.assertTrue(line(out, "39 bf16 peak", "BC-100 L=48 buffer-recompute-inplace").endswith("MISSED"))
        got = line(out, "39 bf16 buffer-recompute-inplace / PyTorch autocast frugal (eager)", "BC-100 L=48")
        self.assertIn("×0.70 (7.00 / 10.00 ms, 60 min apart)", got)
        self.assertTrue(got.endswith("met (channels_last PyTorch not measured)"), got)

    def test_rows_of_two_gpus_are_never_set_side_by_side(self):
        h200 = "NVIDIA H200 (sm_90, 139.8 GiB; driver 580.159.04, CUDA 13.0; toolkit 13.0)"
        rows = [row("cat-store-copy", 16, "ieee", "graph", 5.0),
                row("pytorch-compiled-naive", 16, "ieee", "graph", 10.0, device_desc=h200)]
        out = run(rows).stdout
        self.assertIn("== NVIDIA H100 80GB HBM3: 1 rows", out)
        self.assertIn("== NVIDIA H200: 1 rows", out)
        for got in [x for x in out.splitlines()
                    if x.startswith("38 cat-store-copy / compiled naive") and "L=16 ieee" in x]:
            self.assertIn("not measured", got)

    def test_not_a_result_csv_exits_2(self):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("a,b\n1,2\n")
        r = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
        os.remove(f.name)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a densebench result CSV", r.stderr)
        r = subprocess.run([sys.executable, SCRIPT, "/nonexistent.csv"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)


if __name__ == "__main__":
    result = unittest.main(verbosity=1, exit=False).result
    bad = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)
