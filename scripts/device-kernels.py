"""The kernels behind the GPT-2 plan's measured step on a GPU (issue 35: the step at 2.08x the
planner's prediction; linear 2.4x, attention 6x, casts 2.3x), each timed under hybrid_train's
determinism settings (runtime/determinism.h) beside the alternatives:

  - the output layer's products at GPT-2's vocabulary (50,257, odd) against the padded 50,304:
    forward, and backward's two products, as runtime/ops/linear.cpp calls them;
  - the logits' cast to fp32 at both widths (a memory-bound kernel: GB/s);
  - attention (B, 12, 1024, 64, causal, bf16): which fused kernel ATen picks under these settings,
    and each backend's forward and forward + backward, and whether its backward repeats its bits.

  - flash attention's rate by head size and sequence length (--only grid);
  - what a process holds on the GPU beside its tensors: context, cuBLAS, NCCL (--only overhead);
  - layer norm at GPT-2's rows (bf16 x, 768 wide): whether ATen takes fp32 weights with a bf16 x,
    and forward + backward widened to fp32 (the CPU's path), mixed, and with bf16 weights (--only norm).

  python3 scripts/device-kernels.py [--batch 32] [--out kernels.json] [--only overhead,linear,attention,grid,norm]

CUDA-event medians of 5 after 2 warm-up runs. One line per measurement, and a JSON file.
"""
import argparse
import json
import os
import statistics

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # as runtime/determinism.h
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def timed(fn, reps=5, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def linears(tokens, rows):
    for vocab in (50257, 50304):
        x = torch.randn(tokens, 768, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(vocab, 768, device="cuda", dtype=torch.bfloat16)
        g = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16)
        flop = 2.0 * tokens * 768 * vocab
        for name, fn in (("forward", lambda: F.linear(x, w)),
                         ("backward dx", lambda: torch.matmul(g, w)),
                         ("backward dW", lambda: g.t().mm(x)),
                         ("cast to fp32", lambda: g.float())):
            ms = timed(fn)
            rate = (tokens * vocab * 6 / ms / 1e6, "GB/s") if "cast" in name else (flop / ms / 1e9, "TFLOP/s")
            rows.append({"kernel": f"logits {name}", "vocab": vocab, "ms": ms, "rate": rate[0], "unit": rate[1]})
            print(f"logits {name:12s} vocab {vocab}: {ms:8.3f} ms  {rate[0]:7.1f} {rate[1]}", flush=True)
        del x, w, g
    for d_in, d_out in ((768, 2304), (768, 3072), (3072, 768), (768, 768)):
        x = torch.randn(tokens // 1024, 1024, d_in, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(d_out, d_in, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(d_out, device="cuda", dtype=torch.bfloat16)
        ms = timed(lambda: F.linear(x, w, b))
        tf = 2.0 * tokens * d_in * d_out / ms / 1e9
        rows.append({"kernel": f"linear {d_in}->{d_out}", "ms": ms, "rate": tf, "unit": "TFLOP/s"})
        print(f"linear {d_in}->{d_out} with bias, 3-D: {ms:8.3f} ms  {tf:7.1f} TFLOP/s", flush=True)


def time_attention(q, k, v, g):
    """Causal SDPA under the backend in force: (forward ms, forward + backward ms, the step)."""
    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

    def step():
        for t in (q, k, v):
            t.grad = None
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)
    return fwd, timed(step), step


def attention(batch, rows):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.randn(batch, 12, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn(batch, 12, 1024, 64, device="cuda", dtype=torch.bfloat16)
    try:
        choice = int(torch._fused_sdp_choice(q, k, v, None, 0.0, True, None))
    except Exception as e:  # noqa: BLE001
        choice = f"error: {e}"
    print(f"attention: ATen's fused choice under determinism (warn_only): {choice} "
          "(0 math, 1 flash, 2 efficient, 3 cuDNN)", flush=True)
    rows.append({"kernel": "attention choice", "choice": choice})
    flop_fwd = 4.0 * batch * 12 * 1024 * 1024 * 64 / 2  # causal
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for strict in (False, True):
            torch.use_deterministic_algorithms(True, warn_only=not strict)
            row = {"kernel": f"attention {backend.name}", "strict": strict}
            try:
                with sdpa_kernel([backend]):
                    fwd, both, step = time_attention(q, k, v, g)
                    step()
                    first = [t.grad.clone() for t in (q, k, v)]
                    step()
                    same = all(torch.equal(a, t.grad) for a, t in zip(first, (q, k, v)))
                row.update(forward_ms=fwd, step_ms=both, backward_ms=both - fwd, repeats_bits=same,
                           forward_tflops=flop_fwd / fwd / 1e9, backward_tflops=2.5 * flop_fwd / (both - fwd) / 1e9)
                print(f"attention {backend.name:20s} strict={strict!s:5s}: forward {fwd:7.3f} ms "
                      f"({row['forward_tflops']:6.1f} TFLOP/s), backward {both - fwd:7.3f} ms "
                      f"({row['backward_tflops']:6.1f}), bits repeat: {same}", flush=True)
            except Exception as e:  # noqa: BLE001
                row["error"] = str(e).splitlines()[0][:200]
                print(f"attention {backend.name:20s} strict={strict!s:5s}: {row['error']}", flush=True)
            rows.append(row)
    torch.use_deterministic_algorithms(True, warn_only=True)


def attention_grid(rows):
    """Flash attention (strict determinism, as hybrid_train runs it) at head sizes 64 and 128 and
    sequences of 1,024 to 8,192 tokens, 16,384 tokens and 2,048 features a call: the fraction of
    the bf16 peak a planner should price attention at, by head size and length."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.use_deterministic_algorithms(True, warn_only=False)
    for hd in (64, 128):
        for t in (1024, 2048, 4096, 8192):
            h, b = 2048 // hd, 16384 // t
            q, k, v = (torch.randn(b, h, t, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            g = torch.randn(b, h, t, hd, device="cuda", dtype=torch.bfloat16)
            flop = 4.0 * b * h * t * t * hd / 2
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                fwd, both, _ = time_attention(q, k, v, g)
            row = {"kernel": "flash grid", "hd": hd, "T": t, "B": b, "H": h, "forward_flop": flop,
                   "forward_ms": fwd, "backward_ms": both - fwd, "forward_tflops": flop / fwd / 1e9,
                   "backward_tflops": 2.5 * flop / (both - fwd) / 1e9}
            rows.append(row)
            print(f"flash hd {hd:3d} T {t:5d} (B {b:2d}, H {h:2d}): forward {fwd:7.3f} ms "
                  f"{row['forward_tflops']:6.1f} TFLOP/s, backward {both - fwd:7.3f} ms "
                  f"{row['backward_tflops']:6.1f}", flush=True)
            del q, k, v, g
    torch.use_deterministic_algorithms(True, warn_only=True)


def process_overhead(rows):
    """What a rank's process holds on the GPU outside its tensors: free memory before CUDA starts
    (nvidia-smi's view through mem_get_info after init), after a cuBLAS product, after NCCL."""
    free0, total = torch.cuda.mem_get_info()
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    free1, _ = torch.cuda.mem_get_info()
    held = torch.cuda.memory_reserved()
    row = {"kernel": "process overhead", "total": total, "after_context": total - free0,
           "after_cublas": total - free1, "reserved_by_tensors": held}
    try:
        import torch.distributed as dist
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl", rank=0, world_size=1)
        x = torch.ones(1 << 20, device="cuda")
        dist.all_reduce(x)
        torch.cuda.synchronize()
        free2, _ = torch.cuda.mem_get_info()
        row["after_nccl"] = total - free2
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        row["nccl_error"] = str(e).splitlines()[0][:200]
    rows.append(row)
    mib = {k: round(v / 2**20, 1) for k, v in row.items() if isinstance(v, int)}
    print(f"process overhead, MiB in use on the device: {mib}", flush=True)


def norm(batch, rows):
    n = 768
    x = torch.randn(batch * 1024, n, device="cuda").to(torch.bfloat16)
    g = torch.randn_like(x)
    w, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    try:
        y, mean, rstd = torch.ops.aten.native_layer_norm(x, [n], w, b, 1e-5)
        gx, gw, gb = torch.ops.aten.native_layer_norm_backward(g, x, [n], mean, rstd, w, b, [True, True, True])
        mixed = f"yes: y {y.dtype}, mean {mean.dtype}, gx {gx.dtype}, gw {gw.dtype}"
    except RuntimeError as e:
        mixed = "no: " + str(e).splitlines()[0][:160]
    print(f"layer norm, bf16 x with fp32 weights in one kernel: {mixed}", flush=True)

    def widened():
        xf, gf = x.float(), g.float()
        y, mean, rstd = torch.ops.aten.native_layer_norm(xf, [n], w, b, 1e-5)
        y.to(torch.bfloat16)
        gx, _, _ = torch.ops.aten.native_layer_norm_backward(gf, xf, [n], mean, rstd, w, b, [True, True, True])
        gx.to(torch.bfloat16)

    def with_weights(wk, bk):
        def run():
            y, mean, rstd = torch.ops.aten.native_layer_norm(x, [n], wk, bk, 1e-5)
            torch.ops.aten.native_layer_norm_backward(g, x, [n], mean, rstd, wk, bk, [True, True, True])
        return run

    variants = {"widened to fp32": widened, "bf16 weights": with_weights(w.bfloat16(), b.bfloat16())}
    if mixed.startswith("yes"):
        variants["mixed (fp32 weights)"] = with_weights(w, b)
    for name, fn in variants.items():
        ms = timed(fn)
        rows.append({"kernel": "layer_norm fwd+bwd", "variant": name, "rows": batch * 1024, "ms": ms})
        print(f"layer norm fwd+bwd, {batch * 1024} rows x {n}, {name}: {ms:.3f} ms", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=32, help="sequences of 1024 tokens")
    p.add_argument("--out", default="kernels.json")
    p.add_argument("--only", default="overhead,linear,attention,grid",
                   help="which of overhead, linear, attention, grid, norm")
    a = p.parse_args()
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    rows = []
    only = a.only.split(",")
    if "overhead" in only:  # first: before anything else allocates
        process_overhead(rows)
    if "linear" in only:
        linears(a.batch * 1024, rows)
    if "attention" in only:
        attention(a.batch, rows)
    if "grid" in only:
        attention_grid(rows)
    if "norm" in only:
        norm(a.batch, rows)
    with open(a.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": a.batch,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
