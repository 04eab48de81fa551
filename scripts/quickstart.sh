#!/usr/bin/env bash
# The README's first command: install, build, and train the default job on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh
./build/launcher/hybrid_train "$@"
