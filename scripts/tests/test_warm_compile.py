#!/usr/bin/env python3
"""Tests of scripts/warm_compile.py (the compile-cache warm-up before a GPU sweep): which rows it
compiles (the compiled peer rows of the sweep not yet measured, in the sweep's order), the peer
command it runs (the harness's own arguments), and, with a stand-in interpreter for PyTorch, how
it runs them: several at once, the budget, a failure's exit status and its CSV. Needs the
densebench binary (`DENSEBENCH_BIN`, else target/release, else target/debug) for `plan` and
`case`; without one those tests say `skipped`. The last line is `N passed, N failed`.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "warm_compile.py")
sys.path.insert(0, os.path.dirname(HERE))
import warm_compile  # noqa: E402
from densebench_bin import binary  # noqa: E402

SWEEP = """
name = "warm-test"
[defaults]
peer = "none"
[[group]]
family = "bc"
batch = 2
channels = 4
growth = 2
bn_size = 2
size = 6
depth = [2, 3]
variants = ["cat-store-copy"]
[[group]]
family = "mlp"
batch = 8
channels = 4
growth = 2
depth = 2
variants = ["buffer-store-inplace"]
"""

# A stand-in for the peer's interpreter: sleeps, then prints the JSON line the peer prints, or
# fails for a variant named in WARM_FAKE_FAIL. It records when each "compile" ran, to see how
# many overlapped.
FAKE = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys, time
    args = sys.argv[2:]
    variant = args[args.index("--variant") + 1]
    log = os.environ["WARM_FAKE_LOG"]
    with open(log, "a") as f:
        f.write(f"start {time.monotonic()} {variant}\\n")
    time.sleep(float(os.environ.get("WARM_FAKE_SECS", "0.5")))
    sys.stderr.write("inductor says: " + "x" * int(os.environ.get("WARM_FAKE_NOISE", "0")) + "\\n")
    with open(log, "a") as f:
        f.write(f"end {time.monotonic()} {variant}\\n")
    if variant in os.environ.get("WARM_FAKE_FAIL", "").split(","):
        print("RuntimeError: inductor said no", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"compile_ns": 1500000000, "variant": variant}))
""")


class Selection(unittest.TestCase):
    JOBS = [warm_compile.pf.parse_key(k) for k in (
        "pytorch-naive/bc/64/24/12/16/4/32/on/f32/0/cpu",
        "pytorch-compiled-naive/bc/64/24/12/16/4/32/on/f32/0/cpu/compiled",
        "cat-store-copy/bc/64/24/12/16/4/32/on/f32/0/cpu",
        "pytorch-compiled-memory-efficient/bc/64/24/12/16/4/32/on/f32/0/cpu/compiled",
        "pytorch-compiled-naive/bc/64/24/12/16/4/32/on/f32/0/cpu/tf32/compiled",
        "pytorch-compiled-naive/bc/64/24/12/48/4/32/on/f32/0/cpu/compiled",
    )]

    def test_compiled_rows_not_measured_in_the_sweeps_order_on_the_gpu(self):
        done = {"pytorch-compiled-memory-efficient/bc/64/24/12/16/4/32/on/f32/0/cuda:0/graph"}
        keys = [j["key"] for j in warm_compile.to_warm(self.JOBS, "cuda:0", done, None)]
        self.assertEqual(keys, [
            "pytorch-compiled-naive/bc/64/24/12/16/4/32/on/f32/0/cuda:0/graph",
            "pytorch-compiled-naive/bc/64/24/12/16/4/32/on/f32/0/cuda:0/tf32/graph",
            "pytorch-compiled-naive/bc/64/24/12/48/4/32/on/f32/0/cuda:0/graph",
        ])

    def test_the_cpu_has_no_tf32_rows_and_a_match_narrows(self):
        import re
        keys = [j["key"] for j in warm_compile.to_warm(self.JOBS, "cpu", set(), re.compile("/48/"))]
        self.assertEqual(keys, ["pytorch-compiled-naive/bc/64/24/12/48/4/32/on/f32/0/cpu/compiled"])
        keys = [j["key"] for j in warm_compile.to_warm(self.JOBS, "cpu", set(), None)]
        self.assertNotIn("tf32", " ".join(keys))
        self.assertEqual(len(keys), 3)

    def test_done_keys_read_a_result_csv_and_none_without_one(self):
        self.assertEqual(warm_compile.done_keys(None), set())
        self.assertEqual(warm_compile.done_keys("/nonexistent/ref.csv"), set())
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write("schema,key,variant\n1,a/b,a\n1,c/d,c\n")
        self.assertEqual(warm_compile.done_keys(f.name), {"a/b", "c/d"})
        os.remove(f.name)

    def test_the_peer_command_carries_the_harness_arguments(self):
        # The flags harness/src/measure/peer.rs `args` gives the peer: a change there must be
        # made here too, or the warmed cache would not be the one the sweep's rows look up.
        with open(os.path.join(ROOT, "harness", "src", "measure", "peer.rs")) as f:
            src = f.read()
        body = src[src.index("pub fn args("):src.index("pub const SHOWN_CHARS")]
        harness_flags = {w.strip('"') for w in body.split() if w.startswith('"--')}
        harness_flags = {w.split('"')[0] for w in harness_flags}

        class A:
            python, device, threads = "python3", "cuda:0", 16
        mlp = warm_compile.pf.parse_key("pytorch-compiled-naive/mlp/8/4/2/2/1/1/on/f32/0/cuda:0/graph")
        cmd = warm_compile.peer_command(A, mlp, "case.st", "out.st")
        ours = {w for w in cmd if w.startswith("--")}
        # --mem-limit only where the harness has a memory limit set; the rest exactly
        self.assertEqual(harness_flags - {"--mem-limit"}, ours)
        self.assertEqual(cmd[cmd.index("--math") + 1], "ieee")
        self.assertEqual(cmd[cmd.index("--activation") + 1], "on")


@unittest.skipIf(binary() is None, "no densebench binary (cargo build)")
class Runs(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bin = binary()
        cls.dir = tempfile.mkdtemp(prefix="warm-test-")
        cls.sweep = os.path.join(cls.dir, "sweep.toml")
        with open(cls.sweep, "w") as f:
            f.write(SWEEP)
        cls.fake = os.path.join(cls.dir, "fake-python")
        with open(cls.fake, "w") as f:
            f.write(FAKE)
        os.chmod(cls.fake, 0o755)

    def warm(self, *extra, env=None):
        log = os.path.join(self.dir, f"log{len(os.listdir(self.dir))}")
        full = dict(os.environ, WARM_FAKE_LOG=log, **(env or {}))
        r = subprocess.run(
            [sys.executable, SCRIPT, "--densebench", self.bin, "--sweep", self.sweep,
             "--device", "cpu", "--python", self.fake, *extra],
            capture_output=True, text=True, env=full, timeout=120)
        events = []
        if os.path.exists(log):
            with open(log) as f:
                events = [line.split() for line in f]
        return r, events

    def test_every_compiled_row_runs_several_at_once_and_the_csv_says_how_long(self):
        out = os.path.join(self.dir, "warm.csv")
        r, events = self.warm("--jobs", "3", "--csv", out, env={"WARM_FAKE_SECS": "1.5"})
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        # bc L=2, bc L=3: naive and memory-efficient, each contiguous and channels_last;
        # mlp: naive and checkpoint
        self.assertIn("warm: 10 of 10 compiled", r.stdout)
        with open(out) as f:
            rows = list(csv.DictReader(f))
        self.assertEqual(len(rows), 10)
        self.assertEqual({row["status"] for row in rows}, {"ok"})
        self.assertEqual({row["compile_s"] for row in rows}, {"1.5"})
        # at some moment three ran at once, never four
        live, most = 0, 0
        for kind, t, _ in sorted(events, key=lambda e: float(e[1])):
            live += 1 if kind == "start" else -1
            most = max(most, live)
        self.assertEqual(most, 3)

    def test_a_compile_that_logs_a_lot_does_not_stall(self):
        # 1 MB on stderr: more than a pipe holds, were it read only at the end
        r, _ = self.warm("--jobs", "2", env={"WARM_FAKE_NOISE": str(1 << 20),
                                             "WARM_FAKE_SECS": "0.1"})
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-2000:])
        self.assertIn("warm: 10 of 10 compiled", r.stdout)

    def test_measured_rows_are_left_out(self):
        done = os.path.join(self.dir, "done.csv")
        with open(done, "w") as f:
            f.write("key\npytorch-compiled-naive/bc/2/4/2/2/2/6/on/f32/0/cpu/compiled\n")
        r, events = self.warm("--done", done, "--jobs", "8")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("warm: 9 of 9 compiled", r.stdout)
        self.assertNotIn("pytorch-compiled-naive/bc/2/4/2/2/2/6/", r.stdout)

    def test_a_failed_compile_is_named_and_exits_1(self):
        r, _ = self.warm("--jobs", "2", env={"WARM_FAKE_FAIL": "pytorch-compiled-checkpoint",
                                             "WARM_FAKE_SECS": "0.1"})
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED pytorch-compiled-checkpoint/mlp/", r.stdout)
        self.assertIn("inductor said no", r.stdout)
        self.assertIn("warm: 9 of 10 compiled", r.stdout)

    def test_a_case_that_cannot_be_made_fails_its_rows_not_the_others(self):
        # A densebench whose `case` fails for the mlp (its `plan` is the real one's).
        wrapper = os.path.join(self.dir, "densebench-no-mlp-case")
        with open(wrapper, "w") as f:
            f.write(f"""#!/bin/sh
if [ "$1" = case ] && echo "$*" | grep -q -- '--family mlp'; then
    echo "densebench case: error: no room for the case file" >&2; exit 1
fi
exec {self.bin} "$@"
""")
        os.chmod(wrapper, 0o755)
        log = os.path.join(self.dir, "log-case")
        r = subprocess.run(
            [sys.executable, SCRIPT, "--densebench", wrapper, "--sweep", self.sweep,
             "--device", "cpu", "--python", self.fake, "--jobs", "2"],
            capture_output=True, text=True, env=dict(os.environ, WARM_FAKE_LOG=log,
                                                     WARM_FAKE_SECS="0.1"), timeout=120)
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn("FAILED pytorch-compiled-naive/mlp/", r.stdout)
        self.assertIn("no room for the case file", r.stdout)
        self.assertIn("warm: 8 of 10 compiled in", r.stdout)

    def test_nothing_is_started_after_the_budget(self):
        # The budget counts from the script's start: a spent one starts nothing.
        r, events = self.warm("--budget", "0")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(events, [])
        self.assertIn("warm: 0 of 10 compiled", r.stdout)
        self.assertIn("10 not started (budget)", r.stdout)

    def test_nothing_to_compile_says_so(self):
        r, events = self.warm("--match", "^no-such-variant")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("warm: nothing to compile", r.stdout)
        self.assertEqual(events, [])

    def test_bad_arguments_exit_2(self):
        r, _ = self.warm("--jobs", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--jobs and --threads must be at least 1", r.stderr)
        r, _ = self.warm("--match", "(unclosed")
        self.assertEqual(r.returncode, 2)
        self.assertIn("--match: not a regular expression", r.stderr)


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed - len(result.skipped)} passed, {failed} failed"
          + (f", {len(result.skipped)} skipped" if result.skipped else ""))
    sys.exit(1 if failed else 0)
