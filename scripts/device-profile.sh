#!/usr/bin/env bash
# The planner's GPT-2 small plan on this GPU, taken apart (issue 35: measured 2.07x its predicted
# step on an H200 at b91dab8): PyTorch eager in bf16 at the plan's micro-batch (what the step could
# be), and the plan's own run under Nsight Systems where it is installed (GPU kernel time by kernel,
# against the step the run logs: kernels or the host between them).
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
(cd bench/peer && timeout 60 python3 gpu_peer.py --model gpt --batch 128 --amp bf16 --modes eager --steps 3 --warmup 2) \
  2>&1 | tail -3 | tee -a "$out/summary.txt"
gpt2=(configs/gpt2_124m.toml --data.dataset=synthetic --data.synthetic_shape=[1024] --data.synthetic_classes=50257
      --data.synthetic_samples=16384)
"$bin/launcher/hybrid_train" plan "${gpt2[@]}" --cluster h200:1x1 --job.output_dir=plan >"$out/plan.log" 2>&1
say "plan: exit $?"
nsys=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/*/bin/nsys /usr/local/cuda*/nsight-systems*/bin/nsys 2>/dev/null | head -1)
run=("$bin/launcher/hybrid_train" plan/plan.toml --training.steps=8 --metrics.log_interval=1 --job.output_dir=run)
if [ -n "$nsys" ]; then
  say "nsys: $nsys"
  timeout 120 "$nsys" profile -o "$out/gpt2" --force-overwrite true --stats=false "${run[@]}" >"$out/run.log" 2>&1
  say "run under nsys: exit $?"
  timeout 60 "$nsys" stats -q --report cuda_gpu_kern_sum --format csv -o "$out/kern" "$out/gpt2.nsys-rep" >/dev/null 2>&1
  say "stats: exit $?"
  rm -f "$out/gpt2.nsys-rep" "$out"/*.sqlite
  head -40 "$out"/kern*.csv >>"$out/summary.txt" 2>/dev/null
else
  say "no nsys here"
  timeout 120 "${run[@]}" >"$out/run.log" 2>&1
  say "run: exit $?"
fi
grep '"train"' run/metrics.jsonl | python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
print("step_ms", [round(r["step_ms"]) for r in rows])
print(rows[-1])' 2>&1 | tee -a "$out/summary.txt"
say "ended in $((SECONDS - start)) s"
