#!/usr/bin/env bash
# Install the CUDA pieces candle needs to build densebench with `--features cuda` — nvcc, NVVM,
# the CRT and CCCL headers, the runtime, cuBLAS, cuRAND and NVRTC — into a user directory. No
# root, no apt, no system CUDA. CUDA 13.x comes from NVIDIA's `nvidia-*` wheels on the Python
# package index. CUDA 12.x cannot: its `nvidia-cuda-nvcc-cu12` wheels ship only ptxas, NVVM and
# headers, not the nvcc driver, cudafe++, fatbinary or nvlink (checked for 12.8.93 and 12.9.86);
# 12.x therefore comes from NVIDIA's redistributable archives (developer.download.nvidia.com/
# compute/cuda/redist, the same component versions, sha256-checked against NVIDIA's manifest).
#
#   scripts/install-cuda-toolkit.sh                 # CUDA 13.0 (driver >= 580)
#   scripts/install-cuda-toolkit.sh --cuda 12.8     # for drivers 570..579 (see below)
#   scripts/install-cuda-toolkit.sh --prefix DIR    # default: ${XDG_CACHE_HOME:-~/.cache}/densebench-cuda/<version>
#   scripts/install-cuda-toolkit.sh --cudnn         # also cuDNN 9 (for candle-core/cudnn; large)
#   eval "$(scripts/install-cuda-toolkit.sh --print-env)"   # install if needed, then export
#
# Which version: the toolkit must not be newer than the CUDA version of the GPU machine's
# driver (`nvidia-smi` prints it as "CUDA Version"). candle loads its own kernels as PTX, and the
# driver refuses PTX from a newer toolkit (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); the binary also
# links the toolkit's libcublas.so.<major>, so 12.x and 13.x binaries are not interchangeable.
# Minimum Linux drivers (NVIDIA's CUDA toolkit release notes, "CUDA Toolkit and Corresponding
# Driver Versions"): 13.0 >= 580.65.06, 12.8 >= 570.26, 12.6 >= 560.28.03, 12.4 >= 550.54.14.
#
# What it does:
#   1. 13.x: `pip download` the pinned wheels for this CPU architecture (no install, no
#      virtualenv) and unpack them with `python3 -m zipfile`; 12.x: fetch NVIDIA's
#      `redistrib_<release>.json` manifest, download each component's archive and check its
#      sha256. Then merge the trees (`nvidia/<pkg>/`, `<component>-archive/`) into one
#      CUDA_HOME-style prefix (bin/, nvvm/, include/, lib/), where nvcc's own nvcc.profile
#      finds everything relative to itself;
#   2. adds the unversioned `lib*.so` links the linker needs (the wheels ship only `.so.N`);
#   3. where no NVIDIA driver library is installed (a build machine without a GPU), builds a
#      link-only stub `lib/stubs/libcuda.so` (soname libcuda.so.1) exporting every `cu*` symbol
#      of cudarc's driver bindings with empty bodies: it satisfies the linker only; at run time
#      the GPU machine's real libcuda.so.1 is loaded (the stub's file name is not libcuda.so.1,
#      so the loader never picks it);
#   4. writes `<prefix>/env.sh` and prints the exports to use.
# Idempotent: a second run with the same version and prefix only prints the exports.
# Needs python3 (with pip for 13.x), curl and tar for 12.x, gcc for the stub, and network
# access to pypi.org (13.x: about 0.7 GB of wheels, 1.2 GB unpacked) or developer.download.
# nvidia.com (12.x; DENSEBENCH_CUDA_REDIST overrides the base URL, e.g. for a mirror).
set -euo pipefail

die() { echo "install-cuda-toolkit: $*" >&2; exit 1; }
say() { echo "install-cuda-toolkit: $*" >&2; }

version=13.0
prefix=
print_env=0
cudnn=0
# The value of an option that takes one: present, and not another option.
value() {
    [ $# -ge 2 ] && [ -n "$2" ] && [ "${2#-}" = "$2" ] || die "$1 needs a value (see --help)"
}
while [ $# -gt 0 ]; do
    case "$1" in
        --cuda) value "$@"; version=$2; shift 2 ;;
        --cuda=*) version=${1#--cuda=}; shift ;;
        --prefix) value "$@"; prefix=$2; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --print-env) print_env=1; shift ;;
        --cudnn) cudnn=1; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# 13.x: pinned wheels, each checked to exist on PyPI (`pip index versions <name>`, then
# installed here). 12.x: the last update release of each minor version; NVIDIA's manifest of
# that release pins the component versions and their sha256.
redist_components=(cuda_nvcc cuda_cudart cuda_cccl cuda_nvrtc libcublas libcurand)
redist_base=${DENSEBENCH_CUDA_REDIST:-https://developer.download.nvidia.com/compute/cuda/redist}
source=pypi
case "$version" in
    13.0)
        wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
                nvidia-cuda-cccl==13.0.85 nvidia-cuda-runtime==13.0.96
                nvidia-cublas==13.0.2.14 nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88)
        cudnn_wheel=nvidia-cudnn-cu13==9.26.0.51 ;;
    12.8) source=redist; release=12.8.1; cudnn_wheel= ;;
    12.6) source=redist; release=12.6.3; cudnn_wheel= ;;
    12.4) source=redist; release=12.4.1; cudnn_wheel= ;;
    *) die "unsupported --cuda '$version': choose 13.0 (driver >= 580), 12.8 (>= 570), 12.6 (>= 560) or 12.4 (>= 550)" ;;
esac

prefix=${prefix:-${XDG_CACHE_HOME:-$HOME/.cache}/densebench-cuda/$version}
repo=$(cd "$(dirname "$0")/.." && pwd)

case "$(uname -m)" in
    x86_64) platforms=(manylinux2010_x86_64 manylinux_2_12_x86_64 manylinux2014_x86_64
                       manylinux_2_17_x86_64 manylinux_2_27_x86_64 manylinux_2_28_x86_64)
            redist_platform=linux-x86_64 ;;
    aarch64) platforms=(manylinux2014_aarch64 manylinux_2_17_aarch64 manylinux_2_27_aarch64
                        manylinux_2_28_aarch64)
             redist_platform=linux-sbsa ;;
    *) die "no NVIDIA wheels for CPU architecture $(uname -m)" ;;
esac

# What this prefix was installed from; a different pin list means reinstall.
if [ "$source" = pypi ]; then
    want="$version ${wheels[*]}"
    if [ "$cudnn" = 1 ]; then want="$want $cudnn_wheel"; fi
else
    [ "$cudnn" = 0 ] || die "--cudnn is only wired for 13.0 (the nvidia-cudnn-cu13 wheel)"
    want="$version redist $release ${redist_components[*]}"
fi
marker=$prefix/.densebench-installed

fetch_wheels() {
    local stage=$1
    python3 -m pip --version >/dev/null 2>&1 || die "python3 has no pip (try: python3 -m ensurepip --user)"
    mkdir -p "$stage/whl"
    local plat=()
    for p in "${platforms[@]}"; do plat+=(--platform "$p"); done
    local list=("${wheels[@]}")
    if [ "$cudnn" = 1 ]; then list+=("$cudnn_wheel"); fi
    say "downloading CUDA $version wheels: ${list[*]}"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
        "${plat[@]}" -d "$stage/whl" "${list[@]}" \
        || die "pip download failed (network to pypi.org? a pin unavailable for $(uname -m)?)"
    for w in "$stage"/whl/*.whl; do python3 -m zipfile -e "$w" "$stage/x"; done
}

fetch_redist() {
    local stage=$1 rel sha
    command -v curl >/dev/null || die "curl not found (needed for CUDA $version's archives)"
    say "fetching NVIDIA's CUDA $release manifest from $redist_base"
    curl -fsSL "$redist_base/redistrib_$release.json" -o "$stage/manifest.json" \
        || die "cannot download $redist_base/redistrib_$release.json"
    python3 - "$stage/manifest.json" "$redist_platform" "${redist_components[@]}" \
        > "$stage/list" <<'PY' || die "manifest lacks a component for $redist_platform"
import json, sys
manifest = json.load(open(sys.argv[1]))
for component in sys.argv[3:]:
    entry = manifest[component][sys.argv[2]]
    print(entry["relative_path"], entry["sha256"])
PY
    mkdir -p "$stage/x/archives"
    while read -r rel sha; do
        say "downloading $rel"
        curl -fsSL "$redist_base/$rel" -o "$stage/archive.tar.xz" || die "cannot download $rel"
        echo "$sha  $stage/archive.tar.xz" | sha256sum -c --quiet - || die "sha256 mismatch: $rel"
        tar -xJf "$stage/archive.tar.xz" -C "$stage/x/archives"
    done < "$stage/list"
    rm -f "$stage/archive.tar.xz"
}

install() {
    command -v python3 >/dev/null || die "python3 not found"
    local stage=$prefix/.stage
    rm -rf "$stage"
    mkdir -p "$stage/x"
    if [ "$source" = pypi ]; then fetch_wheels "$stage"; else fetch_redist "$stage"; fi
    # Merge nvidia/<pkg>/ (wheels) or <component>-archive/ (redist) into the prefix:
    # {bin,include,lib,nvvm,...} side by side, as in a CUDA installation.
    mkdir -p "$prefix"
    for d in "$stage"/x/nvidia/*/ "$stage"/x/archives/*/; do
        [ -d "$d" ] || continue
        case "$(basename "$d")" in __pycache__) continue ;; esac
        find "$d" -name '__pycache__' -prune -exec rm -rf {} +
        find "$d" -name '__init__.py' -delete
        rm -f "$d"LICENSE
        cp -a "$d". "$prefix"/
    done
    rm -rf "$stage"
    chmod +x "$prefix"/bin/* "$prefix"/nvvm/bin/* 2>/dev/null || true
    [ -x "$prefix/bin/nvcc" ] || die "no bin/nvcc in $prefix after unpacking"
}

link_libs() {
    # The linker wants libX.so; the wheels ship libX.so.N only.
    local l f
    for l in libcudart libcublas libcublasLt libcurand libnvrtc libcudnn; do
        if [ -e "$prefix/lib/$l.so" ]; then continue; fi
        f=$(cd "$prefix/lib" && ls "$l".so.* 2>/dev/null | grep -v '\.alt\.' | sort -V | head -n 1 || true)
        if [ -n "$f" ]; then ln -sf "$f" "$prefix/lib/$l.so"; fi
    done
}

driver_present() {
    if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then return 0; fi
    local d
    for d in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib/wsl/lib; do
        if [ -e "$d/libcuda.so.1" ]; then return 0; fi
    done
    return 1
}

build_stub() {
    local stub=$prefix/lib/stubs/libcuda.so
    if [ -e "$stub" ]; then return 0; fi
    if driver_present; then
        say "NVIDIA driver library found: no libcuda stub needed"
        return 0
    fi
    command -v gcc >/dev/null || die "gcc not found (needed to build the link-only libcuda stub)"
    local reg
    reg=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.* 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$reg" ]; then
        say "fetching crates (for cudarc's driver symbols)"
        (cd "$repo" && cargo fetch -q) || die "cargo fetch failed"
        reg=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-0.* | sort -V | tail -n 1)
    fi
    mkdir -p "$prefix/lib/stubs"
    grep -ho 'pub unsafe fn cu[A-Za-z0-9_]*' "$reg"/src/driver/sys/*.rs \
        | sed 's/pub unsafe fn //' | sort -u | awk '{print "void " $1 "(void) {}"}' \
        > "$prefix/lib/stubs/libcuda-stub.c"
    local n
    n=$(wc -l < "$prefix/lib/stubs/libcuda-stub.c")
    [ "$n" -gt 100 ] || die "found only $n driver symbols in $reg"
    gcc -shared -fPIC -o "$stub" -Wl,-soname,libcuda.so.1 "$prefix/lib/stubs/libcuda-stub.c"
    say "built link-only $stub ($n symbols from $(basename "$reg"))"
}

write_env() {
    cat > "$prefix/env.sh" <<EOF
# CUDA $version from NVIDIA's wheels (scripts/install-cuda-toolkit.sh). Source it to build
# densebench with --features cuda; CUDA_COMPUTE_CAP picks the GPU candle's kernels target
# (90 = H100/H200, 80 = A100, 89 = L4/RTX 40xx, 86 = A10/RTX 30xx).
export CUDA_HOME="$prefix"
export CUDA_PATH="$prefix"
export PATH="$prefix/bin:\$PATH"
export LIBRARY_PATH="$prefix/lib:$prefix/lib/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
# At run time on the GPU machine: the toolkit's libcublas, libcurand, libnvrtc (+ builtins).
export LD_LIBRARY_PATH="$prefix/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export CUDA_COMPUTE_CAP="\${CUDA_COMPUTE_CAP:-90}"
EOF
}

# A prefix installed with cuDNN also serves a request without it (no download back and forth
# between a `--cudnn` build and a plain one).
installed=$(cat "$marker" 2>/dev/null || true)
if [ "$cudnn" = 0 ] && [ -n "${cudnn_wheel:-}" ] && [ "$installed" = "$want $cudnn_wheel" ]; then
    want=$installed
fi
if [ "$installed" != "$want" ] || [ ! -x "$prefix/bin/nvcc" ]; then
    install
    printf '%s\n' "$want" > "$marker"
else
    say "CUDA $version already installed in $prefix"
fi
link_libs
build_stub
write_env
say "$("$prefix/bin/nvcc" --version | tail -n 2 | head -n 1)"
if [ "$print_env" = 1 ]; then
    cat "$prefix/env.sh"
else
    say "to use it:  source $prefix/env.sh"
    sed -n '/^export/p' "$prefix/env.sh" >&2
fi
