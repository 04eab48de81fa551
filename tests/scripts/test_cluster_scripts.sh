#!/usr/bin/env bash
# The cluster scripts' own logic, without a cluster: cluster/slurm/train.sbatch under stand-ins
# for srun and scontrol (each local rank keeps its own GPU, a SIGTERM stop requeues the job),
# cluster/mpirun/two-node.sh under a stand-in for mpirun (ranks from the hostfile's slots, the
# interface choice), scripts/same_losses.py on hand-made runs, and each one's refusals (exit 2).
# The real runs are cluster/slurm/test-slurm.sh, cluster/mpirun/test-two-hosts.sh and
# docker/test-image.sh (root, not in CI).
set -u
src="$1"
source "$(dirname "$0")/check.sh"
mkdir -p "$dir/bin"
# srun: starts the command once per local rank (2), as Slurm's tasks on one node.
cat >"$dir/bin/srun" <<'SH'
#!/usr/bin/env bash
echo "srun $*" >>"$LOG"
while [ "${1#--}" != "$1" ]; do shift; done
status=0
for id in 0 1; do SLURM_LOCALID=$id "$@" || status=$?; done
exit $status
SH
cat >"$dir/bin/scontrol" <<'SH'
#!/usr/bin/env bash
echo "scontrol $*" >>"$LOG"
SH
# mpirun and hybrid_train: say what they were given.
cat >"$dir/bin/mpirun" <<'SH'
#!/usr/bin/env bash
echo "mpirun $*" >>"$LOG"
env | grep '^NCCL_' >>"$LOG"
SH
cat >"$dir/bin/fake_train" <<'SH'
#!/usr/bin/env bash
echo "rank $SLURM_LOCALID device ${CUDA_VISIBLE_DEVICES:-none} args $*" >>"$LOG"
exit "${FAKE_EXIT:-0}"
SH
chmod +x "$dir/bin/"*
export PATH="$dir/bin:$PATH" LOG="$dir/log" HYBRID_TRAIN="$dir/bin/fake_train"
export SLURM_JOB_ID=42 SLURM_JOB_NODELIST=node1 SLURM_NTASKS=2 SLURM_RESTART_COUNT=0
sbatch="$src/cluster/slurm/train.sbatch"

# train.sbatch
: >"$LOG"
CUDA_VISIBLE_DEVICES=3,5 bash "$sbatch" configs/quickstart.toml --training.steps=5 >/dev/null
check "srun through PMIx" grep -q "^srun --mpi=pmix" "$LOG"
check "local rank 0 keeps the node's first GPU" grep -q "^rank 0 device 3 " "$LOG"
check "local rank 1 keeps the second" grep -q "^rank 1 device 5 " "$LOG"
check "the job resumes from its latest checkpoint" grep -q "args configs/quickstart.toml --training.steps=5 --checkpoint.resume=latest$" "$LOG"
check "a finished job is not requeued" test -z "$(grep scontrol "$LOG")"
: >"$LOG"
CUDA_VISIBLE_DEVICES=7 bash "$sbatch" configs/quickstart.toml >/dev/null
check "a task Slurm bound to one GPU keeps it" test "$(grep -c "device 7 " "$LOG")" = 2
: >"$LOG"
bash "$sbatch" configs/quickstart.toml >/dev/null
check "a CPU job gets no device" test "$(grep -c "device none " "$LOG")" = 2
: >"$LOG"
FAKE_EXIT=143 bash "$sbatch" configs/quickstart.toml >"$dir/out"
check "stopped by SIGTERM: requeued" grep -q "^scontrol requeue 42$" "$LOG"
check "and the exit status kept" test "$(FAKE_EXIT=143 bash "$sbatch" configs/quickstart.toml >/dev/null; echo $?)" = 143
: >"$LOG"
FAKE_EXIT=143 SLURM_RESTART_COUNT=10 bash "$sbatch" configs/quickstart.toml >/dev/null
check "no requeue beyond HT_MAX_REQUEUES" test -z "$(grep scontrol "$LOG")"
: >"$LOG"
FAKE_EXIT=1 bash "$sbatch" configs/quickstart.toml >/dev/null
check "a failed job is not requeued" test -z "$(grep scontrol "$LOG")"
bash "$sbatch" 2>"$dir/err" >/dev/null
check "no config: exit 2" test $? -eq 2
check "no config: says what to give" grep -q "give the job's config" "$dir/err"

# two-node.sh
twonode="$src/cluster/mpirun/two-node.sh"
: >"$LOG"
HT_IFACE=eth1 bash "$twonode" "$src/cluster/mpirun/hostfile.example" configs/gpt_tiny.toml >/dev/null
check "ranks = the hostfile's slots" grep -q "^mpirun -np 16 --hostfile " "$LOG"
check "Open MPI told the interface" grep -q "btl_tcp_if_include eth1 --mca oob_tcp_if_include eth1" "$LOG"
check "NCCL told it too" grep -q "NCCL_SOCKET_IFNAME=eth1" "$LOG"
: >"$LOG"
HT_IFACE=10.0.0.0/24 bash "$twonode" "$src/cluster/mpirun/hostfile.example" configs/gpt_tiny.toml >/dev/null
check "a CIDR block is for Open MPI only" test -z "$(grep -v '^NCCL_DEBUG' "$LOG" | grep NCCL_SOCKET)"
for bad in "no arguments:" "missing hostfile:$dir/nothing" "no slots:$dir/empty"; do
  name=${bad%%:*}
  file=${bad#*:}
  : >"$dir/empty"
  if [ -z "$file" ]; then bash "$twonode" 2>"$dir/err" >/dev/null; else bash "$twonode" "$file" x.toml 2>"$dir/err" >/dev/null; fi
  check "two-node.sh, $name exit 2" test $? -eq 2
  check "two-node.sh, $name one line saying what would work" test "$(wc -l <"$dir/err")" = 1
done

# same_losses.py
same="$src/scripts/same_losses.py"
run() {  # run NAME LOSS...
  mkdir -p "$dir/$1"
  local name=$1 step=0
  shift
  : >"$dir/$name/metrics.jsonl"
  for loss in "$@"; do
    step=$((step + 1))
    echo "{\"event\": \"train\", \"step\": $step, \"loss\": $loss}" >>"$dir/$name/metrics.jsonl"
  done
}
run a 2.3 2.1 1.9
run b 2.3 2.1000001 1.9
run c 2.3 2.2 1.9
python3 "$same" "$dir/a" "$dir/b" --steps 3 >/dev/null
check "same_losses: agreeing runs" test $? -eq 0
python3 "$same" "$dir/a" "$dir/c" --steps 3 >"$dir/out"
check "same_losses: a difference, exit 1" test $? -eq 1
check "same_losses: names the step" grep -q "step 2: loss 2.1 " "$dir/out"
python3 "$same" "$dir/a" "$dir/b" --steps 4 2>"$dir/err" >/dev/null
check "same_losses: too few steps, exit 2" test $? -eq 2
python3 "$same" "$dir/a" "$dir/none" 2>"$dir/err" >/dev/null
check "same_losses: no run, exit 2" test $? -eq 2
check "same_losses: names the file" grep -q "$dir/none/metrics.jsonl" "$dir/err"

echo "$failures failures"
[ "$failures" = 0 ]
