#!/usr/bin/env python3
"""scripts/bench_vs_pytorch.py without running anything: a compiled PyTorch row pairs with the
densebench row of its configuration (its key ends in `/compiled`), and the "best of" pair takes
the fastest of eager and compiled PyTorch, contiguous and channels_last (bc). Before this test,
the compiled pairs were silently missing from the ratio table (their keys never matched)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import bench_vs_pytorch as b  # noqa: E402

CFG = "bc/64/24/12/16/4/32/on/f32/0/cpu"


def row(variant, median, key_suffix="", execution="eager"):
    return {"key": f"{variant}/{CFG}{key_suffix}", "variant": variant, "family": "bc",
            "depth": "16", "status": "ok", "grad_ok": "true", "median_ns": str(median),
            "min_ns": str(median), "peak_bytes": "100", "framework_version": "torch x",
            "framework": "densebench" if not variant.startswith("pytorch") else "pytorch",
            "device_desc": "AMD EPYC, AVX-512 (1 threads)", "execution": execution,
            "tolerance": "1", "max_rel_err": "0"}


def main():
    rows = [
        row("cat-store-copy", 80),
        row("pytorch-naive", 100),
        row("pytorch-compiled-naive", 90, "/compiled", "compiled"),
        row("pytorch-channels-last-naive", 70),
        row("pytorch-compiled-channels-last-naive", 75, "/compiled", "compiled"),
    ]
    assert b.key_config(rows[2]) == CFG, b.key_config(rows[2])
    assert b.key_config(rows[0]) == CFG

    class A:
        bin = "unused"
        only = None
        out_dir = "/nonexistent"
        repeat = 1
    b.bench_all = lambda a, t, path, peer: rows  # no densebench run: the rows above
    samples, versions = {}, set()
    b.measure(A(), 1, 0, samples, versions)
    got = {k[3]: v[0]["time_ratio"] for k, v in samples.items()}
    assert got.get("pytorch-naive") == 0.8, got
    assert got.get("pytorch-compiled-naive") == 80 / 90, got
    assert got.get("pytorch-channels-last-naive") == 80 / 70, got
    assert got.get("pytorch-compiled-channels-last-naive") == 80 / 75, got
    best = b.best_label("bc", "pytorch-naive")
    assert got.get(best) == 80 / 70, got  # the fastest PyTorch: channels_last eager here
    best_run = samples[("bc L=16", 1, "cat-store-copy", best)][0]
    assert best_run["pytorch_variant"] == "pytorch-channels-last-naive", best_run
    # A Linear block has no memory format: mlp pairs take eager and compiled only.
    assert b.twins("mlp", "pytorch-checkpoint") == [
        "pytorch-checkpoint", "pytorch-compiled-checkpoint"]
    print("ok: compiled and channels_last rows pair with densebench's, best-of takes the "
          "fastest PyTorch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
