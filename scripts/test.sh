#!/usr/bin/env bash
# The README's second command: install, build everything (tests and benchmarks too), and run the
# whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --tests
bash scripts/build.sh -DHT_BUILD_TESTS=ON -DHT_BUILD_BENCH=ON
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
