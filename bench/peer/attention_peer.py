"""bench_attention's peer: the same two-layer GPT-2 step (forward and backward) in PyTorch eager
under bf16 autocast, as a PyTorch user writes it (bench/peer/peer_models.py: on PyTorch 1.13,
Debian's, attention stores the T x T scores; on 2.x it is F.scaled_dot_product_attention, which
picks flash or memory-efficient attention on a GPU). Prints "peer-row eager <median ms> <peak>"
for bench/peer_rows.h (peak: torch.cuda.max_memory_allocated() on a GPU, -1 on the CPU).
"""
import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

from peer_models import Gpt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    if cuda:  # as hybrid_train does on a GPU (runtime/determinism.h)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
        torch.use_deterministic_algorithms(True, warn_only=True)
    torch.manual_seed(2)
    vocab = 256
    model = Gpt(vocab, a.seq, 2, a.heads, a.embd, a.dropout).train().to(a.device)
    tokens = torch.randint(vocab, (a.batch, a.seq)).to(a.device)
    targets = torch.randint(vocab, (a.batch, a.seq)).to(a.device)
    times = []
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(a.warmup + a.reps):
        t0 = time.perf_counter()
        with torch.autocast(a.device, dtype=torch.bfloat16):
            logits = model(tokens)
            loss = F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))
        loss.backward()
        if cuda:
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - t0) * 1e3
        model.zero_grad(set_to_none=True)
        if i >= a.warmup:
            times.append(elapsed)
    peak = torch.cuda.max_memory_allocated() if cuda else -1
    print(f"peer-row eager {statistics.median(times):.3f} {peak}")


if __name__ == "__main__":
    main()
