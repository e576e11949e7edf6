#!/usr/bin/env python3
"""The PyTorch peer: one training step of PyTorch's own dense block on a densebench case file.

densebench's harness spawns this program as a child process, one result row per call, on the
exact case file its own variants are measured on (parameters and BN state under PyTorch
`state_dict` names, `input`, `grad_output`; see impls/src/case/mod.rs). It

1. builds torchvision's `_DenseBlock` (family `bc`: `pytorch-naive` = memory_efficient=False,
   `pytorch-memory-efficient` = True, drop_rate 0) or the forum's Linear block (family `mlp`:
   `pytorch-naive`, `pytorch-checkpoint` = `torch.utils.checkpoint` per layer,
   use_reentrant=False), loads the case's weights, BN running stats, input and upstream gradient;
2. runs `--warmup` unmeasured and `--steps` measured training steps (forward, then backward of
   `sum(output * grad_output)`), each from the same state: the BN running stats are restored
   from the case before every step and the gradients dropped, so every step is the same step
   and the written running stats are those after exactly one step (the last measured one);
3. measures each step's time (device synchronised before every clock read) and its peak memory
   above the baseline read just before it (CPU: the malloc-counting LD_PRELOAD shim
   `malloc_count.c`; GPU: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats`);
4. writes the last step's output, input gradient, every parameter gradient and updated running
   stats to `--out` in the names and layouts `densebench step --out` writes (`output`,
   `grad.input`, `grad.<param>`, `<bn>.running_mean|running_var`; NCHW / [N, C]);
5. prints one JSON object on one line on stdout (see README.md for every key).

Errors: one line on stderr and a non-zero exit: 2 bad arguments or case file, 3 PyTorch not
importable, 4 out of memory (the `--mem-limit` or the device), 1 anything else.

Only the standard library is needed until PyTorch is imported; the safetensors files are read
and written by a few lines of code here (no `safetensors`/`numpy` dependency), so the peer runs
with any importable torch + torchvision, e.g. a GPU machine's preinstalled one.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

# When this process started its script: the phases of `phases_ns` are counted from here.
STARTED_NS = time.perf_counter_ns()

PEER_DIR = os.path.dirname(os.path.abspath(__file__))
VENV_DIR = os.path.join(PEER_DIR, ".venv-peer")
VENV_PYTHON = os.path.join(VENV_DIR, "bin", "python")
SHIM_SOURCE = os.path.join(PEER_DIR, "malloc_count.c")
SHIM_PATH = os.path.join(PEER_DIR, "build", "libmalloc_count.so")
# Set in the environment of the re-executed process: a second re-exec would be a loop.
REEXEC_ENV = "DENSEBENCH_PEER_REEXEC"

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NO_TORCH = 3
EXIT_OOM = 4

NO_TORCH_LINE = (
    "PyTorch is not importable: run `just peer-setup` "
    "(or pip install -r harness/peer/requirements.txt)"
)

VARIANTS = {
    "bc": (
        "pytorch-naive",
        "pytorch-memory-efficient",
        "pytorch-channels-last-naive",
        "pytorch-channels-last-memory-efficient",
        "pytorch-compiled-naive",
        "pytorch-compiled-memory-efficient",
        "pytorch-compiled-channels-last-naive",
        "pytorch-compiled-channels-last-memory-efficient",
    ),
    "mlp": (
        "pytorch-naive",
        "pytorch-checkpoint",
        "pytorch-compiled-naive",
        "pytorch-compiled-checkpoint",
    ),
}
# A compiled variant is its eager twin under `torch.compile`: mode `reduce-overhead` (inductor's
# kernels replayed as CUDA graphs) on CUDA, the default mode (inductor's kernels, no graphs) on
# the CPU, as PyTorch's documentation tells users to reach for each.
COMPILED_PREFIX = "pytorch-compiled-"
# Warm-up steps a compiled variant takes at least, whatever --warmup says: the first call
# compiles forward and backward, and under `reduce-overhead` cudagraph trees run the second
# call eagerly to warm up and record the graph on the third; only then is a step a replay.
COMPILED_MIN_WARMUP = 3


def eager_twin(variant: str) -> str:
    """`pytorch-compiled-naive` → `pytorch-naive`; an eager variant is its own twin."""
    if variant.startswith(COMPILED_PREFIX):
        return "pytorch-" + variant[len(COMPILED_PREFIX):]
    return variant


# A channels-last variant is its contiguous (NCHW) twin with the module and its input (and the
# upstream gradient) in `torch.channels_last` memory format (NHWC strides), as PyTorch's
# performance tuning guide advises for convolutional networks: bc blocks only.
CHANNELS_LAST = "channels-last-"


def is_channels_last(variant: str) -> bool:
    """Whether `variant` runs in channels_last memory format (`pytorch-[compiled-]channels-last-*`)."""
    return eager_twin(variant).startswith("pytorch-" + CHANNELS_LAST)


def block_of(variant: str) -> str:
    """The block a variant runs, as its eager contiguous name: `pytorch-compiled-channels-last-naive`
    → `pytorch-naive`."""
    v = eager_twin(variant)
    return "pytorch-" + v[len("pytorch-" + CHANNELS_LAST):] if is_channels_last(v) else v


def variant_name(variant: str, *, compiled: bool | None = None,
                 channels_last: bool | None = None) -> str:
    """`variant` with its axes changed where asked (the harness's naming, `PeerVariant::name`):
    `variant_name("pytorch-naive", compiled=True)` → `pytorch-compiled-naive`,
    `variant_name("pytorch-compiled-naive", channels_last=True)` →
    `pytorch-compiled-channels-last-naive`."""
    c = variant.startswith(COMPILED_PREFIX) if compiled is None else compiled
    cl = is_channels_last(variant) if channels_last is None else channels_last
    return ("pytorch-" + ("compiled-" if c else "") + (CHANNELS_LAST if cl else "")
            + block_of(variant)[len("pytorch-"):])


def compile_mode(device: str) -> str | None:
    """torch.compile's mode for a compiled variant on `device` (None: the default mode)."""
    return "reduce-overhead" if device.startswith("cuda") else None


def execution_of(variant: str, device: str) -> str:
    """The row's `execution`: `eager`; `graph` (the whole step replayed as CUDA graphs:
    `reduce-overhead`); `compiled` (inductor's kernels launched one by one: the CPU's default)."""
    if not variant.startswith(COMPILED_PREFIX):
        return "eager"
    return "graph" if compile_mode(device) == "reduce-overhead" else "compiled"

# BatchNorm constants: PyTorch's defaults, the same as densebench's (impls/src/config/mod.rs).
BN_EPS = 1e-5
BN_MOMENTUM = 0.1


class PeerError(Exception):
    """A failure reported as one stderr line with an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {v}")
    return v


def device_arg(text: str) -> str:
    if text == "cpu":
        return text
    if text.startswith("cuda:") and text[5:].isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected `cpu` or `cuda:N`, got {text!r}")


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an argument error is one line on stderr (exit 2), like every other error."""

    def error(self, message: str):  # type: ignore[override]
        sys.stderr.write(f"pytorch_peer: error: {message}\n")
        sys.exit(EXIT_USAGE)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = OneLineParser(
        prog="pytorch_peer.py",
        description="One PyTorch training step of a dense block on a densebench case file. "
        "`pytorch_peer.py --check` alone: print the PyTorch versions as JSON (exit 0) or say "
        "that PyTorch is not importable (exit 3).",
    )
    p.add_argument("--case", required=True, help="densebench case file (safetensors)")
    p.add_argument("--family", required=True, choices=("bc", "mlp"))
    p.add_argument(
        "--variant",
        required=True,
        choices=sorted({v for vs in VARIANTS.values() for v in vs}),
        help="bc: pytorch-naive | pytorch-memory-efficient, and each in channels_last memory "
        "format: pytorch-channels-last-<the same>; mlp: pytorch-naive | pytorch-checkpoint; "
        "and each under torch.compile: pytorch-compiled-<the same>",
    )
    p.add_argument("--device", default="cpu", type=device_arg, help="cpu or cuda:N")
    p.add_argument(
        "--dtype",
        default="f32",
        choices=("f32", "f64", "bf16"),
        help="dtype of the step; the case is converted to it (f32 → f64 is exact). bf16: mixed "
        "precision as users run it — parameters and BN buffers in f32, the block's input and "
        "upstream gradient in bf16, forward under torch.autocast(device, dtype=torch.bfloat16), "
        "backward outside it",
    )
    p.add_argument(
        "--warmup",
        default=1,
        type=non_negative_int,
        help=f"unmeasured steps (a compiled variant takes at least {COMPILED_MIN_WARMUP})",
    )
    p.add_argument("--steps", default=1, type=positive_int, help="measured steps")
    p.add_argument("--threads", default=1, type=positive_int, help="CPU compute threads")
    p.add_argument(
        "--math",
        default="ieee",
        choices=("ieee", "tf32"),
        help="fp32 matmul/convolution precision on CUDA (ieee: full fp32; tf32: TF32 tensor cores)",
    )
    p.add_argument(
        "--activation",
        default=None,
        choices=("on", "off"),
        help="ReLU after each Linear (mlp only; the tensors cannot show it): a case file written "
        "by `densebench case` records it, and this must then agree; default: the file's, else on",
    )
    p.add_argument("--out", required=True, help="result file to write (safetensors)")
    p.add_argument(
        "--running-stats",
        default="after-forward",
        choices=("after-forward", "after-step"),
        help="which BN running stats the result holds: as they are after forward (default; what "
        "densebench compares, and what a training step leaves when nothing recomputes BN), or "
        "as PyTorch leaves them after backward (memory_efficient updates norm1 twice, "
        "pytorch/pytorch#96136)",
    )
    p.add_argument(
        "--mem-limit",
        type=positive_int,
        default=None,
        help="CPU: limit on the process's live heap bytes (PyTorch's own ~150 MB included), set "
        "after PyTorch is imported; an allocation past it fails and the peer exits 4. "
        "CUDA: torch.cuda.set_per_process_memory_fraction(limit / device memory)",
    )
    a = p.parse_args(argv)
    if a.variant not in VARIANTS[a.family]:
        p.error(
            f"--variant {a.variant} is not a {a.family} variant "
            f"(expected one of {', '.join(VARIANTS[a.family])})"
        )
    if a.family == "bc" and a.activation == "off":
        p.error("--activation off applies to mlp only (a bc layer always has its ReLUs)")
    if a.math == "tf32" and (a.device == "cpu" or a.dtype != "f32"):
        p.error("--math tf32 applies to f32 on a CUDA device only")
    # The result must not replace its own case (any path to the same file, a link included):
    # the run would succeed and the next one find no input (as `densebench step` refuses).
    if os.path.realpath(a.out) == os.path.realpath(a.case):
        p.error(f"--out {a.out} is the case file --case {a.case}: write the result elsewhere")
    return a


# --------------------------------------------------------------------------------------------
# Bootstrap: the right interpreter, the counting shim preloaded, thread counts set
# --------------------------------------------------------------------------------------------


def torch_findable() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "torchvision"))


def in_venv(venv: str) -> bool:
    return os.path.realpath(sys.prefix) == os.path.realpath(venv)


def shim_loaded() -> bool:
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mc_installed())
    except AttributeError:
        return False


def build_shim() -> None:
    """Compiles the shim next to this file (setup.sh does the same; this is a fallback)."""
    os.makedirs(os.path.dirname(SHIM_PATH), exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=os.path.dirname(SHIM_PATH))
    os.close(fd)
    cc = os.environ.get("CC", "gcc")
    try:
        r = subprocess.run(
            [cc, "-O2", "-shared", "-fPIC", "-o", tmp, SHIM_SOURCE],
            capture_output=True,
            text=True,
        )
    except OSError as e:
        os.unlink(tmp)
        raise PeerError(
            f"the malloc-counting shim {SHIM_PATH} is not built and {cc} cannot run ({e}): "
            "run harness/peer/setup.sh",
            EXIT_ERROR,
        ) from None
    if r.returncode != 0:
        os.unlink(tmp)
        last = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise PeerError(f"building {SHIM_PATH} failed: {last}", EXIT_ERROR)
    os.replace(tmp, SHIM_PATH)  # atomic: concurrent peers never see a half-written file


def bootstrap(a: argparse.Namespace, argv: list[str]) -> None:
    """Re-executes this script once if it needs another interpreter (the setup's venv, when the
    current one has no torch) or the counting shim preloaded (CPU). Sets thread counts."""
    threads = str(a.threads)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = threads
    python = sys.executable
    if not torch_findable():
        if not os.path.exists(VENV_PYTHON) or in_venv(VENV_DIR):
            raise PeerError(NO_TORCH_LINE, EXIT_NO_TORCH)
        python = VENV_PYTHON
    need_shim = a.device == "cpu" and not shim_loaded()
    if python == sys.executable and not need_shim:
        return
    if os.environ.get(REEXEC_ENV):
        if need_shim:
            raise PeerError(
                f"re-executed with LD_PRELOAD={SHIM_PATH} but the shim's symbols are not "
                "visible (is another LD_PRELOAD overriding malloc?)"
            )
        return
    env = dict(os.environ)
    env[REEXEC_ENV] = "1"
    if need_shim:
        if not os.path.exists(SHIM_PATH) or os.path.getmtime(SHIM_PATH) < os.path.getmtime(SHIM_SOURCE):
            build_shim()
        env["LD_PRELOAD"] = ":".join(x for x in (SHIM_PATH, env.get("LD_PRELOAD")) if x)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(python, [python, os.path.abspath(__file__), *argv], env)


# --------------------------------------------------------------------------------------------
# Memory meters
# --------------------------------------------------------------------------------------------


class CpuMeter:
    """Live heap bytes and their peak from the LD_PRELOAD shim (see malloc_count.c)."""

    name = "malloc_count LD_PRELOAD shim: live heap bytes (malloc_usable_size), peak reset per step"

    def __init__(self, limit: int | None):
        import ctypes

        lib = ctypes.CDLL(None)
        for fn in ("mc_current", "mc_peak", "mc_limit", "mc_refused"):
            getattr(lib, fn).restype = ctypes.c_longlong
        lib.mc_set_limit.argtypes = [ctypes.c_longlong]
        self.lib = lib
        if limit is not None:
            lib.mc_set_limit(limit)

    def sync(self) -> None:
        pass

    def mark(self):
        """No device clock on the CPU: the host's clock is the work's."""
        return None

    def refused(self) -> int:
        return int(self.lib.mc_refused())

    def current(self) -> int:
        return int(self.lib.mc_current())

    def peak(self) -> int:
        return int(self.lib.mc_peak())

    def reset_peak(self) -> None:
        self.lib.mc_reset_peak()


class CudaMeter:
    """PyTorch's caching allocator's allocated bytes and their peak on one device."""

    name = "torch.cuda.max_memory_allocated above memory_allocated, peak reset per step"

    def __init__(self, torch, device, limit: int | None):
        self.torch = torch
        self.device = device
        if limit is not None:
            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def mark(self):
        """A CUDA timing event recorded now on the current stream: forward is timed on the
        device between two of them, as densebench times its GPU rows (no synchronisation
        inside the step, which would stall the device between forward and backward)."""
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def current(self) -> int:
        return int(self.torch.cuda.memory_allocated(self.device))

    def peak(self) -> int:
        return int(self.torch.cuda.max_memory_allocated(self.device))

    def reset_peak(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.device)


# --------------------------------------------------------------------------------------------
# safetensors, read and written here (the format: u64 LE header length, JSON header, raw bytes)
# --------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "U8": "uint8",
}


def read_safetensors(torch, path: str) -> dict:
    """Every tensor of a safetensors file, on the CPU, by name."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise PeerError(f"reading case file {path}: {e.strerror or e}", EXIT_USAGE) from None
    if len(data) < 8:
        raise PeerError(f"case file {path}: not a safetensors file (too short)", EXIT_USAGE)
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + n])
    except ValueError as e:
        raise PeerError(f"case file {path}: bad safetensors header ({e})", EXIT_USAGE) from None
    body = memoryview(data)[8 + n :]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = SAFETENSORS_DTYPES.get(info["dtype"])
        if dt is None:
            raise PeerError(
                f"case file {path}: tensor {name} has dtype {info['dtype']}, not supported",
                EXIT_USAGE,
            )
        lo, hi = info["data_offsets"]
        dtype = getattr(torch, dt)
        t = torch.frombuffer(bytearray(body[lo:hi]), dtype=dtype) if hi > lo else torch.empty(
            0, dtype=dtype
        )
        out[name] = t.reshape(info["shape"])
    return out


ACTIVATION_KEY = "densebench.activation"


def resolve_activation(path: str, family: str, asked: str | None) -> str:
    """The mlp ReLU, `on` or `off`: what the case file records under `__metadata__`
    (`densebench case` writes it; the tensors cannot show it) and what was asked for must agree
    where both are given; either alone; on where neither is (as `densebench step`)."""
    if family != "mlp":
        return "on"
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n)).get("__metadata__") or {}
    recorded = meta.get(ACTIVATION_KEY) if isinstance(meta, dict) else None
    if recorded not in (None, "on", "off"):
        raise PeerError(f"case file {path}: __metadata__ {ACTIVATION_KEY} is {recorded!r}, not on or off",
                        EXIT_USAGE)
    if recorded and asked and recorded != asked:
        raise PeerError(
            f"case file {path} says the mlp's ReLU is {recorded} (densebench case --activation "
            f"{recorded}), but --activation {asked} was asked for: drop the flag or make the case again",
            EXIT_USAGE,
        )
    return asked or recorded or "on"


def write_safetensors(torch, tensors: dict, path: str) -> None:
    """Writes CPU tensors (little-endian host) as safetensors, names sorted like candle's."""
    names = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        # Flattened first: a contiguous tensor may still carry a non-unit stride on a size-1
        # dimension (inductor's channels-last 1×1 convolution weight gradients: [48, 24, 1, 1]
        # with strides (24, 1, 24, 24)), which view(uint8) refuses; reshape(-1) of a contiguous
        # tensor is a stride-1 view of the same bytes in the same order.
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": names[str(t.dtype).replace("torch.", "")],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # 8-byte alignment of the data, as the format recommends
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            for c in chunks:
                f.write(c)
        os.replace(tmp, path)
    except OSError as e:
        raise PeerError(f"writing result file {path}: {e.strerror or e}") from None


# --------------------------------------------------------------------------------------------
# The case: config read from the tensors, as impls/src/case/mod.rs does
# --------------------------------------------------------------------------------------------


def mlp_weight(i: int) -> str:
    return f"layers.{i}.weight"


def conv_name(i: int, conv: int) -> str:
    return f"denselayer{i + 1}.conv{conv}.weight"


def bn_name(i: int, norm: int, what: str) -> str:
    return f"denselayer{i + 1}.norm{norm}.{what}"


def read_config(tensors: dict, family: str, path: str) -> dict:
    """N, C0, k, L, bn_size, H, W from the case's tensors; errs naming what does not fit."""

    def get(name: str):
        if name not in tensors:
            raise PeerError(f"case file {path}: no tensor {name}", EXIT_USAGE)
        return tensors[name]

    x = get("input")
    has_mlp = mlp_weight(0) in tensors
    has_bc = conv_name(0, 1) in tensors
    found = "mlp" if has_mlp else "bc" if has_bc else None
    if found != family:
        raise PeerError(
            f"case file {path} holds a {found or 'unknown'}-family block "
            f"({'layers.0.weight' if has_mlp else 'denselayer1.conv1.weight'} "
            f"{'present' if found else 'absent'}), but --family {family} was given",
            EXIT_USAGE,
        )
    if family == "mlp":
        depth = 0
        while mlp_weight(depth) in tensors:
            depth += 1
        if x.dim() != 2:
            raise PeerError(f"case file {path}: input has shape {list(x.shape)}, expected [N, C0]", EXIT_USAGE)
        n, c0 = x.shape
        k = get(mlp_weight(0)).shape[0]
        cfg = dict(batch=n, channels=c0, growth=k, depth=depth, bn_size=1, height=1, width=1)
    else:
        depth = 0
        while conv_name(depth, 1) in tensors:
            depth += 1
        if x.dim() != 4:
            raise PeerError(
                f"case file {path}: input has shape {list(x.shape)}, expected NCHW [N, C0, H, W]",
                EXIT_USAGE,
            )
        n, c0, h, w = x.shape
        k = get(conv_name(0, 2)).shape[0]
        b = get(conv_name(0, 1)).shape[0]
        if k == 0 or b % k:
            raise PeerError(
                f"case file {path}: conv1 has {b} output channels, not a multiple of the growth "
                f"rate {k}",
                EXIT_USAGE,
            )
        cfg = dict(batch=n, channels=c0, growth=k, depth=depth, bn_size=b // k, height=h, width=w)
    cfg = {key: int(v) for key, v in cfg.items()}
    c_total = cfg["channels"] + cfg["depth"] * cfg["growth"]
    want = [cfg["batch"], c_total] + ([cfg["height"], cfg["width"]] if family == "bc" else [])
    go = get("grad_output")
    if list(go.shape) != want:
        raise PeerError(
            f"case file {path}: grad_output has shape {list(go.shape)}, expected {want} "
            "(the block output in NCHW / [N, C] layout)",
            EXIT_USAGE,
        )
    if go.dtype != x.dtype:
        raise PeerError(f"case file {path}: grad_output is {go.dtype}, input {x.dtype}", EXIT_USAGE)
    return cfg


# --------------------------------------------------------------------------------------------
# The blocks
# --------------------------------------------------------------------------------------------


def forum_block_class(torch):
    nn = torch.nn

    class ForumDenseBlock(nn.Module):
        """The forum's block: layer i is Linear(C0 + i·k → k), optional ReLU, and
        `x = cat([x, layer(x)], 1)` after each layer. `checkpoint` wraps each layer (Linear and
        ReLU) in torch.utils.checkpoint (use_reentrant=False): its output is recomputed in
        backward instead of kept."""

        def __init__(self, c0: int, k: int, depth: int, activation: bool, checkpoint: bool):
            super().__init__()
            self.layers = nn.ModuleList(nn.Linear(c0 + i * k, k) for i in range(depth))
            self.activation = activation
            self.checkpoint = checkpoint

        def layer(self, i: int, x):
            y = self.layers[i](x)
            return torch.relu(y) if self.activation else y

        def forward(self, x, probe=None):
            from torch.utils.checkpoint import checkpoint

            for i in range(len(self.layers)):
                if self.checkpoint:
                    y = checkpoint(self.layer, i, x, use_reentrant=False)
                else:
                    y = self.layer(i, x)
                x = torch.cat([x, y], 1)
                if probe is not None:
                    probe(i)
            return x

    return ForumDenseBlock


def build_block(torch, family: str, variant: str, cfg: dict, activation: bool):
    """The eager module of `variant` (a compiled variant's eager twin; `compile_block` wraps it;
    a channels-last variant's contiguous twin: `run` converts it after loading the case)."""
    variant = block_of(variant)
    if family == "bc":
        from torchvision.models.densenet import _DenseBlock

        return _DenseBlock(
            num_layers=cfg["depth"],
            num_input_features=cfg["channels"],
            bn_size=cfg["bn_size"],
            growth_rate=cfg["growth"],
            drop_rate=0.0,
            memory_efficient=(variant == "pytorch-memory-efficient"),
        )
    cls = forum_block_class(torch)
    return cls(
        cfg["channels"],
        cfg["growth"],
        cfg["depth"],
        activation,
        checkpoint=(variant == "pytorch-checkpoint"),
    )


def in_memory_format(torch, variant: str, block, x, g):
    """(block, input, upstream gradient) in `variant`'s memory format. A channels-last variant's
    are converted as a user converts them: the module once (its 4-d weights get NHWC strides),
    the input as it arrives from the layer before and so the gradient from the layer after; all
    before the baseline, outside every timed step. The results are written contiguous (NCHW)."""
    if not is_channels_last(variant):
        return block, x, g
    cl = torch.channels_last
    return block.to(memory_format=cl), x.contiguous(memory_format=cl), g.contiguous(memory_format=cl)


def load_state(torch, block, tensors: dict, path: str) -> None:
    """Copies every parameter and BN buffer of the block from the case, checking shapes."""
    state = block.state_dict()
    want = {k for k in state if not k.endswith("num_batches_tracked")}
    missing = sorted(want - tensors.keys())
    if missing:
        raise PeerError(
            f"case file {path}: missing {len(missing)} tensors of the block, e.g. {missing[0]}",
            EXIT_USAGE,
        )
    extra = sorted(
        k
        for k in tensors.keys() - state.keys()
        if k not in ("input", "grad_output") and not k.endswith("num_batches_tracked")
    )
    if extra:
        raise PeerError(
            f"case file {path}: {len(extra)} tensors the block does not have, e.g. {extra[0]}",
            EXIT_USAGE,
        )
    new_state = {}
    for k, v in state.items():
        src = tensors.get(k)
        if src is None:  # num_batches_tracked: keep the module's own
            new_state[k] = v
            continue
        if list(src.shape) != list(v.shape):
            raise PeerError(
                f"case file {path}: {k} has shape {list(src.shape)}, the block expects "
                f"{list(v.shape)}",
                EXIT_USAGE,
            )
        new_state[k] = src.to(v.dtype)
    block.load_state_dict(new_state, strict=True)


# --------------------------------------------------------------------------------------------
# Measuring
# --------------------------------------------------------------------------------------------


def median_ns(xs: list[int]) -> int:
    """The median; of an even count, the mean of the middle two (densebench's rule)."""
    return int(statistics.median(xs)) if len(xs) % 2 else int(round(statistics.median(xs)))


def stats(xs: list[int]) -> dict:
    return {"median": median_ns(xs), "min": min(xs), "max": max(xs)}


def cpu_model() -> str:
    """`model name` of /proc/cpuinfo and its widest x86 vector ISA (`, AVX-512` or `, AVX2`),
    then `, AMX` where it has AMX's bf16 tiles (flag `amx_bf16`: oneDNN's bf16 kernels run
    there, densebench's do not), exactly as densebench's `cpu_model_from` writes it, so both
    sides' rows carry one description; the architecture when unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            found = cpu_model_from(f.read())
        if found:
            return found
    except OSError:
        pass
    import platform

    return platform.machine()


def cpu_model_from(cpuinfo: str):
    def field(key):
        for line in cpuinfo.splitlines():
            if ":" in line and line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
        return None

    model = field("model name")
    if model is None:
        return None
    flags = (field("flags") or "").split()
    isa = ", AVX-512" if "avx512f" in flags else ", AVX2" if "avx2" in flags else ""
    amx = ", AMX" if "amx_bf16" in flags else ""
    return model + isa + amx


def peak_rss_bytes() -> int | None:
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        return None


def set_math(torch, math: str) -> str:
    """Sets the CUDA fp32 matmul/convolution precision; returns what is in force."""
    prec = "tf32" if math == "tf32" else "ieee"
    matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if matmul is not None:  # PyTorch >= 2.9: the fp32_precision API
        torch.backends.cuda.matmul.fp32_precision = prec
        torch.backends.cudnn.conv.fp32_precision = prec
    else:
        torch.backends.cuda.matmul.allow_tf32 = math == "tf32"
        torch.backends.cudnn.allow_tf32 = math == "tf32"
    return math


OOM_TEXTS = ("out of memory", "can't allocate memory", "not enough memory", "OutOfMemory")


def is_oom(e: BaseException) -> bool:
    """Whether an exception is an allocation failure (CPU or CUDA)."""
    return isinstance(e, MemoryError) or any(t in str(e) for t in OOM_TEXTS)


def graph_pool_bytes(torch, device) -> int:
    """Bytes reserved by the caching allocator's private pools on `device`: the memory that
    CUDA graphs recorded by torch.compile(mode="reduce-overhead") replay in (cudagraph trees
    give their graphs one private pool; the default pool is (0, 0))."""
    total = 0
    for seg in torch.cuda.memory_snapshot():
        if seg.get("device", device.index) != device.index:
            continue
        pool = seg.get("segment_pool_id")
        if pool is not None and tuple(pool) != (0, 0):
            total += int(seg.get("total_size", 0))
    return total


def compile_block(torch, block, device: str):
    """`torch.compile(block)` in the mode users reach for on `device` (see [`compile_mode`]).
    Compilation itself happens on the first call (a warm-up step)."""
    mode = compile_mode(device)
    return torch.compile(block) if mode is None else torch.compile(block, mode=mode)


def bn_counters(block) -> list:
    """(module name, its `num_batches_tracked` buffer) of every BatchNorm: BatchNorm adds 1 to it
    on every training-mode call, so its change over a step counts the running-stat updates
    without a hook (hooks would be instrumentation in the step, and break compiled graphs)."""
    suffix = ".num_batches_tracked"
    return [(n[: -len(suffix)], b) for n, b in block.named_buffers() if n.endswith(suffix)]


class Stepper:
    """Runs identical training steps: state restored, gradients dropped, before each one.

    Two kinds of step (results/README.md, "What a timed step contains"):

    - a **timed step** ([`timed_step`]) holds the training step and nothing else: forward,
      `backward(grad_output)`, and one clock mark at the end of forward (the host clock on the
      CPU; one CUDA event record on a GPU, no synchronisation), exactly as densebench's timed
      steps do. The live-byte baseline and the peak are read outside it (before the clock starts
      and after it stops);
    - one **probe step** ([`probe_step`]), untimed, run once after warm-up: live bytes at each
      layer boundary (forward hooks that synchronise the device, registered for this step only),
      live bytes at the end of forward (`saved_bytes`), the running stats as they are after
      forward (copied into buffers allocated before the baseline), and how often each BatchNorm
      updated its running stats (its `num_batches_tracked`).
    """

    def __init__(self, torch, block, fn, x, grad_output, meter, device, family, compiled,
                 autocast=None):
        self.torch = torch
        # What the forward runs under: torch.autocast(...) for bf16 (entered inside the timed
        # step, as a user's training step enters it), else nothing.
        self.autocast = autocast or contextlib.nullcontext
        self.block = block  # the eager module: parameters, buffers, hooks
        self.fn = fn  # what a step calls: the block, or torch.compile(block)
        self.x = x
        self.g = grad_output
        self.meter = meter
        self.device = device
        self.family = family
        self.compiled = compiled
        self.graphs = compiled and device.type == "cuda"
        self.params = list(block.parameters())
        # The case's BN running stats (and num_batches_tracked), restored before every step.
        self.initial_buffers = [(b, b.detach().clone()) for b in block.buffers()]
        # The running stats as they are at the end of the probe step's forward (allocated here,
        # before any baseline: the copy allocates nothing in the step).
        self.after_forward = {
            name: (b, b.detach().clone())
            for name, b in block.named_buffers()
            if not name.endswith("num_batches_tracked")
        }
        self.counters = bn_counters(block)
        self.initial_counts = {n: int(b.item()) for n, b in self.counters}
        self.timeline: list[tuple[int, int]] = []
        self.baseline = 0
        # Training-mode BatchNorm calls per module in the probe step: each one updates that
        # module's running stats, so more than one per step is a double update.
        self.bn_calls: dict[str, int] = {}

    def reset(self) -> None:
        with self.torch.no_grad():
            for buf, init in self.initial_buffers:
                buf.copy_(init)
        for p in self.params:
            p.grad = None
        self.x.grad = None
        if self.graphs:
            # cudagraph trees: a new iteration begins (the previous step's outputs are dead).
            self.torch.compiler.cudagraph_mark_step_begin()

    def _begin(self) -> None:
        """Before a step's clock starts: state restored, Python's garbage collected, device idle,
        baseline read, peak reset."""
        self.reset()
        # The cyclic garbage collector's work is done here, outside the clock: a timed step runs
        # with it disabled (`timed_step`), as timeit and torch.utils.benchmark.Timer time a
        # statement. Left enabled, a collection lands in whichever step crosses its allocation
        # threshold: a full one, which walks every object of torch and torchvision, took
        # 136-211 ms inside 21-34 ms `pytorch-memory-efficient` steps (bc N=16, L=8, 8x8). (`run`
        # freezes the heap it built, so that this walks only the objects made since.)
        gc.collect()
        self.meter.sync()
        self.baseline = self.meter.current()
        self.meter.reset_peak()

    def timed_step(self) -> dict:
        """One timed step: the training step and two clock marks, nothing else (no garbage
        collection: see `_begin`)."""
        self._begin()
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            c0 = time.process_time_ns()
            t0 = time.perf_counter_ns()
            start = self.meter.mark()
            with self.autocast():
                out = self.fn(self.x)
            # GPU: a timing event, not a synchronisation (the device's clock says when forward
            # ended; the host's, without a sync, only when it was queued). CPU: the host's clock.
            forward_end = self.meter.mark()
            t1 = time.perf_counter_ns()
            out.backward(self.g)
            self.meter.sync()
            t2 = time.perf_counter_ns()
            c2 = time.process_time_ns()
        finally:
            if gc_was_enabled:
                gc.enable()
        peak = self.meter.peak() - self.baseline
        total = t2 - t0
        if start is None:
            fwd = t1 - t0
        else:
            fwd = min(total, int(round(start.elapsed_time(forward_end) * 1e6)))
        return {
            "output": out,
            "baseline": self.baseline,
            "peak": peak,
            "fwd": fwd,
            "bwd": total - fwd,
            "total": total,
            "cpu": c2 - c0,
        }

    def _probe(self, i: int) -> None:
        # Only in the forward pass proper (checkpointed recomputation also runs the layers).
        if self.torch.is_grad_enabled():
            self.meter.sync()
            self.timeline.append((i, self.meter.current() - self.baseline))

    def probe_step(self) -> dict:
        """The untimed step every instrumented number comes from (see the class doc). A compiled
        block has no layer boundaries to hook: its timeline stays empty."""
        handles = []
        if self.family == "bc" and not self.compiled:
            for i, layer in enumerate(self.block.values()):
                handles.append(layer.register_forward_hook(lambda _m, _i, _o, i=i: self._probe(i)))
        self.timeline = []
        try:
            self._begin()
            with self.autocast():
                if self.family == "mlp" and not self.compiled:
                    out = self.block(self.x, probe=self._probe)
                else:
                    out = self.fn(self.x)
            self.meter.sync()
            saved = self.meter.current() - self.baseline
            with self.torch.no_grad():
                for buf, snap in self.after_forward.values():
                    snap.copy_(buf)
            out.backward(self.g)
            self.meter.sync()
            peak = self.meter.peak() - self.baseline
        finally:
            for h in handles:
                h.remove()
        self.bn_calls = {n: int(b.item()) - self.initial_counts[n] for n, b in self.counters}
        del out
        return {
            "peak": peak,
            "saved": saved,
            "timeline": ";".join(f"f{i}={b}" for i, b in self.timeline),
        }


def freeze_heap() -> None:
    """Collects the garbage, then freezes what is left (`gc.freeze`): later collections skip it."""
    gc.collect()
    gc.freeze()


class Phases:
    """Where the process's time went, outside the timed steps: `(name, ns)` in order, each
    from the end of the one before (the first from the script's start). The harness shows
    them beside the row (a row's process costs seconds; its steps, milliseconds)."""

    def __init__(self):
        self.last = STARTED_NS
        self.done: list[list] = []

    def mark(self, name: str) -> None:
        now = time.perf_counter_ns()
        self.done.append([name, now - self.last])
        self.last = now


def run(a: argparse.Namespace) -> dict:
    phases = Phases()
    try:
        import torch
        import torchvision
    except ImportError as e:
        raise PeerError(f"{NO_TORCH_LINE} ({e})", EXIT_NO_TORCH) from None
    phases.mark("import")

    torch.set_num_threads(a.threads)
    # bf16 is mixed precision: the block (parameters, BN buffers) stays f32, the features are
    # bf16, autocast picks each op's dtype.
    dtype = {"f32": torch.float32, "f64": torch.float64, "bf16": torch.float32}[a.dtype]
    feature_dtype = torch.bfloat16 if a.dtype == "bf16" else dtype
    if a.device == "cpu":
        meter = CpuMeter(a.mem_limit)
        device = torch.device("cpu")
        device_desc = f"{cpu_model()} ({a.threads} threads)"
    else:
        if not torch.cuda.is_available():
            raise PeerError(
                f"--device {a.device}: CUDA is not available to PyTorch {torch.__version__} "
                f"(torch.version.cuda = {torch.version.cuda})"
            )
        index = int(a.device.split(":")[1])
        if index >= torch.cuda.device_count():
            raise PeerError(
                f"--device {a.device}: PyTorch sees {torch.cuda.device_count()} CUDA device(s)"
            )
        device = torch.device(a.device)
        torch.cuda.set_device(device)
        meter = CudaMeter(torch, device, a.mem_limit)
        props = torch.cuda.get_device_properties(device)
        device_desc = (
            f"{props.name} (sm_{props.major}{props.minor}, {props.total_memory / 2**30:.1f} GiB; "
            f"PyTorch CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()})"
        )
    math = set_math(torch, a.math) if device.type == "cuda" else a.math

    tensors = read_safetensors(torch, a.case)
    cfg = read_config(tensors, a.family, a.case)
    a.activation = resolve_activation(a.case, a.family, a.activation)
    case_dtype = {torch.float32: "f32", torch.float64: "f64", torch.bfloat16: "bf16"}.get(
        tensors["input"].dtype
    )
    if case_dtype is None:
        raise PeerError(
            f"case file {a.case}: input is {tensors['input'].dtype}, expected f32, f64 or bf16",
            EXIT_USAGE,
        )

    block = build_block(torch, a.family, a.variant, cfg, a.activation == "on")
    block = block.to(dtype=dtype)
    load_state(torch, block, tensors, a.case)
    block = block.to(device=device)
    block.train()
    x = tensors["input"].to(device=device, dtype=feature_dtype)
    g = tensors["grad_output"].to(device=device, dtype=feature_dtype)
    del tensors
    block, x, g = in_memory_format(torch, a.variant, block, x, g)
    x.requires_grad_(True)

    compiled = a.variant.startswith(COMPILED_PREFIX)
    fn = compile_block(torch, block, a.device) if compiled else block
    autocast = (
        (lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16))
        if a.dtype == "bf16"
        else None
    )
    stepper = Stepper(torch, block, fn, x, g, meter, device, a.family, compiled, autocast)
    # Every object made so far (torch's, torchvision's, the block's) moved out of the garbage
    # collector's sight, and again after warm-up (a compiled variant's compiler makes many):
    # the collection before each step (`Stepper._begin`) then walks only what came since: 0.03 ms
    # instead of 144-199 ms (a full walk of torch's 340,000 objects). This process ends with
    # `os._exit`.
    freeze_heap()
    phases.mark("setup")
    # Warm-up settles the allocator, oneDNN/MKL scratch, cuDNN/cuBLAS handles and workspaces;
    # a compiled variant's first steps also compile (and under reduce-overhead record graphs).
    warmup = max(a.warmup, COMPILED_MIN_WARMUP) if compiled else a.warmup
    warmup_ns = 0
    for i in range(warmup):
        t0 = time.perf_counter_ns()
        try:
            r = stepper.timed_step()
        except (MemoryError, PeerError):
            raise
        except Exception as e:  # noqa: BLE001 - any compiler failure is the row's reason
            if not compiled or is_oom(e):
                raise
            text = " ".join(str(e).split())[:400] or type(e).__name__
            raise PeerError(
                f"torch.compile(mode={compile_mode(a.device) or 'default'}) failed in warm-up "
                f"step {i + 1}: {type(e).__name__}: {text}"
            ) from None
        warmup_ns += time.perf_counter_ns() - t0
        del r
    freeze_heap()
    phases.mark("warm-up")
    probe = stepper.probe_step()
    phases.mark("probe")
    records = []
    last = None
    for _ in range(a.steps):
        last = None  # the previous step's output must not count in this step's baseline
        r = stepper.timed_step()
        last = r.pop("output")
        records.append(r)
    # A step replayed as CUDA graphs runs in memory its graphs reserved while recording (a
    # private pool of the caching allocator): the allocator's peak over a replay is ~0. The
    # pool is counted whole, plus what the step allocates outside it.
    graph_pool = graph_pool_bytes(torch, device) if stepper.graphs else None
    phases.mark("steps")

    # The last measured step's results: the state was restored before it, so its running
    # stats are those after exactly one step from the case's.
    result = {"output": last.detach(), "grad.input": x.grad}
    for name, p in block.named_parameters():
        if p.grad is None:
            raise PeerError(f"{a.variant}: parameter {name} got no gradient")
        result[f"grad.{name}"] = p.grad
    for name, (b, snap) in stepper.after_forward.items():
        result[name] = snap if a.running_stats == "after-forward" else b
    write_safetensors(torch, result, a.out)
    phases.mark("result")

    # How often each BN module updated its running stats in the last step (bc). torchvision's
    # memory_efficient recomputes norm1 inside torch.utils.checkpoint during backward, which
    # updates norm1's running stats a second time (pytorch/pytorch#96136); the result file holds
    # what PyTorch leaves, so the comparison with densebench's reference shows it.
    updates = sorted(set(stepper.bn_calls.values()))
    double = sorted(n for n, c in stepper.bn_calls.items() if c > 1)
    warning = ""
    if double:
        holds = (
            "the result holds the running stats as they are after forward (one update)"
            if a.running_stats == "after-forward"
            else "the result holds PyTorch's running stats as they are after the step"
        )
        warning = (
            f"PyTorch updated the running stats of {len(double)} of {len(stepper.bn_calls)} "
            f"BatchNorm modules {max(stepper.bn_calls.values())} times in one step "
            f"(e.g. {double[0]}: recomputed in backward by torch.utils.checkpoint, "
            f"pytorch/pytorch#96136); {holds}"
        )

    worst = max(records, key=lambda r: r["peak"])
    total, fwd, bwd, cpu = (
        stats([r[k] for r in records]) for k in ("total", "fwd", "bwd", "cpu")
    )
    # Warm-up beyond running steps: compiling (dynamo, AOTAutograd, inductor), autotuning and
    # recording graphs. Eager variants: none.
    compile_ns = max(0, warmup_ns - warmup * total["median"]) if compiled else None
    peak = worst["peak"] if graph_pool is None else graph_pool + max(0, worst["peak"])
    return {
        "framework": "pytorch",
        "framework_version": f"torch {torch.__version__}, torchvision {torchvision.__version__}",
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
        "variant": a.variant,
        "family": a.family,
        **{k: cfg[k] for k in ("batch", "channels", "growth", "depth", "bn_size")},
        "size": cfg["height"] if cfg["height"] == cfg["width"] else f"{cfg['height']}x{cfg['width']}",
        "height": cfg["height"],
        "width": cfg["width"],
        "activation": a.family == "bc" or a.activation == "on",
        "dtype": a.dtype,
        "case_dtype": case_dtype,
        "device": a.device,
        "device_desc": device_desc,
        "threads": a.threads if device.type == "cpu" else torch.get_num_threads(),
        "math": math,
        "execution": execution_of(a.variant, a.device),
        # what the step's input really was in (a channels-last variant whose conversion did not
        # take would say `contiguous` here)
        "memory_format": "channels_last" if (
            x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last)
            and (is_channels_last(a.variant) or not x.is_contiguous())) else "contiguous",
        "compile_mode": (compile_mode(a.device) or "default") if compiled else None,
        "compile_ns": compile_ns,
        "graph_pool_bytes": graph_pool,
        "warmup": warmup,
        "steps": a.steps,
        "peak_bytes": peak,
        "baseline_bytes": worst["baseline"],
        # A graph replay allocates nothing the allocator sees: what it keeps is in the pool.
        "saved_bytes": None if stepper.graphs else probe["saved"],
        "probe_peak_bytes": probe["peak"],
        "peak_rss_bytes": peak_rss_bytes(),
        "median_ns": total["median"],
        "min_ns": total["min"],
        "max_ns": total["max"],
        "fwd_median_ns": fwd["median"],
        "fwd_min_ns": fwd["min"],
        "fwd_max_ns": fwd["max"],
        "bwd_median_ns": bwd["median"],
        "bwd_min_ns": bwd["min"],
        "bwd_max_ns": bwd["max"],
        "cpu_median_ns": cpu["median"],
        "cpu_min_ns": cpu["min"],
        "cpu_max_ns": cpu["max"],
        "step_ns": [r["total"] for r in records],
        "step_peak_bytes": [r["peak"] for r in records],
        "timeline": probe["timeline"],
        "memory_meter": meter.name
        + (
            "; plus the CUDA-graph pool the step replays in (torch.cuda.memory_snapshot: the "
            "reserved bytes of every private pool's segments)"
            if graph_pool is not None
            else ""
        ),
        "running_stats": "restored from the case before every step; written from the last "
        "measured step, " + ("as they are after forward" if a.running_stats == "after-forward"
                             else "as they are after backward"),
        "running_snapshot": a.running_stats.replace("-", "_"),
        "bn_updates": dict(sorted(stepper.bn_calls.items())),
        "bn_updates_per_step": max(updates) if updates else 0,
        "warning": warning,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark) if device.type == "cuda" else None,
        "phases_ns": phases.done,
        "out": a.out,
    }


def limit_refusals() -> int:
    """Allocations the shim refused at the --mem-limit (0 without the shim)."""
    if not shim_loaded():
        return 0
    import ctypes

    f = ctypes.CDLL(None).mc_refused
    f.restype = ctypes.c_longlong
    return int(f())


def oom_message(limit: int | None) -> str:
    return f"out of memory: an allocation would have passed --mem-limit {limit} bytes (live heap bytes of the process, counted by the malloc_count shim)"


def fail(message: str, code: int) -> int:
    """One line on stderr, then exit at once: no atexit handlers (PyTorch registers some that
    print) can add lines after it."""
    sys.stderr.write(f"pytorch_peer: error: {message}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(code)


def check(argv: list[str]) -> int:
    """`--check`: is PyTorch importable (here or in the setup's venv)? One JSON line with the
    versions and CUDA devices and exit 0, or the not-importable line and exit 3. For the
    harness to fail fast before a sweep with `--peer pytorch`."""
    if not torch_findable():
        if os.path.exists(VENV_PYTHON) and not in_venv(VENV_DIR) and not os.environ.get(REEXEC_ENV):
            env = dict(os.environ, **{REEXEC_ENV: "1"})
            os.execve(VENV_PYTHON, [VENV_PYTHON, os.path.abspath(__file__), *argv], env)
        return fail(NO_TORCH_LINE, EXIT_NO_TORCH)
    try:
        import torch
        import torchvision
    except ImportError as e:
        return fail(f"{NO_TORCH_LINE} ({e})", EXIT_NO_TORCH)
    cuda = torch.cuda.is_available()
    info = {
        "framework": "pytorch",
        "framework_version": f"torch {torch.__version__}, torchvision {torchvision.__version__}",
        "python": sys.executable,
        "cuda_available": cuda,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda
        else [],
        "torch_cuda": torch.version.cuda,
    }
    sys.stdout.write(json.dumps(info, separators=(",", ":")) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        return check(argv)
    a = parse_args(argv)
    try:
        bootstrap(a, argv)
        row = run(a)
    except PeerError as e:
        return fail(str(e), e.code)
    except (MemoryError, RuntimeError) as e:
        # The shim's limit is one shot: a refused allocation lifts it, so this handler can run.
        if a.device == "cpu" and limit_refusals():
            return fail(oom_message(a.mem_limit), EXIT_OOM)
        text = " ".join(str(e).split()) or type(e).__name__
        oom = is_oom(e)
        return fail(("out of memory: " if oom else "") + text[:500], EXIT_OOM if oom else EXIT_ERROR)
    if a.device == "cpu" and limit_refusals():
        # An allocation failed at the limit but was caught and retried inside a library.
        return fail(oom_message(a.mem_limit), EXIT_OOM)
    sys.stdout.write(json.dumps(row, separators=(",", ":")) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    # Out at once, as `fail` does: the JSON line is flushed and the RESULT file written and
    # renamed, and the interpreter's teardown (PyTorch's atexit handlers, CUDA contexts,
    # inductor's compile workers) is no part of a measurement: it took 0.7-1.0 s of a 3-6 s
    # CPU row (2026-11-30).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
