#!/usr/bin/env python3
"""Turns peer runs into result-CSV rows: how harness/peer/fixtures/peer-rows.csv was made.

A reference for the Rust side's conversion (JSON line + result file → `Row`), not part of the
harness: each `--run` is `JSON:RESULT`, a peer's stdout line and its result file; `--reference`
is densebench's f64 result on the same case (e.g. `densebench step --variant cat-store-copy` on
the case widened to f64), rounded to the row's dtype before comparing, as densebench does. The
errors are densebench's (impls/src/check/compare.rs): per tensor max |a − b| and max |a − b| / max
|ref|, worst over the output, the input gradient, every parameter gradient and running stat.

    make_fixture_rows.py --reference REF.st --reference-label cat-store-copy/f64 \
        --tolerance 1e-4 --seed 0 --flops F --git-rev REV --run a.json:a.st ... --out rows.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import pytorch_peer  # noqa: E402

# results/README.md's columns (schema 1), then the columns the peer adds.
BASE_COLUMNS = (
    "schema,key,variant,family,batch,channels,growth,depth,bn_size,size,activation,dtype,seed,"
    "device,device_desc,threads,densebench_version,git_rev,timestamp,status,error,steps,warmup,"
    "baseline_bytes,peak_bytes,saved_bytes,declared_saved_bytes,predicted_peak_bytes,"
    "peak_rss_bytes,fwd_median_ns,fwd_min_ns,fwd_max_ns,bwd_median_ns,bwd_min_ns,bwd_max_ns,"
    "median_ns,min_ns,max_ns,flops,gflops_per_s,machine_gflops,reference,max_abs_err,"
    "max_rel_err,output_max_abs_err,grad_input_max_abs_err,grad_params_max_abs_err,"
    "running_max_abs_err,bitwise_equal,grad_ok,timeline"
).split(",")
NEW_COLUMNS = ["framework", "framework_version", "math", "tolerance", "note"]
SCHEMA = 2  # a header with new columns is a new schema (row::SCHEMA_VERSION)


def compare(torch, ours: dict, ref: dict) -> dict:
    groups = {"output": [], "grad_input": [], "grad_params": [], "running": []}
    for name in sorted(ref):
        if name not in ours:
            raise SystemExit(f"result lacks {name}")
        a = ours[name].double()
        b = ref[name].to(ours[name].dtype).double()  # the reference rounded to the row's dtype
        d = (a - b).abs().max().item()
        scale = b.abs().max().item()
        rel = 0.0 if d == 0 else (d / scale if scale else float("inf"))
        bitwise = torch.equal(ours[name], ref[name].to(ours[name].dtype))
        g = ("output" if name == "output" else "grad_input" if name == "grad.input"
             else "grad_params" if name.startswith("grad.") else "running")
        groups[g].append((d, rel, bitwise, name))
    allv = [x for v in groups.values() for x in v]
    return {
        "max_abs_err": max(x[0] for x in allv),
        "max_rel_err": max(x[1] for x in allv),
        "worst": max(allv, key=lambda x: x[1])[3],
        "bitwise_equal": all(x[2] for x in allv),
        **{f"{g}_max_abs_err": max((x[0] for x in v), default=0.0) for g, v in groups.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reference", required=True)
    p.add_argument("--reference-label", required=True)
    p.add_argument("--tolerance", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flops", type=int, required=True)
    p.add_argument("--machine-gflops", default="")
    p.add_argument("--git-rev", required=True)
    p.add_argument("--timestamp", required=True)
    p.add_argument("--run", action="append", required=True, help="JSON:RESULT")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    import torch

    ref = pytorch_peer.read_safetensors(torch, a.reference)
    new_file = not os.path.exists(a.out)
    with open(a.out, "a", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        if new_file:
            w.writerow(BASE_COLUMNS + NEW_COLUMNS)
        for run in a.run:
            jpath, rpath = run.split(":")
            j = json.load(open(jpath))
            c = compare(torch, pytorch_peer.read_safetensors(torch, rpath), ref)
            ok = c["max_rel_err"] <= a.tolerance
            error = "" if ok else (
                f"max relative error {c['max_rel_err']:.3e} > tolerance {a.tolerance:.1e} "
                f"(worst: {c['worst']})" + (f"; {j['warning']}" if j.get("warning") else "")
            )
            mlp = j["family"] == "mlp"
            act = "on" if j["activation"] else "off"
            key = "/".join(str(x) for x in (
                j["variant"], j["family"], j["batch"], j["channels"], j["growth"], j["depth"],
                1 if mlp else j["bn_size"], 1 if mlp else j["size"], act if mlp else "on",
                j["dtype"], a.seed, j["device"]))
            row = {
                "schema": SCHEMA, "key": key, "variant": j["variant"], "family": j["family"],
                "batch": j["batch"], "channels": j["channels"], "growth": j["growth"],
                "depth": j["depth"], "bn_size": j["bn_size"], "size": j["size"],
                "activation": str(bool(j["activation"])).lower(), "dtype": j["dtype"],
                "seed": a.seed, "device": j["device"], "device_desc": j["device_desc"],
                "threads": j["threads"], "densebench_version": "0.1.0", "git_rev": a.git_rev,
                "timestamp": a.timestamp, "status": "ok", "error": error,
                "steps": j["steps"], "warmup": j["warmup"],
                "baseline_bytes": j["baseline_bytes"], "peak_bytes": j["peak_bytes"],
                "saved_bytes": j["saved_bytes"], "declared_saved_bytes": "",
                "predicted_peak_bytes": "", "peak_rss_bytes": j["peak_rss_bytes"],
                **{k: j[k] for k in ("fwd_median_ns", "fwd_min_ns", "fwd_max_ns",
                                     "bwd_median_ns", "bwd_min_ns", "bwd_max_ns",
                                     "median_ns", "min_ns", "max_ns")},
                "flops": a.flops, "gflops_per_s": a.flops / j["median_ns"],
                "machine_gflops": a.machine_gflops, "reference": a.reference_label,
                "max_abs_err": c["max_abs_err"], "max_rel_err": c["max_rel_err"],
                "output_max_abs_err": c["output_max_abs_err"],
                "grad_input_max_abs_err": c["grad_input_max_abs_err"],
                "grad_params_max_abs_err": c["grad_params_max_abs_err"],
                "running_max_abs_err": c["running_max_abs_err"],
                "bitwise_equal": str(c["bitwise_equal"]).lower(), "grad_ok": str(ok).lower(),
                "timeline": j["timeline"], "framework": j["framework"],
                "framework_version": j["framework_version"], "math": j["math"],
                "tolerance": "", "note": "",
            }
            w.writerow([row[k] for k in BASE_COLUMNS + NEW_COLUMNS])
            print(f"{key}: max_rel_err {c['max_rel_err']:.3e} ({c['worst']}) grad_ok {ok}")


if __name__ == "__main__":
    main()
