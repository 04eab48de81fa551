#!/usr/bin/env python3
"""Checks that two runs trained alike: their train losses agree step by step over the first
--steps steps (relative --rtol), as data-parallel ranks must with the one-rank run of the same
global batch (the sums differ only in fp32 reduction order, which compounds over later steps).

    python3 scripts/same_losses.py RUN_A RUN_B [--steps 50] [--rtol 1e-4]

RUN_A and RUN_B are job.output_dir folders with a metrics.jsonl logged every step
(metrics.log_interval = 1). Exits 0 and prints one line when they agree, 1 naming the first step
where they do not, 2 on unusable input."""
import argparse
import json
import sys


def losses(run):
    path = f"{run}/metrics.jsonl"
    try:
        with open(path) as f:
            return {r["step"]: r["loss"] for r in map(json.loads, f) if r.get("event") == "train"}
    except OSError as e:
        sys.exit(print(f"same_losses: cannot read {path}: {e.strerror}", file=sys.stderr) or 2)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--rtol", type=float, default=1e-4)
    a = p.parse_args()
    la, lb = losses(a.run_a), losses(a.run_b)
    for step in range(1, a.steps + 1):
        if step not in la or step not in lb:
            missing = a.run_a if step not in la else a.run_b
            print(f"same_losses: {missing} has no loss for step {step}; run it with "
                  f"--metrics.log_interval=1 and at least {a.steps} steps", file=sys.stderr)
            return 2
        if abs(la[step] - lb[step]) > a.rtol * abs(la[step]):
            print(f"same_losses: step {step}: loss {la[step]} in {a.run_a}, {lb[step]} in {a.run_b} "
                  f"(beyond rtol {a.rtol})")
            return 1
    worst = max(abs(la[s] - lb[s]) / abs(la[s]) for s in range(1, a.steps + 1))
    print(f"same_losses: steps 1-{a.steps} agree (largest relative difference {worst:.2g}); "
          f"step {a.steps}: {la[a.steps]} and {lb[a.steps]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
