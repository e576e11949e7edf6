"""Reads safetensors files (densebench's case and step-result files, the PyTorch peer's results)
without the safetensors package: a GPU machine or CI may have numpy, or only Python.

The format: an 8-byte little-endian header length, a JSON header of name -> {dtype, shape,
data_offsets}, then the raw little-endian data. `read(path)` gives {name: (shape, values)} with
the values as numpy float64/int arrays when numpy is importable and `use_numpy` is not False,
else as flat Python lists; bf16 is widened exactly (its 16 bits are the top half of an f32).
A file that is not safetensors, or a dtype outside the table, raises `SafetensorsError`.
"""
import array
import json
import struct
import sys

# safetensors dtype -> (array typecode, bytes per element); BF16 is read as 16-bit words
_CODES = {"F64": ("d", 8), "F32": ("f", 4), "BF16": ("H", 2), "I64": ("q", 8), "I32": ("i", 4),
          "U32": ("I", 4), "U8": ("B", 1)}


class SafetensorsError(Exception):
    pass


def _header(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise SafetensorsError(f"{path}: not a safetensors file ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise SafetensorsError(f"{path}: not a safetensors file (header of {n} bytes claimed)")
    try:
        header = json.loads(blob[8 : 8 + n])
    except ValueError as e:
        raise SafetensorsError(f"{path}: not a safetensors file (header: {e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: not a safetensors file (header is not an object)")
    return header, memoryview(blob)[8 + n :]


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def read(path, use_numpy=None):
    """{name: (shape, values)} of every tensor in the file (see the module doc)."""
    np = None
    if use_numpy is not False:
        try:
            import numpy as np  # noqa: F811
        except ImportError:
            if use_numpy:
                raise
    header, data = _header(path)
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = t["dtype"], list(t["shape"]), t["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise SafetensorsError(f"{path}: tensor {name}: malformed header entry") from None
        if dtype not in _CODES:
            raise SafetensorsError(f"{path}: tensor {name} has dtype {dtype}, not one of {sorted(_CODES)}")
        code, size = _CODES[dtype]
        if not (0 <= lo <= hi <= len(data)) or hi - lo != _count(shape) * size:
            raise SafetensorsError(f"{path}: tensor {name}: data offsets {lo}..{hi} do not fit shape {shape}")
        raw = data[lo:hi]
        if np is not None:
            if dtype == "BF16":
                v = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                v = np.frombuffer(raw, dtype=np.dtype(code).newbyteorder("<"))
            values = v.astype(np.float64 if dtype in ("F64", "F32", "BF16") else np.int64)
        else:
            a = array.array(code)
            a.frombytes(raw)
            if sys.byteorder != "little":
                a.byteswap()
            if dtype == "BF16":
                f = array.array("f", struct.pack(f"<{len(a)}I", *(w << 16 for w in a)))
                if sys.byteorder != "little":
                    f.byteswap()
                a = f
            values = list(a)
        out[name] = (shape, values)
    return out
