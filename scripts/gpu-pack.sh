#!/usr/bin/env bash
# Builds a `--features cuda` densebench and its GPU test binaries on a machine WITHOUT a GPU (and
# without a system CUDA), and packs them, gzipped, into .gpu/ for a GPU machine that has no Rust:
# there, `scripts/gpu-session.sh` unpacks and runs them (docs/gpu.md, "A GPU machine without
# Rust").
#
#   scripts/gpu-pack.sh            # toolkit via scripts/install-cuda-toolkit.sh (13.0 default)
#
# The first build compiles candle's CUDA kernels with nvcc: ~25 minutes on 2 cores, in a target
# directory of its own (target/cuda) so the CPU build is not invalidated; later builds take
# minutes. The packed tree must stay under the size a copy to the GPU machine allows: the script
# prints each file's size and fails above DENSEBENCH_PACK_LIMIT_MIB (default 60).
#
# Built with the `cudnn` feature (issue 38: the bc layer's 3×3 convolution in cuDNN), linking
# libcudnn.so.9 from the nvidia-cudnn-cu13 wheel; on the GPU machine gpu-session.sh finds the
# libcudnn.so.9 of PyTorch's wheels; cuDNN runs with DENSEBENCH_CONV=cudnn (the tap stack is the
# default until cuDNN has passed on a GPU). DENSEBENCH_CUDNN=0 builds without it (the tap stack only).
#
# Environment: DENSEBENCH_CUDA (toolkit version, default 13.0), CARGO_TARGET_DIR (default
# target/cuda), CUDA_COMPUTE_CAP (default 90: H100/H200), DENSEBENCH_PACK_LIMIT_MIB,
# DENSEBENCH_CUDNN (default 1).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
    "") ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-pack: takes no arguments (got '$1'); settings are environment variables: see --help" >&2; exit 2 ;;
esac

# Not `eval "$(…)"` alone: that hides the installer's exit status from `set -e`, and a failed
# toolkit went on to a build without nvcc.
features=cudnn
cudnn_flag=(--cudnn)
case "${DENSEBENCH_CUDNN:-1}" in
    1) ;;
    0) features=cuda; cudnn_flag=() ;;
    *) echo "gpu-pack: DENSEBENCH_CUDNN must be 1 or 0 (got '${DENSEBENCH_CUDNN}')" >&2; exit 2 ;;
esac
toolkit_env=$(scripts/install-cuda-toolkit.sh --cuda "${DENSEBENCH_CUDA:-13.0}" "${cudnn_flag[@]}" --print-env) \
    || { echo "gpu-pack: the CUDA toolkit could not be installed or found (above); nothing was built" >&2; exit 1; }
eval "$toolkit_env"
command -v nvcc > /dev/null || { echo "gpu-pack: no nvcc on PATH after the toolkit's environment; nothing was built" >&2; exit 1; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/cuda}
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$(nproc)}
limit_mib=${DENSEBENCH_PACK_LIMIT_MIB:-60}

# Excluded from git, so the packed binaries never land in a commit.
# (A checkout made without `git clone`'s templates has no .git/info: made here.)
exclude="$(git rev-parse --git-common-dir)/info/exclude"
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"

echo "gpu-pack: $(nvcc --version | tail -n 2 | head -n 1); sm_${CUDA_COMPUTE_CAP}; target ${CARGO_TARGET_DIR}; features ${features}"
cargo build --release --features "$features" -p densebench --bin densebench
# The test binaries that need a GPU (they skip without one) and the CLI tests that drive the
# densebench binary through DENSEBENCH_BIN.
tests=(gpu fused_cuda)
listing=$(mktemp)
trap 'rm -f "$listing"' EXIT
cargo test --release --features "$features" --workspace --no-run --message-format=json \
    | jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test == true)
             | "\(.target.name) \(.executable)"' > "$listing"

# A sweep's partial CSV put there to resume (.gpu/reference-gpu*.csv) survives the repack.
keep=$(mktemp -d)
trap 'rm -f "$listing"; rm -rf "$keep"' EXIT
cp .gpu/*.csv "$keep"/ 2>/dev/null || true
rm -rf .gpu && mkdir -p .gpu
cp "$keep"/*.csv .gpu/ 2>/dev/null || true
gzip -c "${CARGO_TARGET_DIR}/release/densebench" > .gpu/densebench.gz
for t in "${tests[@]}"; do
    exe=$(awk -v t="$t" '$1 == t { print $2 }' "$listing" | tail -n 1)
    [ -n "$exe" ] || { echo "gpu-pack: no test binary named $t was built" >&2; exit 1; }
    gzip -c "$exe" > ".gpu/test-$t.gz"
done
# The CUDA version these were built with: gpu-session.sh checks it against the driver's.
nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p' > .gpu/cuda-version
# The revision, as the binary records it (harness/build.rs): +dirty when tracked files differ.
rev=$(git rev-parse --short HEAD)
git diff --quiet HEAD -- 2>/dev/null || rev="$rev+dirty"
echo "$rev" > .gpu/git-rev

ls -l .gpu
total=$(du -sm .gpu | cut -f1)
if [ "$total" -gt "$limit_mib" ]; then
    echo "gpu-pack: .gpu/ is ${total} MiB, over ${limit_mib} MiB: the copy to the GPU machine would be refused; pack fewer test binaries" >&2
    exit 1
fi
echo "gpu-pack: .gpu/ holds ${total} MiB; on the GPU machine run: bash scripts/gpu-session.sh (with .gpu carried)"
