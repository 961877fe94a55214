#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention at batch 1 decode, the baseline of kvsim_gpu_bench.

One query token over 1k, 4k and 16k cached tokens per head, in float32 and bfloat16. Two ways of
handing GQA to SDPA: "native" (`enable_gqa=True`, PyTorch >= 2.5: K and V stay at the KV heads,
what a model's fused attention does) and "expanded" (K and V repeated to the query heads first,
what older models do; the repeat is timed too). Bandwidth = bytes of the unexpanded K and V /
time, the convention of kvsim_gpu_bench. Prints CSV.

    bench_sdpa.py [--heads 32] [--kv-heads 8] [--head-dim 128] [--peak-gbs 3350]
"""
import argparse
import sys

import torch
import torch.nn.functional as F


def time_call(call, device: str) -> float:
    """Seconds per call: 20 warm-up calls, then the mean of 200."""
    for _ in range(20):
        call()
    if device != "cuda":
        import time
        start = time.perf_counter()
        for _ in range(200):
            call()
        return (time.perf_counter() - start) / 200
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(200):
        call()
    stop.record()
    torch.cuda.synchronize()
    return start.elapsed_time(stop) / 1000 / 200


def supports_native_gqa() -> bool:
    q, k = torch.zeros(1, 2, 1, 8), torch.zeros(1, 1, 4, 8)
    try:
        F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
        return True
    except TypeError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--peak-gbs", type=float, default=3350)
    p.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    a = p.parse_args()
    if not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"bench_sdpa.py: PyTorch {torch.__version__} has no scaled_dot_product_attention "
                 "(2.0 or later needed)")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    native = supports_native_gqa()
    print(f"device,{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}")
    print(f"torch,{torch.__version__},heads,{a.heads},kv_heads,{a.kv_heads},"
          f"head_dim,{a.head_dim},peak_gbs,{a.peak_gbs:.0f}")
    print("dtype,gqa,tokens,us_per_call,kv_bytes,gbs,percent_of_peak")
    group = a.heads // a.kv_heads
    modes = ["native", "expanded"] if group > 1 else ["native"]
    if group > 1 and not native:
        modes = ["expanded"]  # this PyTorch has no enable_gqa
    for dtype in (torch.float32, torch.bfloat16):
        for n in a.tokens:
            q = torch.randn(1, a.heads, 1, a.head_dim, device=device, dtype=dtype)
            k = torch.randn(1, a.kv_heads, n, a.head_dim, device=device, dtype=dtype)
            v = torch.randn_like(k)
            for mode in modes:
                if mode == "expanded":
                    def call():
                        return F.scaled_dot_product_attention(
                            q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))
                elif group > 1:
                    def call():
                        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                else:
                    def call():
                        return F.scaled_dot_product_attention(q, k, v)
                seconds = time_call(call, device)
                kv_bytes = 2 * k.numel() * k.element_size()
                gbs = kv_bytes / seconds / 1e9
                print(f"{str(dtype).split('.')[-1]},{mode},{n},{seconds * 1e6:.2f},{kv_bytes},"
                      f"{gbs:.1f},{100 * gbs / a.peak_gbs:.1f}")


if __name__ == "__main__":
    main()
