#!/usr/bin/env bash
# The README's second command: install, build, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh --tests
bash scripts/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" "$@"
