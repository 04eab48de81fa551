#!/usr/bin/env python3
"""The planner's prediction against the run of the plan it wrote (issue 35's last item, issue 33):

  python3 scripts/compare_plan_run.py PLAN_DIR RUN_DIR

PLAN_DIR holds `hybrid_train plan`'s plan.toml and plans.jsonl (the first line is the plan it
ranked first, the one plan.toml writes); RUN_DIR the run's metrics.jsonl. Prints the predicted and
measured step (the median of the logged steps after the first five: warm-up, cuDNN's and cuBLAS's
choices) and peak (the largest logged mem_peak_bytes from the second step on: the first holds no
optimizer state), and their ratios. Exit 2 when a file is missing or holds no step."""
import json
import statistics
import sys


def main(plan_dir, run_dir):
    try:
        with open(f"{plan_dir}/plans.jsonl") as f:
            plan = json.loads(f.readline())
        with open(f"{plan_dir}/plan.toml") as f:
            header = [line.rstrip() for line in f if line.startswith("# ")][:2]
        with open(f"{run_dir}/metrics.jsonl") as f:
            steps = [r for r in map(json.loads, f) if r.get("event") == "train"]
    except (OSError, ValueError) as e:
        print(f"compare_plan_run: {e}", file=sys.stderr)
        return 2
    if not steps:
        print(f"compare_plan_run: {run_dir}/metrics.jsonl: no train records", file=sys.stderr)
        return 2
    timed = [r["step_ms"] for r in steps[5:]] or [r["step_ms"] for r in steps]
    peaks = [r["mem_peak_bytes"] for r in steps[1:] if r.get("mem_peak_bytes") is not None] or [0]
    step, peak = statistics.median(timed), max(peaks)
    for line in header:
        print(line)
    print(f"plan: {plan['ranks']} rank(s), micro-batch {plan['micro_batch']} x {plan['accumulation']}, "
          f"{plan['precision']}, {plan['policy']}")
    print(f"step ms: predicted {plan['step_ms']:.1f}, measured {step:.1f} (median of {len(timed)}), "
          f"measured/predicted {step / plan['step_ms']:.3f}")
    if peak > 0:
        print(f"peak bytes: predicted {plan['peak_bytes']}, measured {peak}, "
              f"measured/predicted {peak / plan['peak_bytes']:.4f}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
