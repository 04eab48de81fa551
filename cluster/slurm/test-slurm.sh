#!/usr/bin/env bash
# Runs cluster/slurm/train.sbatch on a one-node Slurm started here, with 2 CPU ranks:
#   1. a short job, whose 2 ranks must train as one rank with the same global batch
#      (scripts/same_losses.py; the MLP without dropout, as batch norm sees each rank's half batch);
#   2. the quick start's ConvNet for longer than its time limit: Slurm's SIGTERM before the limit
#      must make it checkpoint and requeue itself, until a requeued start finishes it with the
#      model.pt of the same job never stopped (byte for byte).
#
#   sudo bash cluster/slurm/test-slurm.sh        (after scripts/build.sh; about 10 minutes)
#
# Needs root and Debian's slurm-wlm and munge (apt-get install slurm-wlm munge). It starts munged
# if none runs, and its own slurmctld and slurmd (stopped at the end) with a slurm.conf in a
# temporary folder: proctrack/linuxproc, task/none, select/cons_tres.
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
bin=$repo/build/launcher/hybrid_train
say() { echo "test-slurm: $(date +%H:%M:%S) $*"; }
fail() { say "FAILED: $*"; exit 1; }
if [ "$(id -u)" != 0 ]; then echo "test-slurm: run as root (it starts slurmd and slurmctld)" >&2; exit 2; fi
for tool in munged slurmctld slurmd sbatch; do
  command -v "$tool" >/dev/null || { echo "test-slurm: $tool is missing; apt-get install slurm-wlm munge" >&2; exit 2; }
done
[ -x "$bin" ] || { echo "test-slurm: $bin is missing; run scripts/build.sh first" >&2; exit 2; }

dir=$(mktemp -d /var/tmp/ht-slurm.XXXXXX)
chmod 755 "$dir"
host=$(hostname -s)
export SLURM_CONF=$dir/slurm.conf
cat >"$SLURM_CONF" <<CONF
ClusterName=ht-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
KillWait=30
MinJobAge=600
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
mkdir -p "$dir/state" "$dir/spool" "$dir/runs"
cleanup() {
  scancel --quiet --user=root 2>/dev/null || true
  for d in slurmd slurmctld; do [ -f "$dir/$d.pid" ] && kill "$(cat "$dir/$d.pid")" 2>/dev/null || true; done
  sleep 1
  if [ "${KEEP:-0}" = 1 ]; then say "kept $dir"; else rm -rf "$dir"; fi
}
trap cleanup EXIT

if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge && chown munge:munge /run/munge
  runuser -u munge -- /usr/sbin/munged
fi
munge -n | unmunge >/dev/null || fail "munge does not work (is /etc/munge/munge.key there?)"
slurmctld -i
slurmd
for _ in $(seq 60); do
  sinfo -h -o %t 2>/dev/null | grep -qx idle && break
  sleep 1
done
sinfo -h -o %t | grep -qx idle || { tail "$dir/slurmctld.log" "$dir/slurmd.log"; fail "the node did not come up"; }
say "one-node Slurm up: $(sinfo -h -o '%P %D node, %c CPUs, %t')"

# Waits for a job to end for good (a requeued job goes back to PENDING), printing its state.
wait_job() {
  local id=$1 limit=$2 state="" restarts="" last="" start=$SECONDS
  while [ $((SECONDS - start)) -lt "$limit" ]; do
    state=$(scontrol show job "$id" | grep -o 'JobState=[A-Z_]*' | cut -d= -f2)
    restarts=$(scontrol show job "$id" | grep -o 'Restarts=[0-9]*' | cut -d= -f2)
    if [ "$state/$restarts" != "$last" ]; then say "job $id: $state (restarts $restarts)"; last="$state/$restarts"; fi
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) echo "$state" >"$dir/state.$id"; return ;; esac
    sleep 2
  done
  fail "job $id still $state after $limit s"
}
summary() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$dir/runs/$1/summary.json" "$2"; }
submit() {  # name, time limit, signal, then the job's config and overrides
  local name=$1 limit=$2 signal=$3
  shift 3
  sbatch --parsable --chdir="$repo" --output="$dir/$name.out" --ntasks-per-node=2 --gpus-per-node=0 \
    --cpus-per-task=1 --time="$limit" --signal="$signal" --export=ALL,HYBRID_TRAIN="$bin" \
    cluster/slurm/train.sbatch "$@" --job.output_dir="$dir/runs/$name"
}
mpirun2() { OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun --oversubscribe -np 2 "$bin" "$@"; }

# 1. Two ranks against one.
mlp="configs/quickstart.toml --model.name=mlp --model.dropout=0 --training.steps=100 --checkpoint.interval=0 --metrics.log_interval=1"
id=$(submit short 10 TERM@60 $mlp)
say "submitted job $id: 2 ranks of the MLP, 100 steps"
wait_job "$id" 600
[ "$(cat "$dir/state.$id")" = COMPLETED ] || { cat "$dir/short.out"; fail "job $id ended $(cat "$dir/state.$id")"; }
"$bin" $mlp --job.output_dir="$dir/runs/one" >/dev/null 2>&1
python3 scripts/same_losses.py "$dir/runs/one" "$dir/runs/short" || fail "2 ranks under srun did not train as 1 rank"

# 2. Longer than its time limit: SIGTERM 60 s before a 3-minute limit (Slurm sends it up to 60 s
# earlier still), so each start trains 60 to 120 s; 200 s of training needs at least one requeue.
mpirun2 configs/quickstart.toml --training.steps=100 --checkpoint.interval=0 --job.output_dir="$dir/runs/rate" >/dev/null 2>&1
steps=$(python3 -c "print(int($(summary rate samples_per_s) * 200 / 64))")
convnet="configs/quickstart.toml --training.steps=$steps --checkpoint.interval=$steps --metrics.log_interval=500"
id=$(submit preempted 3 TERM@60 $convnet)
say "submitted job $id: 2 ranks of the quick start's ConvNet, $steps steps (about 200 s) under a 3-minute limit"
wait_job "$id" 1200
grep -E "^(train.sbatch|stopped by|done)" "$dir/preempted.out" || true
[ "$(cat "$dir/state.$id")" = COMPLETED ] || { tail -30 "$dir/preempted.out"; fail "job $id ended $(cat "$dir/state.$id")"; }
grep -q "^stopped by SIGTERM" "$dir/preempted.out" || fail "job $id was never stopped by SIGTERM (training outran the limit?)"
grep -q "requeueing" "$dir/preempted.out" || fail "job $id did not requeue itself"
[ "$(summary preempted steps)" = "$steps" ] || fail "job $id ended at step $(summary preempted steps), not $steps"
resumed=$(summary preempted resumed_from_step)
[ "$resumed" -gt 0 ] || fail "job $id's last start did not resume from a checkpoint"
say "the same job never stopped, by mpirun -np 2"
mpirun2 $convnet --job.output_dir="$dir/runs/uninterrupted" >/dev/null 2>&1
last=$(printf 'step_%08d' "$steps")
cmp "$dir/runs/preempted/checkpoints/$last/model.pt" "$dir/runs/uninterrupted/checkpoints/$last/model.pt" ||
  fail "the preempted job's model.pt differs from the uninterrupted job's"
say "preempted job: $(grep -c '^stopped by SIGTERM' "$dir/preempted.out") SIGTERM stop(s), last start from step $resumed; its model.pt at step $steps is byte-identical to the uninterrupted job's"
say "passed on $(date -u +%Y-%m-%d)"
