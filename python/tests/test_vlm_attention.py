"""kvsim.vlm.attention: the C++ causal attention the eight-box VLM trains with, against PyTorch's
expression of the same attention in float64 (item by item, grouped heads repeated as
repeat_interleave repeats them): outputs and the three gradients within float32 rounding; the same
bytes on one thread and on two; a decoder packed for the kernels gives the padded PyTorch
decoder's logits; bad shapes and bounds are refused, named. Needs torch only (no models)."""
import unittest

import numpy as np
import torch

from kvsim.vlm.attention import causal_attention
from kvsim.vlm.decoder import LlamaDecoder


def reference(q, k, v, bounds, scale):
    """softmax(scale·q kᵀ + causal mask) v per item, as the PyTorch decoder writes it."""
    group = q.shape[1] // k.shape[1]
    outs = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        qi = q[a:b].transpose(0, 1)
        ki = k[a:b].transpose(0, 1).repeat_interleave(group, 0)
        vi = v[a:b].transpose(0, 1).repeat_interleave(group, 0)
        mask = torch.full((b - a, b - a), float("-inf"), dtype=q.dtype).triu(1)
        outs.append((torch.softmax(qi @ ki.transpose(-1, -2) * scale + mask, -1) @ vi)
                    .transpose(0, 1))
    return torch.cat(outs)


def inputs(lengths, heads=8, kv_heads=4, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = sum(lengths)
    q = torch.randn(tokens, heads, dim, generator=g, dtype=torch.float64) * 2
    k = torch.randn(tokens, kv_heads, dim, generator=g, dtype=torch.float64) * 2
    v = torch.randn(tokens, kv_heads, dim, generator=g, dtype=torch.float64)
    bounds = torch.tensor([0] + list(np.cumsum(lengths)), dtype=torch.int64)
    return q, k, v, bounds


def float32_inputs(lengths, **shape):
    """inputs() with q, k and v as the kernels take them."""
    q, k, v, bounds = inputs(lengths, **shape)
    return q.float(), k.float(), v.float(), bounds


class CausalAttention(unittest.TestCase):
    def run_both(self, lengths, heads=8, kv_heads=4, dim=8, threads=2):
        q, k, v, bounds = inputs(lengths, heads, kv_heads, dim)
        scale = dim ** -0.5
        grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(9), dtype=q.dtype)
        ref = [x.clone().requires_grad_() for x in (q, k, v)]
        out = reference(*ref, bounds, scale)
        (out * grad).sum().backward()
        mine = [x.float().requires_grad_() for x in (q, k, v)]
        got = causal_attention(*mine, bounds, scale, threads)
        (got * grad.float()).sum().backward()
        return ((got, out), *((m.grad, r.grad) for m, r in zip(mine, ref)))

    def assert_close(self, pairs):
        for name, (got, want) in zip(("out", "dq", "dk", "dv"), pairs):
            # float32 rounding of sums over up to a few hundred terms of this size
            err = float((got.double() - want).abs().max())
            self.assertLess(err, 2e-5 * (1 + float(want.abs().max())), name)

    def test_equals_pytorch_on_items_of_every_length_around_the_lane_counts(self):
        self.assert_close(self.run_both([1, 2, 15, 16, 17, 31, 33, 64, 100]))

    def test_empty_items_and_one_head_per_group(self):
        self.assert_close(self.run_both([0, 5, 0, 40, 0], heads=4, kv_heads=4, dim=16))

    def test_long_items_as_the_eight_box_task_has(self):
        self.assert_close(self.run_both([482, 300]))

    def test_the_same_bytes_on_one_thread_and_on_two(self):
        one, two = self.run_both([37, 120, 3], threads=1), self.run_both([37, 120, 3], threads=2)
        for (a, _), (b, _) in zip(one, two):
            self.assertTrue(torch.equal(a, b))

    def test_bad_shapes_and_bounds_are_named(self):
        q, k, v, bounds = float32_inputs([3, 4], heads=8, kv_heads=3)
        with self.assertRaisesRegex(ValueError, "8 query heads are not a multiple of 3"):
            causal_attention(q, k, v, bounds)
        q, k, v, bounds = float32_inputs([3, 4])
        with self.assertRaisesRegex(ValueError, "bounds must run from 0 to the 7 tokens"):
            causal_attention(q, k, v, torch.tensor([0, 3, 6]))
        with self.assertRaisesRegex(ValueError, r"item 1 ends \(token 2\) before it starts "
                                                r"\(token 5\)"):
            causal_attention(q, k, v, torch.tensor([0, 5, 2, 7]))
        with self.assertRaisesRegex(ValueError, "k is not"):
            causal_attention(q, k[:5], v, bounds)
        with self.assertRaisesRegex(ValueError, "float32 CPU tensor"):
            causal_attention(q.double(), k, v, bounds)


class PackedDecoder(unittest.TestCase):
    """A small random LLaMA decoder: packed (the kernels) against padded (PyTorch) logits."""

    def decoder(self):
        config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "head_dim": 8, "vocab_size": 40, "rms_norm_eps": 1e-5,
                  "tie_word_embeddings": True}
        g = torch.Generator().manual_seed(3)
        shapes = {"model.embed_tokens.weight": (40, 32), "model.norm.weight": (32,)}
        for layer in range(2):
            pre = f"model.layers.{layer}."
            shapes.update({pre + "input_layernorm.weight": (32,),
                           pre + "post_attention_layernorm.weight": (32,),
                           pre + "self_attn.q_proj.weight": (32, 32),
                           pre + "self_attn.k_proj.weight": (16, 32),
                           pre + "self_attn.v_proj.weight": (16, 32),
                           pre + "self_attn.o_proj.weight": (32, 32),
                           pre + "mlp.gate_proj.weight": (48, 32),
                           pre + "mlp.up_proj.weight": (48, 32),
                           pre + "mlp.down_proj.weight": (32, 48)})
        params = {k: torch.randn(s, generator=g) * (1.0 if len(s) == 1 else 0.3)
                  for k, s in shapes.items()}
        return LlamaDecoder(config, params)

    def test_packed_logits_equal_the_padded_decoders(self):
        dec = self.decoder()
        g = torch.Generator().manual_seed(4)
        x = torch.randn(3, 21, 32, generator=g)
        pad = torch.zeros(3, 21, dtype=torch.bool)
        pad[1, :6] = True
        pad[2, :20] = True
        want = dec(x, pad=pad)
        dec.attention = "kvsim"
        got = dec(x, pad=pad)
        real = ~pad
        err = float((got[real] - want[real]).abs().max())
        self.assertLess(err, 1e-5 * float(want[real].abs().max()))
        self.assertEqual(float(got[pad].abs().max()), 0.0)  # padding rows: zero, as documented
        last = dec(x, pad=pad, last=2)  # the head's product over fewer rows: BLAS may round
        self.assertTrue(torch.allclose(last, got[:, -2:], rtol=1e-6, atol=1e-6))  # otherwise


if __name__ == "__main__":
    unittest.main()
