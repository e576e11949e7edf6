#!/usr/bin/env python3
"""Tests of scripts/side_by_side.py, which pairs the rows of gpu-session.sh's side-by-side
stages: rows in setting order per key, ratios to the first setting, a missing row said and
never paired across keys, every match of a note's pattern shown, empty columns printed as unknown. Standard
library only:

    python3 scripts/tests/test_side_by_side.py
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import side_by_side  # noqa: E402


def row(key, median, peak, note="", status="ok", predicted=""):
    return {"key": key, "median_ns": median, "peak_bytes": peak, "note": note,
            "status": status, "predicted_peak_bytes": predicted}


class Summarise(unittest.TestCase):
    def test_pairs_by_key_in_setting_order_with_ratios_to_the_first(self):
        rows = [
            row("a", "100", str(2 << 20), note="x; 3×3 convolution in cuDNN (fwd A); y"),
            row("b", "50", str(1 << 20)),
            row("a", "250", str(3 << 20), note="3×3 tap stack in 2 chunks of ≤ 4 images"),
            row("b", "25", str(1 << 20)),
        ]
        lines = side_by_side.summarise(rows, ["cudnn", "tap-stack"],
                                       note=r"3×3 (convolution in cuDNN|tap stack)[^;]*")
        self.assertEqual(len(lines), 2)
        a, b = lines
        self.assertTrue(a.startswith("a: cudnn: median 100 ns (x1.000), peak 2.0 MiB (x1.000"), a)
        self.assertIn("tap-stack: median 250 ns (x2.500), peak 3.0 MiB (x1.500", a)
        self.assertIn("3×3 convolution in cuDNN (fwd A)", a)
        self.assertIn("3×3 tap stack in 2 chunks of ≤ 4 images", a)
        self.assertIn("tap-stack: median 25 ns (x0.500)", b)

    def test_every_match_of_the_pattern_is_shown(self):
        note = ("bc layer fronts split (ReLU1's output in 2 chunks); 3×3 tap stack in 4 chunks "
                "of ≤ 16 images; other")
        rows = [row("a", "100", "1", note=note), row("a", "90", "1")]
        (line,) = side_by_side.summarise(rows, ["model", "0.05"],
                                         note=r"(bc layer fronts split|3×3 tap stack in)[^;]*")
        self.assertIn("ok, bc layer fronts split (ReLU1's output in 2 chunks); 3×3 tap stack in 4 "
                      "chunks of ≤ 16 images |", line)
        self.assertNotIn("other", line)

    def test_a_missing_row_is_said_not_paired_across_keys(self):
        rows = [row("a", "100", "1"), row("b", "50", "1"), row("b", "60", "1")]
        lines = side_by_side.summarise(rows, ["on", "off"], log="conv.err")
        self.assertEqual(lines[0], "a: 1 row(s) for 2 settings, not paired (a run failed: conv.err)")
        self.assertIn("off: median 60 ns (x1.200)", lines[1])

    def test_empty_columns_are_unknown_not_an_error(self):
        rows = [row("a", "", "", status="error"), row("a", "10", "5")]
        (line,) = side_by_side.summarise(rows, ["x", "y"])
        self.assertIn("x: median ? ns (xnan), peak ? (xnan; predicted ?), error", line)
        self.assertIn("y: median 10 ns (xnan)", line)


if __name__ == "__main__":
    unittest.main()
