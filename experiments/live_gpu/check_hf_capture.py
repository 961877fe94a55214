#!/usr/bin/env python3
"""kvsim.capture.hf against real transformers classes, on random tiny models (no weights
downloaded): LlamaForCausalLM, LlavaForConditionalGeneration and Qwen2VLForConditionalGeneration
built from configs. Each is captured with capture_pretrained; then

  * the token ids must equal the model's own greedy generate (attn_implementation "sdpa");
  * every decoder layer's recorded q, k (after the rotary embedding) and v must equal tensors
    taken independently: forward hooks on q_proj/k_proj/v_proj during one full-sequence forward
    pass, rotated here with the modeling module's own rotary functions (M-RoPE position ids from
    get_rope_index for Qwen2-VL);
  * the vision towers' attention calls must not be recorded (as many layers as the decoder has);
  * with --kvsim: the checkpoint saved by save_pretrained (float32) runs in `kvsim live capture`
    on the prompt file capture_pretrained wrote beside the trace (prompts_out: the language
    model's input embeddings at the image positions, M-RoPE position ids), with no export step;
    kvsim's greedy tokens must equal generate's and its logits (the prefill's row and one per
    step) transformers' over the same sequence within 1e-5 of the largest logit.

Needs torch, transformers (written against 4.57; run on the GPU machine with 5.17), h5py and
numpy. Prints a JSON report; exit status 1 on any
mismatch.

    check_hf_capture.py [--device cuda] [--kvsim build/kvsim --backend cuda] [--out report.json]
"""
import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np
import torch
import transformers

from kvsim.capture import hf

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=320, max_position_embeddings=1024)


def tiny_llama():
    config = transformers.LlamaConfig(**TEXT)
    return transformers.LlamaForCausalLM(config), None


def tiny_llava():
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=2, num_attention_heads=2,
                                           image_size=28, patch_size=14)
    config = transformers.LlavaConfig(vision_config=vision,
                                      text_config=transformers.LlamaConfig(**TEXT),
                                      image_token_index=TEXT["vocab_size"] - 1,
                                      image_seq_length=4)
    return transformers.LlavaForConditionalGeneration(config), "llava"


def tiny_qwen2_vl():
    text = dict(TEXT, rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]})
    config = transformers.Qwen2VLConfig(
        vision_config=dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2),
        image_token_id=TEXT["vocab_size"] - 1, video_token_id=TEXT["vocab_size"] - 2,
        vision_start_token_id=TEXT["vocab_size"] - 3, vision_end_token_id=TEXT["vocab_size"] - 4,
        **text)
    return transformers.Qwen2VLForConditionalGeneration(config), "qwen2_vl"


def inputs_for(kind, model):
    """Processor-like tensors: a prompt with one image for the VLMs."""
    torch.manual_seed(1)
    ids = torch.randint(0, TEXT["vocab_size"] - 8, (1, 24))
    if kind is None:
        return {"input_ids": ids}, 0
    if kind == "llava":
        image = torch.full((1, 4), model.config.image_token_index)
        ids = torch.cat((ids[:, :4], image, ids[:, 4:]), 1)
        return {"input_ids": ids, "pixel_values": torch.randn(1, 3, 28, 28)}, 1
    c = model.config
    grid = torch.tensor([[1, 4, 4]])  # 16 patches, 4 tokens after the 2x2 merge
    image = torch.tensor([[c.vision_start_token_id] + [c.image_token_id] * 4 +
                          [c.vision_end_token_id]])
    ids = torch.cat((ids[:, :4], image, ids[:, 4:]), 1)
    patch = 3 * c.vision_config.temporal_patch_size * c.vision_config.patch_size ** 2
    # transformers 5's processors also return mm_token_type_ids (1 on image tokens), which M-RoPE
    # needs there; earlier versions ignore it.
    types = (ids == c.image_token_id).int()
    return {"input_ids": ids, "pixel_values": torch.randn(16, patch), "image_grid_thw": grid,
            "mm_token_type_ids": types}, 1


class FixedProcessor:
    def __init__(self, inputs):
        self.inputs = inputs

    def __call__(self, **kwargs):
        return dict(self.inputs)


def decoder_layers(model):
    for path in ("model.language_model.layers", "model.layers", "language_model.model.layers",
                 "model.language_model.model.layers"):
        obj = model
        try:
            for part in path.split("."):
                obj = getattr(obj, part)
            return obj
        except AttributeError:
            continue
    raise RuntimeError("cannot find the decoder layers")


def text_rotary(model):
    """The decoder's rotary embedding module (not the vision tower's)."""
    for name, module in model.named_modules():
        if name.endswith("rotary_emb") and "visual" not in name and "vision" not in name:
            return module
    raise RuntimeError("cannot find the decoder's rotary embedding")


def sequence_inputs(inputs, sequence):
    """The prompt's inputs with the whole sequence as input_ids (mm_token_type_ids extended: the
    generated tokens are text)."""
    full = dict(inputs, input_ids=sequence)
    if "mm_token_type_ids" in full:
        types = full["mm_token_type_ids"]
        pad = sequence.shape[1] - types.shape[1]
        full["mm_token_type_ids"] = torch.cat(
            (types, torch.zeros(1, pad, dtype=types.dtype, device=types.device)), 1)
    return full


def independent_qkv(kind, model, inputs, sequence):
    """q/k (rotated here) and v of every decoder layer over `sequence`, from forward hooks on the
    projections and on the rotary embedding (its cos and sin, M-RoPE sections included), rotated
    with the modeling module's own function."""
    raw = {}
    hooks = []
    for l, layer in enumerate(decoder_layers(model)):
        for name in ("q_proj", "k_proj", "v_proj"):
            def hook(module, args, output, l=l, name=name):
                raw[(l, name)] = output.detach()
            hooks.append(getattr(layer.self_attn, name).register_forward_hook(hook))
    rotary = text_rotary(model)
    hooks.append(rotary.register_forward_hook(
        lambda module, args, output: raw.__setitem__("cos_sin", output)))
    full = sequence_inputs(inputs, sequence)
    T = sequence.shape[1]
    with torch.no_grad():
        model(**full, use_cache=False)
    for h in hooks:
        h.remove()
    modeling = importlib.import_module(type(rotary).__module__)
    text = getattr(model.config, "text_config", model.config)
    H, Hkv = text.num_attention_heads, text.num_key_value_heads
    d = text.hidden_size // H
    cos, sin = raw["cos_sin"]
    out = []
    for l in range(len(decoder_layers(model))):
        q = raw[(l, "q_proj")].view(1, T, H, d).transpose(1, 2)
        k = raw[(l, "k_proj")].view(1, T, Hkv, d).transpose(1, 2)
        v = raw[(l, "v_proj")].view(1, T, Hkv, d).transpose(1, 2)
        if kind == "qwen2_vl" and hasattr(modeling, "apply_multimodal_rotary_pos_emb"):
            section = (getattr(text, "rope_scaling", None) or
                       getattr(text, "rope_parameters", None) or {})["mrope_section"]
            q, k = modeling.apply_multimodal_rotary_pos_emb(q, k, cos, sin, section)
        else:  # transformers 5: the rotary module already interleaves the M-RoPE sections
            q, k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
        out.append({n: t[0].transpose(0, 1).float().cpu().numpy()
                    for n, t in (("q", q), ("k", k), ("v", v))})
    return out


def transformers_logits(model, inputs, sequence, P):
    """The model's logits at positions P-1 .. T-1 of one full forward pass over `sequence`."""
    with torch.no_grad():
        return model(**sequence_inputs(inputs, sequence),
                     use_cache=False).logits[0, P - 1:].float().cpu().numpy()


def check_live(name, model, inputs, expected, P, gen, prompts, work, kvsim, backend):
    """kvsim live on the saved checkpoint and the captured prompt file, against transformers."""
    import subprocess

    ckpt = work / f"{name}_checkpoint"
    model.save_pretrained(str(ckpt), safe_serialization=True)
    trace = work / f"{name}_live.h5"
    r = subprocess.run([kvsim, "live", "capture", "-m", str(ckpt), "--prompts", str(prompts),
                        "--gen", str(gen), "--logits", "--backend", backend, "-o", str(trace)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {"live_error": (r.stdout + r.stderr)[-2000:], "live_ok": False}
    with h5py.File(trace) as f:
        tokens = list(f["samples/000000/token_ids"][()])
        logits = f["samples/000000/logits"][()]
    ref = transformers_logits(model, inputs, expected[None], P)
    rel = float(np.abs(logits - ref).max() / np.abs(ref).max())
    report = {"live_tokens_equal_generate": tokens == expected.tolist(),
              "live_max_rel_error_logits": rel}
    report["live_ok"] = report["live_tokens_equal_generate"] and rel <= 1e-5
    return report


def check(name, build, device, gen, work, kvsim=None, backend="cpu"):
    torch.manual_seed(0)
    model, kind = build()
    model = model.to(device).eval()
    inputs, images = inputs_for(kind, model)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    P = inputs["input_ids"].shape[1]
    model.set_attn_implementation("sdpa")
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=gen + 1, min_new_tokens=gen + 1,
                                  do_sample=False, num_beams=1)[0, : P + gen]
    trace, prompts = work / f"{name}.h5", work / f"{name}_prompts.h5"
    hf.capture_pretrained(model, FixedProcessor(inputs),
                          [{"name": "000000", "text": "", "images": ["x"] * images}], str(trace),
                          gen=gen, dtype="float32", prompts_out=str(prompts))
    reference = independent_qkv(kind, model, inputs, expected[None])
    report = {"model": name, "prompt_len": P, "gen": gen}
    with h5py.File(trace) as f:
        g = f["samples/000000"]
        report["tokens_equal_generate"] = list(g["token_ids"][()]) == expected.tolist()
        report["layers_recorded"] = len(g["layers"])
        report["decoder_layers"] = len(reference)
        report["image_tokens"] = int((g["modality"][()] == 1).sum())
        worst = 0.0
        for l, ref in enumerate(reference):
            for n in ("q", "k", "v"):
                got = g[f"layers/{l}/{n}"][()]
                worst = max(worst, float(np.abs(got - ref[n]).max() / max(np.abs(ref[n]).max(),
                                                                            1e-12)))
        report["max_rel_error_qkv"] = worst
    report["ok"] = (report["tokens_equal_generate"] and report["layers_recorded"] ==
                    report["decoder_layers"] and worst < 1e-4 and
                    (images == 0 or report["image_tokens"] > 0))
    if kvsim:
        report.update(check_live(name, model, inputs, expected, P, gen, prompts, work, kvsim,
                                 backend))
        report["ok"] = report["ok"] and report["live_ok"]
    return report


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gen", type=int, default=8)
    ap.add_argument("--out", help="JSON report")
    ap.add_argument("--kvsim", help="the kvsim binary: also run kvsim live on each checkpoint")
    ap.add_argument("--backend", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="kvsim live's backend")
    a = ap.parse_args()
    reports = []
    with tempfile.TemporaryDirectory() as work:
        for name, build in (("llama", tiny_llama), ("llava", tiny_llava),
                            ("qwen2_vl", tiny_qwen2_vl)):
            try:
                reports.append(check(name, build, a.device, a.gen, Path(work), a.kvsim,
                                     a.backend))
            except Exception as e:  # report every model, then fail
                import traceback
                reports.append({"model": name, "ok": False, "error": f"{type(e).__name__}: {e}",
                                "where": traceback.format_exc().splitlines()[-8:]})
    report = {"transformers": transformers.__version__, "torch": torch.__version__,
              "device": a.device, "models": reports}
    text = json.dumps(report, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text)
    sys.exit(0 if all(r["ok"] for r in reports) else 1)


if __name__ == "__main__":
    main()
