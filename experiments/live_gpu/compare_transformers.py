#!/usr/bin/env python3
"""Logits of kvsim's live decoder against Hugging Face transformers, on random tiny models.

Builds a random-initialised LlamaForCausalLM and Qwen2ForCausalLM with save_pretrained (bf16
safetensors), writes a prompt file, runs `kvsim live capture --logits` on the chosen backend and
compares its logits (prefill + every greedy step) with transformers' forward pass over the same
tokens, in float32 and in bfloat16. Needs torch, transformers, h5py and numpy (the GPU machine).

    compare_transformers.py --kvsim build/kvsim --backend cuda --out results.json
"""
import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import h5py
import numpy as np
import torch
import transformers

SHAPE = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096,
             rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False)


def build(kind: str, path: Path) -> None:
    torch.manual_seed(0)
    if kind == "llama":
        config = transformers.LlamaConfig(**SHAPE)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.Qwen2Config(**SHAPE)
        model = transformers.Qwen2ForCausalLM(config)
    model.to(torch.bfloat16).save_pretrained(path, safe_serialization=True)


def write_prompts(path: Path, prompt_len: int) -> np.ndarray:
    ids = np.random.default_rng(1).integers(0, SHAPE["vocab_size"], prompt_len).astype(np.int32)
    with h5py.File(path, "w") as f:
        f.attrs["kvprompt_version"] = 1
        g = f.create_group("samples/000000")
        g["token_ids"] = ids
    return ids


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def compare(kind: str, kvsim: str, backend: str, gen: int, work: Path) -> dict:
    model_dir = work / kind
    build(kind, model_dir)
    prompts = work / "prompts.h5"
    prompt = write_prompts(prompts, 128)
    trace = work / f"{kind}.h5"
    subprocess.run([kvsim, "live", "capture", "-m", str(model_dir), "--prompts", str(prompts),
                    "--gen", str(gen), "--backend", backend, "--logits", "-o", str(trace)],
                   check=True)
    with h5py.File(trace) as f:
        tokens = f["samples/000000/token_ids"][:]
        ours = f["samples/000000/logits"][:]
    result = {"model": kind, "backend": backend, "prompt_len": len(prompt), "gen": gen}
    cls = transformers.AutoModelForCausalLM
    for dtype in (torch.float32, torch.bfloat16):
        model = cls.from_pretrained(model_dir, torch_dtype=dtype).to("cuda").eval()
        with torch.no_grad():
            ids = torch.tensor(tokens[None, :], device="cuda", dtype=torch.long)
            theirs = model(ids).logits[0, len(prompt) - 1:].float().cpu().numpy()
        result[f"rel_error_vs_{str(dtype).split('.')[-1]}"] = relative_error(ours, theirs)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--kvsim", default="build/kvsim")
    p.add_argument("--backend", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--gen", type=int, default=16)
    p.add_argument("--out", default="compare_transformers.json")
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        results = [compare(kind, a.kvsim, a.backend, a.gen, Path(tmp)) for kind in ("llama", "qwen2")]
    Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
