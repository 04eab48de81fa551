#!/usr/bin/env python3
"""Checks the layer rule of docs/design.md ("Layout and the layer rule"): a source file includes
headers of its own folder and of folders below it, never above. The order, top to bottom:
launcher, planner, training, parallel, models, memory, runtime, alloc, schedule, base. (schedule/ is plain
C++ beside alloc/: neither includes the other.) Tests and benchmarks may include anything.

Prints each include that points up as FILE:LINE: FOLDER includes HEADER (above it), and exits 1
if there is any; else one line of summary. Argument: the repository root (default: this script's
folder's parent)."""
import os
import re
import sys

ORDER = ["launcher", "planner", "training", "parallel", "models", "memory", "runtime", "alloc", "schedule", "base"]
# Folders on one level that must not include each other.
SIDE_BY_SIDE = {("alloc", "schedule"), ("schedule", "alloc")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def rank(folder):
    return ORDER.index(folder)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad, files, includes = [], 0, 0
    for folder in ORDER:
        for dirpath, _, names in os.walk(os.path.join(root, folder)):
            for name in sorted(names):
                if not name.endswith((".h", ".cpp", ".cu")):
                    continue
                path = os.path.join(dirpath, name)
                files += 1
                with open(path, encoding="utf-8") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in ORDER:
                            continue
                        includes += 1
                        target = m.group(1)
                        if rank(target) < rank(folder) or (folder, target) in SIDE_BY_SIDE:
                            rel = os.path.relpath(path, root)
                            bad.append(f"{rel}:{number}: {folder}/ includes {line.strip()[9:].strip()} (above it)")
    for b in bad:
        print(b)
    if bad:
        return 1
    print(f"check_layers: {includes} includes of project headers in {files} files, none points up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
