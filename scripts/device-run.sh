#!/usr/bin/env bash
# Issue 35's GPU list, in order, in one command on the GPU machine (after device-deps.sh here):
#
#   run(command="bash scripts/device-run.sh", carry=[".deps"], timeout_s=600)
#
#   1. the build (scripts/device-build.sh, going on past a failing file so that one run shows
#      every error): hybrid_train, the CUDA memory tests and the benchmarks first;
#   2. the engine's test programs, whose op and model checks also run on CUDA where a GPU is:
#      the CUDA memory tests first and alone, then (built while steps 3 and 4 run) the others side
#      by side, 2 threads each;
#   3. hybrid_train on CUDA: the quick start, gpt_tiny in bf16 and in fp16 with loss scaling, the
#      Llama debug config in bf16;
#   4. gpt_tiny with and without a DTR budget on CUDA: the same model.pt, byte for byte;
#   5. planner: `hybrid_train plan` for GPT-2 small (synthetic tokens) on one device of this GPU's
#      catalog kind, the plan it writes trained 20 steps, its predicted step and peak against the
#      measured ones (scripts/compare_plan_run.py);
#   6. calibrate: scripts/device-calibrate.py, the GPU's matmul and bandwidth curves for the
#      planner's device catalog, into $OUT/calibration.json (run before the test programs);
#   8. ranks (issue 67): two ranks sharing the GPU over the carried Open MPI (device tensors through
#      host memory): pipeline 1F1B, interleaved and NCCL-like posting at pp = 2 against one rank,
#      ZeRO-2 and ZeRO-3 against plain data parallelism, t = 2 against one rank's losses;
#   7. the measured tables: bench_step_vs_autograd (interpreter vs autograd), bench_dtr_budget
#      (DTR at 0.5/0.3/0.2 of activations, with PyTorch eager and torch.utils.checkpoint in this
#      machine's python3), then its largest-batch search, on ResNet-50 at 224 and GPT-2 small;
#      bench_host_swap (issue 67: swap and hybrid at 0.3 of the activations over the GPU's link);
#      bench_attention (the attention op against composed attention and PyTorch's SDPA);
#      bench_fused_optimizer (ATen's multi-tensor AdamW against torch::optim's kernels: "optimizer").
#
# A session holds the machine for about 15 minutes, its start included, and the machine comes back
# bare: so every step runs under one deadline (HT_DEVICE_DEADLINE seconds from the start, default
# 530, inside the tool's 600), each step's time limit cut to what is left, and what is not reached
# is said. HT_DEVICE_STEPS (default build,tests,jobs,budget,ranks,bench,calibrate,planner) picks steps; instead
# of bench, autograd, dtr, maxbatch, hostswap, attention and optimizer pick benchmarks. HT_DEVICE_TEST_LIMIT (default
# 200) caps each test program's seconds; test_launcher runs last, alone, in three gtest shards
# without the sharded jobs and then those alone, each capped by HT_DEVICE_LAUNCHER_LIMIT (default 240).
#
# The tool brings back at most 8 files: everything lands in $OUT/summary.txt (a line per step) and
# $OUT/logs.tgz (each step's whole log), packed again after every step.
set -uo pipefail
cd "$(dirname "$0")/.."
# Open MPI carried in .deps/openmpi (scripts/device-mpi.sh): the build finds MPI, the ranks step runs.
# shellcheck source=scripts/device-mpi.sh
source scripts/device-mpi.sh
out=${OUT:-device-out}
logs=device-logs
rm -rf "$logs" && mkdir -p "$out" "$logs"
steps=${HT_DEVICE_STEPS:-build,tests,jobs,budget,ranks,bench,calibrate,planner}
deadline=$((SECONDS + ${HT_DEVICE_DEADLINE:-530}))
bin=${HT_BUILD_DIR:-build-device}
say() { echo "device-run: $*" | tee -a "$out/summary.txt"; }
# Without the runs' checkpoints: the GPT-2 plan's end-of-run checkpoint (1.4 GB) kept logs.tgz
# from coming back in the fifth session.
pack() { tar czf "$out/logs.tgz" --exclude='checkpoints' --exclude='*.pt' "$logs" 2>/dev/null; }
# left MAX: seconds a step may take, at most MAX, never past the deadline (0 when it has passed).
left() { local l=$((deadline - SECONDS)); ((l < 0)) && l=0; ((l > $1)) && l=$1; echo "$l"; }
say "started $(date -u +%FT%TZ) at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
nvidia-smi >"$logs/nvidia-smi.txt" 2>&1 || true
# Which C++ standard library symbols libtorch exports (its copies shadow libstdc++'s).
nm -D --defined-only "$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch.so"))')" \
  2>/dev/null | c++filt | grep -E ' std::(filesystem|__cxx11)' >"$logs/libtorch-std-symbols.txt" || true
say "libtorch exports $(wc -l <"$logs/libtorch-std-symbols.txt") std:: symbols (libtorch-std-symbols.txt)"

# shellcheck disable=SC2206
tests=(${HT_DEVICE_TESTS:-test_runtime test_memory test_models test_training test_alloc test_parallel test_planner test_launcher})
build() {  # log name, time limit, targets...: one build, a summary line and its first errors
  local name=$1 limit=$2 start=$SECONDS
  shift 2
  HT_KEEP_GOING=1 timeout "$limit" bash scripts/device-build.sh "$@" >"$logs/$name.log" 2>&1
  local status=$?
  say "$name: exit $status in $((SECONDS - start)) s; $(grep -c 'error:' "$logs/$name.log") error lines"
  grep -m 30 -E 'error:|FAILED:|CMake Error' "$logs/$name.log" | tee -a "$out/summary.txt"
}
# First what the jobs and the benchmarks need, then (in the background, while the CUDA memory
# tests and the jobs run) the other test programs.
test_build=
if [[ $steps == *build* ]]; then
  build build "$(left 330)" hybrid_train test_cuda_memory bench_step_vs_autograd bench_dtr_budget bench_attention \
    bench_fused_optimizer bench_host_swap
  grep -E "^(cmake|ninja|g\+\+|nvcc|mpirun|torch|nccl) |^NVIDIA|^-- hybrid_train" "$logs/build.log" | tee -a "$out/summary.txt"
  pack
  if [[ $steps == *tests* ]]; then
    build build_tests "$(left 300)" "${tests[@]}" &
    test_build=$!
  fi
fi

gtest() {  # program, time limit[, log name[, gtest arguments...]]: one test program, a summary line when it ends
  local t=$1 limit=$2 name=${3:-$1} start=$SECONDS
  shift 3 2>/dev/null || shift $#
  local args=("$@")
  ((${#args[@]})) || args=(--gtest_brief=1)
  if [ ! -x "$bin/tests/$t" ]; then say "$t: not built"; return; fi
  if ((limit == 0)); then say "$t: not run (deadline)"; return; fi
  # Line-buffered, so that a crash leaves the log up to it.
  timeout "$limit" stdbuf -oL -eL "$bin/tests/$t" "${args[@]}" >"$logs/$name.log" 2>&1
  local status=$?
  say "$name: exit $status in $((SECONDS - start)) s; $(grep -hE '^\[  (PASSED|FAILED|SKIPPED) ' "$logs/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$logs/$name.log" | head -20 | tee -a "$out/summary.txt"
  # A crash (a signal, not a timeout): where, from cuda-gdb (the machine has no gdb).
  if ((status > 128 && status != 137)) && command -v cuda-gdb >/dev/null && (($(left 90) > 20)); then
    tail -3 "$logs/$name.log" | tee -a "$out/summary.txt"
    timeout "$(left 90)" cuda-gdb -batch -ex run -ex bt --args "$bin/tests/$t" --gtest_brief=1 >"$logs/$name.gdb.log" 2>&1
    grep -E '^#[0-9]+ ' "$logs/$name.gdb.log" | head -25 | tee -a "$out/summary.txt"
  fi
}

if [[ $steps == *tests* ]]; then
  gtest test_cuda_memory "$(left 90)"
  pack
fi

job() {  # name, config, overrides...
  local name=$1 start=$SECONDS limit
  shift
  limit=$(left 90)
  if ((limit == 0)); then say "$name: not run (deadline)"; return; fi
  timeout "$limit" "$bin/launcher/hybrid_train" "$@" --training.device=cuda --job.output_dir="$logs/runs/$name" \
    >"$logs/$name.log" 2>&1
  say "$name: exit $? in $((SECONDS - start)) s: $(grep -E '^(done|hybrid_train: error|stopped)' "$logs/$name.log" | tail -1)"
}

# The quick start's data: Debian's dataset-fashion-mnist, carried in .deps/ by device-deps.sh; the
# tests read it where Debian's package puts it.
fmnist=()
[ -d .deps/fashion-mnist ] && fmnist=(--data.path=.deps/fashion-mnist)
if [ -d .deps/fashion-mnist ] && [ ! -e /usr/share/datasets/fashion-mnist ]; then
  mkdir -p /usr/share/datasets && ln -s "$PWD/.deps/fashion-mnist" /usr/share/datasets/fashion-mnist
fi
if [[ $steps == *jobs* ]]; then
  job quickstart configs/quickstart.toml --training.epochs=1 "${fmnist[@]}"
  job gpt_bf16 configs/gpt_tiny.toml --training.steps=200 --training.mixed_precision=bf16
  job gpt_fp16 configs/gpt_tiny.toml --training.steps=200 --training.mixed_precision=fp16
  job llama_bf16 configs/llama_debug.toml --training.steps=200 --training.mixed_precision=bf16
  pack
fi

if [[ $steps == *budget* ]]; then
  # The budget: the plain run's fixed state (its memory after a step) and half its activations
  # (the peak above that), the DTR paper's convention.
  common=(configs/gpt_tiny.toml --training.steps=60 --checkpoint.interval=60 --model.dropout=0)
  job gpt_plain "${common[@]}"
  plain=$(ls -d "$logs"/runs/gpt_plain/checkpoints/*/ 2>/dev/null | tail -1)
  # The budget: the plain run's fixed state (its memory after a step) and a share of its
  # activations (the peak above that): half first (the DTR paper's convention), then less where
  # nothing was evicted (the plain peak counts cuBLAS's workspaces, which no budget holds), or
  # more where half is out of reach.
  for share in 0.5 0.3 0.2 0.7; do
    budget=$(python3 - "$logs/runs/gpt_plain/metrics.jsonl" "$share" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"mem_peak_bytes"' in l]
peak = max(r["mem_peak_bytes"] for r in rows if r.get("mem_peak_bytes"))
act = max(r.get("activation_peak_bytes") or 0 for r in rows)
print(int(peak - act * (1 - float(sys.argv[2]))))
PY
)
    say "budget: ${budget:-?} bytes (the plain run's peak less $(python3 -c "print(round(1 - $share, 2))") of its activations)"
    job "gpt_dtr_$share" "${common[@]}" --memory.budget="${budget:-0}" --memory.policy=dtr
    dtr=$(ls -d "$logs/runs/gpt_dtr_$share"/checkpoints/*/ 2>/dev/null | tail -1)
    # A budget that fits and evicts: the check means nothing where nothing was recomputed.
    [ -n "$dtr" ] && grep -q '"evictions": *[1-9]' "$logs/runs/gpt_dtr_$share/metrics.jsonl" && break
  done
  if [ -n "$plain" ] && [ -n "$dtr" ] && cmp "$plain/model.pt" "$dtr/model.pt"; then
    say "budget: model.pt byte-identical with and without the budget; $(grep -c '"evictions": *[1-9]' "$logs/runs/gpt_dtr_$share/metrics.jsonl") logged steps evicted"
  else
    say "budget: model.pt differs or is missing (plain ${plain:-none}, dtr ${dtr:-none})"
  fi
  # The static policies at DTR's budget (full recomputation, the per-block plan, with offload over
  # the CUDA host link too) and host swap over that link (swap, hybrid), each against the plain
  # run's model.pt; the swaps say how many bytes came back before they were needed.
  for policy in full per_block per_block_offload swap hybrid; do
    extra=(--memory.policy="$policy")
    [ "$policy" = per_block_offload ] && extra=(--memory.policy=per_block --memory.block_offload=true)
    job "gpt_$policy" "${common[@]}" --memory.budget="${budget:-0}" "${extra[@]}"
    grep -o '"swap_[a-z_]*": *[0-9.]*' "$logs/runs/gpt_$policy/metrics.jsonl" 2>/dev/null | tail -4 | tr '\n' ' ' |
      sed 's/^/  /' | tee -a "$out/summary.txt"
    ran=$(ls -d "$logs/runs/gpt_$policy"/checkpoints/*/ 2>/dev/null | tail -1)
    if [ -n "$plain" ] && [ -n "$ran" ] && cmp "$plain/model.pt" "$ran/model.pt"; then
      say "budget, $policy: model.pt byte-identical; peak $(grep -o '"mem_peak_bytes": *[0-9]*' "$logs/runs/gpt_$policy/metrics.jsonl" | tail -1)"
    else
      say "budget, $policy: model.pt differs or is missing (${ran:-none}); $(grep -m2 -E 'error|refus' "$logs/gpt_$policy.log")"
    fi
  done
  pack
fi

if [[ $steps == *ranks* ]]; then
  if ! command -v mpirun >/dev/null || [ ! -e "$bin/CMakeCache.txt" ] || ! grep -q 'MPI_CXX_FOUND:INTERNAL=TRUE\|MPI_CXX_LIB_NAMES' "$bin/CMakeCache.txt"; then
    say "ranks: not run: no MPI in this build (carry .deps/openmpi: scripts/device-deps.sh)"
  else
    rjob() {  # name, ranks, overrides...: one job of N ranks sharing the GPU
      local name=$1 n=$2 start=$SECONDS limit
      shift 2
      limit=$(left 90)
      if ((limit == 0)); then say "ranks $name: not run (deadline)"; return; fi
      timeout "$limit" mpirun --oversubscribe -np "$n" "$bin/launcher/hybrid_train" "${rcommon[@]}" "$@" \
        --training.device=cuda --job.output_dir="$logs/runs/ranks_$name" >"$logs/ranks_$name.log" 2>&1
      say "ranks $name: exit $? in $((SECONDS - start)) s: $(grep -E '^(done|hybrid_train: error|stopped)' "$logs/ranks_$name.log" | tail -1)"
    }
    same() {  # name, reference: model.pt byte for byte
      local a b
      a=$(ls -d "$logs/runs/ranks_$1"/checkpoints/*/ 2>/dev/null | tail -1)
      b=$(ls -d "$logs/runs/ranks_$2"/checkpoints/*/ 2>/dev/null | tail -1)
      if [ -n "$a" ] && [ -n "$b" ] && cmp -s "$a/model.pt" "$b/model.pt"; then
        say "ranks $1: model.pt byte-identical to $2's"
      else
        say "ranks $1: model.pt differs from $2's or is missing"
      fi
    }
    # Llama untied: a pipeline of a tied model sums the tied gradients in another order.
    rcommon=(configs/gpt_tiny.toml --model.name=llama --model.n_kv_heads=2 --model.multiple_of=16
             --model.tie_embeddings=false --model.n_layer=4 --model.dropout=0 --training.steps=20
             --checkpoint.interval=20 --training.micro_batch_size=8 --metrics.log_interval=1)
    rjob one 1
    rjob pp2_1f1b 2 --parallel.pipeline_parallel=2 --parallel.pipeline_schedule=1f1b && same pp2_1f1b one
    rjob pp2_interleaved 2 --parallel.pipeline_parallel=2 --parallel.pipeline_schedule=interleaved_1f1b \
      --parallel.virtual_stages=2 && same pp2_interleaved one
    rjob pp2_nccl_like 2 --parallel.pipeline_parallel=2 --parallel.pipeline_p2p=nccl_like && same pp2_nccl_like one
    rjob dp2 2
    rjob zero2 2 --parallel.shard=gradients && same zero2 dp2
    rjob zero3 2 --parallel.shard=parameters && same zero3 dp2
    rjob t2 2 --parallel.tensor_parallel=2
    python3 scripts/same_losses.py "$logs/runs/ranks_one" "$logs/runs/ranks_t2" --steps 20 2>&1 |
      tail -1 | sed 's/^/ranks t2 against one: /' | tee -a "$out/summary.txt"
  fi
  pack
fi

# GPU time by CUDA events: the background build does not disturb it.
if [[ $steps == *calibrate* ]]; then
  start=$SECONDS
  timeout "$(left 120)" python3 scripts/device-calibrate.py --out "$out/calibration.json" >"$logs/calibrate.log" 2>&1
  say "calibrate: exit $? in $((SECONDS - start)) s"
  cat "$logs/calibrate.log" >>"$out/summary.txt"
  pack
fi

# The other test programs side by side (2 threads each); they end before the benchmarks time anything.
if [[ $steps == *tests* ]]; then
  [ -n "$test_build" ] && wait "$test_build"
  background=()
  launcher=
  for t in "${tests[@]}"; do
    if [ "$t" = test_launcher ]; then launcher=1; continue; fi
    OMP_NUM_THREADS=2 gtest "$t" "$(left "${HT_DEVICE_TEST_LIMIT:-200}")" &
    background+=($!)
  done
  for p in "${background[@]}"; do wait "$p"; done
  pack
  # test_launcher last and alone: its jobs (mpirun ranks among them) take cores of their own. Beside
  # the other programs it did not finish in 170 s (third GPU session); in two gtest shards side by
  # side, each stopped after the Report tests and ran out its 330 s with no failure shown (fourth
  # session). The same tests finished in three pieces: three shards without the sharded jobs (41
  # tests each, 88-124 s) and then the sharded jobs alone (83 s). So: that, with each test's start
  # in the log (no --gtest_brief), so that a test that hangs is named.
  if [ -n "$launcher" ]; then
    background=()
    for shard in 0 1 2; do
      GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$shard OMP_NUM_THREADS=4 \
        gtest test_launcher "$(left "${HT_DEVICE_LAUNCHER_LIMIT:-240}")" "test_launcher.$shard" \
        --gtest_filter='-*ShardedJob*' &
      background+=($!)
    done
    for p in "${background[@]}"; do wait "$p"; done
    OMP_NUM_THREADS=8 gtest test_launcher "$(left "${HT_DEVICE_LAUNCHER_LIMIT:-240}")" test_launcher.sharded \
      --gtest_filter='*ShardedJob*'
    pack
  fi
fi

# The planner against this GPU: the catalog kind's plan for GPT-2 small on one device (synthetic
# tokens: no data set there), trained as written for 20 steps.
if [[ $steps == *planner* ]]; then
  gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
  case "$gpu" in
    *H200*) kind=h200 ;;
    *H100*PCIe*) kind=h100-pcie ;;
    *H100*) kind=h100-sxm ;;
    *) kind= ;;
  esac
  gpt2=(configs/gpt2_124m.toml --data.dataset=synthetic --data.synthetic_shape=[1024] --data.synthetic_classes=50257
        --data.synthetic_samples=16384)
  # Issue 67: `plan` on "cuda" without --cluster names this GPU's kind itself (its first line says which).
  timeout 60 "$bin/launcher/hybrid_train" plan "${gpt2[@]}" --training.device=cuda --job.output_dir="$logs/plan_local" \
    >"$logs/plan_local.log" 2>&1
  say "planner: plan on cuda without --cluster exit $?: $(grep -m1 -E "^plan: this machine|error" "$logs/plan_local.log")"
  # ... and a run on cuda predicts itself from that trace; auto trains the plan it chose.
  job gpt_auto configs/gpt_tiny.toml --training.steps=20 --parallel.strategy=auto
  grep -m2 -E "^predicted|auto:" "$logs/gpt_auto.log" | sed 's/^/  /' | tee -a "$out/summary.txt"
  if [ -z "$kind" ]; then
    say "planner: no catalog kind for '$gpu'"
  elif (($(left 240) < 60)); then
    say "planner: not run (deadline)"
  else
    start=$SECONDS
    timeout 60 "$bin/launcher/hybrid_train" plan "${gpt2[@]}" --cluster "$kind:1x1" --job.output_dir="$logs/plan_gpt2" \
      >"$logs/plan_gpt2.log" 2>&1
    say "planner: plan for $kind:1x1 exit $? in $((SECONDS - start)) s"
    timeout "$(left 200)" "$bin/launcher/hybrid_train" "$logs/plan_gpt2/plan.toml" --training.steps=20 --metrics.time_by_op=true \
      --metrics.log_interval=1 --job.output_dir="$logs/run_gpt2" >"$logs/run_gpt2.log" 2>&1
    say "planner: the plan trained, exit $? in $((SECONDS - start)) s"
    python3 scripts/compare_plan_run.py "$logs/plan_gpt2" "$logs/run_gpt2" 2>&1 | tee -a "$out/summary.txt"
  fi
  pack
fi
want() { [[ $steps == *bench* || $steps == *$1* ]]; }  # bench: all of them; or by name
if want autograd || want dtr || want maxbatch || want attention || want optimizer || want hostswap; then
  bench() {  # log name, limit, program, arguments...
    local name=$1 limit=$2 program=$3 start=$SECONDS
    shift 3
    if [ ! -x "$bin/bench/$program" ]; then say "$name: not built"; return; fi
    if ((limit == 0)); then say "$name: not run (deadline)"; return; fi
    timeout "$limit" "$bin/bench/$program" --device cuda "$@" >"$logs/$name.log" 2>&1
    say "$name: exit $? in $((SECONDS - start)) s"
    cat "$logs/$name.log" >>"$out/summary.txt"
    pack
  }
  want autograd && bench step_vs_autograd "$(left 120)" bench_step_vs_autograd --reps 5 --warmup 2
  want dtr && bench dtr_budget "$(left 180)" bench_dtr_budget --policies dtr --ratios 0.5,0.3,0.2 --reps 3 --warmup 1 \
    --peer python3 --no-max-batch
  # Issue 67's stage 1: swap and hybrid at 0.3 of GPT-2 small's and ResNet-50's activations over the
  # GPU's own link, bit for bit against the unbudgeted run (exit 1 otherwise), with the share of
  # bytes back before their read ("hidden").
  want hostswap && bench host_swap "$(left 150)" bench_host_swap --policies swap,hybrid --ratios 0.3 --reps 3 \
    --warmup 1 --no-max-batch
  want attention && bench attention "$(left 150)" bench_attention --reps 5 --warmup 2
  want optimizer && bench fused_optimizer "$(left 90)" bench_fused_optimizer --reps 10 --warmup 2
  want maxbatch && bench dtr_max_batch "$(left 600)" bench_dtr_budget --policies dtr --only-max-batch --reps 2 --warmup 1
fi
say "ended $(date -u +%FT%TZ), $SECONDS s after the start"
pack
