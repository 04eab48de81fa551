#!/usr/bin/env bash
# Installs what hybrid_train builds and trains with, from Debian 12's packages (the README's first
# command). With --tests, also what only the tests use (the README's second command): GoogleTest
# with GoogleMock, and Chromium, in which a test opens a run's report.html (headless).
# scripts/test-bare-debian.sh checks both lists on a bare Debian 12 (debootstrap --variant=minbase).
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
packages=(
  cmake g++ make ccache pkg-config zlib1g-dev
  libtorch-dev libopenblas0-pthread      # without OpenBLAS, libtorch falls back to reference BLAS
  libopenmpi-dev openmpi-bin
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  coinor-libcbc-dev                      # the MIP solver of static plans (schedule/)
  libsentencepiece-dev                   # the tokenizer: hybrid_train tokenize, data.tokenizer
  python3                                # scripts/memory_timeline.py
  dataset-fashion-mnist
  python3-doc                            # English text for tokenizing: the Python docs' reST sources
)
# python3-torch and python3-numpy: the independent reference of the Hugging Face export (tests/python/).
if [ "${1:-}" = "--tests" ]; then packages+=(googletest libgtest-dev libgmock-dev chromium python3-torch python3-numpy); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
