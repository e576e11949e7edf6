#!/usr/bin/env bash
# End-to-end test of the Slurm path on a real, single-node Slurm cluster on loopback:
#
#  1. installs Debian's slurm-wlm and munge if missing (apt-get, non-interactive);
#  2. generates a munge key and a minimal slurm.conf in a temp dir, starts munged, slurmctld and
#     slurmd (as root; non-default ports; state, spool, logs and pid files in the temp dir);
#  3. runs the quick sweep on this machine (bench-all --quick), submits it as a 3-task array
#     with scripts/slurm/submit.sh, waits for the merge job, and checks that the merged CSV has
#     exactly the keys and statuses of the single-machine run;
#  4. submits a slower sweep (real work, 2 shards), cancels shard 1 mid-run, checks the merge
#     job reports it incomplete, resubmits index 1 (submit.sh -i 1) and checks the final merge:
#     no row for the job the cancel interrupted, every key once, nothing lost, the rows written
#     before the cancel kept as they were;
#  5. stops every daemon it started, by pid file, on any exit (trap).
#
# Exit status: 0 passed; 77 skipped (not root, no apt-get, or Slurm cannot be installed or
# started here: the reason is printed); anything else failed.
# Environment: DENSEBENCH_BIN (default target/release/densebench, built if missing);
# DENSEBENCH_SLURM_TEST_KEEP=DIR copies the CSVs and logs there for inspection.
set -euo pipefail
SKIP=77
t0=$(date +%s%N)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
say() { echo "== $*"; }
skip() { echo "SKIP: $*" >&2; exit "$SKIP"; }
fail() { echo "FAIL: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || skip "not root: a private Slurm cluster needs root (SlurmUser=root)"
[ "$(uname -s)" = Linux ] || skip "not Linux"
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  command -v apt-get >/dev/null || skip "slurm-wlm and munge are not installed and there is no apt-get"
  say "installing slurm-wlm and munge (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1; } \
    || skip "apt-get could not install slurm-wlm and munge"
fi

bin=${DENSEBENCH_BIN:-$repo/target/release/densebench}
if [ ! -x "$bin" ]; then
  say "building $bin"
  (cd "$repo" && cargo build --release -q)
fi

T=$(mktemp -d /tmp/densebench-slurm.XXXXXX)
chmod 755 "$T"
mkdir -p "$T/munge" "$T/state" "$T/spool" "$T/log"
chmod 700 "$T/munge"

cleanup() {
  local status=$?
  set +e
  if [ -n "${SLURM_CONF:-}" ] && [ -f "$T/slurmctld.pid" ]; then
    scancel --quiet --user=root >/dev/null 2>&1
  fi
  for daemon in slurmd slurmctld; do
    [ -f "$T/$daemon.pid" ] && kill "$(cat "$T/$daemon.pid")" 2>/dev/null
  done
  [ -f "$T/munge/munged.pid" ] && kill "$(cat "$T/munge/munged.pid")" 2>/dev/null
  # Wait (at most 10 s) for them to exit, then make sure.
  for _ in $(seq 50); do
    alive=0
    for f in "$T/slurmd.pid" "$T/slurmctld.pid" "$T/munge/munged.pid"; do
      [ -f "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1
    done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  for f in "$T/slurmd.pid" "$T/slurmctld.pid" "$T/munge/munged.pid"; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
  done
  if [ -n "${DENSEBENCH_SLURM_TEST_KEEP:-}" ]; then
    mkdir -p "$DENSEBENCH_SLURM_TEST_KEEP"
    cp -r "$T/log" "$T"/*.csv "$T/quick" "$T/slow" "$DENSEBENCH_SLURM_TEST_KEEP/" 2>/dev/null
  fi
  if [ "$status" -ne 0 ] && [ "$status" -ne "$SKIP" ]; then
    echo "--- logs ($T/log) ---" >&2
    tail -n 20 "$T"/log/*.log >&2 2>/dev/null
    for f in "$T"/quick/logs/* "$T"/slow/logs/*; do
      [ -f "$f" ] && { echo "--- $f" >&2; tail -n 15 "$f" >&2; }
    done
  fi
  rm -rf "$T"
  local ms=$((($(date +%s%N) - t0) / 1000000))
  printf 'wall time: %d.%03d s\n' $((ms / 1000)) $((ms % 1000))
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- munge ----
dd if=/dev/urandom of="$T/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge/munge.key"
munged --force --socket="$T/munge/munge.socket" --key-file="$T/munge/munge.key" \
  --pid-file="$T/munge/munged.pid" --log-file="$T/munge/munged.log" \
  --seed-file="$T/munge/munged.seed" \
  || skip "munged does not start here: $(tail -n 3 "$T/munge/munged.log" 2>/dev/null)"

# ---- slurm.conf ----
host=$(hostname -s)
# Ports from the pid: two runs on one machine do not collide, and none is Slurm's default.
port=$((20000 + ($$ % 2000) * 2))
avail_mb=$(awk '/^MemAvailable:/ {print int($2 / 1024)}' /proc/meminfo)
mem_mb=$((avail_mb / 2))
[ "$mem_mb" -ge 512 ] || skip "less than 1 GiB of free memory"
export SLURM_CONF="$T/slurm.conf"
cat > "$SLURM_CONF" <<CONF
ClusterName=densebench-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$T/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/log/slurmctld.log
SlurmdLogFile=$T/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MailProg=/bin/true
KillWait=5
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=2 RealMemory=$mem_mb State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

say "$(slurmctld -V), munge $(munged -V 2>&1 | head -n 1 | awk '{print $2}'), node $host, ports $port/$((port + 1))"
slurmctld -c || skip "slurmctld does not start here: $(tail -n 3 "$T/log/slurmctld.log" 2>/dev/null)"
slurmd || skip "slurmd does not start here: $(tail -n 3 "$T/log/slurmd.log" 2>/dev/null)"
for i in $(seq 100); do
  state=$(sinfo -h -N -o %T 2>/dev/null | head -n 1 || true)
  [ "$state" = idle ] && break
  [ "$i" = 100 ] && skip "the node did not become idle (state: ${state:-none}): $(tail -n 3 "$T/log/slurmd.log")"
  sleep 0.2
done
say "cluster up: node $host idle"

# ---- helpers ----
# Waits for a job (array or not) to leave the queue; at most $2 seconds.
wait_job() {
  local id=$1 limit=$2 waited=0
  while [ -n "$(squeue -h -j "$id" -o %i 2>/dev/null)" ]; do
    sleep 0.5
    waited=$((waited + 1))
    [ "$waited" -le $((limit * 2)) ] || fail "job $id still queued after $limit s: $(squeue -j "$id")"
  done
}
job_state() { scontrol -o show job "$1" | grep -o 'JobState=[A-Z_]*' | head -n 1 | cut -d= -f2; }
# `key,status` of every row of a result CSV, sorted. Quoted cells (commas in device_desc or
# error) become Q first; the harness keeps every cell on one line.
key_status() {
  local file=$1
  local cols
  cols=$(head -n 1 "$file" | tr ',' '\n' | grep -n -x -e key -e status | cut -d: -f1 | paste -sd,)
  [ "$cols" != "" ] || fail "$file has no key/status columns"
  tail -n +2 "$file" | sed -E 's/"([^"]|"")*"/Q/g' | cut -d, -f"$cols" | sort
}
rows() { tail -n +2 "$1" | wc -l; }
submit() { "$here/submit.sh" -b "$bin" -c 1 "$@" | tee /dev/stderr | tail -n 1; }

# ---- 1: quick sweep, 3 shards vs one machine ----
say "quick sweep on this machine"
"$bin" bench-all --quick --out "$T/single.csv" --cache-dir "$T/cache-single" 2>"$T/log/single.err" \
  || fail "single-machine quick sweep: $(tail -n 3 "$T/log/single.err")"
say "quick sweep as a 3-task array"
ids=$(submit -n 3 -r "$T/quick" -s quick)
merge_job=${ids##*MERGE_JOB=}
wait_job "$merge_job" 120
[ "$(job_state "$merge_job")" = COMPLETED ] \
  || fail "merge job $merge_job: $(job_state "$merge_job"): $(cat "$T"/quick/logs/densebench-merge-*.out)"
grep -q "complete: all" "$T"/quick/logs/densebench-merge-*.out || fail "the merge did not report complete"
diff <(key_status "$T/single.csv") <(key_status "$T/quick/merged.csv") >&2 \
  || fail "merged array result differs from the single-machine run in keys or statuses"
dups=$(tail -n +2 "$T/quick/merged.csv" | cut -d, -f2 | sort | uniq -d | wc -l)
[ "$dups" = 0 ] || fail "$dups duplicated keys in the merged CSV"
say "ok: $(rows "$T/quick/merged.csv") rows, same keys and statuses as the single-machine run"

# ---- 2: cancel one task mid-run, resubmit it ----
cat > "$T/slow.toml" <<'TOML'
name = "slurm-test-slow"
description = "Enough real work per shard to cancel a task mid-run."
[defaults]
steps = 2
warmup = 1
[[group]]
family = "mlp"
batch = 1024
channels = 128
growth = 32
depth = [8, 16, 24, 32]
TOML
expected=$("$bin" plan --sweep "$T/slow.toml" --shards 2 --format tsv | tail -n +2 | wc -l)
in_shard1=$("$bin" plan --sweep "$T/slow.toml" --shards 2 --format tsv | awk -F'\t' '$1 == 1' | wc -l)
say "slow sweep ($expected jobs, $in_shard1 in shard 1) as a 2-task array; cancelling shard 1 mid-run"
ids=$(submit -n 2 -r "$T/slow" -s "$T/slow.toml" -- --export=ALL,DENSEBENCH_PLOTS=0)
array_job=${ids%% MERGE_JOB=*}
array_job=${array_job#ARRAY_JOB=}
merge_job=${ids##*MERGE_JOB=}
shard1="$T/slow/shard-1-of-2.csv"
for i in $(seq 600); do
  [ -f "$shard1" ] && [ "$(rows "$shard1")" -ge 2 ] && break
  [ "$i" = 600 ] && fail "shard 1 wrote no 2 rows in 60 s"
  sleep 0.1
done
scancel "${array_job}_1"
before=$(rows "$shard1")
[ "$before" -lt "$in_shard1" ] || fail "shard 1 finished before it could be cancelled: make the slow sweep slower"
wait_job "$merge_job" 120
sleep 0.5
kept=$(mktemp -p "$T")
cp "$shard1" "$kept"
say "cancelled with $(rows "$shard1") of $in_shard1 rows; task state $(job_state "${array_job}_1"), merge job $(job_state "$merge_job")"
[ "$(job_state "${array_job}_1")" = CANCELLED ] || fail "task ${array_job}_1 is not CANCELLED"
# scancel signals every process of the task, the measuring child too: the job it interrupted
# must leave no row (a `killed` row would be kept by the resubmission).
notok=$(key_status "$shard1" | awk -F, '$2 != "ok"')
[ -z "$notok" ] || fail "rows after the cancel that are not ok: $notok"
[ "$(job_state "$merge_job")" = FAILED ] || fail "the merge after the cancel did not report the shard incomplete"
grep -q "INCOMPLETE" "$T"/slow/logs/densebench-merge-"$merge_job".out || fail "no INCOMPLETE in the merge log"
grep -q "shard 1/2" "$T"/slow/logs/densebench-merge-"$merge_job".out || fail "the missing keys are not attributed to shard 1/2"

say "resubmitting array index 1"
ids=$(submit -n 2 -r "$T/slow" -s "$T/slow.toml" -i 1 -- --export=ALL,DENSEBENCH_PLOTS=0)
merge_job=${ids##*MERGE_JOB=}
wait_job "$merge_job" 120
[ "$(job_state "$merge_job")" = COMPLETED ] \
  || fail "final merge job $merge_job: $(job_state "$merge_job"): $(tail -n 20 "$T"/slow/logs/densebench-merge-"$merge_job".out)"
[ "$(rows "$T/slow/merged.csv")" = "$expected" ] || fail "merged $(rows "$T/slow/merged.csv") rows, expected $expected"
for f in "$shard1" "$T/slow/merged.csv"; do
  dups=$(tail -n +2 "$f" | cut -d, -f2 | sort | uniq -d | wc -l)
  [ "$dups" = 0 ] || fail "$dups duplicated keys in $f"
done
[ "$(rows "$shard1")" = "$in_shard1" ] || fail "shard 1 has $(rows "$shard1") rows, expected $in_shard1"
cmp -s "$kept" <(head -c "$(stat -c %s "$kept")" "$shard1") || fail "rows written before the cancel changed"
say "ok: $expected rows, each key once; shard 1 kept its $before rows from before the cancel and ran the rest"
say "PASS"
