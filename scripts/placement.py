#!/usr/bin/env python3
"""Placement check: does a step's time depend on which CPU its process runs on?

On an H100 (2026-11-27) the eager steps of densebench's launch-bound variants (and PyTorch's
`memory_efficient`) took 17–25 ms from one process to the next, each process steady over its own
steps, while their CUDA-graph replays agreed to 0.4 % — so a fidelity pair (`peer_fidelity.py`)
could land ±20 % apart with nothing in either timed step. This script asks whether the host CPU a
process lands on explains it: the same `densebench step --bare-loop` in fresh processes, each
pinned to one CPU (`os.sched_setaffinity` before `exec`), every chosen CPU in turn, and as many
processes left unpinned, `--repeat` rounds.

    python3 scripts/placement.py --case CASE [--densebench BIN] [--variant V] [--device cuda:0]
        [--cpus all|LIST] [--steps S] [--warmup W] [--repeat R] [--execution eager|graph]
        [--csv OUT]

`--cpus`: `all` (every CPU this process may use), `half` (every second one) or a comma list.
Prints one line per CPU (the median of its processes' medians, and the spread between them), the
unpinned processes' the same way, and a verdict: `placement` when the pinned processes agree with
their own CPU (spread within --tolerance) but CPUs differ by more than it; `process` when even
processes pinned to one CPU differ (something per process, not per CPU); `steady` when neither.
A diagnostic, not a test of densebench: quote it with its command and machine. Exit 2 on bad
arguments or a failing step.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def die(msg: str, code: int = 2):
    sys.stderr.write(f"placement: {msg}\n")
    sys.exit(code)


def cpus_of(spec: str) -> list[int]:
    """The CPUs `--cpus` names, each one this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    if spec == "all":
        return allowed
    if spec == "half":
        return allowed[::2]
    try:
        wanted = [int(c) for c in spec.split(",") if c.strip()]
    except ValueError:
        die(f"--cpus {spec!r}: expected all, half or a comma list of CPU numbers")
    if not wanted:
        die(f"--cpus {spec!r}: no CPU named (all, half or a comma list)")
    bad = [c for c in wanted if c not in allowed]
    if bad:
        die(f"--cpus {spec!r}: CPU(s) {bad} not among this process's {allowed}")
    return wanted


def one_process(a, cpu: int | None) -> dict:
    """One `step --bare-loop` in a fresh process, pinned to `cpu` (None: unpinned)."""
    step = [a.densebench, "step", "--case", a.case, "--variant", a.variant, "--device", a.device,
            "--out", os.path.join(a.work, "result.st"), "--force", "--bare-loop", str(a.steps),
            "--warmup", str(a.warmup), "--execution", a.execution]
    cmd = step if cpu is None else [
        sys.executable, "-c",
        "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); "
        "os.execvp(sys.argv[2], sys.argv[2:])",
        str(cpu)] + step
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        die(f"step on cpu {cpu if cpu is not None else 'any'} exited {r.returncode}: "
            f"{r.stderr.strip().splitlines()[-1:] or r.stdout.strip()}")
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        die(f"step printed no JSON line: {r.stdout!r}")


def spread(values: list[float]) -> float:
    """(max − min) / median of a side's per-process medians."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def verdict(per_cpu: dict, tol: float) -> str:
    """`process`, `placement` or `steady` (see the module's doc)."""
    if any(spread(v) > tol for v in per_cpu.values()):
        return "process"
    medians = [statistics.median(v) for v in per_cpu.values()]
    return "placement" if spread(medians) > tol else "steady"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", required=True, help="a case file (`densebench case … --out`)")
    p.add_argument("--densebench", default=os.environ.get("DENSEBENCH_BIN")
                   or os.path.join(ROOT, "target", "release", "densebench"))
    p.add_argument("--variant", default="buffer-recompute-inplace")
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--cpus", default="half")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--execution", choices=("eager", "graph"), default="eager")
    p.add_argument("--tolerance", type=float, default=5.0, help="percent (default 5)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per process")
    p.add_argument("--csv", help="one row per process")
    a = p.parse_args(argv)
    if not os.access(a.densebench, os.X_OK):
        die(f"no densebench binary at {a.densebench} (cargo build --release, or --densebench)")
    if not os.path.isfile(a.case):
        die(f"--case {a.case}: no such file")
    if a.steps < 1 or a.repeat < 1 or a.warmup < 0:
        die("--steps and --repeat must be at least 1, --warmup at least 0")
    cpus = cpus_of(a.cpus)
    a.work = os.path.join(os.path.dirname(os.path.abspath(a.case)), ".placement")
    os.makedirs(a.work, exist_ok=True)
    tol = a.tolerance / 100.0
    print(f"placement: {a.variant} on {a.device} ({a.execution}), {a.steps} steps after "
          f"{a.warmup}, {a.repeat} round(s) over CPUs {cpus} and {len(cpus)} unpinned "
          f"process(es) a round", flush=True)
    rows, per_cpu, unpinned = [], {c: [] for c in cpus}, []
    for rnd in range(a.repeat):
        # pinned and unpinned interleaved, so drift over the call hits both alike
        for cpu in cpus:
            for where in (cpu, None):
                r = one_process(a, where)
                (per_cpu[cpu] if where is not None else unpinned).append(r["median_ns"])
                rows.append({"round": rnd, "cpu": "" if where is None else where,
                             "median_ns": r["median_ns"], "min_ns": r["min_ns"]})
    for cpu, v in per_cpu.items():
        print(f"cpu {cpu:>3}: median {statistics.median(v) / 1e6:8.3f} ms over {len(v)} "
              f"process(es), spread {spread(v) * 100:5.1f} %")
    print(f"unpinned: median {statistics.median(unpinned) / 1e6:8.3f} ms over {len(unpinned)} "
          f"process(es), spread {spread(unpinned) * 100:5.1f} %")
    medians = [statistics.median(v) for v in per_cpu.values()]
    print(f"between CPUs: {min(medians) / 1e6:.3f}–{max(medians) / 1e6:.3f} ms "
          f"(spread {spread(medians) * 100:.1f} %); verdict: {verdict(per_cpu, tol)}")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["round", "cpu", "median_ns", "min_ns"])
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
