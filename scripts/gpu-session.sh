#!/usr/bin/env bash
# On a GPU machine without Rust: unpacks the binaries scripts/gpu-pack.sh put in .gpu/, finds
# the CUDA libraries they link, and runs the GPU checklist of issue 11, writing everything under
# $OUT (default /tmp/densebench-gpu). Stages, in order (default: all of them):
#
#   bash scripts/gpu-session.sh [info] [tests] [tf32] [sweep] [report]
#
#   info    nvidia-smi, driver vs the toolkit the binaries were built with, PyTorch's version
#   tests   the packed GPU test binaries (fused CUDA kernels vs the CPU, pool peaks, GPU CLI
#           tests through DENSEBENCH_BIN): $OUT/tests.log
#   tf32    `run --math tf32` (cat-store-copy) on the configs of docs/gpu.md's TF32 table: each
#           row's note has the tf32 step's own error against f64, to compare with the CPU
#           emulation's numbers there: $OUT/tf32.csv and $OUT/tf32.txt
#   sweep   harness/sweeps/gpu.toml with the PyTorch peer rows (when PyTorch is importable),
#           resumable: $OUT/reference-gpu.csv. A sweep longer than one command's time limit is
#           stopped cleanly after DENSEBENCH_SWEEP_SECS (default 480) and goes on with --resume
#           when the CSV is given back in .gpu/reference-gpu.csv on the next call.
#   report  plots (one tarball, $OUT/plots.tar.gz) and the Markdown report ($OUT/REPORT-gpu.md)
#   chunks  the 3×3 tap stack in the chunks the memory model picks vs one chunk
#           (DENSEBENCH_TAP_CHUNK_COLUMNS=0), side by side, on the torchvision-style block at
#           L = 6 and BC-100's at L = 16: $OUT/chunks.csv and $OUT/chunks.txt (not a default stage)
#   flips   the forum mlp at L = 64 stepped on the GPU, its ReLU decisions that differ from
#           exact arithmetic counted (scripts/relu_flips.py): $OUT/flips.txt (not a default stage)
#
# Exit status: that of the first stage that failed (the later ones still run).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-/tmp/densebench-gpu}
mkdir -p "$OUT"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(info tests tf32 sweep report)
status=0
fail() { echo "gpu-session: $*" >&2; [ "$status" -ne 0 ] || status=1; }

[ -f .gpu/densebench.gz ] || { echo "gpu-session: .gpu/densebench.gz is missing: run scripts/gpu-pack.sh where Rust is, and carry .gpu" >&2; exit 2; }

# The CUDA libraries the binaries link (cuBLAS, cuRAND, NVRTC, the runtime), wherever this
# machine has them (a system CUDA or PyTorch's nvidia-* wheels).
dirs=""
for l in libcublas.so.13 libcublasLt.so.13 libcurand.so.10 libnvrtc.so.13 libcudart.so.13; do
    f=$(ls /usr/local/cuda*/targets/x86_64-linux/lib/$l /usr/local/cuda*/lib64/$l 2>/dev/null | head -n 1)
    [ -n "$f" ] || f=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name "$l" -print 2>/dev/null | head -n 1)
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

for stage in "${stages[@]}"; do
    case "$stage" in
    info)
        {
            nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv
            echo "built with CUDA $(cat .gpu/cuda-version 2>/dev/null || echo '?') at $(cat .gpu/git-rev 2>/dev/null || echo '?')"
            python3 harness/peer/pytorch_peer.py --check || echo "PyTorch peer: not available"
        } 2>&1 | tee "$OUT/info.txt"
        ;;
    tests)
        : > "$OUT/tests.log"
        for t in "$bin"/test-*; do
            [ -e "$t" ] || continue
            echo "== $(basename "$t")" | tee -a "$OUT/tests.log"
            # From the repository root: the tests read files relative to it.
            "$t" --test-threads=1 --nocapture >> "$OUT/tests.log" 2>&1 || fail "$(basename "$t") failed (see tests.log)"
            grep -E "^test result|FAILED|panicked" "$OUT/tests.log" | tail -n 3
        done
        ;;
    tf32)
        csv="$OUT/tf32.csv"
        : > "$csv"
        : > "$OUT/tf32.txt"
        while read -r label args; do
            row=$("$db" run $args --variant cat-store-copy --device cuda:0 --math tf32 < /dev/null 2>> "$OUT/tf32.err") \
                || { fail "tf32 run '$label' failed (see tf32.err)"; continue; }
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
    sweep)
        csv="$OUT/reference-gpu.csv"
        [ ! -f .gpu/reference-gpu.csv ] || cp .gpu/reference-gpu.csv "$csv"
        peer=()
        if python3 harness/peer/pytorch_peer.py --check > /dev/null 2>&1; then
            peer=(--peer pytorch)
        else
            echo "gpu-session: PyTorch is not importable here: the sweep runs without peer rows" >&2
        fi
        # SIGTERM after the budget: the harness stops its child, keeps every finished row and
        # leaves a valid CSV for --resume.
        timeout -s TERM "${DENSEBENCH_SWEEP_SECS:-480}" "$db" bench-all --sweep harness/sweeps/gpu.toml \
            "${peer[@]}" --resume --out "$csv" 2>&1 | tail -n 40
        code=${PIPESTATUS[0]}
        if [ "$code" -eq 124 ]; then
            echo "gpu-session: sweep stopped after ${DENSEBENCH_SWEEP_SECS:-480} s; copy $csv back into .gpu/ and run the sweep stage again to go on"
        elif [ "$code" -ne 0 ]; then
            fail "the sweep exited with $code"
        fi
        ;;
    report)
        csv="$OUT/reference-gpu.csv"
        [ -f "$csv" ] || { fail "no $csv: run the sweep stage first"; continue; }
        rm -rf /tmp/densebench-gpu-plots
        "$db" plots "$csv" --out /tmp/densebench-gpu-plots || fail "plots failed"
        tar -C /tmp -czf "$OUT/plots.tar.gz" densebench-gpu-plots
        "$db" report "$csv" --out "$OUT/REPORT-gpu.md" --plots plots || fail "report failed"
        ;;
    chunks)
        csv="$OUT/chunks.csv"
        : > "$csv"
        while read -r label args; do
            for v in buffer-recompute-inplace cat-store-inplace cat-store-copy; do
                for columns in model 0; do
                    # the model's chunking, then one chunk forced
                    chunking=()
                    [ "$columns" = model ] || chunking=(DENSEBENCH_TAP_CHUNK_COLUMNS="$columns")
                    row=$(env "${chunking[@]}" "$db" run $args --variant "$v" --device cuda:0 < /dev/null 2>> "$OUT/chunks.err") \
                        || { fail "chunks run '$label' $v ($columns) failed (see chunks.err)"; continue; }
                    if [ -s "$csv" ]; then echo "$row" | tail -n +2 >> "$csv"; else echo "$row" >> "$csv"; fi
                done
            done
        done <<'CONFIGS'
torchvision-6 --family bc --batch 32 --channels 64 --growth 32 --size 56 --depth 6
bc100-16 --family bc --batch 64 --channels 24 --growth 12 --size 32 --depth 16
CONFIGS
        # each pair: the model's chunks (the note says how many), then one chunk
        python3 - "$csv" <<'PY' | tee "$OUT/chunks.txt"
import csv, re, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for a, b in zip(rows[0::2], rows[1::2]):
    chunks = re.search(r"3×3 tap stack in [^;]*", a["note"])
    ratio = int(a["median_ns"]) / int(b["median_ns"]) if a["median_ns"] and b["median_ns"] else float("nan")
    print(f"{a['key']}: {chunks.group(0) if chunks else 'one chunk'}: "
          f"median {a['median_ns']} ns vs {b['median_ns']} ns one chunk (x{ratio:.3f}), "
          f"peak {a['peak_bytes']} vs {b['peak_bytes']} B, status {a['status']}/{b['status']}")
PY
        ;;
    flips)
        work=/tmp/densebench-flips
        mkdir -p "$work"
        args="--family mlp --batch 4096 --channels 256 --growth 64 --depth 64"
        {
            "$db" case $args --out "$work/case.st" &&
                "$db" step --case "$work/case.st" --variant cat-store-copy --device cuda:0 --out "$work/gpu.st" &&
                python3 scripts/relu_flips.py "$work/case.st" "$work/gpu.st"
        } 2>&1 | tee "$OUT/flips.txt"
        [ "${PIPESTATUS[0]}" -eq 0 ] || fail "flips failed (see flips.txt)"
        ;;
    *)
        echo "gpu-session: unknown stage '$stage' (info, tests, tf32, sweep, report, chunks, flips)" >&2
        exit 2
        ;;
    esac
done
exit "$status"
