#!/usr/bin/env bash
# `just check-cuda`: build and clippy-check the workspace with `--features cudnn` (CUDA 13.0;
# `cuda` for 12.x or DENSEBENCH_CUDNN=0), no GPU needed.
#
# 1. Installs CUDA from NVIDIA's PyPI wheels into a user directory when it is not there yet
#    (scripts/install-cuda-toolkit.sh: no root; 13.0 by default, DENSEBENCH_CUDA=12.8 etc. for
#    older drivers), including a link-only libcuda stub where no driver is installed.
# 2. `cargo build` and `cargo clippy -D warnings` of every target with that feature, in a
#    target directory of its own so the CPU build is not invalidated (the CUDA one recompiles
#    candle with a different feature set, and candle-kernels' nvcc step takes ~25 minutes on 2
#    cores the first time).
# 3. Runs the GPU tests (they skip with a message where there is no GPU, and run on one).
#
# Environment:
#   DENSEBENCH_CUDA   toolkit version for the installer (default 13.0)
#   CARGO_TARGET_DIR  default: target/cuda
#   CUDA_COMPUTE_CAP  GPU architecture candle's kernels are compiled for; nvidia-smi is asked
#                     when unset, and without a GPU it defaults to 90 (H100/H200).
#   CUDAFORGE_THREADS parallel nvcc jobs (default: the number of cores)
#   SKIP_TESTS=1      build and clippy only
set -euo pipefail

cd "$(dirname "$0")/.."

user_cap=${CUDA_COMPUTE_CAP:-}
# Prints the exports (installing first if needed) and applies them.
# The `cudnn` feature (the 3×3 convolution in cuDNN) where the toolkit is 13.0 (the cuDNN wheel
# is wired for it); DENSEBENCH_CUDNN=0 checks the plain `cuda` build only.
features=cuda
cudnn_flag=()
if [ "${DENSEBENCH_CUDA:-13.0}" = 13.0 ] && [ "${DENSEBENCH_CUDNN:-1}" = 1 ]; then
    features=cudnn
    cudnn_flag=(--cudnn)
fi
eval "$(scripts/install-cuda-toolkit.sh --cuda "${DENSEBENCH_CUDA:-13.0}" "${cudnn_flag[@]}" --print-env)"

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}

if [ -z "$user_cap" ] \
    && cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1) \
    && [ -n "$cap" ]; then
    CUDA_COMPUTE_CAP=${cap//./}
fi
export CUDA_COMPUTE_CAP

jobs=$(nproc)
export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$jobs}

echo "check-cuda: $(nvcc --version | tail -n 2 | head -n 1); sm_${CUDA_COMPUTE_CAP}; target ${CARGO_TARGET_DIR}"
set -x
cargo build -j "$jobs" --workspace --all-targets --features "$features"
cargo clippy -j "$jobs" --workspace --all-targets --features "$features" -- -D warnings
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    cargo test -j "$jobs" -p densebench-impls --features "$features" --test fused_cuda -- --nocapture
    cargo test -j "$jobs" -p densebench --features "$features" --test gpu -- --nocapture
fi
