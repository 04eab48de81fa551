#!/usr/bin/env bash
# Builds hybrid_train on the GPU machine (CUDA 13, PyTorch in its python3, no package registry),
# in one command, against that PyTorch's libtorch, into build-device/ (kept between commands
# there, so a second run rebuilds only what changed). What that machine lacks comes in .deps/,
# made here by scripts/device-deps.sh and carried by the device tool:
#
#   bash scripts/device-deps.sh                               (here, once)
#   run(command="bash scripts/device-build.sh", carry=[".deps"])   (there)
#
# It first prints what the machine has (compilers, CUDA, PyTorch, NCCL, MPI, the GPU), then
# configures without COIN-OR CBC (static plans use the segments heuristic), without SentencePiece
# (no tokenize command; token files tokenized elsewhere train there) and without MPI unless
# mpirun and its headers are there, and builds the targets given (default: hybrid_train and the
# engine's test programs). Environment: PYTHON (default python3), HT_DEVICE_CMAKE_ARGS (more
# cmake arguments), HT_BUILD_DIR (default build-device).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
build=${HT_BUILD_DIR:-build-device}
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(hybrid_train bench_step_vs_autograd bench_dtr_budget test_cuda_memory test_alloc test_runtime test_memory test_models test_parallel test_planner test_launcher)

echo "== device-build: what this machine has"
for tool in cmake ninja g++ nvcc mpirun nvidia-smi ccache; do
  if command -v "$tool" >/dev/null; then
    printf '%-10s %s\n' "$tool" "$("$tool" --version 2>&1 | grep -m1 -iE 'version|release|[0-9]+\.[0-9]+' || true)"
  else
    printf '%-10s missing\n' "$tool"
  fi
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$python" - <<'PY' || { echo "device-build: $python cannot import torch; set PYTHON to the python with PyTorch" >&2; exit 2; }
import importlib.util, os, torch
print(f"torch      {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, "
      f"GPU available {torch.cuda.is_available()}" + (f": {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
try:
    wheel = [h for h in __import__("glob").glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "**", "nccl.h"), recursive=True)]
    print(f"nccl       torch's {torch.cuda.nccl.version() if torch.cuda.is_available() else 'n/a'}; header {wheel[0] if wheel else 'not beside torch'}")
except Exception as e:  # a report line only: never a reason to stop the build
    print(f"nccl       not read: {e}")
PY
prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)')
[ -d .deps/include ] || { echo "device-build: .deps/ is missing: run bash scripts/device-deps.sh on the build machine and carry .deps" >&2; exit 2; }

args=(-S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" -DHT_DEPS_DIR="$PWD/.deps"
      -DHT_REQUIRE_CBC=OFF -DHT_REQUIRE_SENTENCEPIECE=OFF -DHT_BUILD_BENCH=ON)
command -v ninja >/dev/null && [ ! -f "$build/Makefile" ] && args+=(-G Ninja)
[ -d /usr/local/cuda ] && args+=(-DCUDAToolkit_ROOT=/usr/local/cuda)
# libtorch's CMake probes the GPU for its architecture list when none is given.
[ -n "${TORCH_CUDA_ARCH_LIST:-}" ] || export TORCH_CUDA_ARCH_LIST="9.0"
if ! command -v mpirun >/dev/null; then args+=(-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON); fi
# NCCL: the toolkit's, or the nvidia-nccl wheel beside PyTorch (its include/nccl.h, lib/libnccl.so.2).
if [ ! -e /usr/local/cuda/include/nccl.h ]; then
  nccl_h=$("$python" - <<'PY' 2>/dev/null
import glob, os, sysconfig
for root in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
    for h in sorted(glob.glob(os.path.join(root, "nvidia", "**", "nccl.h"), recursive=True)):
        print(h); raise SystemExit
PY
)
  [ -n "$nccl_h" ] && args+=(-DHT_NCCL_ROOT="$(dirname "$(dirname "$nccl_h")")")
fi
# shellcheck disable=SC2206
args+=(${HT_DEVICE_CMAKE_ARGS:-})
echo "== device-build: cmake ${args[*]}"
start=$(date +%s)
cmake "${args[@]}" 2>&1 | grep -vE '^-- (Looking|Performing|Check|Detecting)' 
echo "== device-build: building ${targets[*]} with $(nproc) jobs"
# HT_KEEP_GOING=1: past a failing file, so that one build shows every error (ninja or make).
keep=()
if [ -n "${HT_KEEP_GOING:-}" ]; then
  if [ -f "$build/build.ninja" ]; then keep=(-- -k 0); else keep=(-- -k); fi
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" "${keep[@]}"
echo "== device-build: done in $(( $(date +%s) - start )) s: $build/launcher/hybrid_train"
