#!/usr/bin/env python3
"""Draws one training step of memory traces (memory.trace = true) side by side as an SVG.

Each trace gets a panel: device bytes in use over the step's time, the budget, every
recomputation as a red bar under the curve, every eviction (or planned drop) as a tick above it.
Only Python's standard library: it runs wherever the trainer does.

    python3 scripts/memory_timeline.py --step 3 --budget 183035456 \\
        "DTR=runs/dtr/memory_trace.json" "static plan=runs/static/memory_trace.json" \\
        -o docs/memory_timeline.svg
"""
import argparse
import json
import os
import sys
from xml.sax.saxutils import escape

def fail(message):
    """A user's mistake: one line naming the file or argument and what would work, exit status 2."""
    print(f"memory_timeline.py: {message}", file=sys.stderr)
    sys.exit(2)


WIDTH, PANEL_H, MARGIN_L, MARGIN_R, MARGIN_T, GAP = 900, 190, 70, 20, 30, 40


def step_events(path, step):
    """The events between the markers "step N" and "step N+1" (or the end), times from the step's start."""
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        fail(f"{path}: not a memory trace ({e}); hybrid_train writes one with memory.trace = true")
    start = end = None
    for e in events:
        if e.get("cat") == "step" and e.get("name") == f"step {step}":
            start = e["ts"]
        elif start is not None and e.get("cat") == "step" and e.get("name", "").startswith("step "):
            end = e["ts"]
            break
    if start is None:
        fail(f"{path}: no marker \"step {step}\" (record more steps with memory.trace_steps, or pick an earlier --step)")
    inside = [e for e in events if e["ts"] >= start and (end is None or e["ts"] < end)]
    for e in inside:
        e["ts"] -= start
    return inside


def summary(events):
    memory = [(e["ts"], e["args"]["in_use"]) for e in events if e.get("ph") == "C"]
    recompute = [e for e in events if e.get("cat") == "recompute"]
    kernels = [e for e in events if e.get("cat") in ("kernel", "recompute")]
    evictions = [e for e in events if e.get("cat") == "evict"]
    duration = max([e["ts"] + e.get("dur", 0) for e in events] or [1.0])
    return memory, recompute, kernels, evictions, duration


def panel(out, top, label, events, budget, x_max, y_max):
    memory, recompute, kernels, evictions, _ = summary(events)
    plot_w = WIDTH - MARGIN_L - MARGIN_R
    x = lambda t: MARGIN_L + plot_w * t / x_max
    y = lambda b: top + PANEL_H - PANEL_H * b / y_max
    peak = max([b for _, b in memory] or [0])
    busy = sum(e["dur"] for e in recompute) / 1e3
    total = sum(e["dur"] for e in kernels) / 1e3
    out.append(f'<text x="{MARGIN_L}" y="{top - 8}" font-size="13" font-weight="bold">{escape(label)}</text>'
               f'<text x="{WIDTH - MARGIN_R}" y="{top - 8}" font-size="12" text-anchor="end">'
               f'peak {peak / 2**20:.1f} MiB, {len(evictions)} evictions, {len(recompute)} recomputations '
               f'({busy:.0f} of {total:.0f} ms of kernels)</text>')
    out.append(f'<rect x="{MARGIN_L}" y="{top}" width="{plot_w}" height="{PANEL_H}" fill="none" stroke="#999"/>')
    for mib in range(0, int(y_max / 2**20) + 1, max(1, int(y_max / 2**20 / 4))):
        yy = y(mib * 2**20)
        out.append(f'<line x1="{MARGIN_L - 4}" x2="{MARGIN_L}" y1="{yy:.1f}" y2="{yy:.1f}" stroke="#999"/>'
                   f'<text x="{MARGIN_L - 6}" y="{yy + 4:.1f}" font-size="10" text-anchor="end">{mib}</text>')
    if budget:
        out.append(f'<line x1="{MARGIN_L}" x2="{WIDTH - MARGIN_R}" y1="{y(budget):.1f}" y2="{y(budget):.1f}" '
                   f'stroke="#c00" stroke-dasharray="5,4"/><text x="{WIDTH - MARGIN_R - 4}" y="{y(budget) - 4:.1f}" '
                   f'font-size="10" fill="#c00" text-anchor="end">budget</text>')
    for e in recompute:
        out.append(f'<rect x="{x(e["ts"]):.1f}" y="{top + PANEL_H - 8}" width="{max(0.8, x(e["ts"] + e["dur"]) - x(e["ts"])):.1f}" '
                   f'height="8" fill="#d33"/>')
    for e in evictions:
        out.append(f'<line x1="{x(e["ts"]):.1f}" x2="{x(e["ts"]):.1f}" y1="{top}" y2="{top + 6}" stroke="#36c"/>')
    # A step of a large model has hundreds of thousands of samples; one point per pixel column keeps
    # the file small and loses nothing visible (the highest sample of each column is drawn).
    columns = {}
    for t, b in memory:
        c = int(x(t))
        columns[c] = max(columns.get(c, 0), b)
    points = " ".join(f"{c},{y(b):.1f}" for c, b in sorted(columns.items()))
    out.append(f'<polyline points="{points}" fill="none" stroke="#222" stroke-width="1.2"/>')


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces", nargs="+", help='LABEL=memory_trace.json, one panel each')
    parser.add_argument("--step", type=int, default=2, help="the step to draw (its \"step N\" marker)")
    parser.add_argument("--budget", type=float, default=0, help="bytes: the dashed line")
    parser.add_argument("-o", "--output", required=True, help="the SVG to write")
    args = parser.parse_args()
    panels = []
    for spec in args.traces:
        label, sep, path = spec.rpartition("=")
        if not sep:
            fail(f"{spec}: write LABEL=path/to/memory_trace.json")
        panels.append((label, step_events(path, args.step)))
    x_max = max(summary(events)[4] for _, events in panels)
    y_max = max([args.budget] + [max([b for _, b in summary(ev)[0]] or [0]) for _, ev in panels]) * 1.08
    height = MARGIN_T + len(panels) * (PANEL_H + GAP) + 10
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'font-family="sans-serif"><rect width="100%" height="100%" fill="white"/>']
    for i, (label, events) in enumerate(panels):
        panel(out, MARGIN_T + i * (PANEL_H + GAP), label, events, args.budget, x_max, y_max)
    bottom = MARGIN_T + len(panels) * (PANEL_H + GAP) - GAP + 28
    out.append(f'<text x="{MARGIN_L}" y="{bottom}" font-size="11">MiB in use over step {args.step} '
               f'({x_max / 1e3:.0f} ms); red: recomputations; blue ticks: evictions and planned drops</text>')
    out.append("</svg>")
    with open(args.output + ".tmp", "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(args.output + ".tmp", args.output)


if __name__ == "__main__":
    main()
