#!/usr/bin/env python3
"""The planner's prediction against the run of the plan it wrote (issue 35's last item, issue 33):

  python3 scripts/compare_plan_run.py PLAN_DIR RUN_DIR

PLAN_DIR holds `hybrid_train plan`'s plan.toml and plans.jsonl (the first line is the plan it
ranked first, the one plan.toml writes); RUN_DIR the run's metrics.jsonl. Prints the predicted and
measured step (the median of the logged steps after the first five: warm-up, cuDNN's and cuBLAS's
choices) and peak (the largest logged mem_peak_bytes from the second step on: the first holds no
optimizer state), and their ratios; where the run logged its time by op (metrics.time_by_op =
true), that beside the plan's compute split by op. Exit 2 when a file is missing or holds no step."""
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
            records = [json.loads(line) for line in f]
        steps = [r for r in records if r.get("event") == "train"]
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
    by_op = [r for r in records if r.get("event") == "time_by_op"]
    if by_op and plan.get("compute_by_op_ms"):
        print_by_op(plan["compute_by_op_ms"], by_op[-1])
    return 0


def print_by_op(predicted, measured):
    """The plan's compute split by op (its traced step's shares) beside the run's kernel times by
    op (metrics.time_by_op), per step, the largest first: the ops a missed step comes from."""
    ran = measured["ms_per_step"]
    ops = sorted(set(predicted) | set(ran), key=lambda op: -max(predicted.get(op, 0), ran.get(op, 0)))
    print(f"time by op, ms per step (run: steps {measured['first_step']}-"
          f"{measured['first_step'] + measured['steps'] - 1}, kernels only):")
    print(f"  {'op':<28} {'predicted':>10} {'measured':>10} {'measured/predicted':>19}")
    shown = 0
    for op in ops:
        p, m = predicted.get(op, 0.0), ran.get(op, 0.0)
        if shown == 16 or max(p, m) < 0.005 * max(sum(predicted.values()), sum(ran.values())):
            continue
        ratio = f"{m / p:.3f}" if p > 0 else "-"
        print(f"  {op:<28} {p:>10.1f} {m:>10.1f} {ratio:>19}")
        shown += 1
    p, m = sum(predicted.values()), sum(ran.values())
    print(f"  {'all ops':<28} {p:>10.1f} {m:>10.1f} {m / p if p > 0 else 0:>19.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
