#!/usr/bin/env python3
"""Prints the efficiency curves planner/op_time.cpp holds, from a device calibration file
(docs/measurements/*-calibration.json, written on a lent GPU by scripts/device-calibrate.py):
per element type, a contraction's achieved fraction of the device's dense peak by its flops
(2 m n k, the mean where shapes share a count), and a memory-bound kernel's achieved fraction of
the memory bandwidth by the bytes it moves.

  python3 scripts/calibration_curves.py docs/measurements/h200-2026-11-26-calibration.json \
      --bf16 989 --fp16 989 --fp32 67 --gbps 4800
"""
import argparse
import collections
import json


def curve(points):
    return ", ".join("{%.3g, %.3f}" % (size, sum(v) / len(v)) for size, v in sorted(points.items()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("calibration")
    ap.add_argument("--bf16", type=float, required=True, help="dense bf16 peak, TFLOP/s (the catalog's)")
    ap.add_argument("--fp16", type=float, required=True)
    ap.add_argument("--fp32", type=float, required=True)
    ap.add_argument("--gbps", type=float, required=True, help="memory bandwidth, GB/s (the catalog's)")
    a = ap.parse_args()
    d = json.load(open(a.calibration))
    peak = {"bfloat16": a.bf16, "float16": a.fp16, "float32": a.fp32}
    for dtype in ("float32", "bfloat16", "float16"):
        points = collections.defaultdict(list)
        for m in d["matmul"]:
            if m["dtype"] == dtype:
                points[2 * m["m"] * m["n"] * m["k"]].append(m["tflops"] / peak[dtype])
        print(f"{dtype}: {{{curve(points)}}}")
    points = collections.defaultdict(list)
    for m in d["memory"]:
        points[m["bytes_moved"]].append(m["gb_per_s"] / a.gbps)
    print(f"memory: {{{curve(points)}}}")


if __name__ == "__main__":
    main()
