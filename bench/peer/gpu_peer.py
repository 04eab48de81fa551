"""The peer a user would pick on a GPU: PyTorch eager, and torch.utils.checkpoint around every
block, on bench_dtr_budget's workloads (same model, batch and optimizer: SGD lr 1e-3 momentum 0.9).

  gpu_peer.py --model resnet50 --batch 64 --size 224 [--device cuda] [--steps 5 --warmup 2]
  gpu_peer.py --model gpt --batch 8 --seq 1024 --vocab 50257 --layers 12 --heads 12 --embd 768
  gpu_peer.py --model gpt --batch 128 --amp bf16 --modes eager   (the planner's GPT-2 plan's micro-batch)

bench_dtr_budget --peer python3 runs it and prints its rows beside its own. One line per mode:

  peer-row <mode> <median step ms> <peak bytes>

With --serve it steps on request instead (one mode), so that bench_dtr_budget interleaves its
steps with ours: `peer-ready`, then a `peer-step <ms>` line for each `step` line read.

The peak is torch.cuda.max_memory_allocated() over the measured steps: bytes in tensors, as
hybrid_train's arena counts them; on the CPU, one more step's from the profiler's memory events
(cpu_step_peak). Runs with PyTorch 2.x on the GPU machine and with Debian's
python3-torch (1.13) on the CPU.
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from peer_models import Gpt, ResNet50


def model_and_batch(args, device):
    torch.manual_seed(0)
    if args.model == "resnet50":
        model = ResNet50(classes=args.classes)
        x = torch.randn(args.batch, 3, args.size, args.size)
        y = torch.randint(args.classes, (args.batch,))
    else:
        model = Gpt(args.vocab, args.seq, args.layers, args.heads, args.embd, 0.1)
        x = torch.randint(args.vocab, (args.batch, args.seq))
        y = torch.randint(args.vocab, (args.batch, args.seq))
    # The batch stays in host memory, pinned on a GPU, and each step copies it without waiting, as
    # a DataLoader(pin_memory=True) loop does and as hybrid_train's harness does (bench/budget_runner.cpp).
    if device.type == "cuda":
        x, y = x.pin_memory(), y.pin_memory()
    return model.to(device), x, y


def forward(model, x, checkpointed):
    """The model's forward, each block under torch.utils.checkpoint when `checkpointed`."""
    run = (lambda blk, h: checkpoint(blk, h, use_reentrant=False)) if checkpointed else (lambda blk, h: blk(h))
    if isinstance(model, ResNet50):
        h = x
        for blk in model.blocks:
            h = run(blk, h)
        return model.head(h)
    pos = torch.arange(x.size(1), device=x.device)
    h = F.dropout(model.wte(x) + model.wpe(pos), model.dropout, model.training)
    for blk in model.blocks:
        h = run(blk, h)
    return F.linear(model.ln_f(h), model.wte.weight)


def set_openblas_threads(n):
    """OpenBLAS keeps a thread pool of its own (Debian's libopenblas0-pthread: every core) that
    torch.set_num_threads does not reach; hybrid_train's --threads sets both
    (runtime/thread_pools.cpp), so the peer must too, or its products run on more cores."""
    import ctypes
    for name in ("libopenblas.so.0", "libblas.so.3"):
        try:
            ctypes.CDLL(name).openblas_set_num_threads(n)
            return
        except (OSError, AttributeError):
            continue


def state_bytes(model, opt):
    """Bytes in the parameters, their gradients and the optimizer's state: what a step begins with."""
    tensors = [p for p in model.parameters()] + [p.grad for p in model.parameters() if p.grad is not None]
    for st in opt.state.values():
        tensors += [t for t in st.values() if torch.is_tensor(t)]
    return sum(t.numel() * t.element_size() for t in tensors)


def cpu_step_peak(step, model, opt):
    """The tensor peak of one training step on the CPU, from the profiler's memory events: the
    parameters and optimizer state, plus the highest running sum of every allocation and free in the
    step's order (each op's own, and those outside ops). Op boundaries only: a temporary an op
    allocates and frees inside itself is not seen."""
    from torch.profiler import profile, ProfilerActivity
    # The last step's gradients freed first (the step frees them after its forward, before its
    # backward, where the peak is): a free of a block allocated before profiling is not recorded.
    opt.zero_grad(set_to_none=True)
    base = state_bytes(model, opt)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    running = high = 0
    for e in events:
        running += e.self_cpu_memory_usage
        high = max(high, running)
    return base + high


def training_step(args, device, checkpointed):
    """One training step of the workload (a closure over its model and optimizer), with them."""
    model, x, y = model_and_batch(args, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def step():
        xd, yd = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp == "bf16"):
            out = forward(model, xd, checkpointed)
            loss = F.cross_entropy(out.reshape(-1, out.size(-1)).float(), yd.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step, model, opt


def serve(args, device, checkpointed):
    """Steps on request, for a benchmark that interleaves them with its own: after the warm-up
    prints `peer-ready`, then for each line `step` on stdin runs one step and prints
    `peer-step <ms>`; returns at the end of stdin."""
    import sys
    step, _, _ = training_step(args, device, checkpointed)
    for _ in range(args.warmup):
        step()
    print("peer-ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            continue
        t0 = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"peer-step {(time.perf_counter() - t0) * 1e3:.3f}", flush=True)


def measure(args, device, checkpointed):
    step, model, opt = training_step(args, device, checkpointed)
    cuda = device.type == "cuda"
    times = []
    for i in range(args.warmup + args.steps):
        if i == args.warmup and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()
        if i >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    # On the CPU: one more step, profiled (not timed).
    peak = torch.cuda.max_memory_allocated() if cuda else cpu_step_peak(step, model, opt)
    del model, opt
    if cuda:
        torch.cuda.empty_cache()
    return statistics.median(times), peak


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["resnet50", "gpt"], required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--embd", type=int, default=768)
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--amp", choices=["none", "bf16"], default="none",
                   help="bf16: forward and loss under torch.autocast, as training.mixed_precision = \"bf16\"")
    p.add_argument("--modes", default="eager,checkpoint", help="which of eager, checkpoint to run")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: PyTorch's default)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="PyTorch's default mode on a GPU (no deterministic algorithms asked for)")
    p.add_argument("--serve", action="store_true",
                   help="the first of --modes, a step per `step` line on stdin (peer-ready, then peer-step <ms>)")
    args = p.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        set_openblas_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not args.nondeterministic:
        # As hybrid_train does on a GPU (runtime/determinism.h): the same bits every run, and the
        # same cost for it.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.use_deterministic_algorithms(True, warn_only=True)
    print(f"PyTorch {torch.__version__} on {device}: {args.model} batch {args.batch}", flush=True)
    if args.serve:
        mode = args.modes.split(",")[0]
        serve(args, device, mode == "checkpoint")
        return
    for mode, checkpointed in (("eager", False), ("checkpoint", True)):
        if mode not in args.modes.split(","):
            continue
        ms, peak = measure(args, device, checkpointed)
        print(f"peer-row {mode} {ms:.3f} {peak}", flush=True)


if __name__ == "__main__":
    main()
