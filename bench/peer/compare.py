#!/usr/bin/env python3
"""hybrid_train against the peer a user would pick instead (PyTorch eager), side by side.

  python3 bench/peer/compare.py [--build build] [--threads 1,2] [--reps 2] [--parts epoch,steps,ranks]
  python3 bench/peer/compare.py --parts accuracy        # 3 epochs each, test accuracy

Every part runs ours and the peer's in the same invocation, interleaved (A B, B A, ...), each in a
fresh process, and prints the ratio ours / peer (below 1: hybrid_train is faster):
  epoch     one epoch of configs/quickstart.toml (no checkpoints), whole-process wall time;
  steps     ResNet-18 and GPT training steps (bench/peer/*_step.toml), median step time after
            2 warm-up steps;
  ranks     the quick-start epoch on `mpirun -np 2` against one rank, 1 thread each (speed-up);
  accuracy  test accuracy after each of 3 quick-start epochs, ours and the peer's.
The peer is run by /usr/bin/python3 (Debian's python3-torch); without it the peer's rows are
skipped with a message. Not part of the test suite: it measures, it does not check.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEER_PYTHON = "/usr/bin/python3"


def run(cmd, env=None):
    """Runs cmd; returns (wall seconds, stdout). Exits on failure, showing the output."""
    start = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    if p.returncode != 0:
        sys.exit("compare.py: failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stdout[-3000:]))
    return wall, p.stdout


def peer_available():
    if not os.path.exists(PEER_PYTHON):
        return False
    return subprocess.run([PEER_PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


class Ours:
    def __init__(self, build, scratch):
        self.binary = os.path.join(ROOT, build, "launcher", "hybrid_train")
        if not os.path.exists(self.binary):
            sys.exit("compare.py: %s not found; build first (bash scripts/build.sh) or pass --build" % self.binary)
        self.scratch = scratch

    def train(self, config, threads, extra=(), ranks=1):
        out = tempfile.mkdtemp(dir=self.scratch)
        cmd = [self.binary, config, "--training.threads=%d" % threads, "--checkpoint.interval=0",
               "--job.output_dir=" + out] + list(extra)
        if ranks > 1:
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + cmd
        wall, _ = run(cmd)
        records = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        shutil.rmtree(out)
        return wall, records


def peer(args, threads):
    # torch.set_num_threads does not reach OpenBLAS's own pool: without this the peer's "1 thread"
    # runs its matrix products on every core. Both sides get the same cores.
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    wall, text = run([PEER_PYTHON, os.path.join(HERE, "peer_train.py")] + args + ["--threads", str(threads)], env)
    return wall, json.loads(text.strip().splitlines()[-1])


def ratio_row(ratios):
    return "%.3fx (%.3f-%.3f)" % (statistics.median(ratios), min(ratios), max(ratios))


def interleaved(reps, a, b):
    """Runs a() and b() reps times each, alternating which goes first; returns both lists."""
    xs, ys = [], []
    for r in range(reps):
        if r % 2 == 0:
            xs.append(a()); ys.append(b())
        else:
            ys.append(b()); xs.append(a())
    return xs, ys


def part_epoch(ours, threads, reps):
    print("\n## Quick-start epoch (configs/quickstart.toml --training.epochs=1), process wall time\n")
    print("PyTorch as its user runs it (NCHW), and with `model.to(memory_format=torch.channels_last)`, "
          "the layout hybrid_train picks by default.\n")
    print("| threads | hybrid_train s | PyTorch s | PyTorch channels-last s | ours/PyTorch (min-max) | "
          "ours/PyTorch channels-last (min-max) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for t in threads:
        a, b, c = [], [], []
        runs = [lambda: a.append(ours.train("configs/quickstart.toml", t, ["--training.epochs=1"])[0]),
                lambda: b.append(peer(["quickstart", "--epochs", "1"], t)[0]),
                lambda: c.append(peer(["quickstart", "--epochs", "1", "--channels-last"], t)[0])]
        for r in range(reps):
            for k in range(3):
                runs[(k + r) % 3]()  # rotating order
        secs = lambda xs: " ".join("%.1f" % x for x in xs)
        print("| %d | %s | %s | %s | %s | %s |" % (t, secs(a), secs(b), secs(c),
                                                   ratio_row([x / y for x, y in zip(a, b)]),
                                                   ratio_row([x / y for x, y in zip(a, c)])), flush=True)


def part_steps(ours, threads, reps, steps=12, warmup=2):
    print("\n## Training steps, median step time after %d warm-up steps\n" % warmup)
    print("| model | threads | hybrid_train ms | PyTorch ms | ratio ours/peer, median (min-max) |")
    print("| --- | --- | --- | --- | --- |")
    for model, config in (("resnet18", "bench/peer/resnet18_step.toml"), ("gpt", "bench/peer/gpt_step.toml")):
        for t in threads:
            def mine():
                _, rec = ours.train(config, t, ["--training.steps=%d" % steps])
                return statistics.median([r["step_ms"] for r in rec if r["event"] == "train"][warmup:])

            def theirs():
                _, res = peer(["step", "--model", model, "--steps", str(steps)], t)
                return statistics.median(res["step_ms"][warmup:])

            a, b = interleaved(reps, mine, theirs)
            print("| %s | %d | %s | %s | %s |" % (model, t, " ".join("%.0f" % x for x in a),
                                                  " ".join("%.0f" % y for y in b),
                                                  ratio_row([x / y for x, y in zip(a, b)])), flush=True)


def part_ranks(ours, reps):
    print("\n## mpirun -np 2 against one rank, quick-start epoch, 1 thread each, process wall time\n")
    print("| one rank s | two ranks s | speed-up, median (min-max) |")
    print("| --- | --- | --- |")
    extra = ["--training.epochs=1"]
    a, b = interleaved(reps, lambda: ours.train("configs/quickstart.toml", 1, extra)[0],
                       lambda: ours.train("configs/quickstart.toml", 1, extra, ranks=2)[0])
    print("| %s | %s | %s |" % (" ".join("%.1f" % x for x in a), " ".join("%.1f" % y for y in b),
                                ratio_row([x / y for x, y in zip(a, b)])), flush=True)


def part_accuracy(ours, threads):
    t = threads[0]
    print("\n## Test accuracy after each of 3 quick-start epochs, %d thread(s)\n" % t)
    _, rec = ours.train("configs/quickstart.toml", t, ["--training.epochs=3"])
    mine = [r["eval_accuracy"] for r in rec if r["event"] == "eval"]
    _, res = peer(["quickstart", "--epochs", "3"], t)
    print("| run | epoch 1 | epoch 2 | epoch 3 |")
    print("| --- | --- | --- | --- |")
    print("| hybrid_train | " + " | ".join("%.4f" % a for a in mine) + " |")
    print("| PyTorch | " + " | ".join("%.4f" % a for a in res["eval_accuracy"]) + " |")
    print("\ndifference after epoch 3: %+.4f" % (mine[-1] - res["eval_accuracy"][-1]))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--parts", default="epoch,steps,ranks")
    args = p.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    parts = args.parts.split(",")
    has_peer = peer_available()
    print("# hybrid_train vs PyTorch eager, %s, %d CPUs" % (time.strftime("%Y-%m-%d"), os.cpu_count()))
    if not has_peer:
        print("\n%s has no torch (apt-get install python3-torch python3-torchvision): the peer's parts are "
              "skipped" % PEER_PYTHON)
    with tempfile.TemporaryDirectory() as scratch:
        ours = Ours(args.build, scratch)
        if "epoch" in parts and has_peer:
            part_epoch(ours, threads, args.reps)
        if "steps" in parts and has_peer:
            part_steps(ours, threads, args.reps)
        if "ranks" in parts:
            if shutil.which("mpirun"):
                part_ranks(ours, args.reps)
            else:
                print("\nno mpirun on PATH: the ranks part is skipped")
        if "accuracy" in parts and has_peer:
            part_accuracy(ours, threads)


if __name__ == "__main__":
    main()
