#!/usr/bin/env bash
# Builds hybrid_train and its tests with AddressSanitizer and UndefinedBehaviorSanitizer into
# build-sanitize/ (RelWithDebInfo: line numbers in reports) and runs the test suite there; any
# report fails its test. Slow (a full build, and tests 2-3x slower): not part of CI; docs/testing.md
# says when it last passed. Extra arguments go to ctest (e.g. -R HostSwap).
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
jobs=$(nproc)
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHT_SANITIZE=ON -DHT_BUILD_BENCH=OFF >/dev/null
cmake --build build-sanitize -j"$jobs"
# Leaks: libtorch, oneDNN, OpenBLAS and Open MPI keep process-lifetime allocations they never free;
# leaks from this project's code still fail (scripts/lsan.supp names only those libraries).
# Full stacks for allocations: Open MPI's plugins are unloaded before the leak check, so their
# allocations show as "<unknown module>" unless the stack reaches the library that loaded them.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:detect_stack_use_after_return=0:strict_string_checks=1:fast_unwind_on_malloc=0"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0:fast_unwind_on_malloc=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Open MPI's own processes (mpirun) are not instrumented; its libraries in ours are.
ctest --test-dir build-sanitize -j"$jobs" --output-on-failure --timeout 1800 "$@"
