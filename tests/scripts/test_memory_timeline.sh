#!/usr/bin/env bash
# scripts/memory_timeline.py on a small hand-made trace: it draws the step asked for, and refuses
# bad input with exit status 2, one line naming what would work, and nothing written.
set -u
script="$1/scripts/memory_timeline.py"
source "$(dirname "$0")/check.sh"
cat > "$dir/trace.json" <<'JSON'
{"traceEvents":[
{"name":"step 1","cat":"step","ph":"i","ts":0,"s":"t"},
{"name":"device memory","ph":"C","ts":1,"args":{"in_use":1048576}},
{"name":"relu","cat":"kernel","ph":"X","ts":2,"dur":5},
{"name":"evict relu","cat":"evict","ph":"i","ts":8,"s":"t","args":{"tensor":3,"bytes":4096}},
{"name":"relu","cat":"recompute","ph":"X","ts":10,"dur":4},
{"name":"device memory","ph":"C","ts":12,"args":{"in_use":2097152}},
{"name":"step 2","cat":"step","ph":"i","ts":20,"s":"t"},
{"name":"device memory","ph":"C","ts":21,"args":{"in_use":9999999999}}
]}
JSON
python3 "$script" --step 1 --budget 3145728 "one=$dir/trace.json" "two=$dir/trace.json" -o "$dir/out.svg"
check "draws a step" test $? -eq 0 -a -s "$dir/out.svg"
check "one curve per panel" test "$(grep -c '<polyline' "$dir/out.svg")" -eq 2
check "the step's summary" grep -q '1 evictions, 1 recomputations' "$dir/out.svg"
check "only the step asked for (its peak, not the next step's)" grep -q 'peak 2.0 MiB' "$dir/out.svg"
refused() {  # refused MESSAGE ARGS...
  local message=$1; shift
  local out
  out=$(python3 "$script" "$@" -o "$dir/bad.svg" 2>&1)
  local status=$?
  [ $status -eq 2 ] && [[ "$out" == *"$message"* ]] && [ ! -e "$dir/bad.svg" ]
}
check "a step not traced" refused 'no marker "step 5" (record more steps with memory.trace_steps' --step 5 "a=$dir/trace.json"
check "a missing file" refused 'not a memory trace' "a=$dir/nope.json"
check "no label" refused 'write LABEL=path/to/memory_trace.json' "$dir/trace.json"
echo "$(( 7 - failures )) passed, $failures failed"
[ $failures -eq 0 ]
