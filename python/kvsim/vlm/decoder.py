"""A LLaMA decoder in PyTorch for checkpoints in transformers' LlamaForCausalLM layout (config.json
+ model.safetensors, as `kvsim live` loads them): what the assembled VLM trains through. It is
written from transformers' modeling_llama.py conventions (RMSNorm, rotate-half RoPE, grouped-query
attention, SwiGLU, tied embeddings), so a checkpoint it saves runs unchanged in `kvsim live`.

    dec = LlamaDecoder.load("models/stories260K")
    logits = dec(dec.embed(ids))                     # [N, T, vocab]
    logits = dec(torch.cat([dec.embed(bos), image_rows, dec.embed(text)], 1))
"""
import json
import os

import numpy as np

from kvsim.vlm.encoder import read_safetensors

__all__ = ["LlamaDecoder", "greedy_answers"]


def _torch():
    import torch
    return torch


class LlamaDecoder:
    """Parameters are plain tensors in `params` (names as in the checkpoint); `trainable(names)`
    marks which ones require gradients (none: the decoder stays frozen, as in LLaVA's stage 1)."""

    def __init__(self, config, params):
        torch = _torch()
        self.config = config
        self.params = params
        self.layers = int(config["num_hidden_layers"])
        self.heads = int(config["num_attention_heads"])
        self.kv_heads = int(config.get("num_key_value_heads", self.heads))
        self.hidden = int(config["hidden_size"])
        self.head_dim = int(config.get("head_dim", self.hidden // self.heads))
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        theta = float(config.get("rope_theta", 10000.0))
        if config.get("rope_scaling"):
            raise ValueError("LlamaDecoder: rope_scaling is not supported")
        self.inv_freq = 1.0 / theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64)
                                        / self.head_dim)
        self.tied = bool(config.get("tie_word_embeddings", False))
        # Contiguous attention operands (faster; the multi-image build sets it): see __call__.
        self.contiguous = False
        # "torch": attention as PyTorch expressions (any device); "kvsim": the items packed
        # without padding and attention by kvsim's C++ kernels (kvsim.vlm.attention: CPU,
        # float32, several times faster; the eight-box build's CPU training and evaluation).
        self.attention = "torch"
        self.attention_threads = None  # the kernels' threads (None: PyTorch's count)

    @classmethod
    def load(cls, directory):
        torch = _torch()
        with open(os.path.join(directory, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
        if config.get("model_type") != "llama":
            raise ValueError(f"{directory}: model_type {config.get('model_type')!r} is not llama")
        arrays = read_safetensors(os.path.join(directory, "model.safetensors"))
        return cls(config, {k: torch.from_numpy(v.astype(np.float32)) for k, v in arrays.items()})

    def to(self, device):
        """Moves the parameters to `device` (a torch device or its name); inputs must be there."""
        torch = _torch()
        device = torch.device(device)
        self.params = {k: v.to(device) for k, v in self.params.items()}
        self.inv_freq = self.inv_freq.to(device)
        return self

    def trainable(self, names):
        for k, v in self.params.items():
            v.requires_grad_(k in names)
        return [self.params[k] for k in names]

    def embed(self, ids):
        # F.embedding, not indexing: indexing's backward accumulates repeated ids in parallel on
        # the CPU, in a varying order (a fine-tuned build would not be deterministic).
        return _torch().nn.functional.embedding(ids, self.params["model.embed_tokens.weight"])

    def _norm(self, x, w):
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * w

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = _torch().cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def __call__(self, inputs, positions=None, pad=None, last=None):
        """inputs: [N, T, hidden] input embeddings; causal attention over positions 0..T-1 (or
        `positions` [T]). `pad` [N, T] (True: padding, at the start of an item): each item then
        starts at position 0 after its pads, which no real token attends. Returns the logits
        [N, T, vocab], or [N, last, vocab] of the last `last` positions."""
        if self.attention == "kvsim":
            return self._packed(inputs, positions, pad, last)
        torch = _torch()
        p = self.params
        n, t, _ = inputs.shape
        at = inputs.device
        if pad is None:
            pos = (torch.arange(t, dtype=torch.float64, device=at) if positions is None
                   else positions.double())
            mask = torch.full((t, t), float("-inf"), device=at).triu(1)
        else:
            pos = ((~pad).cumsum(1) - 1).clamp(min=0).double()[:, None]  # [N, 1, T]
            hidden_keys = pad[:, None, None, :] & ~torch.eye(t, dtype=torch.bool, device=at)
            mask = torch.full((t, t), float("-inf"), device=at).triu(1).expand(  # pads see
                n, 1, t, t).masked_fill(hidden_keys, float("-inf"))  # themselves only
        angles = pos[..., None] * self.inv_freq
        cos = torch.cat([angles.cos(), angles.cos()], -1).float()
        sin = torch.cat([angles.sin(), angles.sin()], -1).float()
        group = self.heads // self.kv_heads
        x = inputs
        for layer in range(self.layers):
            pre = f"model.layers.{layer}."
            h = self._norm(x, p[pre + "input_layernorm.weight"])
            q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(n, t, self.heads, self.head_dim)
            k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(n, t, self.kv_heads, self.head_dim)
            v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(n, t, self.kv_heads, self.head_dim)
            q = self._rope(q.transpose(1, 2), cos, sin)
            k = self._rope(k.transpose(1, 2), cos, sin).repeat_interleave(group, dim=1)
            v = v.transpose(1, 2).repeat_interleave(group, dim=1)
            if self.contiguous:
                # torch 1.13's CPU batched matmul is ~15x slower on a transposed operand with a
                # head dimension of 8; the same products, summed in another order.
                q, v = q.contiguous(), v.contiguous()
                scores = (q @ k.transpose(-1, -2).contiguous()).div_(self.head_dim ** 0.5)
                scores = scores.add_(mask)
            else:  # the single-image build's arithmetic, kept as its results were measured
                scores = q @ k.transpose(-1, -2) / self.head_dim ** 0.5 + mask
            att = torch.softmax(scores, dim=-1) @ v
            x = x + att.transpose(1, 2).reshape(n, t, -1) @ p[pre + "self_attn.o_proj.weight"].T
            x = self._mlp(x, pre)
        return self._logits(x if last is None else x[:, t - last:])

    def _packed(self, inputs, positions, pad, last):
        """__call__ with the items' real tokens back to back ([tokens, hidden]: no padding row is
        computed) and kvsim's attention kernels; padding rows' logits are zero."""
        torch = _torch()
        from kvsim.vlm.attention import causal_attention

        p = self.params
        n, t, _ = inputs.shape
        real = (torch.ones(n, t, dtype=torch.bool, device=inputs.device) if pad is None
                else ~pad)
        lengths = real.sum(1).cpu()
        bounds = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        x = inputs[real]
        tokens = x.shape[0]
        if positions is not None:
            if pad is not None:
                raise ValueError("LlamaDecoder: positions are for unpadded inputs")
            pos = positions.double().repeat(n)
        else:  # each item from position 0
            pos = (torch.arange(tokens, dtype=torch.float64) -
                   bounds[:-1].repeat_interleave(lengths).double())
        angles = pos.to(inputs.device)[:, None, None] * self.inv_freq  # [tokens, 1, d/2]
        cos = torch.cat([angles.cos(), angles.cos()], -1).float()
        sin = torch.cat([angles.sin(), angles.sin()], -1).float()
        for layer in range(self.layers):
            pre = f"model.layers.{layer}."
            h = self._norm(x, p[pre + "input_layernorm.weight"])
            q = (h @ p[pre + "self_attn.q_proj.weight"].T).view(tokens, self.heads, self.head_dim)
            k = (h @ p[pre + "self_attn.k_proj.weight"].T).view(tokens, self.kv_heads,
                                                                 self.head_dim)
            v = (h @ p[pre + "self_attn.v_proj.weight"].T).view(tokens, self.kv_heads,
                                                                 self.head_dim)
            att = causal_attention(self._rope(q, cos, sin), self._rope(k, cos, sin), v, bounds,
                                   self.head_dim ** -0.5, self.attention_threads)
            x = x + att.reshape(tokens, -1) @ p[pre + "self_attn.o_proj.weight"].T
            x = self._mlp(x, pre)
        x = torch.zeros(n, t, x.shape[-1], dtype=x.dtype, device=x.device).masked_scatter(
            real[..., None], x)
        return self._logits(x if last is None else x[:, t - last:])

    def _mlp(self, x, pre):
        """x plus the SwiGLU block of the layer whose names start with `pre`."""
        p = self.params
        h = self._norm(x, p[pre + "post_attention_layernorm.weight"])
        gate = _torch().nn.functional.silu(h @ p[pre + "mlp.gate_proj.weight"].T)
        return x + (gate * (h @ p[pre + "mlp.up_proj.weight"].T)) @ p[pre + "mlp.down_proj.weight"].T

    def _logits(self, x):
        p = self.params
        head = p["model.embed_tokens.weight"] if self.tied else p["lm_head.weight"]
        return self._norm(x, p["model.norm.weight"]) @ head.T


def greedy_answers(dec, inputs, max_tokens, end_ids):
    """Greedy continuations of a batch of unpadded prompts' input embeddings [N, T, hidden]: each
    item's token ids up to and including its first of `end_ids`, at most max_tokens."""
    torch = _torch()
    x = inputs
    out = [[] for _ in range(x.shape[0])]
    done = np.zeros(x.shape[0], dtype=bool)
    with torch.no_grad():
        for _ in range(max_tokens):
            nxt = dec(x)[:, -1].argmax(-1)
            for i, t in enumerate(nxt.tolist()):
                if not done[i]:
                    out[i].append(t)
                    done[i] = t in end_ids
            if done.all():
                break
            x = torch.cat([x, dec.embed(nxt[:, None])], 1)
    return out
