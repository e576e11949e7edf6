#!/usr/bin/env python3
"""Fidelity check: does a row's time say what the same step costs when nothing measures it?

For every job of the given sweep files (densebench's variants and the PyTorch peer's), this times
the same step twice, each in a fresh process, and compares the medians:

- **the harness's way**: densebench's row as `densebench run` measures it (its measuring child:
  warm-up, one untimed probe step, the timed steps); the peer's row as the harness runs it
  (`harness/peer/pytorch_peer.py` with the harness's arguments, the malloc-counting shim
  preloaded on the CPU);
- **a bare loop**: the same step in a plain loop and nothing else, as a user would time it (in
  the same process environment as the harness's children: thread count and glibc's malloc
  tunables; `--plain` drops the tunables) —
  densebench's `densebench step --bare-loop N` (one process, `impls::step` timed with the host
  clock, the device synchronised before the clock stops); PyTorch's module built from the same
  case file in a plain interpreter (no shim, no hooks), `out = block(x); out.backward(g)` timed
  with `time.perf_counter_ns` on the CPU and CUDA events on a GPU, gradients set to None between
  steps.

A row passes when harness / bare is within ±TOL (10 % on the CPU, 5 % on a GPU: issue 36).
A shared machine drifts, so `--repeat R` measures each pair R times, alternating which side goes
first, and judges the median of the per-repeat medians (or, with `--statistic min`, the fastest
step each side took over all repeats: load only ever slows a step).

    python3 scripts/peer_fidelity.py [--sweep FILE ...] [--device cpu|cuda:N] [--peer pytorch|
        pytorch-compiled|none] [--steps S] [--warmup W] [--threads T] [--repeat R]
        [--tolerance PCT] [--statistic median|min] [--only densebench|pytorch] [--variants A,B]
        [--match REGEX] [--csv OUT]

Default sweeps: harness/sweeps/versus-pytorch.toml on the CPU; on a GPU also
harness/sweeps/gpu.toml (every configuration the issue names). Needs a release build
(`cargo build --release`, or `--densebench BIN`) and, for the peer's rows, PyTorch (`just
peer-setup`); without PyTorch the peer's jobs are reported as skipped. The last line is
`N passed, N failed` (`, N skipped`); exit 1 when any pair is outside the tolerance, 2 on bad
arguments. A benchmark, not a unit test: quote it with its command and machine.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "harness", "peer", "pytorch_peer.py")
SWEEPS = os.path.join(ROOT, "harness", "sweeps")
CPU_TOLERANCE_PCT = 10.0
GPU_TOLERANCE_PCT = 5.0
# glibc's malloc tunables the harness gives every measuring child, densebench's and the peer's
# (`HUGE_PAGE_TUNABLE` in harness/src/measure/child.rs, which says why: 15-20 % faster steps on
# the CPU). The bare loops run with them too, so that the check sees what is inside a timed
# step, not the process's malloc settings (`--plain` leaves them out, to see what they are
# worth). scripts/tests/test_peer_fidelity.py checks this copy against child.rs.
HARNESS_GLIBC_TUNABLES = (
    "glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"
)


def die(msg: str, code: int = 2):
    sys.stderr.write(f"peer_fidelity: {msg}\n")
    sys.exit(code)


def parse_key(key: str) -> dict:
    """A row key `variant/family/N/C0/k/L/bn/size/act/dtype/seed/device[/tf32][/graph|/compiled]`
    as a dict (the fields `plan::job::key` writes)."""
    parts = key.split("/")
    if len(parts) < 12:
        raise ValueError(f"key `{key}` has {len(parts)} fields, expected at least 12")
    names = ["variant", "family", "batch", "channels", "growth", "depth", "bn_size", "size",
             "activation", "dtype", "seed", "device"]
    job = dict(zip(names, parts[:12]))
    rest = parts[12:]
    job["math"] = "tf32" if "tf32" in rest else "ieee"
    job["execution"] = next((r for r in rest if r in ("graph", "compiled")), "eager")
    job["key"] = key
    return job


def plan_jobs(densebench: str, sweep: str, peer: str) -> list[dict]:
    """The jobs of a sweep file, from `densebench plan` (the harness's own parser)."""
    cmd = [densebench, "plan", "--sweep", sweep, "--format", "tsv"]
    if peer != "none":
        cmd += ["--peer", peer]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        die(f"`{' '.join(cmd)}` exited {r.returncode}: {r.stderr.strip()}")
    jobs = []
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    for line in lines[1:]:  # the header: shard, key, cost
        key = line.split("\t")[1]
        jobs.append(parse_key(key))
    return jobs


def on_device(job: dict, device: str) -> dict:
    """`job` moved to `device` (`cpu` or `cuda:N`): its key names that device, and a compiled
    peer's `compiled` becomes `graph` on a GPU (the peer compiles with `reduce-overhead`, CUDA
    graphs, there; the harness's rows say so), and `graph` becomes `compiled` on the CPU."""
    parts = job["key"].split("/")
    rest = parts[12:]
    if job["variant"].startswith("pytorch-compiled-"):
        want, other = ("compiled", "graph") if device == "cpu" else ("graph", "compiled")
        rest = [want if r == other else r for r in rest]
    return parse_key("/".join(parts[:11] + [device] + rest))


def config_flags(job: dict) -> list[str]:
    size = job["size"]
    return [
        "--family", job["family"], "--batch", job["batch"], "--channels", job["channels"],
        "--growth", job["growth"], "--depth", job["depth"], "--bn-size", job["bn_size"],
        "--size", size, "--activation", job["activation"], "--dtype", job["dtype"],
        "--seed", job["seed"],
    ]


def config_id(job: dict) -> str:
    return job["key"].split("/", 1)[1]


def run_json(cmd: list[str], env: dict | None = None, timeout: float = 3600) -> dict:
    """Runs `cmd` and returns the JSON object on the last non-empty line of its stdout."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        raise RuntimeError(f"{os.path.basename(cmd[0])} … exited {r.returncode}: {last}")
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError(f"{' '.join(cmd[:3])} … printed nothing")
    return json.loads(lines[-1])


def bare_env(a) -> dict:
    """A bare loop's environment: the thread count and, unless --plain, the harness's malloc
    tunables (as `child::glibc_tunables` composes them with the user's own)."""
    env = dict(os.environ)
    for var in ("RAYON_NUM_THREADS", "CANDLE_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(a.threads)
    if not a.plain:
        own = os.environ.get("GLIBC_TUNABLES", "")
        env["GLIBC_TUNABLES"] = HARNESS_GLIBC_TUNABLES + (f":{own}" if own else "")
    return env


# ---------------------------------------------------------------------------------------------
# The two ways, for densebench's variants and for the peer's
# ---------------------------------------------------------------------------------------------


def densebench_harness(a, job) -> dict:
    cmd = [a.densebench, "run", *config_flags(job), "--variant", job["variant"],
           "--device", a.device, "--math", job["math"], "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--threads", str(a.threads), "--execution", job["execution"],
           "--format", "json"]
    row = run_json(cmd)
    if row.get("status") != "ok":
        raise RuntimeError(f"run: status {row.get('status')}: {row.get('error')}")
    if row.get("grad_ok") is not True:
        raise RuntimeError(f"run: gradients not within tolerance (max_rel_err {row.get('max_rel_err')})")
    return {"median_ns": row["median_ns"], "min_ns": row["min_ns"]}


def densebench_bare(a, job, case: str, out: str) -> dict:
    cmd = [a.densebench, "step", "--case", case, "--variant", job["variant"], "--out", out,
           "--force", "--device", a.device, "--bare-loop", str(a.steps), "--warmup", str(a.warmup),
           "--math", job["math"], "--execution", job["execution"]]
    if job["family"] == "mlp":
        cmd += ["--activation", job["activation"]]
    return run_json(cmd, env=bare_env(a))


def peer_harness(a, job, case: str, out: str) -> dict:
    """The peer exactly as the harness spawns it (harness/src/measure/peer.rs `args`)."""
    cmd = [a.python, PEER, "--case", case, "--family", job["family"], "--variant", job["variant"],
           "--device", a.device, "--dtype", job["dtype"], "--warmup", str(a.warmup),
           "--steps", str(a.steps), "--threads", str(a.threads), "--math", job["math"],
           "--out", out]
    if job["family"] == "mlp":
        cmd += ["--activation", job["activation"]]
    # The environment the harness gives every child (harness/src/measure/child.rs `run`):
    # its malloc tunables, whatever --plain says (that flag is about the bare loops).
    env = dict(os.environ)
    own = os.environ.get("GLIBC_TUNABLES", "")
    env["GLIBC_TUNABLES"] = HARNESS_GLIBC_TUNABLES + (f":{own}" if own else "")
    return run_json(cmd, env=env)


def peer_bare(a, job, case: str) -> dict:
    """The same module timed in a plain loop, in a fresh interpreter without the shim."""
    cmd = [a.torch_python, os.path.abspath(__file__), "--bare-peer", case, job["family"],
           job["variant"], a.device, job["dtype"], job["activation"], job["math"],
           str(a.warmup), str(a.steps), str(a.threads)]
    env = bare_env(a)
    env.pop("LD_PRELOAD", None)
    return run_json(cmd, env=env)


def bare_peer_main(argv: list[str]) -> int:
    """`--bare-peer CASE FAMILY VARIANT DEVICE DTYPE ACTIVATION MATH WARMUP STEPS THREADS`: the
    peer's module, built as the peer builds it, timed as a user's loop; one JSON line."""
    case, family, variant, device, dtype, activation, math, warmup, steps, threads = argv
    warmup, steps, threads = int(warmup), int(steps), int(threads)
    sys.path.insert(0, os.path.dirname(PEER))
    import pytorch_peer as pp  # the module builder and case reader, not its measuring code
    import torch

    torch.set_num_threads(threads)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        pp.set_math(torch, math)
    # as the peer runs it: bf16 is mixed precision (the block f32, the features bf16, the
    # forward under torch.autocast, entered inside the timed step)
    dt = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.float32}[dtype]
    feature_dt = torch.bfloat16 if dtype == "bf16" else dt
    tensors = pp.read_safetensors(torch, case)
    cfg = pp.read_config(tensors, family, case)
    block = pp.build_block(torch, family, variant, cfg, activation == "on").to(dtype=dt)
    pp.load_state(torch, block, tensors, case)
    block = block.to(device=dev).train()
    x = tensors["input"].to(device=dev, dtype=feature_dt)
    g = tensors["grad_output"].to(device=dev, dtype=feature_dt)
    del tensors
    block, x, g = pp.in_memory_format(torch, variant, block, x, g)  # channels_last variants
    x.requires_grad_(True)
    compiled = variant.startswith(pp.COMPILED_PREFIX)
    fn = pp.compile_block(torch, block, device) if compiled else block
    params = list(block.parameters())
    graphs = compiled and dev.type == "cuda"
    if dtype == "bf16":
        def autocast():
            return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext

    def one() -> int:
        for p in params:
            p.grad = None
        x.grad = None
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if dev.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            with autocast():
                out = fn(x)
            out.backward(g)
            end.record()
            end.synchronize()
            return int(round(start.elapsed_time(end) * 1e6))
        t0 = time.perf_counter_ns()
        with autocast():
            out = fn(x)
        out.backward(g)
        return time.perf_counter_ns() - t0

    for _ in range(max(warmup, pp.COMPILED_MIN_WARMUP) if compiled else warmup):
        one()
    times = [one() for _ in range(steps)]
    sys.stdout.write(json.dumps({
        "median_ns": pp.median_ns(times), "min_ns": min(times), "step_ns": times,
    }) + "\n")
    return 0


# ---------------------------------------------------------------------------------------------


def torch_python() -> str | None:
    """An interpreter that imports torch: this one, else the peer's venv."""
    probe = "import torch, torchvision"
    for py in (sys.executable, os.path.join(ROOT, "harness", "peer", ".venv-peer", "bin", "python")):
        if os.path.exists(py) and subprocess.run([py, "-c", probe], capture_output=True).returncode == 0:
            return py
    return None


def judge(a, harness: list[dict], bare: list[dict]) -> tuple[float, float, float, float]:
    """(harness ns, bare ns, ratio, worst per-repeat ratio) by the chosen statistic."""
    if a.statistic == "min":
        h = min(r["min_ns"] for r in harness)
        b = min(r["min_ns"] for r in bare)
        per = [x["min_ns"] / y["min_ns"] for x, y in zip(harness, bare)]
    else:
        h = statistics.median(r["median_ns"] for r in harness)
        b = statistics.median(r["median_ns"] for r in bare)
        per = [x["median_ns"] / y["median_ns"] for x, y in zip(harness, bare)]
    worst = max(per, key=lambda r: abs(r - 1))
    return h, b, h / b, worst


def main(argv: list[str]) -> int:
    if argv[:1] == ["--bare-peer"]:
        return bare_peer_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sweep", action="append", help="sweep file (repeatable)")
    p.add_argument("--device", default="cpu", help="cpu or cuda:N (every job runs here)")
    p.add_argument("--peer", default="pytorch", choices=("pytorch", "pytorch-compiled", "none"))
    p.add_argument("--only", choices=("densebench", "pytorch"))
    p.add_argument("--variants", help="comma-separated variant names to keep")
    p.add_argument("--match", metavar="REGEX",
                   help="keep the jobs whose row key matches (re.search), e.g. "
                        "'/bc/64/24/12/16/' for BC-100's block at L=16")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tolerance", type=float, help="percent (default 10 on the CPU, 5 on a GPU)")
    p.add_argument("--statistic", choices=("median", "min"), default="median")
    p.add_argument("--densebench", default=os.environ.get(
        "DENSEBENCH_BIN", os.path.join(ROOT, "target", "release", "densebench")))
    p.add_argument("--python", default=os.environ.get("DENSEBENCH_PYTHON", "python3"),
                   help="interpreter the harness runs the peer with")
    p.add_argument("--plain", action="store_true",
                   help="run the bare loops without the harness's malloc tunables")
    p.add_argument("--csv", help="write one row per pair here")
    a = p.parse_args(argv)
    if a.steps < 1 or a.repeat < 1 or a.warmup < 0 or a.threads < 1:
        die("--steps, --repeat and --threads must be at least 1, --warmup at least 0")
    if not os.access(a.densebench, os.X_OK):
        die(f"no densebench binary at {a.densebench}: cargo build --release (or --densebench BIN)")
    gpu = a.device != "cpu"
    tol = (a.tolerance if a.tolerance is not None
           else GPU_TOLERANCE_PCT if gpu else CPU_TOLERANCE_PCT) / 100
    sweeps = a.sweep or [os.path.join(SWEEPS, "versus-pytorch.toml")] + (
        [os.path.join(SWEEPS, "gpu.toml")] if gpu else [])
    jobs, seen = [], set()
    for s in sweeps:
        for j in plan_jobs(a.densebench, s, a.peer):
            # Every job on --device; one per key there.
            j = on_device(j, a.device)
            if j["key"] in seen:
                continue
            if (a.device == "cpu") and j["math"] == "tf32":
                continue
            seen.add(j["key"])
            jobs.append(j)
    keep = set(a.variants.split(",")) if a.variants else None
    jobs = [j for j in jobs if keep is None or j["variant"] in keep]
    if a.match:
        try:
            pattern = re.compile(a.match)
        except re.error as e:
            die(f"--match: not a regular expression: {e}")
        jobs = [j for j in jobs if pattern.search(j["key"])]
    is_peer = lambda j: j["variant"].startswith("pytorch-")  # noqa: E731
    if a.only:
        jobs = [j for j in jobs if is_peer(j) == (a.only == "pytorch")]
    a.torch_python = torch_python() if any(is_peer(j) for j in jobs) else None
    # One row per pair, written and flushed as each is judged: a check stopped by a time limit
    # (SIGTERM, as a GPU call's `timeout` sends) keeps every pair it finished.
    cols = ["key", "verdict", "harness_ns", "bare_ns", "ratio", "worst_repeat_ratio",
            "statistic", "tolerance", "device", "threads", "steps", "repeat", "error"]
    sink = open(a.csv, "w", newline="") if a.csv else None
    writer = csv.DictWriter(sink, fieldnames=cols, restval="") if sink else None
    if writer:
        writer.writeheader()
        sink.flush()

    def record(row: dict):
        if writer:
            writer.writerow(row)
            sink.flush()

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        passed, failed, skipped = run_jobs(a, jobs, tol, is_peer, record)
    except KeyboardInterrupt:
        print("fidelity: stopped before every job ran (the CSV holds the pairs judged so far)",
              flush=True)
        return 1
    finally:
        if sink:
            sink.close()
    line = f"{passed} passed, {failed} failed"
    if skipped:
        line += f", {skipped} skipped"
    print(line)
    return 1 if failed else 0


def run_jobs(a, jobs, tol, is_peer, record) -> tuple[int, int, int]:
    """Times every job both ways; `record` gets each pair's CSV row. (passed, failed, skipped)"""
    passed, failed, skipped = 0, 0, 0
    print(f"fidelity: {len(jobs)} jobs on {a.device}, {a.threads} thread(s), {a.steps} steps "
          f"after {a.warmup} warm-up, {a.repeat} repeat(s), ±{tol:.0%} on the {a.statistic}"
          + (", bare loops without the harness's malloc tunables" if a.plain else ""),
          flush=True)
    tmp = tempfile.mkdtemp(prefix="densebench-fidelity-")
    cases: dict[str, str] = {}
    for j in jobs:
        label = f"{j['variant']} {config_id(j)}"
        if is_peer(j) and a.torch_python is None:
            print(f"SKIPPED {label}: PyTorch not importable (just peer-setup)", flush=True)
            skipped += 1
            continue
        cid = config_id(j)
        if cid not in cases:
            path = os.path.join(tmp, f"case{len(cases)}.safetensors")
            r = subprocess.run([a.densebench, "case", *config_flags(j), "--out", path],
                               capture_output=True, text=True)
            if r.returncode != 0:
                die(f"densebench case for {cid}: {r.stderr.strip()}", 1)
            cases[cid] = path
        case = cases[cid]
        out = os.path.join(tmp, "result.safetensors")
        harness, bare = [], []
        try:
            for i in range(a.repeat):
                ways = [("harness", harness), ("bare", bare)]
                if i % 2:
                    ways.reverse()
                for way, acc in ways:
                    if is_peer(j):
                        acc.append(peer_harness(a, j, case, out) if way == "harness"
                                   else peer_bare(a, j, case))
                    else:
                        acc.append(densebench_harness(a, j) if way == "harness"
                                   else densebench_bare(a, j, case, out))
        except (RuntimeError, subprocess.TimeoutExpired, ValueError, KeyError) as e:
            print(f"FAILED {label}: {e}", flush=True)
            failed += 1
            record({"key": j["key"], "verdict": "error", "error": str(e)})
            continue
        h, b, ratio, worst = judge(a, harness, bare)
        ok = abs(ratio - 1) <= tol
        passed += ok
        failed += not ok
        print(f"{'ok    ' if ok else 'FAILED'} {label}: harness {h / 1e6:.3f} ms, bare loop "
              f"{b / 1e6:.3f} ms, ×{ratio:.3f} (worst repeat ×{worst:.3f})", flush=True)
        record({"key": j["key"], "verdict": "ok" if ok else "outside", "harness_ns": int(h),
                "bare_ns": int(b), "ratio": f"{ratio:.4f}", "worst_repeat_ratio": f"{worst:.4f}",
                "statistic": a.statistic, "tolerance": tol, "device": a.device,
                "threads": a.threads, "steps": a.steps, "repeat": a.repeat, "error": ""})
    return passed, failed, skipped


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
