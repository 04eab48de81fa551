#!/usr/bin/env bash
# The README's first command: install, build, and train the default job on the CPU.
# Extra arguments are config overrides, e.g. --training.epochs=1
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/launcher/hybrid_train configs/quickstart.toml "$@"
