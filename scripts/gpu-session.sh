#!/usr/bin/env bash
# On a GPU machine without Rust: unpacks the binaries scripts/gpu-pack.sh put in .gpu/, finds
# the CUDA libraries they link, and runs the GPU checklist of issue 11, writing everything under
# $OUT (default /tmp/densebench-gpu). Stages, in order (default: all of them):
#
#   bash scripts/gpu-session.sh [info] [tests] [warm] [sweep] [tf32] [report]
#
#   info    nvidia-smi, driver vs the toolkit the binaries were built with, PyTorch's version
#   tests   the packed GPU test binaries (fused CUDA kernels vs the CPU, pool peaks, GPU CLI
#           tests through DENSEBENCH_BIN): $OUT/tests.log
#   tf32    `run --math tf32` (cat-store-copy) on the configs of docs/gpu.md's TF32 table: each
#           row's note has the tf32 step's own error against f64, to compare with the CPU
#           emulation's numbers there: $OUT/tf32.csv and $OUT/tf32.txt
#   warm    the compiled PyTorch rows the sweep reaches next (those not in .gpu/reference-gpu.csv,
#           in the sweep's order), compiled several at a time for DENSEBENCH_WARM_SECS (default
#           90; no compile started after it) so that the sweep's own compiled peers find
#           inductor's on-disk caches warm (scripts/warm_compile.py): $OUT/warm.csv (each block's
#           cold wall time) and $OUT/warm.txt. Nothing is timed while it runs. It yields to the
#           stages after it (the sweep's four minutes first) and is skipped, not failed, when
#           they leave it under 10 s.
#   sweep   harness/sweeps/gpu.toml with the PyTorch peer rows (when PyTorch is importable),
#           resumable: $OUT/reference-gpu.csv. A sweep longer than one command's time limit is
#           stopped cleanly after DENSEBENCH_SWEEP_SECS (default 480) and goes on with --resume
#           when the CSV is given back in .gpu/reference-gpu.csv on the next call; without that
#           file, from the committed results/reference-*.csv of this GPU (its rows name it).
#           Its whole log in $OUT/sweep.txt: each row's line says where its process's time went
#           ([process 12.3 s: import …, setup …, warm-up …; check …] for a PyTorch row).
#   report  plots (one tarball, $OUT/plots.tar.gz) and the Markdown report ($OUT/REPORT-gpu.md)
#   fidelity  issue 36's fidelity check on cuda:0 (scripts/peer_fidelity.py): every job of
#           versus-pytorch.toml and gpu.toml, densebench's and PyTorch's (eager and compiled),
#           timed the harness's way and in a bare loop with CUDA events, within ±5 %:
#           $OUT/fidelity.csv and $OUT/fidelity.txt (not a default stage; it may need more than
#           one call: name variants with DENSEBENCH_FIDELITY_ARGS="--variants a,b")
#   bf16    issue 39's first GPU rows in bf16: harness/sweeps/bf16-vs-pytorch.toml on cuda:0
#           (BC-100 L=16 and the forum mlp L=32, f32 and bf16, two variants each) beside PyTorch
#           eager under torch.autocast when the peer has CUDA: $OUT/bf16.csv (resumable from
#           .gpu/bf16.csv) and the `report` of it, $OUT/bf16.md (not a default stage)
#   front   issue 38's split front on the GPU against the whole front (DENSEBENCH_WHOLE_FRONT=1),
#           side by side, for the recomputing variants of BC-100's block at L = 16 and 48:
#           peaks and times, $OUT/front.csv and $OUT/front.txt; then buffer-recompute-inplace's
#           cut at the model's slack against coarser ones (DENSEBENCH_FRONT_SLACK 0.05, 0.25;
#           on the tap stack the slack also takes fewer tap chunks, picked with the cut):
#           $OUT/front-slack.csv and .txt (not a default stage)
#   placement  whether an eager step's time follows the CPU its process runs on (issue 36: eager
#           fidelity pairs ±20 % apart, graph pairs exact): scripts/placement.py, BC-100 L=16
#           buffer-recompute-inplace pinned to every second CPU and unpinned, two rounds:
#           $OUT/placement.txt and .csv (not a default stage)
#   chunks  the 3×3 tap stack in the chunks the memory model picks vs one chunk
#           (DENSEBENCH_TAP_CHUNK_COLUMNS=0), side by side, on the torchvision-style block at
#           L = 6 and BC-100's at L = 16: $OUT/chunks.csv and $OUT/chunks.txt (not a default stage)
#   conv    issue 38's 3×3 convolution in cuDNN (a binary built with the `cudnn` feature) and in
#           densebench's direct kernels, on tensor cores (DENSEBENCH_CONV=direct) and in FMA
#           only (direct-fma), against the tap stack (DENSEBENCH_CONV=tap-stack), side by side,
#           cat-store-copy and buffer-recompute-inplace on BC-100's block at L = 16 and the
#           torchvision-style block at L = 6, `--math tf32 --execution graph`
#           (DENSEBENCH_CONV_ARGS to change): times, peaks and each row's kernels,
#           $OUT/conv.csv and $OUT/conv.txt; the four in bf16 on BC-100 L=16
#           ($OUT/conv-bf16.csv and .txt); cuDNN, direct and the tap stack in IEEE FP32 on BC-100
#           L=16 ($OUT/conv-ieee.csv and .txt); the four on BC-100 L=48 as conv.txt
#           ($OUT/conv-deep.csv and .txt); then on
#           BC-100 L=16 cuDNN as planned against every pass on packed copies
#           (DENSEBENCH_CUDNN_STAGING=packed): $OUT/conv-staging.csv and .txt (not a default stage)
#   recompute  the four recomputing variants (cat-/buffer-recompute-copy/-inplace) on the direct
#           kernels, in cuDNN and on the tap stack, side by side, BC-100 L=16 and the
#           torchvision-style block at L=6, `--math tf32 --execution graph`
#           (DENSEBENCH_CONV_ARGS to change): what a 3×3 convolution that follows the variant
#           (the tap stack for storing variants, another for recomputing ones) would be decided
#           on; `conv` timed only buffer-recompute-inplace of them. $OUT/recompute.csv and .txt
#           (not a default stage; some 24 rows, three to four minutes)
#   flips   the forum mlp at L = 64 stepped on the GPU, its ReLU decisions that differ from
#           exact arithmetic counted (scripts/relu_flips.py): $OUT/flips.txt (not a default stage)
#   sanitize  compute-sanitizer's memcheck, racecheck, synccheck and initcheck on the kernel
#           tests (test-fused_cuda), then memcheck on one step of every hand-written variant on
#           tiny bc and mlp cases: $OUT/sanitize.txt, each tool's log beside it (not a default
#           stage; a few minutes)
#   profile one BC-100 L = 16 step (DENSEBENCH_PROFILE_DEPTH to change L) of cat-store-copy and
#           buffer-recompute-inplace, and of the PyTorch peer's naive and memory-efficient
#           blocks when PyTorch is importable, under `ncu --metrics gpu__time_duration.sum`:
#           kernel launches, kernel time and the heaviest kernels of each, side by side
#           (scripts/ncu_summary.py): $OUT/profile.txt, the CSV exports and ncu reports beside
#           it (not a default stage); DENSEBENCH_PROFILE_ARGS adds `step` flags to densebench's
#           two (e.g. '--math tf32'), DENSEBENCH_PROFILE_CASE_ARGS to the case (e.g. '--dtype
#           bf16'), DENSEBENCH_CONV picks their convolution as everywhere
#
# Time: one call of a lent GPU machine may run 10 minutes. The stages share a budget of
# DENSEBENCH_SESSION_SECS (default 540) from the script's start: every command is bounded by
# what is left of it (`timeout`), the sweep stops cleanly when it runs out (its CSV resumable),
# and a stage that finds less than a minute left is not started ("not run: out of time") and
# fails the call, to be named in the next one. Rows time out after gpu.toml's timeout_secs.
#
# Everything written under $OUT is also packed into $OUT/00-all.tgz at the end: a lent
# machine's reply brings back only the first few files by name.
#
# Exit status: that of the first stage that failed (the later ones still run).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

known=(info tests tf32 warm sweep report fidelity bf16 front chunks conv recompute placement flips sanitize profile)
case "${1:-}" in
    -h|--help)
        sed -n '2,/^# Exit status/p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
esac
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(info tests warm sweep tf32 report)
# Every stage name checked before any work: a typo must not cost a GPU lease's minutes first.
for stage in "${stages[@]}"; do
    case " ${known[*]} " in
        *" $stage "*) ;;
        *) echo "gpu-session: unknown stage '$stage' (${known[*]}); nothing was run" >&2; exit 2 ;;
    esac
done
[ -f .gpu/densebench.gz ] || { echo "gpu-session: .gpu/densebench.gz is missing: run scripts/gpu-pack.sh where Rust is, and carry .gpu" >&2; exit 2; }
OUT=${OUT:-/tmp/densebench-gpu}
mkdir -p "$OUT"
status=0
fail() { echo "gpu-session: $*" >&2; [ "$status" -ne 0 ] || status=1; }

# The session's time budget (see the header): seconds left, and a cap for one command.
budget=${DENSEBENCH_SESSION_SECS:-540}
case "$budget" in ''|*[!0-9]*) echo "gpu-session: DENSEBENCH_SESSION_SECS must be a whole number of seconds" >&2; exit 2 ;; esac
left() { echo $(( budget - SECONDS )); }
# cap N: N seconds, or what is left of the budget less 15 s for the stages' own ends (at least 1)
cap() { local l; l=$(( $(left) - 15 )); [ "$l" -ge 1 ] || l=1; [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }
# bounded N CMD...: CMD under `timeout` (TERM, then KILL 10 s later); 124/137 mean it ran out
bounded() { local n; n=$(cap "$1"); shift; timeout -k 10 "$n" "$@"; }

# The driver's JIT cache (candle's kernels are PTX): kept where it can be written, so only the
# first process of the session compiles them.
export CUDA_CACHE_PATH=${CUDA_CACHE_PATH:-/tmp/densebench-cuda-jit}
# densebench's own kernels: NVRTC's PTX, kept on disk so each row's process does not compile it
# again (impls::ops::cuda::ptx_cache; a folder that can be written on a lent machine).
export DENSEBENCH_PTX_CACHE=${DENSEBENCH_PTX_CACHE:-/tmp/densebench-ptx}
# Rows name the revision the binaries were built from: recorded in them at build time (the
# checkout here may have no .git); .gpu/git-rev says the same for info.
# Whether the PyTorch peer can run on this GPU: importable and CUDA available (a peer without
# CUDA would fail every peer row and every tolerance it is asked for).
# Asked once per call (it imports PyTorch: seconds); `info` prints the answer's JSON.
peer_json=""
peer_asked=""
peer_check() {
    [ -n "$peer_asked" ] || { peer_json=$(bounded 120 "${peer_env[@]}" python3 harness/peer/pytorch_peer.py --check 2>/dev/null); peer_asked=1; }
    [ -n "$peer_json" ]
}
peer_on_gpu() {
    peer_check && echo "$peer_json" | grep -q '"cuda_available": *true'
}

# The CUDA libraries the binaries link (cuBLAS, cuRAND, NVRTC, the runtime), wherever this
# machine has them (a system CUDA or PyTorch's nvidia-* wheels).
# The PyTorch peer keeps the library path it had (it loads the CUDA libraries it ships with,
# as outside densebench): densebench passes this to it, and the script's own peer calls use it.
export DENSEBENCH_PEER_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
peer_env=(env "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}")
# NVRTC first (its folder leads LD_LIBRARY_PATH, ahead of a newer one beside cuBLAS).
# NVRTC compiles densebench's kernels to PTX at run time, and a driver refuses PTX of a newer
# CUDA: of several libnvrtc.so.13 (a system CUDA, PyTorch's wheels) the newest that is no newer
# than the driver's CUDA version (nvidia-smi's "CUDA Version") is taken. densebench itself
# refuses a newer one with one line (docs/gpu.md).
driver_cuda=$(nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | head -n 1 | awk '{print $3}')
nvrtc_version() {
    python3 -c 'import ctypes, sys
l = ctypes.CDLL(sys.argv[1]); a, b = ctypes.c_int(), ctypes.c_int()
sys.exit(1) if l.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)) else print(f"{a.value}.{b.value}")' "$1" 2>/dev/null
}
# The newest of the files named on stdin that is no newer than the driver; empty if none.
newest_nvrtc() {
    local best="" best_v="" f v
    while read -r f; do
        [ -n "$f" ] || continue
        v=$(nvrtc_version "$f") || continue
        # no newer than the driver, and newer than the best so far (version order)
        [ "$(printf '%s\n%s\n' "$v" "$driver_cuda" | sort -V | tail -n 1)" = "$driver_cuda" ] || continue
        if [ -z "$best" ] || [ "$(printf '%s\n%s\n' "$v" "$best_v" | sort -V | tail -n 1)" = "$v" ]; then
            best=$f best_v=$v
        fi
    done
    [ -n "$best" ] && echo "libnvrtc: $best (CUDA $best_v; driver CUDA $driver_cuda)" >&2
    echo "$best"
}
# PyTorch's nvidia-* wheels, asked of Python (its site-packages may be on another filesystem
# than /, which `find / -xdev` does not enter); then the root filesystem, bounded.
wheel_roots=$(python3 -c 'import nvidia; print(*nvidia.__path__)' 2>/dev/null || true)
find_everywhere() {
    local found=""
    # shellcheck disable=SC2086  # the roots are words
    [ -z "$wheel_roots" ] || found=$(timeout 60 find $wheel_roots -name "$1" 2>/dev/null)
    [ -n "$found" ] || found=$(timeout 120 find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$1" -print 2>/dev/null)
    echo "$found"
}
# A system CUDA's first; the wheels (and the disk) only when none of those will do.
pick_nvrtc() {
    local f
    f=$(ls /usr/local/cuda*/targets/x86_64-linux/lib/libnvrtc.so.13 \
        /usr/local/cuda*/lib64/libnvrtc.so.13 2>/dev/null | newest_nvrtc)
    [ -n "$f" ] || f=$(find_everywhere libnvrtc.so.13 | newest_nvrtc)
    echo "$f"
}
dirs=""
# cuDNN 9 where the binary links it (built with the `cudnn` feature: scripts/gpu-pack.sh's
# default), PyTorch's own (its nvidia/cudnn/lib, with the sub-libraries cuDNN loads beside it).
libs="libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libcudart.so.13"
if [ -e .gpu/densebench.gz ] && gunzip -c .gpu/densebench.gz | grep -ac 'libcudnn\.so\.9' > /dev/null; then
    libs="$libs libcudnn.so.9"
fi
for l in $libs; do
    f=""
    [ "$l" != libnvrtc.so.13 ] || [ -z "$driver_cuda" ] || f=$(pick_nvrtc)
    [ -n "$f" ] || f=$(ls /usr/local/cuda*/targets/x86_64-linux/lib/$l /usr/local/cuda*/lib64/$l 2>/dev/null | head -n 1)
    [ -n "$f" ] || f=$(find_everywhere "$l" | head -n 1)
    [ -n "$f" ] || { fail "$l not found on this machine"; continue; }
    case ":$dirs:" in *":$(dirname "$f"):"*) ;; *) dirs="$dirs:$(dirname "$f")" ;; esac
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

bin=/tmp/densebench-gpu-bin
mkdir -p "$bin"
for f in .gpu/*.gz; do
    gunzip -c "$f" > "$bin/$(basename "$f" .gz)" && chmod +x "$bin/$(basename "$f" .gz)"
done
export DENSEBENCH_BIN="$bin/densebench"
db="$DENSEBENCH_BIN"

# The least time a stage is started with (report: seconds of work; the others: a minute).
least() { case "$1" in report) echo 20 ;; *) echo 60 ;; esac; }
# What a stage leaves for the stages named after it: their least time, tf32 (seven rows) a
# minute and a half, the sweep four minutes.
reserve_after() {
    local after="" t r=0
    for t in "${stages[@]}"; do
        if [ -n "$after" ]; then
            case "$t" in
                sweep) r=$(( r + 240 )) ;;  # the call's main product: never squeezed out
                tf32) r=$(( r + 90 )) ;;
                *) r=$(( r + $(least "$t") + 10 )) ;;
            esac
        fi
        [ "$t" != "$1" ] || after=1
    done
    echo "$r"
}
# side_by_side NAME VAR SETTINGS VARIANTS NOTE [RUN ARGS...]: each config read from stdin
# ("label args...") and each variant run with VAR set to each of the comma-separated SETTINGS in
# turn (`model`: VAR unset, the memory model's choice), rows appended to $OUT/NAME.csv, then
# paired per key by scripts/side_by_side.py (NOTE: the regex of each row's note to show) into
# $OUT/NAME.txt. The A/B stages (front, chunks, conv) are this with their own settings.
# SIDE_ENV (an array of VAR=value) is set for every run of the call, besides VAR.
SIDE_ENV=()
side_by_side() {
    local name=$1 var=$2 settings=$3 variants=$4 note=$5 label args v setting row
    shift 5
    local csv="$OUT/$name.csv"
    : > "$csv"
    while read -r label args; do
        for v in $variants; do
            for setting in ${settings//,/ }; do
                local set_var=()
                [ "$setting" = model ] || set_var=("$var=$setting")
                [ "$(left)" -ge 30 ] || { fail "$name run '$label' $v ($setting): not run: out of time"; continue; }
                # shellcheck disable=SC2086  # the config's flags are words
                row=$(bounded 180 env "${SIDE_ENV[@]}" "${set_var[@]}" "$db" run $args "$@" --variant "$v" --device cuda:0 < /dev/null 2>> "$OUT/$name.err") \
                    || fail "$name run '$label' $v ($var=$setting) exited $? (see $name.err)"
                [ -n "$row" ] || continue
                if [ -s "$csv" ]; then echo "$row" | tail -n +2 >> "$csv"; else echo "$row" >> "$csv"; fi
            done
        done
    done
    [ -s "$csv" ] || { fail "$name: no rows"; return; }
    python3 scripts/side_by_side.py "$csv" --settings "$settings" --note "$note" --log "$name.err" \
        | tee "$OUT/$name.txt"
}

# $OUT/reference-gpu.csv, the sweep's file: .gpu/reference-gpu.csv resumed (copied once per
# call) when its rows are of this GPU and of this result schema, else set aside under another
# name and none (the sweep starts a new one). Without a .gpu/reference-gpu.csv, the committed
# reference of this GPU (results/reference-*.csv whose rows name it, of this result schema:
# results/reference-h200.csv on an H200) is resumed instead, so a call that was not handed the
# file does not measure its rows again. Used by `warm` (what is measured already) and `sweep`.
# Whether result CSV $1 is of this binary's result schema (its header ends in issue 36's columns).
current_schema() { head -n 1 "$1" | grep -q ',execution,compile_ns$'; }
# Whether result CSV $2 holds a row of GPU $1: a `device_desc` field that is the name and then
# " (sm_…" — the whole name, so that "NVIDIA H200" is not taken for "NVIDIA H200 NVL".
names_gpu() { grep -qF -e ",\"$1 (sm_" -e ",$1 (sm_" "$2"; }

resume_reference() {
    local csv="$OUT/reference-gpu.csv" gpu_name src=.gpu/reference-gpu.csv f
    [ ! -f "$csv" ] || return 0
    gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    if [ ! -f "$src" ]; then
        src=""
        [ -n "$gpu_name" ] || return 0
        for f in results/reference-*.csv; do
            [ -f "$f" ] && current_schema "$f" && names_gpu "$gpu_name" "$f" && { src=$f; break; }
        done
        [ -n "$src" ] || return 0
        echo "gpu-session: no .gpu/reference-gpu.csv: resuming the committed $src ($(( $(wc -l < "$src") - 1 )) rows of this $gpu_name)" >&2
    fi
    cp "$src" "$csv" && chmod u+w "$csv"
    # Resumed rows must be of this GPU: a call on another kind (an H200 for an H100) would mix
    # two devices' rows under one key.
    if [ "$(wc -l < "$csv")" -gt 1 ] && [ -n "$gpu_name" ] && ! names_gpu "$gpu_name" "$csv"; then
        # kept (it comes back as reference-gpu-other.csv), and this call's sweep starts a file
        # of its own GPU instead of running nothing
        mv "$csv" "$OUT/reference-gpu-other.csv"
        echo "gpu-session: .gpu/reference-gpu.csv holds rows of another GPU than this $gpu_name: not resumed (kept as reference-gpu-other.csv); this sweep starts a new reference-gpu.csv" >&2
        return 0
    fi
    # A resumed file of an older result schema (a reference before the timed-step fix of issue
    # 36: its peer rows were timed with hooks inside the step) is kept aside, not resumed: its
    # rows are not this binary's to append to.
    if ! current_schema "$csv"; then
        mv "$csv" "$OUT/reference-gpu-old-schema.csv"
        echo "gpu-session: .gpu/reference-gpu.csv is of an older result schema: kept as reference-gpu-old-schema.csv; this sweep starts a new reference-gpu.csv" >&2
    fi
}

for stage in "${stages[@]}"; do
    if [ "$(left)" -lt "$(least "$stage")" ]; then
        fail "$stage: not run: out of time ($(left) s left of DENSEBENCH_SESSION_SECS=$budget); name it in the next call"
        continue
    fi
    case "$stage" in
    info)
        peer_check || true  # here, not in the pipeline's subshell below: its answer is kept
        {
            nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
            echo "built with CUDA $(cat .gpu/cuda-version 2>/dev/null || echo '?') at $(cat .gpu/git-rev 2>/dev/null || echo '?')"
            if [ -n "$peer_json" ]; then echo "$peer_json"; else echo "PyTorch peer: not available"; fi
            # one tiny row: what a process costs here (context, cuBLAS, NVRTC; it also fills the
            # driver's JIT cache for the stages after it)
            start=$SECONDS
            bounded 180 "$db" run --family mlp --variant buffer-store-inplace --depth 2 --batch 64 \
                --channels 8 --growth 4 --device cuda:0 < /dev/null > "$OUT/info-run.csv" 2> "$OUT/info-run.err" \
                && echo "a tiny cuda:0 row: $(( SECONDS - start )) s, the process included" \
                || echo "a tiny cuda:0 row FAILED (see info-run.err): $(tail -n 1 "$OUT/info-run.err")"
        } 2>&1 | tee "$OUT/info.txt"
        ;;
    tests)
        : > "$OUT/tests.log"
        for t in "$bin"/test-*; do
            [ -e "$t" ] || continue
            echo "== $(basename "$t")" | tee -a "$OUT/tests.log"
            # From the repository root: the tests read files relative to it.
            # at most 300 s, and never the time the stages after it need
            n=$(( $(left) - $(reserve_after tests) ))
            [ "$n" -le 300 ] || n=300
            [ "$n" -ge 30 ] || n=30
            bounded "$n" "$t" --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1 || fail "$(basename "$t") failed or ran out of time (exit $?; see tests.log)"
            grep -E "^test result|FAILED|panicked" "$OUT/tests.log" | tail -n 3
        done
        ;;
    tf32)
        csv="$OUT/tf32.csv"
        : > "$csv"
        : > "$OUT/tf32.txt"
        while read -r label args; do
            [ "$(left)" -ge $(( 30 + $(reserve_after tf32) )) ] || { fail "tf32 '$label' and after: not run: out of time"; break; }
            # A row out of tolerance exits 1 but is printed: kept (its note is what this is for).
            row=$(bounded 180 "$db" run $args --variant cat-store-copy --device cuda:0 --math tf32 < /dev/null 2>> "$OUT/tf32.err") \
                || fail "tf32 run '$label' exited $? (see tf32.err)"
            [ -n "$row" ] || continue
            if [ -s "$csv" ]; then echo "$row" | tail -n +2 >> "$csv"; else echo "$row" >> "$csv"; fi
            echo "$label: $(echo "$row" | tail -n 1 | grep -o "the tf32 step's own error against f64 is [^;\",]*")" \
                | tee -a "$OUT/tf32.txt"
        done <<'CONFIGS'
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
bc100-32-n16 --family bc --batch 16 --channels 24 --growth 12 --size 32 --depth 32
bc100-48-n16 --family bc --batch 16 --channels 24 --growth 12 --size 32 --depth 48
torchvision-6 --family bc --batch 32 --channels 64 --growth 32 --size 56 --depth 6
mlp-16 --family mlp --batch 4096 --channels 256 --growth 64 --depth 16
mlp-32 --family mlp --batch 4096 --channels 256 --growth 64 --depth 32
mlp-64 --family mlp --batch 4096 --channels 256 --growth 64 --depth 64
CONFIGS
        ;;
    warm)
        # The compiled peer rows the sweep reaches next, compiled several at a time so that
        # its own peers find inductor's caches warm (scripts/warm_compile.py); nothing is timed.
        if ! peer_on_gpu; then
            echo "gpu-session: warm: PyTorch is not importable here or has no CUDA: nothing to compile"
            continue
        fi
        resume_reference
        done_csv=()
        [ ! -f "$OUT/reference-gpu.csv" ] || done_csv=(--done "$OUT/reference-gpu.csv")
        wsecs=${DENSEBENCH_WARM_SECS:-90}
        most=$(( $(left) - $(reserve_after warm) - 90 ))
        [ "$wsecs" -le "$most" ] || wsecs=$most
        # an optimisation, not a check: squeezed out by the stages after it, it only says so
        [ "$wsecs" -ge 10 ] || { echo "gpu-session: warm: skipped, the stages after it need the $(left) s left"; continue; }
        # no compile started after $wsecs s; those started get 90 s more to finish
        timeout -s TERM -k 15 $(( wsecs + 90 )) "${peer_env[@]}" python3 scripts/warm_compile.py \
            --densebench "$db" --device cuda:0 "${done_csv[@]}" --budget "$wsecs" \
            --csv "$OUT/warm.csv" 2>&1 | tee "$OUT/warm.txt" | tail -n 40
        code=${PIPESTATUS[0]}
        [ "$code" -eq 0 ] || fail "warm exited $code (see warm.txt; a failed compile is an error row in the sweep)"
        ;;
    sweep)
        csv="$OUT/reference-gpu.csv"
        resume_reference
        peer=()
        if peer_on_gpu; then
            # PyTorch eager and compiled (reduce-overhead: CUDA graphs), issue 36
            peer=(--peer pytorch-compiled)
        else
            echo "gpu-session: PyTorch is not importable here or has no CUDA: the sweep runs without peer rows" >&2
        fi
        # SIGTERM after its budget (DENSEBENCH_SWEEP_SECS, at most what the session has left
        # less the stages named after it (reserve_after) and the 30 s its stop may take): the
        # harness stops its child, keeps every finished row and leaves a valid CSV for --resume.
        secs=${DENSEBENCH_SWEEP_SECS:-480}
        most=$(( $(left) - $(reserve_after sweep) - 30 ))
        [ "$secs" -le "$most" ] || secs=$most
        [ "$secs" -ge 30 ] || secs=30
        timeout -s TERM -k 30 "$secs" "$db" bench-all --sweep harness/sweeps/gpu.toml \
            "${peer[@]}" --resume --out "$csv" 2>&1 | tee "$OUT/sweep.txt" | tail -n 40
        code=${PIPESTATUS[0]}
        if [ "$code" -eq 124 ]; then
            echo "gpu-session: sweep stopped after $secs s; copy $csv back into .gpu/ and run the sweep stage again to go on"
        elif [ "$code" -ne 0 ]; then
            fail "the sweep exited with $code"
        fi
        ;;
    fidelity)
        # Issue 36: every job of versus-pytorch.toml and gpu.toml timed the harness's way and in
        # a bare loop (CUDA events), harness / bare within ±5 %; resumable by hand with
        # --variants. PyTorch's jobs need the peer on CUDA.
        fpeer=none
        if peer_on_gpu; then fpeer=pytorch-compiled; fi
        secs=$(( $(left) - $(reserve_after fidelity) - 15 ))
        [ "$secs" -ge 30 ] || { fail "fidelity: not run: out of time"; continue; }
        timeout -s TERM -k 15 "$secs" "${peer_env[@]}" python3 scripts/peer_fidelity.py \
            --densebench "$db" --device cuda:0 --peer "$fpeer" --steps 10 --warmup 3 --repeat 2 \
            --csv "$OUT/fidelity.csv" ${DENSEBENCH_FIDELITY_ARGS:-} 2>&1 | tee "$OUT/fidelity.txt" | tail -n 60
        code=${PIPESTATUS[0]}
        [ "$code" -eq 0 ] || fail "fidelity exited $code (see fidelity.txt)"
        ;;
    bf16)
        csv="$OUT/bf16.csv"
        [ ! -f .gpu/bf16.csv ] || { cp .gpu/bf16.csv "$csv" && chmod u+w "$csv"; }
        bpeer=()
        if peer_on_gpu; then bpeer=(--peer pytorch); fi
        secs=$(( $(left) - $(reserve_after bf16) - 30 ))
        [ "$secs" -ge 30 ] || { fail "bf16: not run: out of time"; continue; }
        timeout -s TERM -k 30 "$secs" "$db" bench-all --sweep harness/sweeps/bf16-vs-pytorch.toml \
            --devices cuda:0 "${bpeer[@]}" --resume --out "$csv" 2>&1 | tail -n 40
        code=${PIPESTATUS[0]}
        if [ "$code" -eq 124 ]; then
            echo "gpu-session: bf16 stopped after $secs s; copy $csv back into .gpu/ and run the bf16 stage again to go on"
        elif [ "$code" -ne 0 ]; then
            fail "the bf16 sweep exited with $code"
        fi
        [ ! -s "$csv" ] || bounded 60 "$db" report "$csv" --out "$OUT/bf16.md" > /dev/null 2>&1 \
            || fail "bf16: report failed"
        ;;
    report)
        csv="$OUT/reference-gpu.csv"
        [ -f "$csv" ] || { fail "no $csv: run the sweep stage first"; continue; }
        rm -rf /tmp/densebench-gpu-plots
        bounded 120 "$db" plots "$csv" --out /tmp/densebench-gpu-plots || fail "plots failed"
        tar -C /tmp -czf "$OUT/plots.tar.gz" densebench-gpu-plots
        # the figures of this CSV (the repository's plots/ are the CPU reference's)
        bounded 60 "$db" report "$csv" --out "$OUT/REPORT-gpu.md" --plots /tmp/densebench-gpu-plots \
            || fail "report failed"
        ;;
    front)
        configs="bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
bc100-48 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 48"
        # the model's schedule (split where it pays), then the front whole
        # (timed as CUDA-graph replays: eager times of these launch-bound steps scatter by ±20 %
        # from one process to the next, docs/gpu.md "On an H100 again")
        side_by_side front DENSEBENCH_WHOLE_FRONT 0,1 "buffer-recompute-inplace cat-recompute-inplace" \
            "(bc layer fronts split|3×3 tap stack in)[^;]*" --execution graph <<< "$configs"
        # the split's cut: the model's slack, then coarser cuts (fewer launches, higher peaks)
        side_by_side front-slack DENSEBENCH_FRONT_SLACK model,0.05,0.25 "buffer-recompute-inplace" \
            "(bc layer fronts split|3×3 tap stack in)[^;]*" --execution graph <<< "$configs"
        ;;
    placement)
        work=/tmp/densebench-placement
        mkdir -p "$work"
        bounded 120 "$db" case --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16 \
            --out "$work/case.st" > /dev/null 2> "$OUT/placement.err" \
            || { fail "placement: the case failed (see placement.err)"; continue; }
        secs=$(( $(left) - $(reserve_after placement) - 15 ))
        [ "$secs" -ge 30 ] || { fail "placement: not run: out of time"; continue; }
        timeout -s TERM -k 15 "$secs" python3 scripts/placement.py --densebench "$db" \
            --case "$work/case.st" --variant buffer-recompute-inplace --device cuda:0 --cpus half \
            --repeat 2 --csv "$OUT/placement.csv" 2>&1 | tee "$OUT/placement.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || fail "placement failed or ran out of time (see placement.txt)"
        ;;
    chunks)
        # the model's chunks (the note says how many), then one chunk forced
        side_by_side chunks DENSEBENCH_TAP_CHUNK_COLUMNS model,0 \
            "buffer-recompute-inplace cat-store-inplace cat-store-copy" "3×3 tap stack in [^;]*" <<'CONFIGS'
torchvision-6 --family bc --batch 32 --channels 64 --growth 32 --size 56 --depth 6
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
CONFIGS
        ;;
    conv)
        # cuDNN (each pass on the strides where cuDNN plans it, else on packed copies: the
        # note says which), densebench's direct kernels with their forward and data passes on
        # tensor cores (TF32 here) and all in FMA (direct-fma), then the tap stack
        # shellcheck disable=SC2086  # the extra flags are words
        side_by_side conv DENSEBENCH_CONV cudnn,direct,direct-fma,tap-stack "cat-store-copy buffer-recompute-inplace" \
            "3×3 (convolution in cuDNN|convolution in densebench's direct|tap stack)[^;]*" ${DENSEBENCH_CONV_ARGS:---math tf32 --execution graph} <<'CONFIGS'
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
torchvision-6 --family bc --batch 32 --channels 64 --growth 32 --size 56 --depth 6
CONFIGS
        # bf16 (autocast's semantics) on BC-100 L=16: the direct kernels' bf16 tensor cores
        # against their FMA, cuDNN and the tap stack (issue 39's bf16 time)
        side_by_side conv-bf16 DENSEBENCH_CONV cudnn,direct,direct-fma,tap-stack "cat-store-copy buffer-recompute-inplace" \
            "3×3 (convolution in cuDNN|convolution in densebench's direct|tap stack)[^;]*" --dtype bf16 --execution graph <<'CONFIGS'
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
CONFIGS
        # the same in IEEE FP32 on BC-100 L=16 (the direct kernels run FMA only there; the
        # tap stack's GEMMs and cuDNN compute IEEE FP32 too)
        side_by_side conv-ieee DENSEBENCH_CONV cudnn,direct,tap-stack "cat-store-copy buffer-recompute-inplace" \
            "3×3 (convolution in cuDNN|convolution in densebench's direct|tap stack)[^;]*" --math ieee --execution graph <<'CONFIGS'
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
CONFIGS
        # BC-100 at L=48 (issue 38's frugal peak target, 345 MiB), last: the tables above come
        # first when the call runs short
        # shellcheck disable=SC2086  # the extra flags are words
        side_by_side conv-deep DENSEBENCH_CONV cudnn,direct,direct-fma,tap-stack "cat-store-copy buffer-recompute-inplace" \
            "3×3 (convolution in cuDNN|convolution in densebench's direct|tap stack)[^;]*" ${DENSEBENCH_CONV_ARGS:---math tf32 --execution graph} <<'CONFIGS'
bc100-48 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 48
CONFIGS
        # what the packed fallback costs: cuDNN's passes where cuDNN plans them against every
        # pass on packed copies (DENSEBENCH_CUDNN_STAGING=packed), BC-100 L=16
        SIDE_ENV=(DENSEBENCH_CONV=cudnn)
        # shellcheck disable=SC2086  # the extra flags are words
        side_by_side conv-staging DENSEBENCH_CUDNN_STAGING model,packed "cat-store-copy buffer-recompute-inplace" \
            "3×3 convolution in cuDNN[^;]*" ${DENSEBENCH_CONV_ARGS:---math tf32 --execution graph} <<'CONFIGS'
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
CONFIGS
        SIDE_ENV=()
        ;;
    recompute)
        # the recomputing variants on each convolution (direct first: the candidate default
        # for them), the storing ones' default (the tap stack) last
        # shellcheck disable=SC2086  # the extra flags are words
        side_by_side recompute DENSEBENCH_CONV direct,cudnn,tap-stack \
            "cat-recompute-copy cat-recompute-inplace buffer-recompute-copy buffer-recompute-inplace" \
            "3×3 (convolution in cuDNN|convolution in densebench's direct|tap stack)[^;]*" ${DENSEBENCH_CONV_ARGS:---math tf32 --execution graph} <<'CONFIGS'
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
torchvision-6 --family bc --batch 32 --channels 64 --growth 32 --size 56 --depth 6
CONFIGS
        ;;
    flips)
        work=/tmp/densebench-flips
        mkdir -p "$work"
        args="--family mlp --batch 4096 --channels 256 --growth 64 --depth 64"
        {
            bounded 120 "$db" case $args --out "$work/case.st" &&
                bounded 180 "$db" step --case "$work/case.st" --variant cat-store-copy --device cuda:0 --out "$work/gpu.st" &&
                bounded 120 python3 scripts/relu_flips.py "$work/case.st" "$work/gpu.st"
        } 2>&1 | tee "$OUT/flips.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || fail "flips failed (see flips.txt)"
        ;;
    sanitize)
        cs=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)
        [ -n "$cs" ] || { fail "compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"; continue; }
        : > "$OUT/sanitize.txt"
        # The kernel tests under each tool; a tool's findings make it exit 97.
        for tool in memcheck racecheck synccheck initcheck; do
            log="$OUT/sanitize-$tool.log"
            [ "$(left)" -ge 30 ] || { fail "sanitize $tool: not run: out of time"; continue; }
            bounded 240 "$cs" --tool "$tool" --error-exitcode 97 --log-file "$log" \
                "$bin/test-fused_cuda" --test-threads=1 > "$OUT/sanitize-$tool.out" 2>&1
            code=$?
            echo "$tool, test-fused_cuda: exit $code; $(grep -E "SUMMARY" "$log" 2>/dev/null | tail -n 1)" \
                | tee -a "$OUT/sanitize.txt"
            [ "$code" -eq 0 ] || fail "$tool on test-fused_cuda exited $code (see sanitize-$tool.log and .out)"
        done
        # One step of every hand-written variant through the real launch paths (views, buffer
        # offsets, the tap stack), on tiny cases: non-square maps for bc.
        work=/tmp/densebench-sanitize
        mkdir -p "$work"
        while read -r fam args; do
            "$db" case --family "$fam" $args --out "$work/$fam.st" > /dev/null 2>> "$OUT/sanitize-steps.log" \
                || { fail "case $fam failed (see sanitize-steps.log)"; continue; }
            for v in cat-store-copy cat-store-inplace cat-recompute-copy cat-recompute-inplace \
                buffer-store-copy buffer-store-inplace buffer-recompute-copy buffer-recompute-inplace; do
                # an mlp layer has nothing to recompute that its buffer does not hold
                [ "$fam" = mlp ] && [[ $v == buffer-recompute-* ]] && continue
                log="$work/memcheck-$fam-$v.log"
                [ "$(left)" -ge 30 ] || { fail "memcheck of the $fam $v step: not run: out of time"; continue; }
                bounded 120 "$cs" --tool memcheck --error-exitcode 97 --log-file "$log" "$db" step --case "$work/$fam.st" \
                    --variant "$v" --device cuda:0 --out "$work/$fam-$v.st" < /dev/null >> "$OUT/sanitize-steps.log" 2>&1
                code=$?
                { echo "== $fam $v: exit $code"; cat "$log"; } >> "$OUT/sanitize-steps.log"
                echo "memcheck, step $fam $v: exit $code; $(grep -E "SUMMARY" "$log" 2>/dev/null | tail -n 1)" \
                    | tee -a "$OUT/sanitize.txt"
                [ "$code" -eq 0 ] || fail "memcheck of the $fam $v step exited $code (see sanitize-steps.log)"
            done
        done <<'CONFIGS'
bc --batch 2 --channels 8 --growth 4 --size 6x5 --depth 3
mlp --batch 16 --channels 8 --growth 4 --depth 3
CONFIGS
        ;;
    profile)
        ncu=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
        [ -n "$ncu" ] || { fail "ncu not found (PATH, /usr/local/cuda*/bin, /opt/nvidia/nsight-compute)"; continue; }
        work=/tmp/densebench-profile
        mkdir -p "$work"
        depth=${DENSEBENCH_PROFILE_DEPTH:-16}
        # shellcheck disable=SC2086  # the extra flags are words
        "$db" case --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth "$depth" \
            ${DENSEBENCH_PROFILE_CASE_ARGS:-} --out "$work/case.st" > /dev/null 2> "$OUT/profile-case.log" \
            || { fail "case for the profile failed (see profile-case.log)"; continue; }
        # profile LABEL COMMAND...: every kernel's GPU time, the report exported as CSV
        profile() {
            local label=$1
            shift
            bounded 240 "$ncu" --metrics gpu__time_duration.sum --target-processes all -f -o "$work/$label" "$@" \
                < /dev/null > "$OUT/profile-$label.log" 2>&1 &&
                "$ncu" --import "$work/$label.ncu-rep" --csv --page details --print-units base \
                    > "$OUT/ncu-$label.csv" 2>> "$OUT/profile-$label.log" &&
                cp "$work/$label.ncu-rep" "$OUT/"
        }
        inputs=()
        for v in cat-store-copy buffer-recompute-inplace; do
            # shellcheck disable=SC2086  # the extra flags are words
            if profile "$v" "$db" step --case "$work/case.st" --variant "$v" --device cuda:0 ${DENSEBENCH_PROFILE_ARGS:-} --out "$work/$v.st"; then
                inputs+=("$v=$OUT/ncu-$v.csv")
            else
                fail "profile of $v failed (see profile-$v.log)"
            fi
        done
        if peer_on_gpu; then
            for p in pytorch-naive pytorch-memory-efficient; do
                if profile "$p" "${peer_env[@]}" python3 harness/peer/pytorch_peer.py --case "$work/case.st" --family bc \
                    --variant "$p" --device cuda:0 --warmup 0 --steps 1 --out "$work/$p.st"; then
                    inputs+=("$p=$OUT/ncu-$p.csv")
                else
                    fail "profile of $p failed (see profile-$p.log)"
                fi
            done
        else
            echo "gpu-session: PyTorch is not importable here or has no CUDA: no peer profiles" >&2
        fi
        if [ ${#inputs[@]} -gt 0 ]; then
            { echo "BC-100 block L = $depth (N=64, C0=24, k=12, 32x32${DENSEBENCH_PROFILE_CASE_ARGS:+, $DENSEBENCH_PROFILE_CASE_ARGS}${DENSEBENCH_PROFILE_ARGS:+, $DENSEBENCH_PROFILE_ARGS}${DENSEBENCH_CONV:+, DENSEBENCH_CONV=$DENSEBENCH_CONV}), one step each"; echo; \
              python3 scripts/ncu_summary.py "${inputs[@]}"; } | tee "$OUT/profile.txt"
            [ "${PIPESTATUS[0]}" -eq 0 ] || fail "ncu_summary failed (see profile.txt)"
        fi
        ;;
    *)
        echo "gpu-session: unknown stage '$stage' (${known[*]})" >&2
        exit 2
        ;;
    esac
done
# A lent machine's reply brings back only a few of $OUT's files (the first by name; on
# 2026-11-27 tests.log and info.txt were left behind): everything this call wrote, in one
# archive named to come first.
# Written outside $OUT and moved in: an archive growing inside the folder it reads makes tar
# exit 1 ("file changed as we read it") although the archive is whole.
pack=$(mktemp /tmp/densebench-gpu-pack.XXXXXX)
if ! { tar -C "$OUT" --exclude=./00-all.tgz -czf "$pack" . 2>/dev/null && mv -f "$pack" "$OUT/00-all.tgz"; }; then
    rm -f "$pack"
    echo "gpu-session: could not pack $OUT into 00-all.tgz" >&2
fi
exit "$status"
