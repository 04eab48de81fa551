#!/usr/bin/env bash
# Issue 18's GPU list, in order, in one command on the GPU machine (after device-deps.sh here):
#
#   run(command="bash scripts/device-run.sh", carry=[".deps"])
#
#   1. the build (scripts/device-build.sh; build-device/ is kept while the machine stays warm);
#   2. the engine's test programs, whose op and model checks also run on CUDA where a GPU is;
#   3. hybrid_train on CUDA: the quick start, gpt_tiny in bf16 and in fp16 with loss scaling;
#   4. gpt_tiny with and without a DTR budget on CUDA: the same model.pt, byte for byte;
#   5. the measured tables: bench_step_vs_autograd (interpreter vs autograd) and bench_dtr_budget
#      (DTR at 0.5/0.3/0.2 of activations, the largest batch, and PyTorch eager and
#      torch.utils.checkpoint in this machine's python3), on ResNet-50 at 224 and GPT-2 small.
#
# The whole list may not fit one command's 10 minutes: split it with HT_DEVICE_STEPS, e.g.
# "build,tests" first, then "jobs,budget", then "bench" (build-device/ stays while warm).
#
# Each step's whole log goes to $OUT (the device tool brings it back), a line per step here.
# A step that fails does not stop the next. HT_DEVICE_STEPS=tests,jobs,budget skips the build.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-out}
mkdir -p "$out"
steps=${HT_DEVICE_STEPS:-build,tests,jobs,budget,bench}
say() { echo "device-run: $*" | tee -a "$out/summary.txt"; }
nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true

if [[ $steps == *build* ]]; then
  start=$SECONDS
  bash scripts/device-build.sh >"$out/build.log" 2>&1
  status=$?
  grep -E "^(cmake|ninja|g\+\+|nvcc|mpirun|torch|nccl) " "$out/build.log"
  say "build: exit $status in $((SECONDS - start)) s"
  [ "$status" = 0 ] || { tail -40 "$out/build.log"; exit 1; }
fi

if [[ $steps == *tests* ]]; then
  for t in test_cuda_memory test_alloc test_runtime test_memory test_models test_parallel test_planner; do
    [ -x "build-device/tests/$t" ] || { say "$t: not built"; continue; }
    start=$SECONDS
    timeout 300 "build-device/tests/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
    status=$?
    say "$t: exit $status in $((SECONDS - start)) s; $(grep -hE '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$t.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \] [A-Za-z]' "$out/$t.log" | head -20
  done
fi

job() {  # name, config, overrides...
    local name=$1
    shift
    start=$SECONDS
    timeout 240 build-device/launcher/hybrid_train "$@" --training.device=cuda --job.output_dir="$out/runs/$name" \
      >"$out/$name.log" 2>&1
    say "$name: exit $? in $((SECONDS - start)) s: $(grep -E '^(done|hybrid_train: error|stopped)' "$out/$name.log" | tail -1)"
}

if [[ $steps == *jobs* ]]; then
  job quickstart configs/quickstart.toml --training.steps=300
  job gpt_bf16 configs/gpt_tiny.toml --training.steps=200 --training.mixed_precision=bf16
  job gpt_fp16 configs/gpt_tiny.toml --training.steps=200 --training.mixed_precision=fp16
fi

if [[ $steps == *budget* ]]; then
  # The budget: the plain run's fixed state (its memory after a step) and half its activations
  # (the peak above that), the DTR paper's convention.
  common=(configs/gpt_tiny.toml --training.steps=60 --checkpoint.interval=60 --model.dropout=0)
  job gpt_plain "${common[@]}"
  budget=$(python3 - "$out/runs/gpt_plain/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"mem_peak_bytes"' in l]
peak = max(r["mem_peak_bytes"] for r in rows if r.get("mem_peak_bytes"))
act = max(r.get("activation_peak_bytes") or 0 for r in rows)
print(int(peak - act / 2))
PY
)
  say "budget: ${budget:-?} bytes (the plain run's peak less half its activations)"
  job gpt_dtr "${common[@]}" --memory.budget="$budget" --memory.policy=dtr
  plain=$(ls -d "$out"/runs/gpt_plain/checkpoints/*/ 2>/dev/null | tail -1)
  dtr=$(ls -d "$out"/runs/gpt_dtr/checkpoints/*/ 2>/dev/null | tail -1)
  if [ -n "$plain" ] && [ -n "$dtr" ] && cmp "$plain/model.pt" "$dtr/model.pt"; then
    say "budget: model.pt byte-identical with and without the budget; $(grep -c '"evictions": *[1-9]' "$out/runs/gpt_dtr/metrics.jsonl") logged steps evicted"
  else
    say "budget: model.pt differs or is missing (plain ${plain:-none}, dtr ${dtr:-none})"
  fi
fi

if [[ $steps == *bench* ]]; then
  bench() {  # name, arguments...
    local name=$1
    shift
    start=$SECONDS
    timeout 300 "build-device/bench/$name" --device cuda "$@" >"$out/$name.log" 2>&1
    say "$name: exit $? in $((SECONDS - start)) s (table in $name.log)"
  }
  bench bench_step_vs_autograd --reps 7 --warmup 2
  bench bench_dtr_budget --policies dtr --ratios 0.5,0.3,0.2 --reps 5 --warmup 2 --peer python3
fi
