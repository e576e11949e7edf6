#!/usr/bin/env python3
"""Which tensors make a result's gradient error: a step result against the f64 reference, tensor
by tensor, optionally beside a second result of the same case (another variant, another kernel,
the PyTorch peer).

A row's `max_rel_err` is the worst tensor's max|result − reference| / max|reference|
(impls::check::compare). This script lists that error for every tensor the reference and the
result share, worst first, with the norm-wise error ‖result − reference‖₂ / ‖reference‖₂ beside
it; with a second result, that result's errors, the ratio of the two, the median over the
tensors and on how many the first is worse. Use it when a row's error is near its tolerance:
whether one tensor or all of them moved, and whether the other side's worst tensor is the same.

    D=target/release/densebench-cache/<hash>        # the case, reference and peer files of a sweep
    densebench step --case $D/<config>.case.safetensors --variant cat-store-copy --out mine.st
    python3 scripts/tensor_errors.py $D/<config>.<reference variant>.safetensors mine.st [peer.st] [--top 15]

The reference is the `<config>.<variant>.safetensors` file the row's `reference` column names
(`autograd/f64` → `<config>.autograd.safetensors`). Needs only Python; numpy, when importable,
makes it fast (the PyTorch peer's venv has it). Exit status: 0, or 2 when a file cannot be read,
the tensors' shapes disagree, or the files share no tensor.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_read import SafetensorsError, read  # noqa: E402


def errors(reference, result):
    """{name: (max_rel, norm_rel)} over the tensors both hold; raises ValueError on a shape
    mismatch. max_rel is 0 where both are exactly 0 and inf where only the reference is."""
    out = {}
    for name, (shape, ref) in reference.items():
        if name not in result:
            continue
        rshape, got = result[name]
        if rshape != shape:
            raise ValueError(f"tensor {name}: shape {rshape} in the result, {shape} in the reference")
        if hasattr(ref, "dtype"):
            import numpy as np

            d = np.abs(got - ref)
            max_abs, ref_max = float(d.max(initial=0.0)), float(np.abs(ref).max(initial=0.0))
            diff_norm, ref_norm = float(np.linalg.norm(d)), float(np.linalg.norm(ref))
        else:
            max_abs = ref_max = diff_norm = ref_norm = 0.0
            for x, y in zip(got, ref):
                dd = abs(x - y)
                max_abs = max(max_abs, dd) if dd == dd else math.inf
                ref_max = max(ref_max, abs(y))
                diff_norm += dd * dd
                ref_norm += y * y
            diff_norm, ref_norm = math.sqrt(diff_norm), math.sqrt(ref_norm)
        # a NaN anywhere must not hide (impls::check::compare): it makes the error infinite
        max_abs, diff_norm = (math.inf if math.isnan(v) else v for v in (max_abs, diff_norm))
        out[name] = (ratio(max_abs, ref_max), ratio(diff_norm, ref_norm))
    return out


def ratio(num, den):
    if num == 0.0:
        return 0.0
    return math.inf if den == 0.0 else num / den


def median(xs):
    s = sorted(xs)
    if not s:
        return math.nan
    m = len(s) // 2
    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2


def report(paths, top, use_numpy=None):
    files = [read(p, use_numpy) for p in paths]
    ref, first = files[0], files[1]
    second = files[2] if len(files) > 2 else None
    e1 = errors(ref, first)
    if not e1:
        raise ValueError(f"{paths[1]} shares no tensor with the reference {paths[0]}")
    e2 = errors(ref, second) if second is not None else None
    if e2 is not None and not (set(e1) & set(e2)):
        raise ValueError(f"{paths[2]} shares no tensor with {paths[1]}")
    lines = []
    names = sorted(e1, key=lambda n: (-e1[n][0], n))
    worst = names[0]
    lines.append(f"reference {paths[0]}")
    lines.append(f"A = {paths[1]}: {len(e1)} tensors, max_rel_err {e1[worst][0]:.4g} ({worst})")
    if e2 is not None:
        w2 = min(e2, key=lambda n: (-e2[n][0], n))
        lines.append(f"B = {paths[2]}: {len(e2)} tensors, max_rel_err {e2[w2][0]:.4g} ({w2})")
    head = f"{'tensor':<44} {'A max':>9} {'A norm':>9}"
    if e2 is not None:
        head += f" {'B max':>9} {'B norm':>9} {'A/B max':>8}"
    lines.append(head)
    for n in names[:top]:
        row = f"{n:<44} {e1[n][0]:>9.4g} {e1[n][1]:>9.4g}"
        if e2 is not None:
            if n in e2:
                b = e2[n][0]
                r = ratio(e1[n][0], b) if b else (1.0 if e1[n][0] == 0 else math.inf)
                row += f" {b:>9.4g} {e2[n][1]:>9.4g} {r:>8.3g}"
            else:
                row += f" {'–':>9} {'–':>9} {'–':>8}"
        lines.append(row)
    lines.append(f"median over tensors: A max {median(v[0] for v in e1.values()):.4g}, "
                 f"norm {median(v[1] for v in e1.values()):.4g}")
    if e2 is not None:
        both = [n for n in e1 if n in e2]
        lines.append(f"                     B max {median(e2[n][0] for n in both):.4g}, "
                     f"norm {median(e2[n][1] for n in both):.4g} (the {len(both)} tensors both hold)")
        worse = sum(1 for n in both if e1[n][0] > e2[n][0])
        lines.append(f"A's max error above B's on {worse} of {len(both)} tensors")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("reference", help="the f64 reference's result file (safetensors)")
    p.add_argument("result", help="a step result of the same case (safetensors)")
    p.add_argument("other", nargs="?", help="a second result of the same case, listed beside it")
    p.add_argument("--top", type=int, default=15, help="how many of the worst tensors to list (default 15)")
    a = p.parse_args(argv)
    if a.top < 1:
        p.error("--top must be at least 1")
    paths = [a.reference, a.result] + ([a.other] if a.other else [])
    try:
        print(report(paths, a.top))
    except (OSError, SafetensorsError, ValueError) as e:
        print(f"tensor_errors: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
