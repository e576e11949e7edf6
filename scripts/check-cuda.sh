#!/usr/bin/env bash
# `just check-cuda`: build and clippy-check the workspace with `--features cuda`, no GPU needed.
#
# 1. Installs Debian's CUDA toolkit (nvcc 11.8 + g++-11) when nvcc is missing
#    (scripts/install-cuda-toolkit.sh; needs root).
# 2. `cargo build` and `cargo clippy -D warnings` of every target with the `cuda` feature, in a
#    target directory of its own so the CPU build is not invalidated (the CUDA one recompiles
#    candle with a different feature set, and candle-kernels' nvcc step takes many minutes).
# 3. Runs the tests that need no GPU against the CUDA build (GPU tests skip with a message).
#
# Environment:
#   CARGO_TARGET_DIR  default: /work/cuda-target if /work exists, else target/cuda
#   CUDA_COMPUTE_CAP  GPU architecture the kernels are compiled for; nvidia-smi is asked when
#                     unset, and without a GPU it defaults to 80 (A100). Set it to your card's
#                     (e.g. 86, 89, 90) when building to run.
#   CUDAFORGE_THREADS parallel nvcc jobs (default: the number of cores, at most 2 here)
#   SKIP_TESTS=1      build and clippy only
set -euo pipefail

cd "$(dirname "$0")/.."

if ! command -v nvcc >/dev/null 2>&1; then
    if [ "$(id -u)" -eq 0 ]; then
        scripts/install-cuda-toolkit.sh
    else
        echo "check-cuda: nvcc not found; run scripts/install-cuda-toolkit.sh as root first" >&2
        exit 1
    fi
fi

if [ -z "${CARGO_TARGET_DIR:-}" ]; then
    if [ -d /work ]; then CARGO_TARGET_DIR=/work/cuda-target; else CARGO_TARGET_DIR=target/cuda; fi
fi
export CARGO_TARGET_DIR

if [ -z "${CUDA_COMPUTE_CAP:-}" ]; then
    if cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1); then
        CUDA_COMPUTE_CAP=${cap//./}
    fi
    # No GPU to ask: compile for Ampere (sm_80), which nvcc 11.8 supports.
    CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-80}
fi
export CUDA_COMPUTE_CAP

jobs=$(nproc)
if [ "$jobs" -gt 2 ] && [ -d /work ]; then jobs=2; fi
export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$jobs}

echo "check-cuda: $(nvcc --version | tail -n 1); sm_${CUDA_COMPUTE_CAP}; target ${CARGO_TARGET_DIR}"
set -x
cargo build -j "$jobs" --workspace --all-targets --features cuda
cargo clippy -j "$jobs" --workspace --all-targets --features cuda -- -D warnings
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    cargo test -j "$jobs" -p densebench --features cuda --test gpu -- --nocapture
fi
