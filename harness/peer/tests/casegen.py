"""Case files for the peer's tests, written from Python in densebench's case format.

The names, shapes and layouts are those of impls/src/case/mod.rs (`Case::save`): `input` NCHW
[N, C0, H, W] (mlp: [N, C0]), `grad_output` [N, C0 + L·k, H, W], and every parameter and BN
running stat under its torchvision / nn.Linear `state_dict` name. The value ranges follow
impls/src/config/params.rs (PyTorch's fan-in bound for Linear/Conv weights and biases; BN weight in
[0.5, 1.5], bias in [-0.5, 0.5], running mean in [-0.1, 0.1], running var in [0.5, 1.5]; input and
upstream gradient in [-1, 1]) so that every gradient path and the running-stat update are
exercised; the values themselves come from torch's generator, not densebench's ChaCha stream.
"""

from __future__ import annotations


def make_case(torch, family: str, batch: int, channels: int, growth: int, depth: int,
              bn_size: int = 4, height: int = 8, width: int = 8, dtype: str = "f64",
              seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    dt = {"f32": torch.float32, "f64": torch.float64}[dtype]

    def uniform(shape, lo, hi):
        # Drawn in f64 then rounded, like densebench's uniform_tensor.
        return (lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=torch.float64)).to(dt)

    t = {}
    k = growth
    for i in range(depth):
        c = channels + i * k
        if family == "mlp":
            bound = c ** -0.5
            t[f"layers.{i}.weight"] = uniform([k, c], -bound, bound)
            t[f"layers.{i}.bias"] = uniform([k], -bound, bound)
        else:
            b = bn_size * k
            for norm, ch in ((1, c), (2, b)):
                p = f"denselayer{i + 1}.norm{norm}."
                t[p + "weight"] = uniform([ch], 0.5, 1.5)
                t[p + "bias"] = uniform([ch], -0.5, 0.5)
                t[p + "running_mean"] = uniform([ch], -0.1, 0.1)
                t[p + "running_var"] = uniform([ch], 0.5, 1.5)
            t[f"denselayer{i + 1}.conv1.weight"] = uniform([b, c, 1, 1], -c ** -0.5, c ** -0.5)
            t[f"denselayer{i + 1}.conv2.weight"] = uniform([k, b, 3, 3], -(9 * b) ** -0.5, (9 * b) ** -0.5)
    spatial = [] if family == "mlp" else [height, width]
    t["input"] = uniform([batch, channels] + spatial, -1.0, 1.0)
    t["grad_output"] = uniform([batch, channels + depth * k] + spatial, -1.0, 1.0)
    return t


def main() -> None:
    import argparse
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import pytorch_peer
    import torch

    p = argparse.ArgumentParser(description="Write a densebench case file from Python.")
    p.add_argument("--family", required=True, choices=("bc", "mlp"))
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--channels", type=int, required=True)
    p.add_argument("--growth", type=int, required=True)
    p.add_argument("--depth", type=int, required=True)
    p.add_argument("--bn-size", type=int, default=4)
    p.add_argument("--size", default="8", help="H or HxW (bc)")
    p.add_argument("--dtype", default="f32", choices=("f32", "f64"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    h, _, w = a.size.partition("x")
    t = make_case(torch, a.family, a.batch, a.channels, a.growth, a.depth, a.bn_size,
                  int(h), int(w or h), a.dtype, a.seed)
    pytorch_peer.write_safetensors(torch, t, a.out)


if __name__ == "__main__":
    main()
