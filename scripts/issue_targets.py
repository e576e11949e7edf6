#!/usr/bin/env python3
"""Where a GPU reference stands against the targets of issues 38 (GPU speed) and 39 (bf16).

Reads result CSVs (`results/reference-h100.csv`, a call's `reference-gpu.csv`) and prints one line
per target and configuration: the measured value, the limit, and `met`, `MISSED` or `not
measured` (a row missing, failed, or its gradients not within tolerance — a number from an
unchecked row is not a result). Like is compared with like: same device, same math, densebench's
CUDA-graph rows with compiled PyTorch (`reduce-overhead`, CUDA graphs), its eager rows with eager
PyTorch.

Issue 38, on every configuration of harness/sweeps/gpu.toml (f32), in each math measured:
- `cat-store-copy` graph ≤ 0.8 × compiled PyTorch naive;
- `buffer-recompute-inplace` graph ≤ 0.8 × compiled memory-efficient (the mlp: checkpoint) and
  ≤ 1.0 × compiled naive;
- BC-100 L=16 and the torchvision-style block at L=6, tf32, graph step ≤ 4 ms (both variants);
- `buffer-recompute-inplace` peak on BC-100 L=48 ≤ 345 MiB;
- measured / predicted peak within 1 ± 0.001 on every modelled densebench row, gradients within
  tolerance on every row.
Issue 39, BC-100's block at N=64, L = 16/32/48:
- bf16 peak ≤ 0.55 × the f32 peak of the same variant, math and execution;
- densebench bf16 ≤ 0.8 × PyTorch autocast (eager against eager; graph against compiled);
- every bf16 row's gradients within tolerance.

    python3 scripts/issue_targets.py CSV [CSV ...] [--only missed] [--strict]

The eager-against-eager ratios are printed for information (the issue's speed targets are set
against compiled PyTorch). A ratio of two rows measured more than 10 minutes apart (one device
call lasts at most 10) says how far apart: read it as two calls, perhaps two machines. Exit 0,
or with --strict 1 when a target is missed or not measured; 2 on bad input.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from datetime import datetime
import os

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "harness", "peer"))
import pytorch_peer  # noqa: E402  (the peer variants' names; standard library only)

MIB = 1 << 20
# (family, batch, channels, growth, size, depths) of harness/sweeps/gpu.toml's f32 groups
GPU_CONFIGS = [
    ("bc", 64, 24, 12, 32, (16, 32, 48)),  # BC-100's block
    ("bc", 32, 64, 32, 56, (6, 12, 24)),  # torchvision-style
    ("mlp", 4096, 256, 64, 1, (16, 32, 64)),  # the forum mlp
]
BF16_DEPTHS = (16, 32, 48)
OURS_NAIVE, OURS_FRUGAL = "cat-store-copy", "buffer-recompute-inplace"


def die(msg: str) -> None:
    sys.stderr.write(f"issue_targets: {msg}\n")
    sys.exit(2)


def load(paths: list[str]) -> list[dict]:
    rows = []
    for path in paths:
        try:
            with open(path, newline="") as f:
                got = list(csv.DictReader(f))
        except OSError as e:
            die(f"{path}: {e.strerror}")
        if got and "key" not in got[0]:
            die(f"{path}: not a densebench result CSV (no `key` column)")
        for r in got:
            r["_file"] = path
        rows += got
    return rows


def checked(r: dict | None) -> bool:
    return r is not None and r.get("status") == "ok" and r.get("grad_ok") == "true"


def num(r: dict, col: str) -> float | None:
    try:
        return float(r[col])
    except (KeyError, TypeError, ValueError):
        return None


class Index:
    """One GPU's rows, by (variant, family, N, C0, k, L, size, dtype, math, execution); the last
    row of a key wins (a resumed file's rerun)."""

    def __init__(self, rows: list[dict]):
        self.rows = {self.key_of(r): r for r in rows}

    @staticmethod
    def key_of(r: dict) -> tuple:
        return (r["variant"], r["family"], int(r["batch"]), int(r["channels"]), int(r["growth"]),
                int(r["depth"]), int(r["size"] or 1), r["dtype"], r.get("math") or "ieee",
                r.get("execution") or "eager")

    def get(self, variant, family, n, c0, k, depth, size, dtype, math, execution):
        return self.rows.get((variant, family, n, c0, k, depth, size, dtype, math, execution))


def peer_names(family: str, execution: str) -> tuple[str, str]:
    """(naive, frugal) PyTorch variants paired with densebench rows of `execution`."""
    frugal = "checkpoint" if family == "mlp" else "memory-efficient"
    pre = "pytorch-compiled-" if execution == "graph" else "pytorch-"
    return pre + "naive", pre + frugal


def channels_last_twin(variant: str) -> str:
    """`pytorch-compiled-naive` → `pytorch-compiled-channels-last-naive` (the same block, its
    module and input in channels_last memory format)."""
    return pytorch_peer.variant_name(variant, channels_last=True)


def strongest(get, family: str, variant: str) -> tuple[dict | None, str]:
    """The PyTorch row a target is judged against: for bc the faster (by median) of the
    contiguous block and its channels_last twin among the checked rows, with a caveat when the
    twin was not measured (the verdict is then against contiguous PyTorch only); mlp blocks have
    no memory format."""
    plain = get(variant)
    if family != "bc":
        return plain, ""
    twin = get(channels_last_twin(variant))
    rows = [r for r in (plain, twin) if checked(r) and num(r, "median_ns")]
    if not checked(twin):
        return plain, "channels_last PyTorch not measured"
    return (min(rows, key=lambda r: num(r, "median_ns")) if rows else plain), ""


def label(family, n, c0, k, depth, size) -> str:
    if family == "mlp":
        return f"mlp N={n} C0={c0} k={k} L={depth}"
    name = {(64, 24, 12, 32): "BC-100", (32, 64, 32, 56): "torchvision-style"}.get(
        (n, c0, k, size), f"bc N={n} C0={c0} k={k} {size}²")
    return f"{name} L={depth}"


class Report:
    def __init__(self):
        self.lines: list[tuple[str, str, str, str, str]] = []

    def add(self, target: str, where: str, value: str, limit: str, verdict: str):
        self.lines.append((target, where, value, limit, verdict))

    def bound(self, target: str, where: str, value: float | None, limit: float, limit_text: str,
              shown) -> None:
        """`value` ≤ `limit` (`None`: not measured), shown as `shown(value)`."""
        if value is None:
            self.add(target, where, "—", limit_text, "not measured")
        else:
            self.add(target, where, shown(value), limit_text,
                     "met" if value <= limit else "MISSED")

    def ratio(self, target: str, where: str, ours: dict | None, peer: dict | None,
              limit: float, info: bool = False, caveat: str = ""):
        """densebench's median over PyTorch's ≤ `limit`. With a `caveat` (PyTorch's strongest
        configuration not measured) a met target reads `met (caveat)`, never plain `met`."""
        why = [f"{who} row {'missing' if r is None else 'not ok'}"
               for who, r in (("densebench", ours), ("PyTorch", peer)) if not checked(r)]
        a = num(ours, "median_ns") if ours else None
        b = num(peer, "median_ns") if peer else None
        if not why and not (a and b):
            why = ["no median"]
        if why:
            self.add(target, where, "—", f"≤ {limit:g}", "not measured (" + ", ".join(why) + ")")
            return
        r = a / b
        apart = minutes_apart(ours, peer)
        when = "" if apart is not None and apart <= 10 else (
            ", measured in different files" if apart is None else f", {apart:.0f} min apart")
        verdict = "info" if info else ("met" if r <= limit else "MISSED")
        if caveat and verdict == "met":
            verdict = f"met ({caveat})"
        which = (f"; PyTorch {peer['variant'][len('pytorch-'):]}"
                 if "channels-last" in peer.get("variant", "") else "")
        self.add(target, where, f"×{r:.2f} ({a / 1e6:.2f} / {b / 1e6:.2f} ms{when}{which})",
                 f"≤ {limit:g}", verdict)


def minutes_apart(a: dict, b: dict) -> float | None:
    """Minutes between two rows' timestamps (a device call lasts at most 10), None when they
    come from different files or a timestamp is unreadable."""
    if a["_file"] != b["_file"]:
        return None
    try:
        ta = datetime.fromisoformat(a["timestamp"].replace("Z", "+00:00"))
        tb = datetime.fromisoformat(b["timestamp"].replace("Z", "+00:00"))
    except (KeyError, ValueError):
        return None
    return abs((ta - tb).total_seconds()) / 60


def evaluate(rows: list[dict]) -> Report:
    ix = Index(rows)
    rep = Report()
    maths = sorted({k[8] for k in ix.rows}) or ["ieee", "tf32"]
    for family, n, c0, k, size, depths in GPU_CONFIGS:
        for depth in depths:
            where0 = label(family, n, c0, k, depth, size)
            for math in maths:
                where = f"{where0} {math}"
                g = lambda v, ex, dt="f32": ix.get(v, family, n, c0, k, depth, size, dt, math, ex)  # noqa: E731
                naive, frugal = peer_names(family, "graph")
                pn, cn = strongest(lambda v: g(v, "graph"), family, naive)
                pf, cf = strongest(lambda v: g(v, "graph"), family, frugal)
                rep.ratio("38 cat-store-copy / compiled naive (graph)", where,
                          g(OURS_NAIVE, "graph"), pn, 0.8, caveat=cn)
                rep.ratio("38 buffer-recompute-inplace / compiled frugal (graph)", where,
                          g(OURS_FRUGAL, "graph"), pf, 0.8, caveat=cf)
                rep.ratio("38 buffer-recompute-inplace / compiled naive (graph)", where,
                          g(OURS_FRUGAL, "graph"), pn, 1.0, caveat=cn)
                enaive, efrugal = peer_names(family, "eager")
                pn, cn = strongest(lambda v: g(v, "eager"), family, enaive)
                pf, cf = strongest(lambda v: g(v, "eager"), family, efrugal)
                rep.ratio("(info) cat-store-copy / PyTorch naive (eager)", where,
                          g(OURS_NAIVE, "eager"), pn, 1.0, info=True, caveat=cn)
                rep.ratio("(info) buffer-recompute-inplace / PyTorch frugal (eager)", where,
                          g(OURS_FRUGAL, "eager"), pf, 1.0, info=True, caveat=cf)
    for family, n, c0, k, size, depth in (("bc", 64, 24, 12, 32, 16), ("bc", 32, 64, 32, 56, 6)):
        for v in (OURS_NAIVE, OURS_FRUGAL):
            r = ix.get(v, family, n, c0, k, depth, size, "f32", "tf32", "graph")
            ns = num(r, "median_ns") if checked(r) else None
            rep.bound("38 graph step ≤ 4 ms", f"{label(family, n, c0, k, depth, size)} tf32 {v}",
                      None if ns is None else ns / 1e6, 4, "≤ 4 ms", lambda ms: f"{ms:.2f} ms")
    for math in maths:
        for ex in ("eager", "graph"):
            r = ix.get(OURS_FRUGAL, "bc", 64, 24, 12, 48, 32, "f32", math, ex)
            peak = num(r, "peak_bytes") if checked(r) else None
            rep.bound("38 frugal GPU peak ≤ 345 MiB", f"BC-100 L=48 {OURS_FRUGAL} {math} {ex}",
                      None if peak is None else peak / MIB, 345, "≤ 345 MiB",
                      lambda mib: f"{mib:.1f} MiB")
    # every GPU row: the model and the gradients
    gpu = list(ix.rows.values())
    modelled = [r for r in gpu if not r["variant"].startswith("pytorch")
                and num(r, "predicted_peak_bytes") and num(r, "peak_bytes") is not None]
    off = [r for r in modelled
           if abs(num(r, "peak_bytes") / num(r, "predicted_peak_bytes") - 1) > 0.001]
    rep.add("38 measured / predicted within 1 ± 0.001", f"{len(modelled)} modelled GPU rows",
            f"{len(off)} outside" + (f" (e.g. {off[0]['key']})" if off else ""), "0 outside",
            "met" if modelled and not off else ("MISSED" if off else "not measured"))
    bad = [r for r in gpu if not checked(r)]
    rep.add("38/39 every row ok with gradients within tolerance", f"{len(gpu)} GPU rows",
            f"{len(bad)} not" + (f" (e.g. {bad[0]['key']}: {bad[0].get('status')})" if bad else ""),
            "0 not", "met" if gpu and not bad else ("MISSED" if bad else "not measured"))
    # issue 39
    for depth in BF16_DEPTHS:
        for v in (OURS_NAIVE, OURS_FRUGAL):
            b = ix.get(v, "bc", 64, 24, 12, depth, 32, "bf16", "ieee", "eager")
            f = ix.get(v, "bc", 64, 24, 12, depth, 32, "f32", "ieee", "eager")
            pb, pf = (num(r, "peak_bytes") if checked(r) else None for r in (b, f))
            rep.bound("39 bf16 peak ≤ 0.55 × f32", f"BC-100 L={depth} {v} ieee eager",
                      pb / pf if pb is not None and pf else None, 0.55, "≤ 0.55",
                      lambda r: f"×{r:.3f} ({pb / MIB:.1f} / {pf / MIB:.1f} MiB)")
        for ex in ("eager", "graph"):
            naive, frugal = peer_names("bc", ex)
            g = lambda v: ix.get(v, "bc", 64, 24, 12, depth, 32, "bf16", "ieee", ex)  # noqa: E731
            pn, cn = strongest(g, "bc", naive)
            pf, cf = strongest(g, "bc", frugal)
            rep.ratio(f"39 bf16 cat-store-copy / PyTorch autocast naive ({ex})",
                      f"BC-100 L={depth}", g(OURS_NAIVE), pn, 0.8, caveat=cn)
            rep.ratio(f"39 bf16 buffer-recompute-inplace / PyTorch autocast frugal ({ex})",
                      f"BC-100 L={depth}", g(OURS_FRUGAL), pf, 0.8, caveat=cf)
    return rep


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("csv", nargs="+")
    p.add_argument("--only", choices=("missed",),
                   help="print only the targets missed or not measured")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a target is missed or not measured, or met only against "
                   "contiguous PyTorch (its channels_last rows missing)")
    a = p.parse_args(argv)
    rows = load(a.csv)
    # One GPU at a time: an H200's row is never set beside an H100's.
    by_gpu = defaultdict(list)
    for r in rows:
        if r.get("device", "").startswith("cuda"):
            by_gpu[gpu_name(r)].append(r)
    if not by_gpu:
        print("targets: no GPU rows in " + ", ".join(a.csv))
        return 1 if a.strict else 0
    short = False
    for gpu in sorted(by_gpu):
        rep = evaluate(by_gpu[gpu])
        counts = defaultdict(int)
        print(f"== {gpu}: {len(by_gpu[gpu])} rows")
        width = max(len(t) for t, *_ in rep.lines)
        for target, where, value, limit, verdict in rep.lines:
            kind = verdict.split(" ")[0]
            counts[kind] += 1
            if verdict.startswith("met ("):
                counts["caveat"] += 1
            if a.only == "missed" and kind in ("met", "info"):
                continue
            print(f"{target:<{width}}  {where:<44} {value:<40} {limit:<10} {verdict}")
        caveat = (f" ({counts['caveat']} of them against contiguous PyTorch only: its "
                  f"channels_last rows not measured)" if counts["caveat"] else "")
        print(f"targets on {gpu}: {counts['met']} met{caveat}, {counts['MISSED']} missed, "
              f"{counts['not']} not measured ({counts['info']} lines for information)")
        short = short or bool(counts["MISSED"] or counts["not"] or counts["caveat"])
    return 1 if a.strict and short else 0


def gpu_name(r: dict) -> str:
    """The GPU's name from a row's `device_desc` (densebench's and the peer's differ after it)."""
    return (r.get("device_desc") or "unknown GPU").split(" (")[0].strip() or "unknown GPU"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
