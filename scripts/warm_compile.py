#!/usr/bin/env python3
"""Warms PyTorch's compile caches for the compiled peer rows a sweep is about to measure.

A `pytorch-compiled-*` row spends most of its wall time compiling, outside its timed steps:
17–39 s cold on an H100 (dynamo, AOTAutograd, inductor, Triton), 3.5–3.8 s when inductor's
on-disk caches already hold the block (docs/gpu.md) — and a GPU call has minutes. This compiles,
several at a time, the compiled rows of SWEEP not yet in DONE (a resumed result CSV), in the
order `bench-all` measures them (`densebench plan`), each exactly as the harness runs the peer
(harness/peer/pytorch_peer.py with the harness's arguments, one step), so that the sweep after it
finds the caches (inductor's FX-graph and AOTAutograd caches, Triton's kernels: on disk, shared by
every process of the machine) warm. What a row measures does not change: its timed steps run the
same compiled code either way; its `compile_ns` is then the warm compile, and this script's CSV
keeps each block's cold wall time (taken while others compiled beside it).

    python3 scripts/warm_compile.py [--sweep FILE] [--device cuda:0] [--done CSV] [--jobs N]
        [--budget SECS] [--match REGEX] [--csv OUT] [--densebench BIN] [--python PY]

Runs on a machine with the PyTorch the sweep's peer uses; run it right before the sweep, with
nothing being timed meanwhile (it loads every core). `--budget` stops starting compiles after
that many seconds (those started finish; SIGTERM stops them too). Exit 0 when every compile
started succeeded (or there was nothing to compile), 1 when one failed (its row will be an
`error` row with PyTorch's reason in the sweep), 2 on bad arguments. The last line says how many
were compiled, in how long.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer_fidelity as pf  # noqa: E402  (the key parser, the plan and the harness's peer env)

COMPILED_PREFIX = "pytorch-compiled-"


def die(msg: str, code: int = 2):
    sys.stderr.write(f"warm_compile: {msg}\n")
    sys.exit(code)


def done_keys(path: str | None) -> set[str]:
    """The keys of a result CSV (`bench-all --resume` skips exactly these); none without one."""
    if not path or not os.path.exists(path):
        return set()
    with open(path, newline="") as f:
        return {row["key"] for row in csv.DictReader(f) if row.get("key")}


def to_warm(jobs: list[dict], device: str, done: set[str], pattern) -> list[dict]:
    """The compiled peer jobs of `jobs` on `device`, in order, that are not `done` (and match)."""
    out, seen = [], set()
    for j in jobs:
        if not j["variant"].startswith(COMPILED_PREFIX):
            continue
        j = pf.on_device(j, device)
        if device == "cpu" and j["math"] == "tf32":
            continue
        if j["key"] in done or j["key"] in seen or (pattern and not pattern.search(j["key"])):
            continue
        seen.add(j["key"])
        out.append(j)
    return out


def peer_command(a, job: dict, case: str, out: str) -> list[str]:
    """The peer as `harness/src/measure/peer.rs` `args` runs it, for one step."""
    cmd = [a.python, pf.PEER, "--case", case, "--family", job["family"], "--variant",
           job["variant"], "--device", a.device, "--dtype", job["dtype"], "--warmup", "0",
           "--steps", "1", "--threads", str(a.threads), "--math", job["math"], "--out", out]
    if job["family"] == "mlp":
        cmd += ["--activation", job["activation"]]
    return cmd


def peer_env(compile_threads: int) -> dict:
    env = dict(os.environ)
    own = os.environ.get("GLIBC_TUNABLES", "")
    env["GLIBC_TUNABLES"] = pf.HARNESS_GLIBC_TUNABLES + (f":{own}" if own else "")
    # Inductor's worker pool per process; several compile at once here. Not in inductor's
    # cache key (`_cache_config_ignore_prefix`), so the sweep's own peers still hit.
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(compile_threads))
    # The peer's library path as the harness gives it (gpu-session.sh sets it).
    lib = os.environ.get("DENSEBENCH_PEER_LD_LIBRARY_PATH")
    if lib is not None:
        if lib:
            env["LD_LIBRARY_PATH"] = lib
        else:
            env.pop("LD_LIBRARY_PATH", None)
    return env


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", default=os.path.join(pf.SWEEPS, "gpu.toml"))
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--done", help="a result CSV whose keys are not compiled (the sweep resumes it)")
    cores = len(os.sched_getaffinity(0))
    p.add_argument("--jobs", type=int, default=max(1, min(8, cores // 2)),
                   help="compiles at once (default: half the cores, at most 8)")
    p.add_argument("--budget", type=float, help="seconds after which no compile is started")
    p.add_argument("--match", metavar="REGEX", help="keep the jobs whose row key matches")
    p.add_argument("--csv", help="one row per compile: key, status, wall_s, compile_s, error")
    p.add_argument("--threads", type=int, default=cores,
                   help="the peer's --threads (the harness resolves 0 to the cores)")
    p.add_argument("--densebench", default=os.environ.get(
        "DENSEBENCH_BIN", os.path.join(pf.ROOT, "target", "release", "densebench")))
    p.add_argument("--python", default=os.environ.get("DENSEBENCH_PYTHON", "python3"),
                   help="interpreter the harness runs the peer with")
    a = p.parse_args(argv)
    if a.jobs < 1 or a.threads < 1:
        die("--jobs and --threads must be at least 1")
    if a.budget is not None and a.budget < 0:
        die("--budget must not be negative")
    if not os.access(a.densebench, os.X_OK):
        die(f"no densebench binary at {a.densebench}: cargo build --release (or --densebench BIN)")
    if not os.path.isfile(a.sweep):
        die(f"--sweep {a.sweep}: no such file")
    pattern = None
    if a.match:
        try:
            pattern = re.compile(a.match)
        except re.error as e:
            die(f"--match: not a regular expression: {e}")

    start = time.monotonic()
    jobs = to_warm(pf.plan_jobs(a.densebench, a.sweep, "pytorch-compiled"), a.device,
                   done_keys(a.done), pattern)
    if not jobs:
        print(f"warm: nothing to compile: every compiled row of {a.sweep} on {a.device} is "
              f"measured already{' in ' + a.done if a.done else ''}", flush=True)
        return 0
    compile_threads = max(1, cores // a.jobs)
    print(f"warm: {len(jobs)} compiled block(s) of {os.path.basename(a.sweep)} to compile on "
          f"{a.device}, {a.jobs} at a time ({compile_threads} inductor worker(s) each)"
          + (f", none started after {a.budget:.0f} s" if a.budget is not None else ""), flush=True)

    cols = ["key", "status", "wall_s", "compile_s", "jobs", "error"]
    sink = open(a.csv, "w", newline="") if a.csv else None
    writer = csv.DictWriter(sink, fieldnames=cols, restval="") if sink else None
    if writer:
        writer.writeheader()
        sink.flush()
    ok = failed = 0

    def record(key: str, error: str | None = None, wall: float | None = None,
               compile_s: float | None = None) -> None:
        nonlocal ok, failed
        row = {"key": key, "jobs": a.jobs, "status": "failed" if error else "ok"}
        if error:
            failed += 1
            row["error"] = error[:300]
            print(f"FAILED {key}: {error[:300]}", flush=True)
        else:
            ok += 1
            row.update(wall_s=f"{wall:.1f}", compile_s=f"{compile_s:.1f}")
            print(f"ok     {key}: {wall:.1f} s, compile {compile_s:.1f} s", flush=True)
        if writer:
            writer.writerow(row)
            sink.flush()

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    tmp = tempfile.mkdtemp(prefix="warm-compile-")
    cases: dict[str, str] = {}
    queue = list(jobs)
    running: dict = {}  # Popen -> (job, started, its files' stem)
    env = peer_env(compile_threads)
    try:
        while queue or running:
            while queue and len(running) < a.jobs and (
                    a.budget is None or time.monotonic() - start < a.budget):
                j = queue.pop(0)
                cid = "/".join(j["key"].split("/")[1:11])  # one case per config (family … seed)
                if cid not in cases:
                    path = os.path.join(tmp, f"case{len(cases)}.safetensors")
                    r = subprocess.run([a.densebench, "case", *pf.config_flags(j), "--out", path],
                                       capture_output=True, text=True)
                    if r.returncode != 0:
                        record(j["key"], "densebench case: "
                               + (last_line(r.stderr) or f"exit {r.returncode}"))
                        continue
                    cases[cid] = path
                # The peer's output into files, read when it has ended: a pipe nobody reads
                # while it runs would stall a compile that logs more than the pipe holds.
                stem = os.path.join(tmp, f"job{time.monotonic_ns()}")
                with open(stem + ".out", "w") as out, open(stem + ".err", "w") as err:
                    proc = subprocess.Popen(
                        peer_command(a, j, cases[cid], stem + ".safetensors"), env=env,
                        stdout=out, stderr=err, start_new_session=True)
                running[proc] = (j, time.monotonic(), stem)
            if queue and not running:
                break  # the budget is spent and nothing is compiling
            time.sleep(0.2)
            for proc in [q for q in running if q.poll() is not None]:
                j, began, stem = running.pop(proc)
                wall = time.monotonic() - began
                with open(stem + ".out") as f:
                    stdout = f.read()
                with open(stem + ".err") as f:
                    stderr = f.read()
                for ext in (".out", ".err", ".safetensors"):
                    if os.path.exists(stem + ext):
                        os.remove(stem + ext)
                try:
                    compile_s = json.loads(last_line(stdout)).get("compile_ns", 0) / 1e9
                except (ValueError, AttributeError, TypeError):
                    compile_s = None
                if proc.returncode == 0 and compile_s is not None:
                    record(j["key"], wall=wall, compile_s=compile_s)
                else:
                    why = last_line(stderr) or last_line(stdout) or "no output"
                    record(j["key"], f"exit {proc.returncode}: {why}")
    except KeyboardInterrupt:
        for proc in running:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        print(f"warm: stopped with {len(running)} compile(s) running; {ok} finished before",
              flush=True)
        return 1
    finally:
        if sink:
            sink.close()
        shutil.rmtree(tmp, ignore_errors=True)  # the case files: hundreds of MB for big blocks
    left = f", {len(queue)} not started (budget)" if queue else ""
    print(f"warm: {ok} of {len(jobs)} compiled in {time.monotonic() - start:.0f} s, "
          f"{failed} failed{left}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
