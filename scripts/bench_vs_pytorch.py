#!/usr/bin/env python3
"""densebench against PyTorch, side by side in one run (the `just bench-vs-pytorch` recipe).

Runs `densebench bench-all --peer pytorch` on harness/sweeps/versus-pytorch.toml once per thread
count (1 and every core by default), so densebench's variants and PyTorch's run as identical
child processes — the same case file, steps, warm-up, threads and allocator settings — and every
row, PyTorch's included, has its gradients checked against the f64 reference. Then it prints,
per configuration and thread count, the ratios densebench / PyTorch of the median step time and
of the peak memory, and writes the rows to results/versus-pytorch-{N}thread(s).csv (or --out-dir).

Needs PyTorch for the peer (`just peer-setup`) and a release build (`cargo build --release`).
A benchmark, not a test: run it on a quiet machine and quote the ratios with the command.

A shared machine's speed drifts by tens of percent within a minute, so a single pair of rows
can mislead: `--repeat N` runs the whole comparison N times, one thread count after the other
(their order reversed every other repeat; in every other repeat densebench's rows run alone
before the peer sweep and are paired with its PyTorch rows, so neither side always runs second),
and prints each ratio's median with its min–max over
the repeats (the CSVs keep the last repeat's rows). It also prints the ratio of the two sides'
fastest timed steps over all repeats (`time_ratio_best`): load from other tenants only ever
slows a step, so the fastest step is the closest each side came to a quiet machine.

    python3 scripts/bench_vs_pytorch.py [--threads 1,2] [--only bc|mlp] [--repeat N]
                                        [--out-dir DIR] [--csv RATIOS.csv]
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "harness", "peer"))
import pytorch_peer  # noqa: E402  (the peer variants' names; standard library only)
SWEEP = os.path.join(ROOT, "harness", "sweeps", "versus-pytorch.toml")

# (family, densebench variant, PyTorch variant): the pairs of the CPU speed issue, each against
# PyTorch eager, against the same block under torch.compile (the sweep's `peer =
# "pytorch-compiled"`; on the CPU its default mode), for bc also against both in channels_last
# memory format (PyTorch's performance guide's advice for convolutional networks), and against
# the fastest of them per repeat ("best of": the strongest PyTorch a user reaches for).
EAGER_PAIRS = [
    ("bc", "cat-store-copy", "pytorch-naive"),
    ("bc", "buffer-recompute-inplace", "pytorch-memory-efficient"),
    ("mlp", "cat-store-copy", "pytorch-naive"),
    ("mlp", "buffer-store-inplace", "pytorch-naive"),
    ("mlp", "buffer-store-inplace", "pytorch-checkpoint"),
]


def compiled_twin(variant):
    """`pytorch-naive` → `pytorch-compiled-naive`."""
    return pytorch_peer.variant_name(variant, compiled=True)


def channels_last_twin(variant):
    """`pytorch-naive` → `pytorch-channels-last-naive`."""
    return pytorch_peer.variant_name(variant, channels_last=True)


def twins(family, theirs):
    """The PyTorch rows a pair is measured against: the eager block, compiled, and for bc (a
    Linear block has no memory format) both in channels_last."""
    layouts = [theirs] + ([channels_last_twin(theirs)] if family == "bc" else [])
    return [v for eager in layouts for v in (eager, compiled_twin(eager))]


PAIRS = [(f, ours, t) for f, ours, theirs in EAGER_PAIRS for t in twins(f, theirs)]


def best_label(family, theirs):
    return f"best of {', '.join(twins(family, theirs))}"


def csv_name(threads):
    return f"versus-pytorch-{threads}thread{'' if threads == 1 else 's'}.csv"


def sweep_text(threads, only, peer=True):
    """The shipped sweep with `threads` set in [defaults] and, with `only`, one family's group;
    without `peer`, densebench's rows alone."""
    text = open(SWEEP).read()
    text, n = re.subn(r"(?m)^threads\s*=.*$", f"threads = {threads}", text)
    if n != 1:
        sys.exit(f"bench-vs-pytorch: {SWEEP} must set `threads` once in [defaults]")
    if not peer:
        text, n = re.subn(r'(?m)^peer\s*=.*$', 'peer = "none"', text)
        if n != 1:
            sys.exit(f"bench-vs-pytorch: {SWEEP} must set `peer` once in [defaults]")
    if only:
        head, *groups = text.split("[[group]]")
        keep = [g for g in groups if re.search(rf'(?m)^family\s*=\s*"{only}"', g)]
        text = head + "".join("[[group]]" + g for g in keep)
    return text


def key_config(row):
    """The configuration part of a row's key (everything after the variant), without the
    `/compiled` suffix a torch.compile row's key carries: a compiled PyTorch row pairs with the
    densebench row of the same configuration (eager against compiled is the comparison the CPU
    issue asks for; on the CPU no row runs as a CUDA graph)."""
    config = row["key"].split("/", 1)[1]
    return config[: -len("/compiled")] if config.endswith("/compiled") else config


def bench_all(a, t, path, peer):
    """`densebench bench-all` of the sweep at `t` threads into `path`; its rows."""
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
        f.write(sweep_text(t, a.only, peer))
    try:
        p = subprocess.run([a.bin, "bench-all", "--sweep", f.name, "--out", path, "--force"])
    finally:
        os.unlink(f.name)
    if p.returncode != 0:
        sys.exit(f"bench-vs-pytorch: bench-all at {t} thread(s) failed ({p.returncode}); "
                 f"the rows so far are in {path}")
    return list(csv.DictReader(open(path)))


def measure(a, t, rep, samples, versions):
    """One bench-all run of the sweep at `t` threads; appends each pair's ratios to `samples`.

    A sweep runs the peer's rows first (the naive peer's error sets the tolerance of the rows
    after it), and a row run right after PyTorch's measured slower than the same row run alone
    (mlp `cat-store-copy`, 1 thread: 1.10–1.28 s against 1.02–1.05 s). So every other repeat
    first runs densebench's rows alone and pairs those with the peer sweep's PyTorch rows:
    densebench runs before PyTorch in half the repeats and after it in the other half."""
    path = os.path.join(a.out_dir, csv_name(t))
    first = rep % 2 == 1
    print(f"bench-vs-pytorch: repeat {rep + 1}/{a.repeat}, {t} thread(s)"
          f"{', densebench first' if first else ''}", flush=True)
    before = None
    if first:
        with tempfile.TemporaryDirectory() as d:
            before = bench_all(a, t, os.path.join(d, "densebench-first.csv"), peer=False)
    rows = bench_all(a, t, path, peer=True)
    by = {(r["variant"], key_config(r)): r for r in rows}
    if before is not None:
        for r in before:
            paired = by.get((r["variant"], key_config(r)))
            if paired is None:
                sys.exit(f"bench-vs-pytorch: {r['key']} is missing from the peer sweep")
            # Same case, same code: the same errors, judged by the peer-derived tolerance.
            if r["status"] == "ok" and float(r["max_rel_err"]) > float(paired["tolerance"]):
                sys.exit(f"bench-vs-pytorch: {r['key']}: max_rel_err {r['max_rel_err']} beyond "
                         f"the peer-derived tolerance {paired['tolerance']} — not a result")
            by[(r["variant"], key_config(r))] = r
    for r in rows:
        if r["framework"] != "densebench":
            versions.add(r["framework_version"])
    for family, ours, theirs in PAIRS:
        for (v, cfg), d in sorted(by.items()):
            if v != ours or d["family"] != family:
                continue
            pt = by.get((theirs, cfg))
            if pt is None:
                continue
            for r in (d, pt):
                if r["status"] != "ok" or r["grad_ok"] != "true":
                    sys.exit(f"bench-vs-pytorch: {r['key']} at {t} thread(s): {r['status']} "
                             f"grad_ok={r['grad_ok']} {r['error']} — not a result")
            samples.setdefault((f"{family} L={d['depth']}", t, ours, theirs), []).append(
                sample(d, pt))
    # The strongest PyTorch per pair and repeat: the fastest of eager and compiled, in either
    # memory format for bc (by median).
    for family, ours, theirs in EAGER_PAIRS:
        for (v, cfg), d in sorted(by.items()):
            if v != ours or d["family"] != family:
                continue
            all_of = [by.get((w, cfg)) for w in twins(family, theirs)]
            if any(r is None for r in all_of):
                continue
            pt = min(all_of, key=lambda r: int(r["median_ns"]))
            samples.setdefault((f"{family} L={d['depth']}", t, ours, best_label(family, theirs)),
                               []).append(sample(d, pt))


def sample(d, pt):
    """One repeat's numbers of densebench's row `d` against PyTorch's row `pt`."""
    return {
        "densebench_ms": int(d["median_ns"]) / 1e6,
        "pytorch_ms": int(pt["median_ns"]) / 1e6,
        "time_ratio": int(d["median_ns"]) / int(pt["median_ns"]),
        "densebench_best_ms": int(d["min_ns"]) / 1e6,
        "pytorch_best_ms": int(pt["min_ns"]) / 1e6,
        "densebench_peak_mib": int(d["peak_bytes"]) / 2**20,
        "pytorch_peak_mib": int(pt["peak_bytes"]) / 2**20,
        "peak_ratio": int(d["peak_bytes"]) / int(pt["peak_bytes"]),
        "pytorch_variant": pt["variant"],
        "pytorch_execution": pt.get("execution") or "eager",
        "device_desc": d["device_desc"],
    }


def thread_list(text):
    """`1,2` → [1, 2]: positive integers, at least one; else argparse's one-line usage error."""
    try:
        counts = sorted({int(t) for t in text.split(",") if t.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of thread counts")
    if not counts or counts[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give one or more thread counts ≥ 1, e.g. 1,2")
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=thread_list, default=f"1,{os.cpu_count() or 1}",
                    help="comma-separated thread counts to compare at, each run side by side "
                    "(default: 1 and all cores)")
    ap.add_argument("--only", choices=["bc", "mlp"], help="one family's configuration only")
    ap.add_argument("--bin", default=os.environ.get(
        "DENSEBENCH_BIN", os.path.join(ROOT, "target", "release", "densebench")))
    ap.add_argument("--out-dir", default=os.path.join(ROOT, "results"),
                    help="where the result CSVs go (one per thread count)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the comparison this many times; ratios are medians over them")
    ap.add_argument("--csv", help="also write the ratio table as CSV here")
    a = ap.parse_args()
    if a.repeat < 1:
        sys.exit("bench-vs-pytorch: --repeat must be at least 1")
    if not os.path.exists(a.bin):
        sys.exit(f"bench-vs-pytorch: {a.bin} not found: run `cargo build --release` first")
    threads = a.threads
    samples = {}  # (config, threads, ours, theirs) -> list of per-repeat measurements
    versions = set()
    for rep in range(a.repeat):
        for t in (threads if rep % 2 == 0 else threads[::-1]):
            measure(a, t, rep, samples, versions)
    out = []
    for (config, t, ours, theirs), runs in samples.items():
        time_ratios = [r["time_ratio"] for r in runs]
        last = runs[-1]
        out.append({
            "config": config, "threads": t, "densebench": ours, "pytorch": theirs,
            "repeats": len(runs),
            "densebench_median_ms": statistics.median(r["densebench_ms"] for r in runs),
            "pytorch_median_ms": statistics.median(r["pytorch_ms"] for r in runs),
            "time_ratio": statistics.median(time_ratios),
            "time_ratio_min": min(time_ratios), "time_ratio_max": max(time_ratios),
            "densebench_best_ms": min(r["densebench_best_ms"] for r in runs),
            "pytorch_best_ms": min(r["pytorch_best_ms"] for r in runs),
            "time_ratio_best": (min(r["densebench_best_ms"] for r in runs)
                                / min(r["pytorch_best_ms"] for r in runs)),
            "densebench_peak_mib": last["densebench_peak_mib"],
            "pytorch_peak_mib": last["pytorch_peak_mib"],
            "peak_ratio": last["peak_ratio"],
            "pytorch_execution": ",".join(sorted({r["pytorch_execution"] for r in runs})),
            "device_desc": last["device_desc"],
        })
    print()
    for r in out:
        spread = (f" ({r['time_ratio_min']:.2f}–{r['time_ratio_max']:.2f} over {r['repeats']})"
                  if r["repeats"] > 1 else "")
        print(f"{r['config']:10} T={r['threads']:<2} {r['densebench']:25} "
              f"{r['densebench_median_ms']:8.1f} ms {r['densebench_peak_mib']:7.1f} MiB | "
              f"{r['pytorch']:25} {r['pytorch_median_ms']:8.1f} ms "
              f"{r['pytorch_peak_mib']:7.1f} MiB | time ×{r['time_ratio']:.2f}{spread} "
              f"best ×{r['time_ratio_best']:.2f} peak ×{r['peak_ratio']:.2f}")
    machines = sorted({r["device_desc"] for r in out})
    print(f"machine: {'; '.join(machines) or '?'}")
    print(f"PyTorch: {', '.join(sorted(versions)) or '?'}; densebench: {a.bin}; rows in "
          f"{', '.join(os.path.join(a.out_dir, csv_name(t)) for t in threads)}; medians of the "
          f"sweep's timed steps{' and over the repeats' if a.repeat > 1 else ''}; best: fastest "
          f"timed step of each side; ratios are "
          f"densebench / PyTorch (below 1: densebench faster or smaller)")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(out[0].keys()) if out else ["config"])
            w.writeheader()
            w.writerows(out)


if __name__ == "__main__":
    main()
