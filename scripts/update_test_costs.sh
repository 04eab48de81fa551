#!/usr/bin/env bash
# Records the test run's durations (ctest's cost data in build/) as tests/ctest_costs.txt, which a
# new build folder starts from (cmake/HtSuiteTests.cmake): ctest then starts the longest tests
# first on a fresh clone. Run after a whole `ctest` run on a machine like CI's; commit the file
# when tests were added, renamed, or got much longer or shorter.
#   bash scripts/update_test_costs.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
data="$build/Testing/Temporary/CTestCostData.txt"
[[ -f $data ]] || { echo "update_test_costs: no $data: run ctest in $build first" >&2; exit 2; }
{
  echo "# ctest's cost data (name, runs, mean seconds) from a whole run: written by scripts/update_test_costs.sh."
  echo "# Only the order matters: ctest starts the tests with the largest cost first."
  # The runs count as one, so that this build's own runs soon outweigh the seed.
  awk '/^---/ {exit} NF == 3 {printf "%s 1 %.2f\n", $1, $3}' "$data" | sort
} > tests/ctest_costs.txt
echo "update_test_costs: $(grep -vc '^#' tests/ctest_costs.txt) tests in tests/ctest_costs.txt"
