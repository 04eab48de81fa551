#!/usr/bin/env bash
# The planner's GPT-2 small plan on this GPU, taken apart (issue 35: its step measured 2.075x the
# predicted one on an H200 at b91dab8, its peak 0.977x), in one short command:
#   - PyTorch eager in bf16 autocast at 32 sequences (what a step of ours could cost per sequence;
#     at the plan's 128 eager runs out of the H200's memory: its fp32 logits' gradient);
#   - the plan, trained 10 steps with metrics.time_by_op, set beside the plan's compute by op
#     (scripts/compare_plan_run.py): which ops the miss comes from. The machine has no Nsight.
#
#   run(command="bash scripts/device-profile.sh", carry=[".deps"], timeout_s=300)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-out}
mkdir -p "$out"
bin=${HT_BUILD_DIR:-build-device}
say() { echo "device-profile: $*" | tee -a "$out/summary.txt"; }
start=$SECONDS
timeout 150 bash scripts/device-build.sh hybrid_train >"$out/build.log" 2>&1
say "build: exit $? in $((SECONDS - start)) s"
(cd bench/peer && timeout 60 python3 gpu_peer.py --model gpt --batch 32 --amp bf16 --modes eager --steps 3 --warmup 2) \
  2>&1 | tail -3 | tee -a "$out/summary.txt"
gpt2=(configs/gpt2_124m.toml --data.dataset=synthetic --data.synthetic_shape=[1024] --data.synthetic_classes=50257
      --data.synthetic_samples=16384)
"$bin/launcher/hybrid_train" plan "${gpt2[@]}" --cluster h200:1x1 --job.output_dir=plan >"$out/plan.log" 2>&1
say "plan: exit $?"
timeout 120 "$bin/launcher/hybrid_train" plan/plan.toml --training.steps=10 --metrics.log_interval=1 \
  --metrics.time_by_op=true --job.output_dir=run >"$out/run.log" 2>&1
say "run: exit $?"
python3 scripts/compare_plan_run.py plan run 2>&1 | tee -a "$out/summary.txt"
say "ended in $((SECONDS - start)) s"
