#!/usr/bin/env bash
# GPT-2 small's step on the GPU taken apart by op (issue 69, part 1), in one short command after a
# bare build of hybrid_train: layer norm's kernels at GPT-2's rows (scripts/device-kernels.py
# --only norm), then hybrid_train at bench_dtr_budget's GPT-2 row (fp32, T 1024, batch 8, dropout
# 0.1) and in bf16 without dropout, HT_STEP_OPS_STEPS steps each (default 8) with
# metrics.time_by_op, each op's kernel milliseconds per step, the largest first.
#
#   run(command="bash scripts/device-step-ops.sh", carry=[".deps"], timeout_s=200)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-out}
bin=${HT_BUILD_DIR:-build-device}
mkdir -p "$out"
start=$SECONDS
timeout 120 bash scripts/device-build.sh hybrid_train >"$out/build.log" 2>&1
echo "build: exit $? in $((SECONDS - start)) s"; grep -m 10 -E 'error:|FAILED:' "$out/build.log"
python3 scripts/device-kernels.py --only norm --batch 128 --out "$out/norm.json" 2>&1 | tail -5
steps=${HT_STEP_OPS_STEPS:-8}
gpt2=(configs/gpt2_124m.toml --data.dataset=synthetic --data.synthetic_shape=[1024] --data.synthetic_classes=50257
      --data.synthetic_samples=4096 --training.device=cuda --training.steps="$steps" --training.micro_batch_size=8
      --training.global_batch_size=8 --metrics.log_interval=1 --metrics.time_by_op=true --checkpoint.interval=0 --training.eval_batches=1)
run() {  # name, overrides...
  local name=$1
  shift
  rm -rf "runs/$name"  # a warm machine keeps the last call's: never read them as this run's
  timeout 60 "$bin/launcher/hybrid_train" "${gpt2[@]}" "$@" --job.output_dir="runs/$name" >"$out/$name.log" 2>&1
  echo "$name: exit $?: $(grep -E '^(done|hybrid_train: error)' "$out/$name.log" | tail -1)"
  grep -m1 -E '^time by op, measured' "$out/$name.log"
  [ -f "runs/$name/metrics.jsonl" ] || return 0
  python3 - "runs/$name/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step_ms"] for r in rows if "step_ms" in r][2:]
by_op = [r for r in rows if r.get("event") == "time_by_op"]
if steps:
    print(f"  step ms: median {statistics.median(steps):.1f} of {len(steps)} (after 2)")
if by_op:
    ran = by_op[-1]["ms_per_step"]
    print(f"  kernels by op, ms per step: all {sum(ran.values()):.1f}")
    for op, ms in sorted(ran.items(), key=lambda kv: -kv[1])[:14]:
        print(f"    {op:<28} {ms:8.2f}")
PY
}
run fp32_dropout --training.mixed_precision=off --model.dropout=0.1
run bf16 --training.mixed_precision=bf16 --model.dropout=0
echo "ended in $((SECONDS - start)) s"
