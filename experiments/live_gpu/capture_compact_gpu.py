"""Capture throughput on a GPU at long prompts: a transformers model with Qwen2-VL-7B's attention
shape (28 query heads, 4 KV heads, d = 128; random weights, `--layers` layers) prefills a prompt
of P tokens (video tokens, then a 32-token question) and decodes `--gen` tokens, three ways:
    model     the model alone (sdpa attention), nothing recorded
    full      kvsim.capture recording q, k, v of every position (a full trace)
    compact   a compact trace whose prompt statistics are computed on the GPU
              (Recorder.compact(on_device=True)), only the window's query rows leaving the device
Each is timed from the prompt's input to the last decode step, then the trace is written. With
`--kvsim BIN`, the full trace is also compacted by `kvsim compact` on the host's cores (timed),
and the two compact traces' statistics are compared. Results as JSON on stdout and in --out.

    python3 experiments/live_gpu/capture_compact_gpu.py --prompt 8192 32768 --out results.json
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))


def build_model(layers, device):
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, num_hidden_layers=layers,
        intermediate_size=4096, vocab_size=4096, max_position_embeddings=65536)
    return transformers.Qwen2ForCausalLM(config).to(device, torch.float16).eval()


def run(model, P, gen, mode, path, window):
    import torch

    from kvsim.capture import Recorder, greedy, hf

    question = 32
    modality = np.r_[np.zeros(16), np.ones(P - 16 - question), np.zeros(question + gen)]
    segment = np.r_[np.ones(P), np.full(gen, 2)]
    ids = torch.randint(3, 4000, (P,), generator=torch.Generator().manual_seed(P)).tolist()
    recorder = None
    if mode == "model":
        model.set_attn_implementation("sdpa")
    else:
        recorder = Recorder()
        if mode == "compact":
            recorder.compact(window, "float16", entropies=False, on_device=True)
        hf.use_attention(model, hf.register(recorder))

    def step(x, cache):
        out = model(input_ids=x.to(model.device), past_key_values=cache, use_cache=True)
        return out.logits, out.past_key_values

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if recorder is None:
        with torch.no_grad():
            greedy(step, ids, gen)
    else:
        with recorder.sample("000000", modality=modality, segment=segment):
            greedy(step, ids, gen)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    out = {"mode": mode, "prompt": P, "gen": gen, "seconds": round(seconds, 3),
           "prompt_tokens_per_second": round(P / seconds, 1),
           "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 2)}
    torch.cuda.reset_peak_memory_stats()
    if recorder is not None:
        t1 = time.perf_counter()
        recorder.write(path, model="random Qwen2, Qwen2-VL-7B attention shape", dtype="float16",
                       progress=False)
        out["write_seconds"] = round(time.perf_counter() - t1, 3)
        out["file_mb"] = round(os.path.getsize(path) / 1e6, 1)
    return out


def compare(a, b):
    """Largest relative difference of the stats datasets of two compact traces."""
    import h5py

    worst = {}
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and "/stats/" in name and name in fb:
                x, y = obj[()], fb[name][()]
                scale = max(float(np.abs(x).max()), 1e-30)
                key = name.split("/stats/")[1]
                worst[key] = max(worst.get(key, 0.0), float(np.abs(x - y).max()) / scale)
        fa.visititems(visit)
        layers = [f"samples/000000/layers/{n}/q_rows" for n in fa["samples/000000/layers"]]
        same_q = all(np.array_equal(fa[n][()], fb[n][()]) for n in layers)
    return {"max_relative_difference": worst, "q_rows_equal": same_q}


def main():
    import torch

    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--kvsim", help="a kvsim binary: compact the full trace on the host too")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--tmp", default="/tmp/capture_gpu")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    os.makedirs(a.tmp, exist_ok=True)
    model = build_model(a.layers, "cuda")
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "layers": a.layers, "runs": []}
    run(model, 1024, 2, "compact", os.path.join(a.tmp, "warm.h5"), a.window)  # warm-up
    for P in a.prompt:
        for mode in ("model", "full", "compact"):
            path = os.path.join(a.tmp, f"{mode}_{P}.h5")
            try:
                r = run(model, P, a.gen, mode, path, a.window)
            except Exception as e:  # report and go on: one device run measures everything
                r = {"mode": mode, "prompt": P, "error": f"{type(e).__name__}: {e}"}
            results["runs"].append(r)
            print(json.dumps(r), flush=True)
        if a.kvsim:
            host = os.path.join(a.tmp, f"host_compact_{P}.h5")
            if not os.path.exists(os.path.join(a.tmp, f"full_{P}.h5")):
                continue
            t0 = time.perf_counter()
            subprocess.run([a.kvsim, "compact", os.path.join(a.tmp, f"full_{P}.h5"), host,
                            "--window", str(a.window), "--no-entropies", "-j",
                            str(a.threads)], check=True)
            r = {"mode": "kvsim compact on the host", "prompt": P, "threads": a.threads,
                 "seconds": round(time.perf_counter() - t0, 3),
                 **compare(host, os.path.join(a.tmp, f"compact_{P}.h5"))}
            results["runs"].append(r)
            print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
