#!/usr/bin/env python3
"""Whole decode step: kvsim's live decoder against transformers on the same checkpoint.

Builds a random LLaMA-shaped checkpoint (by default 8 layers of LLaMA-7B's width,
hidden 4096, 32 heads, bf16), writes one random prompt (2,048 tokens), then measures the mean
greedy decode step, in ms/token:
  - kvsim (`kvsim live evaluate`): the full cache, and h2o, tova and streamingllm in the loop, with
    each policy's cost relative to the full-cache step of the same run (the policy-overhead table);
  - transformers on the same checkpoint, bf16, eager and sdpa attention, with the same prompt.
Writes step.csv and step.json to --out. Without transformers (as on the CI machine) the checkpoint
comes from `kvsim live make-model` and only kvsim's rows are written, so the script can be
smoke-tested anywhere:

    bench_step.py --kvsim build/kvsim --backend cuda --out results/        # the GPU machine
    bench_step.py --kvsim build/kvsim --backend cpu --layers 2 --hidden 64 --heads 4 \\
        --kv-heads 4 --intermediate 128 --vocab 256 --prompt-len 64 --gen 4 --out /tmp/step
"""
import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

POLICIES = ["full", "h2o", "tova", "streamingllm"]


def transformers_or_none():
    try:
        import torch  # noqa: F401
        import transformers
        return transformers
    except ImportError:
        return None


def build_checkpoint(a, path: Path, transformers) -> str:
    """The checkpoint both implementations run; returns who wrote it."""
    if transformers is None:
        subprocess.run([a.kvsim, "live", "make-model", "-o", str(path), "--arch", "llama",
                        "--layers", str(a.layers), "--hidden", str(a.hidden), "--heads",
                        str(a.heads), "--kv-heads", str(a.kv_heads), "--intermediate",
                        str(a.intermediate), "--vocab", str(a.vocab), "--dtype", "bf16",
                        "--std", "0.02"], check=True, stdout=subprocess.DEVNULL)
        return "kvsim live make-model"
    import torch
    config = transformers.LlamaConfig(
        hidden_size=a.hidden, intermediate_size=a.intermediate, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, vocab_size=a.vocab,
        max_position_embeddings=max(4096, a.prompt_len + a.gen + 1), rms_norm_eps=1e-6,
        rope_theta=10000.0, tie_word_embeddings=False)
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)
    del model
    return "transformers save_pretrained"


def write_prompt(path: Path, prompt_len: int, vocab: int) -> np.ndarray:
    ids = np.random.default_rng(1).integers(0, vocab, prompt_len).astype(np.int32)
    with h5py.File(path, "w") as f:
        f.attrs["kvprompt_version"] = 1
        f.create_group("samples/000000")["token_ids"] = ids
    return ids


def kvsim_rows(a, model: Path, prompts: Path, work: Path) -> list:
    summary = work / "summary.csv"
    subprocess.run([a.kvsim, "live", "evaluate", "-m", str(model), "--prompts", str(prompts),
                    "--gen", str(a.gen), "--backend", a.backend, "--budget", a.budget,
                    "--summary", str(summary)] + [x for p in POLICIES for x in ("-p", p)],
                   check=True, stdout=subprocess.DEVNULL)
    rows = [r for r in csv.DictReader(io.StringIO(summary.read_text())) if r["sample"] != "all"]
    full = float(rows[0]["full_ms_per_token"])  # the model alone, greedy, in the same run
    return [{"implementation": "kvsim", "backend": a.backend, "attention": "kvsim",
             "policy": r["policy"], "ms_per_token": float(r["ms_per_token"]),
             "relative_to_full_cache": float(r["ms_per_token"]) / full} for r in rows]


def transformers_rows(a, transformers, model_dir: Path, prompt: np.ndarray) -> list:
    import torch
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = []
    for attention in ("eager", "sdpa"):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, torch_dtype=torch.bfloat16, attn_implementation=attention).to(device).eval()
        seconds = []
        with torch.no_grad():
            out = model(torch.tensor(prompt[None, :], device=device, dtype=torch.long),
                        use_cache=True)
            past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for step in range(a.gen + 4):  # the first four steps warm up and are not timed
                if device == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                out = model(token, past_key_values=past, use_cache=True)
                past, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                if step >= 4:
                    seconds.append(time.perf_counter() - start)
        rows.append({"implementation": "transformers " + transformers.__version__,
                     "backend": device, "attention": attention, "policy": "full",
                     "ms_per_token": 1000 * float(np.mean(seconds)),
                     "relative_to_full_cache": 1.0})
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kvsim", default="build/kvsim")
    p.add_argument("--backend", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--out", default="step_results")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--gen", type=int, default=64)
    p.add_argument("--budget", default="20%", help="budget of the policies in the loop")
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    transformers = transformers_or_none()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = work / "model"
        writer = build_checkpoint(a, model, transformers)
        prompt = write_prompt(work / "prompt.h5", a.prompt_len, a.vocab)
        rows = kvsim_rows(a, model, work / "prompt.h5", work)
        if transformers is not None:
            rows += transformers_rows(a, transformers, model, prompt)
    shape = {k: getattr(a, k) for k in ("layers", "hidden", "intermediate", "heads", "kv_heads",
                                        "vocab", "prompt_len", "gen", "budget")}
    with open(out / "step.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    report = {"checkpoint": writer, "shape": shape, "rows": rows,
              "transformers": transformers is not None}
    (out / "step.json").write_text(json.dumps(report, indent=2) + "\n")
    for r in rows:
        print(f"{r['implementation']:>22} {r['attention']:>6} {r['policy']:>13} "
              f"{r['ms_per_token']:9.3f} ms/token  {r['relative_to_full_cache']:.3f}x")
    if transformers is None:
        print("transformers is not installed: kvsim's rows only", file=sys.stderr)


if __name__ == "__main__":
    main()
