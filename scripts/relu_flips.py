#!/usr/bin/env python3
"""Counts the ReLU decisions an f32 mlp step took differently from exact arithmetic.

An mlp block's f32 gradient error against the f64 reference is usually ~1e-6, but one
pre-activation within f32 rounding of zero that lands on the other side of its ReLU switches a
whole gradient path, and the norm-wise error jumps to 1e-3..1e-2 (results/README.md,
"Tolerance", F32_RELU_FLIP_FLOOR). This script shows whether that is what happened: it recomputes
the block's forward in f64 from the case file and compares each layer's ReLU mask with the one
the f32 result implies (output > 0), then reports the f64 backward's input-gradient error of the
result with and without those flips.

    densebench case --family mlp --depth 32 --batch 4096 --growth 64 --channels 256 --out case.st
    densebench step --case case.st --variant cat-store-copy --out result.st   # add --device cuda:0
    python3 scripts/relu_flips.py case.st result.st

Needs numpy (the PyTorch peer's venv has it: harness/peer/.venv-peer/bin/python); reads the
files with the safetensors package when it is importable, else with
scripts/safetensors_read.py (a GPU machine may have numpy and PyTorch but not safetensors). Measured here (CPU, f32, seed 0, mlp N=4096 C0=256 k=64
L=32): 1 flip of 8,388,608 pre-activations (layer 26, z = -1.6e-8 exact, +2.8e-9 in f32), which
alone makes the input gradient's error 2.9e-3.
"""
import sys

try:
    import numpy as np
except ImportError:
    if len(sys.argv) != 3:
        print("usage: relu_flips.py CASE.safetensors RESULT.safetensors", file=sys.stderr)
        sys.exit(2)
    sys.exit("relu_flips: needs numpy (e.g. the PyTorch peer's venv: harness/peer/.venv-peer/bin/python)")

try:
    from safetensors.numpy import load_file
except ImportError:
    from safetensors_read import read  # this folder's reader (scripts/safetensors_read.py)

    def load_file(path):
        return {name: values.reshape(shape) for name, (shape, values) in read(path, True).items()}


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        print("usage: relu_flips.py CASE.safetensors RESULT.safetensors", file=sys.stderr)
        return 2
    try:
        case, result = load_file(sys.argv[1]), load_file(sys.argv[2])
    except Exception as e:  # noqa: BLE001 (safetensors raises its own error type too)
        # a missing file, or one that is not safetensors (bad length, JSON or tensor table)
        print(f"relu_flips: cannot read {sys.argv[1]} and {sys.argv[2]} as safetensors: {e}",
              file=sys.stderr)
        return 2
    depth = sum(1 for n in case if n.startswith("layers.") and n.endswith(".weight"))
    if depth == 0 or "output" not in result:
        print("relu_flips: not an mlp case and result (no layers.I.weight / output)", file=sys.stderr)
        return 2
    x = case["input"].astype(np.float64)
    c0 = x.shape[1]
    k = case["layers.0.weight"].shape[0]
    y32 = result["output"].astype(np.float64)
    zs, total = [], 0
    for i in range(depth):
        w = case[f"layers.{i}.weight"].astype(np.float64)
        b = case[f"layers.{i}.bias"].astype(np.float64)
        z = x @ w.T + b
        zs.append(z)
        x = np.concatenate([x, np.maximum(z, 0)], 1)
        ours = y32[:, c0 + i * k : c0 + (i + 1) * k] > 0
        flips = np.argwhere(ours != (z > 0))
        total += len(flips)
        for n, j in flips[:3]:
            print(f"layer {i}: sample {n} unit {j}: exact z = {z[n, j]:.3e}, f32 output "
                  f"{y32[n, c0 + i * k + j]:.3e}")
    print(f"{total} flipped ReLU decisions of {depth * k * x.shape[0]} pre-activations")

    def grad_input(masks):
        g = case["grad_output"].astype(np.float64)
        for i in reversed(range(depth)):
            cin = c0 + i * k
            gy = g[:, cin : cin + k] * masks[i]
            g = g[:, :cin] + gy @ case[f"layers.{i}.weight"].astype(np.float64)
        return g

    exact = grad_input([z > 0 for z in zs])
    f32_masks = [y32[:, c0 + i * k : c0 + (i + 1) * k] > 0 for i in range(depth)]
    with_flips = grad_input(f32_masks)
    got = result["grad.input"].astype(np.float64)
    scale = np.abs(exact).max()
    print(f"grad.input error of the result vs exact: {np.abs(got - exact).max() / scale:.2e}")
    print(f"  vs exact arithmetic with the result's ReLU masks: "
          f"{np.abs(got - with_flips).max() / scale:.2e} (what is left is rounding)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
