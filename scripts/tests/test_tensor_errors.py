#!/usr/bin/env python3
"""Tests of scripts/tensor_errors.py and scripts/safetensors_read.py on small safetensors files
written here (f64, f32, bf16): the per-tensor errors are the harness's (max|a−r|/max|r|, so a
zeroed tensor is exactly 1), the norm-wise ones, the side-by-side listing, NaN, and bad files.
Standard library only (numpy's path is checked too where numpy is importable):

    python3 scripts/tests/test_tensor_errors.py
"""

import io
import json
import math
import os
import struct
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import safetensors_read  # noqa: E402
import tensor_errors  # noqa: E402

try:
    import numpy  # noqa: F401

    NUMPY = [False, True]
except ImportError:
    NUMPY = [False]


def bf16_bits(x):
    """The bf16 bits of an f32 value that bf16 holds exactly (its top 16 bits)."""
    (w,) = struct.unpack("<I", struct.pack("<f", x))
    assert w & 0xFFFF == 0, x
    return w >> 16


def write(path, tensors):
    """tensors: {name: (dtype, shape, values)}, dtype F64, F32 or BF16."""
    header, blobs, off = {}, [], 0
    for name, (dtype, shape, values) in tensors.items():
        if dtype == "F64":
            b = struct.pack(f"<{len(values)}d", *values)
        elif dtype == "F32":
            b = struct.pack(f"<{len(values)}f", *values)
        else:
            b = struct.pack(f"<{len(values)}H", *(bf16_bits(v) for v in values))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


class TensorErrors(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        d = self.dir.name
        self.ref = os.path.join(d, "ref.st")
        self.a = os.path.join(d, "a.st")
        self.b = os.path.join(d, "b.st")
        write(self.ref, {
            "output": ("F64", [3], [1.0, 2.0, 4.0]),
            "grad.w": ("F64", [2, 2], [1.0, -2.0, 0.5, 8.0]),
            "grad.zero": ("F64", [2], [0.0, 0.0]),
        })
        # bf16 output off by 1 in its largest element; grad.w zeroed; grad.zero exact
        write(self.a, {
            "output": ("BF16", [3], [1.0, 2.0, 3.0]),
            "grad.w": ("F32", [2, 2], [0.0, 0.0, 0.0, 0.0]),
            "grad.zero": ("F32", [2], [0.0, 0.0]),
        })
        write(self.b, {
            "output": ("F32", [3], [1.0, 2.0, 4.5]),
            "grad.w": ("F32", [2, 2], [1.0, -2.0, 0.5, 7.0]),
        })

    def tearDown(self):
        self.dir.cleanup()

    def test_errors_are_the_harness_measure_and_norm_wise(self):
        for np in NUMPY:
            ref = safetensors_read.read(self.ref, np)
            e = tensor_errors.errors(ref, safetensors_read.read(self.a, np))
            self.assertAlmostEqual(e["output"][0], 1 / 4, msg=np)
            self.assertAlmostEqual(e["output"][1], 1 / math.sqrt(21), msg=np)
            # a zeroed tensor is exactly 1 in both measures: the cap's meaning
            self.assertEqual(e["grad.w"], (1.0, 1.0))
            self.assertEqual(e["grad.zero"], (0.0, 0.0))
            # a tensor only the reference holds is not compared
            self.assertEqual(set(tensor_errors.errors(ref, safetensors_read.read(self.b, np))),
                             {"output", "grad.w"})

    def test_bf16_is_widened_exactly(self):
        for np in NUMPY:
            shape, v = safetensors_read.read(self.a, np)["output"]
            self.assertEqual(shape, [3])
            self.assertEqual([float(x) for x in v], [1.0, 2.0, 3.0])

    def test_listing_worst_first_beside_a_second_result(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(tensor_errors.main([self.ref, self.a, self.b, "--top", "2"]), 0)
        text = out.getvalue()
        self.assertIn("max_rel_err 1 (grad.w)", text)
        self.assertIn("max_rel_err 0.125 (grad.w)", text)  # B: 1/8
        rows = [l for l in text.splitlines() if l.startswith(("grad.", "output"))]
        self.assertEqual([r.split()[0] for r in rows], ["grad.w", "output"])
        self.assertEqual(rows[0].split()[-1], "8")  # A/B: 1 / 0.125
        self.assertIn("A's max error above B's on 2 of 2 tensors", text)

    def test_nan_is_infinite(self):
        nan = os.path.join(self.dir.name, "nan.st")
        write(nan, {"output": ("F32", [3], [1.0, float("nan"), 4.0])})
        for np in NUMPY:
            e = tensor_errors.errors(safetensors_read.read(self.ref, np), safetensors_read.read(nan, np))
            self.assertEqual(e["output"], (math.inf, math.inf), msg=np)

    def test_bad_inputs_exit_2_with_a_reason(self):
        junk = os.path.join(self.dir.name, "junk.st")
        with open(junk, "wb") as f:
            f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
        short = os.path.join(self.dir.name, "short.st")
        with open(short, "wb") as f:
            f.write(b"\x01")
        other_shape = os.path.join(self.dir.name, "shape.st")
        write(other_shape, {"output": ("F32", [1, 3], [1.0, 2.0, 4.0])})
        unrelated = os.path.join(self.dir.name, "unrelated.st")
        write(unrelated, {"something": ("F32", [1], [1.0])})
        cases = [([self.ref, junk], "header"), ([self.ref, short], "not a safetensors file"),
                 ([self.ref, other_shape], "shape"), ([self.ref, unrelated], "shares no tensor"),
                 ([self.ref, os.path.join(self.dir.name, "missing.st")], "missing.st")]
        for args, why in cases:
            err = io.StringIO()
            with redirect_stderr(err):
                self.assertEqual(tensor_errors.main(args), 2, args)
            self.assertIn(why, err.getvalue(), args)

    def test_offsets_that_do_not_fit_the_shape_are_refused(self):
        bad = os.path.join(self.dir.name, "bad.st")
        h = json.dumps({"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}).encode()
        with open(bad, "wb") as f:
            f.write(struct.pack("<Q", len(h)) + h + b"\x00" * 8)
        with self.assertRaises(safetensors_read.SafetensorsError):
            safetensors_read.read(bad, False)


if __name__ == "__main__":
    unittest.main()
