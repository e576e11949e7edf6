#!/usr/bin/env python3
"""Pairs the rows of a side-by-side GPU stage (scripts/gpu-session.sh `front`, `chunks`, `conv`).

The stage ran every job once per setting, in the order the settings were given, and appended
each run's row to one CSV; rows of one job share a `key`. For each key this prints the rows in
setting order — median time, peak, predicted peak, status and the parts of the row's `note`
that the pattern finds (each match, joined by "; ") — and each row's time and peak as a ratio
to the first setting's. A key with fewer or more rows than settings (a run failed, or the CSV holds rows of another call) is said,
never paired with another key's rows.

    side_by_side.py CSV --settings cudnn,tap-stack [--note 'regex'] [--log conv.err]
"""
import argparse
import csv
import re
import sys


def ratio(a, b):
    try:
        return float(a) / float(b)
    except (TypeError, ValueError, ZeroDivisionError):
        return float("nan")


def mib(v):
    try:
        return f"{int(v) / 2**20:.1f} MiB"
    except (TypeError, ValueError):
        return "?"


def summarise(rows, settings, note=None, log="the stage's .err"):
    """The lines to print for `rows` (dicts of a densebench CSV) run once per setting."""
    pattern = re.compile(note) if note else None
    by_key = {}
    for r in rows:
        by_key.setdefault(r["key"], []).append(r)
    lines = []
    for key, rs in by_key.items():
        if len(rs) != len(settings):
            lines.append(f"{key}: {len(rs)} row(s) for {len(settings)} settings, not paired "
                         f"(a run failed: {log})")
            continue
        first = rs[0]
        parts = []
        for setting, r in zip(settings, rs):
            # every part of the note the pattern finds (a front's cut and its tap chunks)
            found = "; ".join(m.group(0) for m in pattern.finditer(r.get("note", ""))) \
                if pattern else ""
            parts.append(
                f"{setting}: median {r['median_ns'] or '?'} ns (x{ratio(r['median_ns'], first['median_ns']):.3f}), "
                f"peak {mib(r['peak_bytes'])} (x{ratio(r['peak_bytes'], first['peak_bytes']):.3f}; "
                f"predicted {mib(r['predicted_peak_bytes'])}), {r['status']}"
                + (f", {found}" if found else ""))
        lines.append(f"{key}: " + " | ".join(parts))
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("csv")
    p.add_argument("--settings", required=True, help="comma-separated, in run order")
    p.add_argument("--note", help="regex: the part of each row's note to show")
    p.add_argument("--log", default="the stage's .err", help="where a failed run's error is")
    a = p.parse_args()
    settings = [s for s in a.settings.split(",") if s]
    if not settings:
        sys.exit("side_by_side: --settings names no setting")
    with open(a.csv, newline="") as f:
        rows = list(csv.DictReader(f))
    for line in summarise(rows, settings, a.note, a.log):
        print(line)


if __name__ == "__main__":
    main()
