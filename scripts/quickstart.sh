#!/usr/bin/env bash
# The README's first command: install, build hybrid_train (not the tests or benchmarks, which need
# packages of their own), and train the default job on the CPU.
# Extra arguments are config overrides, e.g. --training.epochs=1
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh -DHT_BUILD_TESTS=OFF -DHT_BUILD_BENCH=OFF
./build/launcher/hybrid_train configs/quickstart.toml "$@"
