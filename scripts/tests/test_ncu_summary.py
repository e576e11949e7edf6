#!/usr/bin/env python3
"""Tests of scripts/ncu_summary.py on CSV text in the two shapes Nsight Compute exports
(details page, raw page), with its units, thousands separators, interleaved `==PROF==` lines,
two processes (a PyTorch peer re-executing itself) and malformed files. Standard library only:

    python3 scripts/tests/test_ncu_summary.py
"""

import io
import os
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import ncu_summary  # noqa: E402

HEADER = (
    '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
    '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
    '"Metric Value"'
)


def detail(launch, pid, kernel, metric, unit, value):
    return (
        f'"{launch}","{pid}","densebench","h","{kernel}","1","7","(256, 1, 1)","(64, 1, 1)",'
        f'"0","9.0","Command line profiler metrics","{metric}","{unit}","{value}"'
    )


DETAILS = "\n".join(
    [
        "==PROF== Connected to process 4242 (/tmp/densebench)",
        "some program output",
        HEADER,
        detail(0, 4242, "bn_apply_relu_f32", ncu_summary.METRIC, "nsecond", "2,000"),
        detail(0, 4242, "bn_apply_relu_f32", "other__metric.sum", "byte", "9,999,999"),
        "==PROF== Disconnected from process 4242",
        detail(1, 4242, "void gemm<float, 128>(float*, ...)", ncu_summary.METRIC, "usecond", "2.5"),
        detail(2, 4242, "bn_apply_relu_f32", ncu_summary.METRIC, "ns", "500"),
        # a second process (the peer after re-exec) reuses launch ID 0
        detail(0, 4343, "bn_apply_relu_f32", ncu_summary.METRIC, "msecond", "0.001"),
    ]
)

RAW = "\n".join(
    [
        '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
        f'"Device","CC","dram__bytes_read.sum","{ncu_summary.METRIC}"',
        '"","","","","","","","","","byte","usecond"',
        '"0","7","python3","h","k_a","1","7","0","9.0","10,240","4.0"',
        '"1","7","python3","h","k_b","1","7","0","9.0","2,048","1,000.0"',
    ]
)


class Parse(unittest.TestCase):
    def test_details_page(self):
        p = ncu_summary.parse("ours", DETAILS)
        # four launches of the metric: the other metric's row and the PROF lines are skipped,
        # and (process, ID) keeps the second process's launch 0 apart from the first's
        self.assertEqual(len(p.launches), 4)
        self.assertAlmostEqual(p.total_ns(), 2000 + 2500 + 500 + 1000)
        kernels = p.by_kernel()
        self.assertEqual(kernels[0], ("bn_apply_relu_f32", 3, 3500.0))
        self.assertEqual(kernels[1], ("void gemm<float, 128>(float*, ...)", 1, 2500.0))

    def test_raw_page_with_a_units_row(self):
        p = ncu_summary.parse("peer", RAW)
        self.assertEqual(len(p.launches), 2)
        self.assertAlmostEqual(p.total_ns(), 4000 + 1000000)
        self.assertEqual(p.by_kernel()[0][0], "k_b")

    def test_summary_lists_each_file_and_a_side_by_side_table(self):
        a = ncu_summary.parse("densebench", DETAILS)
        b = ncu_summary.parse("pytorch", RAW)
        text = ncu_summary.summary([a, b], top=1)
        self.assertIn("densebench: 4 kernel launches, 0.006 ms of kernel time", text)
        self.assertIn("pytorch: 2 kernel launches, 1.004 ms", text)
        # --top 1: only the heaviest kernel of each file is listed
        self.assertIn("bn_apply_relu_f32", text)
        self.assertNotIn("gemm<float", text)
        self.assertIn("launches  kernel ms", text)
        self.assertRegex(text, r"densebench\s+4\s+0\.006")

    def test_void_and_long_names_are_shortened(self):
        self.assertEqual(ncu_summary.short("void k(int)"), "k(int)")
        long = "x" * 200
        self.assertEqual(len(ncu_summary.short(long, 50)), 50)


class Errors(unittest.TestCase):
    def bad(self, text, fragment):
        with self.assertRaises(ncu_summary.SummaryError) as e:
            ncu_summary.parse("x", text, "f.csv")
        self.assertIn(fragment, str(e.exception))

    def test_no_header(self):
        self.bad("==PROF== nothing profiled\n", "no ncu CSV header")

    def test_no_time_metric(self):
        self.bad(HEADER + "\n" + detail(0, 1, "k", "other.sum", "byte", "3"), "no gpu__time_duration.sum")

    def test_unknown_unit_and_bad_value_name_the_line(self):
        self.bad(HEADER + "\n" + detail(0, 1, "k", ncu_summary.METRIC, "fortnight", "3"), "f.csv:2")
        self.bad(HEADER + "\n" + detail(0, 1, "k", ncu_summary.METRIC, "ns", "n/a"), "'n/a' is not a number")

    def test_main_exit_status_and_message(self):
        with tempfile.TemporaryDirectory() as d:
            good = os.path.join(d, "good.csv")
            with open(good, "w") as f:
                f.write(DETAILS)
            out, err = io.StringIO(), io.StringIO()
            with redirect_stdout(out), redirect_stderr(err):
                self.assertEqual(ncu_summary.main([f"ours={good}"]), 0)
                self.assertEqual(ncu_summary.main([os.path.join(d, "missing.csv")]), 2)
                self.assertEqual(ncu_summary.main(["--top", "x", good]), 2)
                self.assertEqual(ncu_summary.main([]), 2)
            self.assertIn("ours: 4 kernel launches", out.getvalue())
            self.assertIn("missing.csv", err.getvalue())
            self.assertIn("--top takes a number", err.getvalue())


if __name__ == "__main__":
    unittest.main(verbosity=1)
