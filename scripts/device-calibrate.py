"""Measures a GPU for the planner's device catalog (issue 33): matrix-product throughput by
shape and dtype (cuBLAS, the kernels libtorch calls for hybrid_train's linear layers) and
memory-bound bandwidth by size (copy and add); and, for issue 67, the host link (pinned copies
each way, and one small copy's time: the per-copy latency the link's price lacks) and the
workspaces kernels hold beyond their inputs and outputs (cuDNN's convolutions, the norms, pooling,
attention, the loss, the embedding's backward), which a trace for a GPU does not declare yet
(runtime/kernel_workspace.h: the table its CUDA rules are to be fitted to). Runs on the GPU
machine in its python3 (PyTorch 2.x):

  python3 scripts/device-calibrate.py --out calibration.json

Each timed point: median of --reps runs (CUDA events) after warm-up. Prints tables and writes
JSON: {"device", "torch", "cuda", "matmul": [{dtype, m, n, k, ms, tflops}],
"memory": [{op, bytes_moved, ms, gb_per_s}], "host_link": {h2d_gb_per_s, d2h_gb_per_s,
small_copy_us}, "workspaces": [{op, shape, dtype, pass, workspace_bytes, output_bytes}]}.
"""
import argparse
import json
import statistics

import torch


def timed(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_points(reps):
    squares = [(s, s, s) for s in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    # Transformer shapes, (tokens, out, in): GPT-2 small and Llama 3 8B / 70B projections at 8k tokens.
    llm = [(8192, 768, 768), (8192, 3072, 768), (8192, 768, 3072), (8192, 50304, 768),
           (8192, 4096, 4096), (8192, 14336, 4096), (8192, 4096, 14336), (8192, 1024, 4096),
           (8192, 8192, 8192), (8192, 28672, 8192), (8192, 8192, 28672), (8192, 128256, 4096),
           (2048, 4096, 4096), (1024, 4096, 4096), (512, 4096, 4096)]
    rows = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for m, n, k in squares + llm:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            ms = timed(lambda: a @ b, reps)
            rows.append({"dtype": str(dtype).replace("torch.", ""), "m": m, "n": n, "k": k, "ms": ms,
                         "tflops": 2.0 * m * n * k / ms / 1e9})
            del a, b
    return rows


def memory_points(reps):
    rows = []
    for mib in (1, 4, 16, 64, 256, 1024, 4096):
        n = mib * (1 << 20) // 4
        a = torch.randn(n, device="cuda")
        b = torch.randn(n, device="cuda")
        c = torch.empty(n, device="cuda")
        for op, fn, moved in (("copy", lambda: c.copy_(a), 2), ("add", lambda: torch.add(a, b, out=c), 3)):
            ms = timed(fn, reps)
            rows.append({"op": op, "bytes_moved": moved * n * 4, "ms": ms, "gb_per_s": moved * n * 4 / ms / 1e6})
        del a, b, c
    return rows


def host_link_points(reps):
    """Pinned copies of 64 MiB each way (as alloc/cuda_host_link.cpp measures) and one 4 KiB copy."""
    n = 64 << 20
    host = torch.empty(n, dtype=torch.uint8).pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    h2d = timed(lambda: dev.copy_(host, non_blocking=True), reps)
    d2h = timed(lambda: host.copy_(dev, non_blocking=True), reps)
    small_host, small_dev = host[:4096], dev[:4096]
    small = timed(lambda: small_dev.copy_(small_host, non_blocking=True), reps)
    return {"h2d_gb_per_s": n / h2d / 1e6, "d2h_gb_per_s": n / d2h / 1e6, "small_copy_us": small * 1000}


def tensors_of(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in tensors_of(o)]
    return []


def workspace(make, run):
    """The bytes a kernel holds at its peak beyond what was allocated before it and what it returns:
    run once to warm up (cuDNN picks its algorithm, cuBLAS makes its handle's workspace), then
    measured by the caching allocator's peak."""
    args = make()
    out = run(*args)
    del out
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = run(*args)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    out_bytes = sum(t.numel() * t.element_size() for t in tensors_of(out))
    del out, args
    return max(0, peak - base - out_bytes), out_bytes


def forward_and_backward(name, shape, dtype, inputs, forward, rows):
    """One op's forward and backward workspaces: `inputs()` makes leaf tensors that need grads."""
    def make_forward():
        return inputs()

    def make_backward():
        xs = inputs()
        y = forward(*xs)
        return [xs, y, torch.randn_like(y)]

    def forward_only(*xs):
        with torch.no_grad():  # what forward saves for backward is not its workspace
            return forward(*xs)

    for phase, make, run in (("forward", make_forward, forward_only),
                             ("backward", make_backward,
                              lambda xs, y, g: torch.autograd.grad(y, [x for x in xs if x.requires_grad], g,
                                                                   retain_graph=True))):
        row = {"op": name, "shape": shape, "dtype": str(dtype).replace("torch.", ""), "pass": phase}
        try:
            row["workspace_bytes"], row["output_bytes"] = workspace(make, run)
        except Exception as e:  # one op's failure (a kernel this build lacks) loses only its row
            row["error"] = (str(e).splitlines() or [type(e).__name__])[0][:200]
            torch.cuda.empty_cache()
        rows.append(row)


def workspace_points():
    """As hybrid_train runs them: deterministic cuDNN, no benchmarking (runtime/determinism.h)."""
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    F = torch.nn.functional
    rows = []

    def leaf(*size, dtype=torch.float32, grad=True, memory_format=torch.contiguous_format):
        return torch.randn(*size, device="cuda", dtype=dtype).to(memory_format=memory_format).requires_grad_(grad)

    # ResNet-18's convolutions at batch 32 (N, C, H, W, O, kernel, stride, padding).
    for n, c, h, w, o, k, st, pad in ((32, 3, 224, 224, 64, 7, 2, 3), (32, 64, 56, 56, 64, 3, 1, 1),
                                      (32, 64, 56, 56, 128, 1, 2, 0), (32, 128, 28, 28, 128, 3, 1, 1),
                                      (32, 256, 14, 14, 256, 3, 1, 1), (32, 512, 7, 7, 512, 3, 1, 1)):
        for dtype in (torch.float32, torch.bfloat16):
            for fmt in (torch.contiguous_format, torch.channels_last):
                forward_and_backward(
                    "conv2d" + ("_channels_last" if fmt == torch.channels_last else ""), [n, c, h, w, o, k, st, pad],
                    dtype, lambda: [leaf(n, c, h, w, dtype=dtype, memory_format=fmt),
                                    leaf(o, c, k, k, dtype=dtype, memory_format=fmt)],
                    lambda x, wt: F.conv2d(x, wt, stride=st, padding=pad), rows)
    for dtype in (torch.float32, torch.bfloat16):
        forward_and_backward("batch_norm", [32, 64, 56, 56], dtype,
                             lambda: [leaf(32, 64, 56, 56, dtype=dtype), leaf(64), leaf(64)],
                             lambda x, g, b: F.batch_norm(x, None, None, g, b, training=True), rows)
        forward_and_backward("max_pool2d", [32, 64, 112, 112, 3, 2, 1], dtype,
                             lambda: [leaf(32, 64, 112, 112, dtype=dtype)],
                             lambda x: F.max_pool2d(x, 3, 2, 1), rows)
        for tokens, width in ((8192, 768), (8192, 4096)):
            forward_and_backward("layer_norm", [tokens, width], dtype,
                                 lambda: [leaf(tokens, width, dtype=dtype), leaf(width, dtype=dtype),
                                          leaf(width, dtype=dtype)],
                                 lambda x, g, b: F.layer_norm(x, (width,), g, b), rows)
            forward_and_backward("linear", [tokens, width, 4 * width], dtype,
                                 lambda: [leaf(tokens, width, dtype=dtype), leaf(4 * width, width, dtype=dtype)],
                                 lambda x, wt: F.linear(x, wt), rows)
        forward_and_backward("cross_entropy", [8192, 50304], dtype,
                             lambda: [leaf(8192, 50304, dtype=dtype)],
                             lambda z: F.cross_entropy(z.float() if dtype == torch.float32 else z,
                                                       torch.randint(0, 50304, (8192,), device="cuda"),
                                                       reduction="none"), rows)
    for dropout in (0.0, 0.1):
        forward_and_backward("attention" + ("_dropout" if dropout else ""), [8, 12, 1024, 64], torch.bfloat16,
                             lambda: [leaf(8, 12, 1024, 64, dtype=torch.bfloat16) for _ in range(3)],
                             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=dropout,
                                                                            is_causal=True), rows)
    ids = torch.randint(0, 50304, (8192,), device="cuda")
    forward_and_backward("embedding", [8192, 50304, 768], torch.float32, lambda: [leaf(50304, 768)],
                         lambda table: F.embedding(ids, table), rows)
    return rows


def guarded(measure, empty):
    """A part that fails leaves the others' results (the JSON is written at the end)."""
    try:
        return measure()
    except Exception as e:
        print(f"failed: {type(e).__name__}: {e}")
        return empty


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="calibration.json")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # as libtorch's default, which hybrid_train keeps
    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "memory_bytes": props.total_memory, "sms": props.multi_processor_count,
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "matmul": matmul_points(a.reps), "memory": memory_points(a.reps),
              "host_link": guarded(lambda: host_link_points(a.reps), {}),
              "workspaces": guarded(workspace_points, [])}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{props.name}, {props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs, torch {torch.__version__}")
    print("| dtype | m | n | k | ms | TFLOP/s |\n| --- | --- | --- | --- | --- | --- |")
    for r in result["matmul"]:
        print(f"| {r['dtype']} | {r['m']} | {r['n']} | {r['k']} | {r['ms']:.3f} | {r['tflops']:.1f} |")
    print("\n| op | MiB moved | ms | GB/s |\n| --- | --- | --- | --- |")
    for r in result["memory"]:
        print(f"| {r['op']} | {r['bytes_moved'] / 2**20:.0f} | {r['ms']:.4f} | {r['gb_per_s']:.0f} |")
    link = result["host_link"] or {"h2d_gb_per_s": 0, "d2h_gb_per_s": 0, "small_copy_us": 0}
    print(f"\nhost link: {link['h2d_gb_per_s']:.1f} GB/s to the device, {link['d2h_gb_per_s']:.1f} GB/s to the host, "
          f"{link['small_copy_us']:.1f} us for 4 KiB")
    print("\n| op | shape | dtype | pass | workspace MiB | output MiB |\n| --- | --- | --- | --- | --- | --- |")
    for r in result["workspaces"]:
        if "error" in r:
            print(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['pass']} | failed: {r['error']} | |")
            continue
        print(f"| {r['op']} | {r['shape']} | {r['dtype']} | {r['pass']} | {r['workspace_bytes'] / 2**20:.2f} | "
              f"{r['output_bytes'] / 2**20:.2f} |")


if __name__ == "__main__":
    main()
