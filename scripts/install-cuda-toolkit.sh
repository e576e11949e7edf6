#!/usr/bin/env bash
# Install a CUDA toolkit (nvcc) from Debian's own packages so that `--features cuda` can build.
#
# Debian ships NVIDIA's toolkit as `nvidia-cuda-toolkit` (CUDA 11.8 on bookworm) in the
# `contrib`/`non-free` components, which minimal images do not enable. This script:
#   1. adds one deb822 sources file enabling contrib, non-free and non-free-firmware for the
#      running release (the existing sources are left untouched);
#   2. runs `apt-get update` and installs the toolkit plus a host compiler nvcc accepts:
#      nvcc 11.8 refuses GCC > 11 and clang > 14; bookworm's default g++ is 12, but bookworm
#      main also ships g++-11 (11.3), which is what the package's own dependency picks first
#      (see docs/gpu.md for how the build is pointed at it: NVCC_CCBIN=g++-11).
#
# Idempotent (re-running changes nothing once installed) and non-interactive. Run as root.
# Needs about 2.5 GB of free disk and network access to the Debian mirror.
set -euo pipefail

SOURCES_FILE=/etc/apt/sources.list.d/densebench-contrib-non-free.sources
# nvcc 11.8's host_config.h accepts GCC up to 11; bookworm's default g++ is 12.
HOST_PACKAGES=(gcc-11 g++-11)
TOOLKIT_PACKAGES=(nvidia-cuda-toolkit)
# Roughly the installed size of the toolkit and its dependencies, with margin.
NEEDED_MB=3500

die() { echo "install-cuda-toolkit: $*" >&2; exit 1; }

if [ "$(id -u)" -ne 0 ]; then
    die "must run as root (apt-get install)"
fi

if command -v nvcc >/dev/null 2>&1 && command -v g++-11 >/dev/null 2>&1; then
    echo "install-cuda-toolkit: already installed: $(nvcc --version | tail -n 1); $(g++-11 --version | head -n 1)"
    exit 0
fi

[ -r /etc/os-release ] || die "/etc/os-release missing: cannot tell the Debian release"
# shellcheck disable=SC1091
. /etc/os-release
[ "${ID:-}" = debian ] || die "this script is for Debian (found ID=${ID:-unknown})"
CODENAME=${VERSION_CODENAME:?VERSION_CODENAME not set in /etc/os-release}

avail_mb=$(df -Pm /usr | awk 'NR==2 {print $4}')
if [ "${avail_mb:-0}" -lt "$NEEDED_MB" ]; then
    die "need about ${NEEDED_MB} MB free under /usr, only ${avail_mb} MB available"
fi

# Reuse the mirror the machine already uses (first non-security debian URI), else the default.
MIRROR=$(grep -hE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '{print $2}' | grep -v -- '-security' | grep -m1 debian || true)
if [ -z "$MIRROR" ] && [ -r /etc/apt/sources.list ]; then
    MIRROR=$(awk '$1=="deb" && $0 !~ /security/ && $0 ~ /debian/ {print $2; exit}' /etc/apt/sources.list)
fi
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=http://deb.debian.org/debian-security

wanted=$(cat <<EOF
# Written by densebench scripts/install-cuda-toolkit.sh: contrib/non-free for nvidia-cuda-toolkit.
Types: deb
URIs: ${MIRROR}
Suites: ${CODENAME} ${CODENAME}-updates
Components: contrib non-free non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${SECURITY_MIRROR}
Suites: ${CODENAME}-security
Components: contrib non-free non-free-firmware
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
)

if [ ! -f "$SOURCES_FILE" ] || [ "$(cat "$SOURCES_FILE")" != "$wanted" ]; then
    echo "install-cuda-toolkit: enabling contrib non-free non-free-firmware in $SOURCES_FILE"
    printf '%s\n' "$wanted" > "$SOURCES_FILE"
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${HOST_PACKAGES[@]}" "${TOOLKIT_PACKAGES[@]}"

command -v nvcc >/dev/null 2>&1 || die "nvidia-cuda-toolkit installed but nvcc is not on PATH"
echo "install-cuda-toolkit: done: $(nvcc --version | tail -n 1); $(g++-11 --version | head -n 1)"
