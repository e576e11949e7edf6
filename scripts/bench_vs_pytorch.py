#!/usr/bin/env python3
"""densebench against PyTorch, side by side in one run (the `just bench-vs-pytorch` recipe).

For each configuration of issue 14 it writes the exact case densebench measures
(`densebench case`), measures densebench's variant with `densebench run` (isolated child, f64
reference, gradients checked) and PyTorch's counterpart with `harness/peer/pytorch_peer.py` on
that same case file, at 1 thread and at every core, back to back, and prints the ratios
densebench / PyTorch of the median step time and of the peak memory. Timings are wall-clock
medians of the same number of warm-up and measured steps on both sides; PyTorch's CPU time per
step is printed beside it (a loaded machine inflates wall time, not CPU time).

Needs PyTorch for the peer (`just peer-setup`) and a release build (`cargo build --release`).
A benchmark, not a test: run it on a quiet machine and quote the ratios with the command.

    python3 scripts/bench_vs_pytorch.py [--steps 3] [--threads 1,2] [--only bc|mlp] [--csv OUT]
"""

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEER = os.path.join(ROOT, "harness", "peer", "pytorch_peer.py")

# (label, config flags, densebench variant, PyTorch variant) — the rows of issue 14's table.
BC100 = ["--family", "bc", "--batch", "64", "--channels", "24", "--growth", "12", "--depth", "16",
         "--bn-size", "4", "--size", "32"]
MLP32 = ["--family", "mlp", "--batch", "4096", "--channels", "256", "--growth", "64", "--depth",
         "32", "--activation", "on"]
CASES = [
    ("BC-100 L=16", "bc", BC100, "cat-store-copy", "pytorch-naive"),
    ("BC-100 L=16", "bc", BC100, "buffer-recompute-inplace", "pytorch-memory-efficient"),
    ("mlp L=32", "mlp", MLP32, "cat-store-copy", "pytorch-naive"),
]


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench-vs-pytorch: `{' '.join(cmd)}` failed ({p.returncode}): "
                 f"{(p.stderr.strip().splitlines() or ['no message'])[-1]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", default=f"1,{os.cpu_count() or 1}")
    ap.add_argument("--only", choices=["bc", "mlp"])
    ap.add_argument("--bin", default=os.environ.get(
        "DENSEBENCH_BIN", os.path.join(ROOT, "target", "release", "densebench")))
    ap.add_argument("--csv", help="also write the table as CSV here")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"bench-vs-pytorch: {a.bin} not found: run `cargo build --release` first")
    check = subprocess.run([sys.executable, PEER, "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        sys.exit(check.stderr.strip() or "bench-vs-pytorch: the PyTorch peer is not usable")
    versions = json.loads(check.stdout.strip().splitlines()[-1])
    threads = sorted({int(t) for t in a.threads.split(",") if t.strip()})
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, family, cfg, ours, theirs in CASES:
            if a.only and a.only != family:
                continue
            case = os.path.join(tmp, f"{family}.safetensors")
            run([a.bin, "case", *cfg, "--out", case])
            for t in threads:
                row = json.loads(run([a.bin, "run", *cfg, "--variant", ours, "--threads", str(t),
                                      "--steps", str(a.steps), "--warmup", str(a.warmup),
                                      "--format", "json"]).strip().splitlines()[-1])
                if row["status"] != "ok" or row.get("grad_ok") is not True:
                    sys.exit(f"bench-vs-pytorch: densebench {ours} on {label}: {row['status']} "
                             f"{row.get('error', '')} — not a result")
                peer = json.loads(run([sys.executable, PEER, "--case", case, "--family", family,
                                       "--variant", theirs, "--device", "cpu", "--dtype", "f32",
                                       "--warmup", str(a.warmup), "--steps", str(a.steps),
                                       "--threads", str(t), "--math", "ieee",
                                       "--activation", "on",
                                       "--out", os.path.join(tmp, "peer.safetensors")])
                                  .strip().splitlines()[-1])
                out.append({
                    "config": label, "threads": t, "densebench": ours, "pytorch": theirs,
                    "densebench_median_ms": row["median_ns"] / 1e6,
                    "pytorch_median_ms": peer["median_ns"] / 1e6,
                    "pytorch_cpu_ms": (peer.get("cpu_median_ns") or 0) / 1e6,
                    "time_ratio": row["median_ns"] / peer["median_ns"],
                    "densebench_peak_mib": row["peak_bytes"] / 2**20,
                    "pytorch_peak_mib": peer["peak_bytes"] / 2**20,
                    "peak_ratio": row["peak_bytes"] / peer["peak_bytes"],
                    "densebench_max_rel_err": row["max_rel_err"],
                })
                r = out[-1]
                print(f"{label:12} T={t:<2} {ours:26} {r['densebench_median_ms']:9.1f} ms "
                      f"{r['densebench_peak_mib']:8.1f} MiB | {theirs:26} "
                      f"{r['pytorch_median_ms']:9.1f} ms (cpu {r['pytorch_cpu_ms']:8.1f}) "
                      f"{r['pytorch_peak_mib']:8.1f} MiB | time ×{r['time_ratio']:.2f} "
                      f"peak ×{r['peak_ratio']:.2f}", flush=True)
    print(f"PyTorch: {versions.get('framework_version', versions)}; densebench: {a.bin}; "
          f"{a.warmup} warm-up + {a.steps} measured steps, medians; ratios are densebench / "
          f"PyTorch (below 1: densebench faster or smaller)")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0].keys()) if out else ["config"])
            w.writeheader()
            w.writerows(out)


if __name__ == "__main__":
    main()
