#!/usr/bin/env python3
"""Kernel launches and kernel time of one training step, from Nsight Compute CSV exports.

`scripts/gpu-session.sh profile` runs one `densebench step` per variant (and one PyTorch peer
step per peer variant) under `ncu --metrics gpu__time_duration.sum`, exports each report with
`ncu --import R.ncu-rep --csv --print-units base`, and summarises them here: per file, the
kernel launches, their summed GPU time and the kernels that take the most of it; then one line
per file side by side. This is where a step's time goes on the GPU (issue 11 item 5: PyTorch
eager issues ~540 launches for a BC-100 L=16 step), not a timing of the step: ncu serialises
the kernels and times each alone, so launch gaps and host work are not in these numbers.

    python3 scripts/ncu_summary.py [--top N] LABEL=FILE.csv [LABEL=FILE.csv ...]

A FILE may also be given without `LABEL=` (its name is the label). Both of ncu's CSV shapes
are read: the details page (one row per launch and metric: "Metric Name", "Metric Unit",
"Metric Value") and the raw page (one column per metric, a row of units under the header);
lines before the header and ncu's `==PROF==` lines are skipped; values may carry thousands
separators and any of ncu's time units. Exit status 2, with one line saying why, for a file
that is missing or holds no `gpu__time_duration.sum` of any kernel.
"""

from __future__ import annotations

import csv
import math
import sys
from dataclasses import dataclass, field

METRIC = "gpu__time_duration.sum"

# ncu's time units, in nanoseconds (it prints "nsecond" or "ns" depending on version/options)
UNIT_NS = {
    "": 1.0,
    "ns": 1.0,
    "nsecond": 1.0,
    "us": 1e3,
    "usecond": 1e3,
    "ms": 1e6,
    "msecond": 1e6,
    "s": 1e9,
    "second": 1e9,
}


class SummaryError(Exception):
    """A file this script cannot summarise; the message says which and why."""


@dataclass
class Profile:
    """The kernels of one profiled process tree."""

    label: str
    # (process id, launch id) → (kernel name, ns)
    launches: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)

    def total_ns(self) -> float:
        return sum(ns for _, ns in self.launches.values())

    def by_kernel(self) -> list[tuple[str, int, float]]:
        """(kernel name, launches, ns), most time first."""
        acc: dict[str, list[float]] = {}
        for name, ns in self.launches.values():
            a = acc.setdefault(name, [0, 0.0])
            a[0] += 1
            a[1] += ns
        return sorted(
            ((n, int(c), t) for n, (c, t) in acc.items()), key=lambda r: (-r[2], r[0])
        )


def number(text: str, where: str) -> float:
    """A metric value as ncu prints it: thousands separators allowed."""
    try:
        v = float(text.replace(",", "").strip())
    except ValueError:
        raise SummaryError(f"{where}: metric value {text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise SummaryError(f"{where}: metric value {text!r} is not a finite duration")
    return v


def unit_ns(unit: str, where: str) -> float:
    u = unit.strip().lower()
    if u not in UNIT_NS:
        known = ", ".join(sorted(k for k in UNIT_NS if k))
        raise SummaryError(f"{where}: time unit {unit!r} is not one of ncu's ({known})")
    return UNIT_NS[u]


def parse(label: str, text: str, path: str = "<text>") -> Profile:
    """The launches of one ncu CSV export (details or raw page)."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID",')), None)
    if start is None:
        raise SummaryError(
            f'{path}: no ncu CSV header (a line starting with "ID",): exported with --csv?'
        )
    body = [l for l in lines[start:] if l.startswith('"')]
    reader = csv.DictReader(body)
    header = reader.fieldnames or []
    rows = list(reader)
    prof = Profile(label)
    for need in ("ID", "Kernel Name"):
        if need not in header:
            raise SummaryError(f"{path}: the CSV has no {need!r} column")
    pid = lambda r: r.get("Process ID", "") or ""  # noqa: E731
    if "Metric Name" in header:  # details page: one row per launch and metric
        for n, r in enumerate(rows, start + 2):
            if r.get("Metric Name") != METRIC:
                continue
            where = f"{path}:{n}"
            ns = number(r.get("Metric Value", ""), where) * unit_ns(r.get("Metric Unit", ""), where)
            prof.launches[(pid(r), r["ID"])] = (r["Kernel Name"], ns)
    elif METRIC in header:  # raw page: a column per metric, a row of units first
        scale = 1.0
        for n, r in enumerate(rows, start + 2):
            where = f"{path}:{n}"
            if not r["ID"]:
                scale = unit_ns(r.get(METRIC, ""), where)
                continue
            ns = number(r[METRIC], where) * scale
            prof.launches[(pid(r), r["ID"])] = (r["Kernel Name"], ns)
    if not prof.launches:
        raise SummaryError(f"{path}: no {METRIC} of any kernel (profiled with --metrics {METRIC}?)")
    return prof


def short(name: str, width: int = 90) -> str:
    """A kernel name on one line: `void ` and long template arguments shortened."""
    n = name[5:] if name.startswith("void ") else name
    return n if len(n) <= width else n[: width - 1] + "…"


def summary(profiles: list[Profile], top: int) -> str:
    out = []
    for p in profiles:
        total = p.total_ns()
        out.append(
            f"{p.label}: {len(p.launches)} kernel launches, {total / 1e6:.3f} ms of kernel time "
            f"(each kernel timed alone by ncu)"
        )
        for name, count, ns in p.by_kernel()[:top]:
            share = ns / total if total > 0 else 0.0
            out.append(f"  {ns / 1e6:9.3f} ms {share:6.1%} {count:6d}×  {short(name)}")
        out.append("")
    if len(profiles) > 1:
        width = max(len(p.label) for p in profiles)
        out.append(f"{'':{width}}  launches  kernel ms")
        for p in profiles:
            out.append(f"{p.label:{width}}  {len(p.launches):8d}  {p.total_ns() / 1e6:9.3f}")
    return "\n".join(out).rstrip() + "\n"


def main(argv: list[str]) -> int:
    top = 12
    args = list(argv)
    usage = "usage: ncu_summary.py [--top N] LABEL=FILE.csv [LABEL=FILE.csv ...]"
    if args[:1] in (["-h"], ["--help"]):
        print((__doc__ or usage).strip())
        return 0
    if args[:1] == ["--top"] and len(args) > 1:
        try:
            top = int(args[1])
        except ValueError:
            top = -1
        if top < 1:
            print(f"ncu_summary: --top takes a number ≥ 1, not {args[1]!r}", file=sys.stderr)
            return 2
        args = args[2:]
    if not args or any(a.startswith("-") for a in args):
        print(usage, file=sys.stderr)
        return 2
    if any(a.startswith("=") for a in args):
        print(f"ncu_summary: an empty label in {[a for a in args if a.startswith('=')]}; {usage}",
              file=sys.stderr)
        return 2
    profiles = []
    for a in args:
        label, _, path = a.partition("=") if "=" in a else (a, "", a)
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                profiles.append(parse(label, f.read(), path))
        except OSError as e:
            print(f"ncu_summary: {path}: {e.strerror}", file=sys.stderr)
            return 2
        except SummaryError as e:
            print(f"ncu_summary: {e}", file=sys.stderr)
            return 2
    sys.stdout.write(summary(profiles, top))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
