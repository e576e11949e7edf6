#!/usr/bin/env bash
# Sets up the PyTorch peer (the future `just peer-setup`):
#   1. uses an importable torch + torchvision if the chosen python has them (GPU machines that
#      ship PyTorch), else makes harness/peer/.venv-peer with the pinned versions of
#      requirements.txt;
#   2. builds the malloc-counting shim harness/peer/build/libmalloc_count.so (CPU peak memory);
#   3. checks both: imports torch, and runs the shim's 100 MB self-test.
# Environment: PYTHON (default python3) is the interpreter to try first and to make the venv
# with; PEER_FORCE_VENV=1 makes the venv even when PYTHON already has torch; CC (default gcc).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
venv="$here/.venv-peer"
cc="${CC:-gcc}"

has_torch() { "$1" -c 'import torch, torchvision' >/dev/null 2>&1; }

if [[ "${PEER_FORCE_VENV:-0}" != 1 ]] && has_torch "$python"; then
    echo "peer-setup: using the importable PyTorch of $(command -v "$python")"
    peer_python="$python"
elif [[ -x "$venv/bin/python" ]] && has_torch "$venv/bin/python"; then
    echo "peer-setup: $venv already has torch + torchvision"
    peer_python="$venv/bin/python"
else
    echo "peer-setup: creating $venv with $(grep -E '^[a-z]' "$here/requirements.txt" | tr '\n' ' ')(several GB)"
    "$python" -m venv "$venv"
    "$venv/bin/pip" install --disable-pip-version-check -q -r "$here/requirements.txt"
    peer_python="$venv/bin/python"
fi
"$peer_python" -c 'import torch, torchvision; print("peer-setup: torch", torch.__version__, "torchvision", torchvision.__version__, "CUDA available:", torch.cuda.is_available())'

mkdir -p "$here/build"
"$cc" -O2 -Wall -Wextra -shared -fPIC -o "$here/build/libmalloc_count.so.tmp" "$here/malloc_count.c"
mv "$here/build/libmalloc_count.so.tmp" "$here/build/libmalloc_count.so"
# Self-test: a 100 MB tensor must raise the counted peak by 100 MB (±1 MiB).
LD_PRELOAD="$here/build/libmalloc_count.so" "$peer_python" - <<'PY'
import ctypes, torch
lib = ctypes.CDLL(None)
lib.mc_current.restype = lib.mc_peak.restype = ctypes.c_longlong
lib.mc_reset_peak()
base = lib.mc_current()
t = torch.empty(100_000_000, dtype=torch.uint8)
grew = lib.mc_peak() - base
del t
assert abs(grew - 100_000_000) < 2**20, f"shim counted {grew} bytes for a 100 MB tensor"
print(f"peer-setup: malloc_count shim ok (torch.empty(100 MB) raised the peak by {grew} bytes)")
PY
echo "peer-setup: done; run: python3 $here/pytorch_peer.py --help"
