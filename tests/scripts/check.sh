# Sourced by the scripts' tests: a scratch folder $dir removed at exit, and `check NAME CONDITION...`,
# which prints ok or FAILED and counts failures in $failures.
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok: $name"; else echo "FAILED: $name"; failures=$((failures + 1)); fi
}
