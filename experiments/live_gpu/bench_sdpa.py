#!/usr/bin/env python3
"""PyTorch scaled_dot_product_attention at batch 1 decode, the baseline of kvsim_gpu_bench.

One query token over 1k, 4k and 16k cached tokens per head (GQA: keys and values of the KV heads
are expanded to the query heads, as a model without a fused GQA kernel does). Bandwidth = bytes of
the unexpanded K and V / time, the same convention as kvsim_gpu_bench. Prints CSV.

    bench_sdpa.py [--heads 32] [--kv-heads 8] [--head-dim 128] [--peak-gbs 3350]
"""
import argparse

import torch
import torch.nn.functional as F


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--peak-gbs", type=float, default=3350)
    a = p.parse_args()
    print(f"device,{torch.cuda.get_device_name()}")
    print("dtype,tokens,us_per_call,kv_bytes,gbs,percent_of_peak")
    group = a.heads // a.kv_heads
    for dtype in (torch.float32, torch.float16):
        for n in (1024, 4096, 16384):
            q = torch.randn(1, a.heads, 1, a.head_dim, device="cuda", dtype=dtype)
            k = torch.randn(1, a.kv_heads, n, a.head_dim, device="cuda", dtype=dtype)
            v = torch.randn_like(k)

            def call():
                return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                                      v.repeat_interleave(group, 1))
            for _ in range(20):
                call()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(200):
                call()
            stop.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(stop) / 1000 / 200
            kv_bytes = 2 * k.numel() * k.element_size()
            gbs = kv_bytes / seconds / 1e9
            print(f"{str(dtype).split('.')[-1]},{n},{seconds * 1e6:.2f},{kv_bytes},{gbs:.1f},"
                  f"{100 * gbs / a.peak_gbs:.1f}")


if __name__ == "__main__":
    main()
