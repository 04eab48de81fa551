#!/usr/bin/env bash
# scripts/compare_plan_run.py on hand-made files: the plan ranked first against its run (the
# median step after five, the largest peak after the first step), and exit 2 naming what is missing.
set -u
script="$1/scripts/compare_plan_run.py"
source "$(dirname "$0")/check.sh"
mkdir -p "$dir/plan" "$dir/run"
printf '# Written by hybrid_train plan job.toml: 1 rank, micro-batch 4 x 2, bf16.\n# Predicted: peak 1.0 MiB per rank, step 10.0 ms.\n[job]\n' >"$dir/plan/plan.toml"
cat >"$dir/plan/plans.jsonl" <<'JSON'
{"ranks": 1, "micro_batch": 4, "accumulation": 2, "precision": "bf16", "policy": "none", "peak_bytes": 1000000, "step_ms": 10.0, "compute_by_op_ms": {"linear": 6.0, "linear backward": 3.0, "gelu": 0.0001}}
{"ranks": 2, "micro_batch": 4, "accumulation": 1, "precision": "bf16", "policy": "none", "peak_bytes": 900000, "step_ms": 6.0}
JSON
{
  echo '{"event": "train", "step": 1, "step_ms": 900, "mem_peak_bytes": 700000}'
  for s in 2 3 4 5 6 7 8; do echo "{\"event\": \"train\", \"step\": $s, \"step_ms\": $((s + 5)), \"mem_peak_bytes\": 990000}"; done
  echo '{"event": "eval", "step": 8, "eval_loss": 1.0}'
  echo '{"event": "time_by_op", "first_step": 6, "steps": 3, "kernel_ms_per_step": 11.5, "ms_per_step": {"linear": 6.5, "linear backward": 4.5, "attention": 0.5}}'
} >"$dir/run/metrics.jsonl"
out=$(python3 "$script" "$dir/plan" "$dir/run")
check "compares" test $? -eq 0
check "the first plan's step against the median of steps 6-8" grep -q 'step ms: predicted 10.0, measured 12.0 (median of 3), measured/predicted 1.200' <<<"$out"
check "the peak after the first step" grep -q 'peak bytes: predicted 1000000, measured 990000, measured/predicted 0.9900' <<<"$out"
check "the plan's header" grep -q '^# Predicted: peak 1.0 MiB' <<<"$out"
check "time by op: the run's steps" grep -q 'time by op, ms per step (run: steps 6-8' <<<"$out"
check "an op beside its prediction" grep -qE '^  linear backward +3.0 +4.5 +1.500$' <<<"$out"
check "an op the plan did not price" grep -qE '^  attention +0.0 +0.5 +-$' <<<"$out"
check "the sums" grep -qE '^  all ops +9.0 +11.5 +1.278$' <<<"$out"
check "what is too small to matter left out" test "$(grep -c '^  gelu' <<<"$out")" -eq 0
out=$(python3 "$script" "$dir/plan" "$dir/none" 2>&1)
check "a missing run refused" test $? -eq 2
check "naming the file" grep -q "$dir/none/metrics.jsonl" <<<"$out"
echo "$(( 11 - failures )) passed, $failures failed"
[ $failures -eq 0 ]
