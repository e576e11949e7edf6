#!/usr/bin/env python3
"""Tests of gpu-session.sh's `resume_reference`, which picks the file a GPU sweep resumes: the
carried .gpu/reference-gpu.csv, else the committed results/reference-*.csv whose rows name this
GPU and whose header is of this result schema, else none; a carried file of another GPU or an
older schema is set aside. Run with a stand-in `nvidia-smi`, the function taken from the script
itself. Standard library only:

    python3 scripts/tests/test_gpu_session_resume.py
"""

import os
import subprocess
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpu-session.sh")
HEADER = "schema,key,device_desc,status,execution,compile_ns\n"
OLD_HEADER = "schema,key,device_desc,status\n"


def rows(gpu, n):
    return "".join(f'3,k{i},"{gpu} (sm_90)",ok,eager,\n' for i in range(n))


class Resume(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.root = self.dir.name
        for d in ("results", ".gpu", "bin", "out"):
            os.makedirs(os.path.join(self.root, d))
        self.out = os.path.join(self.root, "out")

    def tearDown(self):
        self.dir.cleanup()

    def write(self, path, text):
        with open(os.path.join(self.root, path), "w") as f:
            f.write(text)

    def run_resume(self, gpu):
        """Runs resume_reference with `gpu` as nvidia-smi's name (None: no nvidia-smi)."""
        if gpu is not None:
            smi = os.path.join(self.root, "bin", "nvidia-smi")
            with open(smi, "w") as f:
                f.write(f"#!/bin/sh\necho '{gpu}'\n")
            os.chmod(smi, 0o755)
        with open(SCRIPT) as f:
            text = f.read()
        start = text.index("current_schema() {")
        function = text[start:text.index("\n}\n", start) + 3]
        env = dict(os.environ, OUT=self.out,
                   PATH=os.path.join(self.root, "bin") + ":/usr/bin:/bin")
        done = subprocess.run(["bash", "-c", "set -uo pipefail\n" + function + "resume_reference"],
                              cwd=self.root, env=env, capture_output=True, text=True)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stderr

    def resumed(self):
        path = os.path.join(self.out, "reference-gpu.csv")
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return f.read()

    def test_without_a_carried_file_the_committed_reference_of_this_gpu_is_resumed(self):
        self.write("results/reference-h100.csv", HEADER + rows("NVIDIA H100 80GB HBM3", 2))
        self.write("results/reference-h200.csv", HEADER + rows("NVIDIA H200", 3))
        said = self.run_resume("NVIDIA H200")
        self.assertEqual(self.resumed(), HEADER + rows("NVIDIA H200", 3))
        self.assertIn("results/reference-h200.csv (3 rows of this NVIDIA H200)", said)

    def test_a_carried_file_is_resumed_before_the_committed_one(self):
        self.write("results/reference-h200.csv", HEADER + rows("NVIDIA H200", 3))
        self.write(".gpu/reference-gpu.csv", HEADER + rows("NVIDIA H200", 5))
        self.assertEqual(self.run_resume("NVIDIA H200"), "")
        self.assertEqual(self.resumed(), HEADER + rows("NVIDIA H200", 5))

    def test_no_committed_file_of_this_gpu_or_schema_starts_none(self):
        self.write("results/reference-h200.csv", HEADER + rows("NVIDIA H200", 3))
        self.write("results/reference-old.csv", OLD_HEADER + '3,k,"NVIDIA B200",ok\n')
        self.run_resume("NVIDIA H100 80GB HBM3")
        self.assertIsNone(self.resumed())
        # an older schema naming the GPU is not resumed either
        self.run_resume("NVIDIA B200")
        self.assertIsNone(self.resumed())
        # nor anything where no GPU answers
        self.run_resume(None)
        self.assertIsNone(self.resumed())

    def test_a_carried_file_of_another_gpu_is_set_aside(self):
        self.write(".gpu/reference-gpu.csv", HEADER + rows("NVIDIA H100 80GB HBM3", 2))
        said = self.run_resume("NVIDIA H200")
        self.assertIsNone(self.resumed())
        self.assertTrue(os.path.exists(os.path.join(self.out, "reference-gpu-other.csv")))
        self.assertIn("another GPU", said)


    def test_a_gpu_whose_name_holds_another_gpus_name_is_another_gpu(self):
        # "NVIDIA H200" is a prefix of "NVIDIA H200 NVL": neither GPU resumes the other's rows
        self.write("results/reference-h200nvl.csv", HEADER + rows("NVIDIA H200 NVL", 2))
        self.run_resume("NVIDIA H200")
        self.assertIsNone(self.resumed())
        self.write("results/reference-h200.csv", HEADER + rows("NVIDIA H200", 3))
        self.run_resume("NVIDIA H200")
        self.assertEqual(self.resumed(), HEADER + rows("NVIDIA H200", 3))
        os.remove(os.path.join(self.out, "reference-gpu.csv"))
        self.write(".gpu/reference-gpu.csv", HEADER + rows("NVIDIA H200 NVL", 2))
        said = self.run_resume("NVIDIA H200")
        self.assertIsNone(self.resumed())
        self.assertIn("another GPU", said)

if __name__ == "__main__":
    unittest.main()
