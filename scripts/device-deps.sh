#!/usr/bin/env bash
# Fills .deps/ (ignored by git) with what the GPU machine lacks and the build needs, from this
# machine's Debian packages, for the device tool to carry there (`carry: [".deps"]`):
#   .deps/include/CLI, .deps/include/toml++   CLI11 and toml++ (header-only there)
#   .deps/include/nlohmann                    nlohmann/json (header-only)
#   .deps/include/zlib.h, zconf.h             zlib's headers (every Linux has libz.so.1)
#   .deps/googletest                          GoogleTest's sources, built there with the tests
#   .deps/fashion-mnist                       the quick start's data, where dataset-fashion-mnist is installed
#   .deps/openmpi                             Open MPI's Debian packages (4.6 MB), which
#                                             scripts/device-mpi.sh unpacks there: several ranks
#                                             on the one GPU (issue 67)
# COIN-OR CBC is not carried: the device build goes without the MIP (static plans take the
# segments heuristic). scripts/device-build.sh uses .deps/.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in /usr/include/CLI/CLI.hpp /usr/include/toml++/toml.h /usr/include/nlohmann/json.hpp /usr/include/zlib.h /usr/src/googletest/CMakeLists.txt; do
  [ -e "$f" ] || { echo "device-deps: $f is missing; run bash scripts/install-deps.sh --tests first" >&2; exit 2; }
done
rm -rf .deps
mkdir -p .deps/include
cp -r /usr/include/CLI /usr/include/toml++ /usr/include/nlohmann .deps/include/
cp /usr/include/zlib.h /usr/include/zconf.h .deps/include/
cp -r /usr/src/googletest .deps/googletest
# The quick start's data (scripts/device-run.sh passes --data.path=.deps/fashion-mnist).
[ -d /usr/share/datasets/fashion-mnist ] && cp -r /usr/share/datasets/fashion-mnist .deps/fashion-mnist
# Open MPI and what its libraries need beyond the C library, as Debian 12 packages them.
mkdir -p .deps/openmpi
(cd .deps/openmpi && apt-get download openmpi-bin libopenmpi3 libopenmpi-dev openmpi-common libpmix2 libhwloc15 \
  libevent-core-2.1-7 libevent-pthreads-2.1-7 >/dev/null 2>&1) ||
  echo "device-deps: Open MPI's packages could not be downloaded (apt-get update first?); the device build goes without MPI" >&2
echo "device-deps: .deps/ holds $(du -sh .deps | cut -f1) (the device tool carries up to 64 MiB)"
