#!/usr/bin/env bash
# Submits a sharded densebench sweep to Slurm: an array job of N tasks (bench-array.sbatch, one
# shard per task) and a follow-up merge job (merge.sbatch: merge, missing keys, plots, report)
# that starts when the array has ended, whatever its tasks' fate (--dependency=afterany).
#
#   scripts/slurm/submit.sh -n 8 -r /shared/densebench [-s sweep.toml] [-g gpu:1] [-c 8]
#   scripts/slurm/submit.sh -n 8 -r /shared/densebench -i 3,5    # resubmit shards 3 and 5
#
# Options:
#   -n N          number of shards = array tasks (required)
#   -r DIR        results directory on a filesystem every node sees (default $DENSEBENCH_RESULTS)
#   -s SWEEP      sweep file, or `default` / `quick` for the built-in sweeps (default: default)
#   -i INDICES    only these array indices (= shard numbers), e.g. `3` or `2,5`: retries
#   -g GRES       generic resources per task, e.g. `gpu:1` (the sweep's device is then cuda:0:
#                 Slurm makes the task's GPU the only one it sees)
#   -c CPUS       CPUs per task (also the children's compute threads)
#   -p PARTITION  partition of both jobs
#   -t TIME       time limit of each array task (e.g. 04:00:00)
#   -b BIN        densebench binary on the shared filesystem (default: this checkout's
#                 target/release/densebench; build it with `cargo build --release` first)
#   -M            no merge job
#   -- ARGS       further sbatch arguments for both jobs (e.g. --account=…, --qos=…)
#
# Prints the job ids, and last a line `ARRAY_JOB=<id> MERGE_JOB=<id>` for scripts.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)

usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

shards="" results=${DENSEBENCH_RESULTS:-} sweep=default indices="" gres="" cpus="" partition=""
time_limit="" bin=${DENSEBENCH_BIN:-$repo/target/release/densebench} merge=1
while getopts "n:r:s:i:g:c:p:t:b:Mh" opt; do
  case "$opt" in
    n) shards=$OPTARG ;;
    r) results=$OPTARG ;;
    s) sweep=$OPTARG ;;
    i) indices=$OPTARG ;;
    g) gres=$OPTARG ;;
    c) cpus=$OPTARG ;;
    p) partition=$OPTARG ;;
    t) time_limit=$OPTARG ;;
    b) bin=$OPTARG ;;
    M) merge=0 ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
[ "${1:-}" = "--" ] && shift
extra=("$@")

[[ "$shards" =~ ^[1-9][0-9]*$ ]] || { echo "submit.sh: -n N (shards, at least 1) is required" >&2; usage; }
[ -n "$results" ] || { echo "submit.sh: -r DIR (or DENSEBENCH_RESULTS) is required" >&2; usage; }
[ -x "$bin" ] || { echo "submit.sh: no densebench binary at $bin (cargo build --release, or -b BIN)" >&2; exit 2; }
command -v sbatch >/dev/null || { echo "submit.sh: sbatch not found: is this a Slurm login node?" >&2; exit 2; }
case "$sweep" in
  default | quick) ;;
  *) [ -f "$sweep" ] || { echo "submit.sh: sweep file $sweep not found" >&2; exit 2; }
     sweep=$(cd "$(dirname "$sweep")" && pwd)/$(basename "$sweep") ;;
esac
mkdir -p "$results/logs"
results=$(cd "$results" && pwd)
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")

# Catch a bad sweep or shard count here, not in N queued tasks.
plan=(--shards "$shards")
case "$sweep" in default) ;; quick) plan+=(--quick) ;; *) plan+=(--sweep "$sweep") ;; esac
"$bin" plan "${plan[@]}" > "$results/plan.txt"
head -n 2 "$results/plan.txt"

# Everything the jobs need travels in the environment (sbatch's default --export=ALL).
export DENSEBENCH_RESULTS=$results DENSEBENCH_SHARDS=$shards DENSEBENCH_SWEEP=$sweep \
  DENSEBENCH_BIN=$bin DENSEBENCH_ARRAY_BASE=1

common=()
[ -n "$partition" ] && common+=(--partition="$partition")
common+=("${extra[@]}")
array=(--parsable --array="${indices:-1-$shards}" --output="$results/logs/%x-%A_%a.out")
[ -n "$gres" ] && array+=(--gres="$gres")
[ -n "$cpus" ] && array+=(--cpus-per-task="$cpus")
[ -n "$time_limit" ] && array+=(--time="$time_limit")

array_job=$(sbatch "${array[@]}" "${common[@]}" "$here/bench-array.sbatch")
array_job=${array_job%%;*}
echo "submitted array job $array_job: shards ${indices:-1-$shards} of $shards -> $results"
merge_job=""
if [ "$merge" = 1 ]; then
  merge_job=$(sbatch --parsable --dependency=afterany:"$array_job" \
    --output="$results/logs/%x-%j.out" "${common[@]}" "$here/merge.sbatch")
  merge_job=${merge_job%%;*}
  echo "submitted merge job $merge_job (after array job $array_job) -> $results/merged.csv"
fi
echo "ARRAY_JOB=$array_job MERGE_JOB=$merge_job"
