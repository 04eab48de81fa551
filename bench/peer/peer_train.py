"""What a PyTorch user would run instead of hybrid_train, with the same settings.

  peer_train.py quickstart --epochs 1 --threads 1 [--data DIR] [--channels-last]
      configs/quickstart.toml: ConvNet on Fashion-MNIST, SGD with momentum, cosine schedule
      with warmup, evaluation after each epoch.
  peer_train.py step --model resnet18|gpt --steps 12 --threads 1
      training steps on random data of bench/peer/{resnet18,gpt}_step.toml's shapes.

Prints one JSON object on its last line (the driver, compare.py, reads it). Run by Debian's
/usr/bin/python3 with python3-torch (PyTorch 1.13).
"""
import argparse
import gzip
import json
import math
import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from peer_models import ConvNet, Gpt, ResNet18

MEAN, STD = 0.2860, 0.3530  # launcher/data/fashion_mnist.cpp


def read_idx(folder, stem):
    for suffix in ("", ".gz"):
        path = os.path.join(folder, stem + suffix)
        if os.path.exists(path):
            opener = gzip.open if suffix else open
            with opener(path, "rb") as f:
                raw = f.read()
            dims = raw[3]
            shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
            return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)
    raise SystemExit(f"peer_train.py: no {stem}[.gz] in {folder}")


def fashion_mnist(folder, split):
    prefix = "train" if split == "train" else "t10k"
    images = torch.from_numpy(read_idx(folder, f"{prefix}-images-idx3-ubyte").copy()).float()
    labels = torch.from_numpy(read_idx(folder, f"{prefix}-labels-idx1-ubyte").copy()).long()
    return ((images / 255.0 - MEAN) / STD).unsqueeze(1), labels


def learning_rate(step, total, lr, warmup, min_lr=0.0):
    """training/optimizer.cpp's learning_rate_at, cosine schedule."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup - 1))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def evaluate(model, images, labels, batch):
    model.eval()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for start in range(0, images.size(0), batch):
            x, y = images[start:start + batch], labels[start:start + batch]
            out = model(x)
            loss += F.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
    model.train()
    return loss / images.size(0), correct / images.size(0)


def quickstart(args):
    """configs/quickstart.toml: batch 64, SGD lr 0.05 momentum 0.9 wd 5e-4, 100 warmup steps."""
    start = time.perf_counter()
    torch.manual_seed(1)
    train_x, train_y = fashion_mnist(args.data, "train")
    test_x, test_y = fashion_mnist(args.data, "test")
    model = ConvNet()
    if args.channels_last:  # what hybrid_train does by default; a PyTorch user must know to ask
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.0005)
    batch, per_epoch = 64, train_x.size(0) // 64
    total, step, accuracies = args.epochs * per_epoch, 0, []
    gen = torch.Generator().manual_seed(1)
    for _ in range(args.epochs):
        order = torch.randperm(train_x.size(0), generator=gen)
        for b in range(per_epoch):
            idx = order[b * batch:(b + 1) * batch]
            for group in opt.param_groups:
                group["lr"] = learning_rate(step, total, 0.05, 100)
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
        accuracies.append(evaluate(model, test_x, test_y, batch)[1])
    print(json.dumps({"wall_s": time.perf_counter() - start, "eval_accuracy": accuracies, "steps": step}))


def step_bench(args):
    """Training steps of bench/peer/{resnet18,gpt}_step.toml on random data: step_ms per step."""
    torch.manual_seed(1)
    if args.model == "resnet18":
        model, batch = ResNet18(), 16
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=0.0005)
        x, y = torch.randn(batch, 3, 32, 32), torch.randint(10, (batch,))
        clip = 0.0
    else:
        model, batch = Gpt(256, 128, 6, 8, 256, 0.1), 8
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        x, y = torch.randint(256, (batch, 128)), torch.randint(256, (batch, 128))
        clip = 1.0
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, out.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        loss.item()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({"step_ms": times}))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["quickstart", "step"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--model", choices=["resnet18", "gpt"], default="resnet18")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--channels-last", action="store_true", help="quickstart: convolution weights NHWC")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    quickstart(args) if args.mode == "quickstart" else step_bench(args)


if __name__ == "__main__":
    main()
