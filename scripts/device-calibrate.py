"""Measures a GPU for the planner's device catalog (issue 33): matrix-product throughput by
shape and dtype (cuBLAS, the kernels libtorch calls for hybrid_train's linear layers) and
memory-bound bandwidth by size (copy and add). Runs on the GPU machine in its python3 (PyTorch 2.x):

  python3 scripts/device-calibrate.py --out calibration.json

Each point: median of --reps timed runs (CUDA events) after warm-up. Prints a table and writes
JSON: {"device", "torch", "cuda", "matmul": [{dtype, m, n, k, ms, tflops}],
"memory": [{op, bytes_moved, ms, gb_per_s}]}.
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="calibration.json")
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False  # as libtorch's default, which hybrid_train keeps
    props = torch.cuda.get_device_properties(0)
    result = {"device": props.name, "memory_bytes": props.total_memory, "sms": props.multi_processor_count,
              "torch": torch.__version__, "cuda": torch.version.cuda,
              "matmul": matmul_points(a.reps), "memory": memory_points(a.reps)}
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{props.name}, {props.total_memory / 2**30:.1f} GiB, {props.multi_processor_count} SMs, torch {torch.__version__}")
    print("| dtype | m | n | k | ms | TFLOP/s |\n| --- | --- | --- | --- | --- | --- |")
    for r in result["matmul"]:
        print(f"| {r['dtype']} | {r['m']} | {r['n']} | {r['k']} | {r['ms']:.3f} | {r['tflops']:.1f} |")
    print("\n| op | MiB moved | ms | GB/s |\n| --- | --- | --- | --- |")
    for r in result["memory"]:
        print(f"| {r['op']} | {r['bytes_moved'] / 2**20:.0f} | {r['ms']:.4f} | {r['gb_per_s']:.0f} |")


if __name__ == "__main__":
    main()
