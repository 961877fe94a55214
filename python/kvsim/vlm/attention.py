"""Causal attention of packed sequences as a torch autograd function computed by kvsim's C++
kernels (core/causal_attention.hpp): the decoder's attention when the eight-box VLM trains on
the CPU.

torch 1.13 computes a decoder with 8-dimensional heads as batched products over [items · heads,
length, length] score tensors, which cost far more in memory traffic and per-call overhead than
in arithmetic, and pads every item to the longest; this takes the items' tokens back to back,
computes each (item, key/value head) row by row over the causal half only, and recomputes the
probabilities in the backward pass as FlashAttention does. The results equal the PyTorch
expression's within float32 rounding (python/tests/test_vlm_attention.py) and are the same bytes
whatever the thread count.

    out = causal_attention(q, k, v, bounds)   # q [tokens, H, d]; k, v [tokens, Hkv, d];
                                              # item n: tokens bounds[n]..bounds[n+1]-1
"""
__all__ = ["causal_attention"]


def _function():
    import torch

    from kvsim import _kvsim

    class CausalAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, bounds, scale, threads):
            arrays = [x.detach().contiguous() for x in (q, k, v)]
            out, lse = _kvsim.causal_attention_forward(*(x.numpy() for x in arrays),
                                                       bounds.numpy(), scale, threads)
            out, lse = torch.from_numpy(out), torch.from_numpy(lse)
            ctx.save_for_backward(*arrays, out, lse, bounds)
            ctx.scale, ctx.threads = scale, threads
            return out

        @staticmethod
        def backward(ctx, dout):
            q, k, v, out, lse, bounds = ctx.saved_tensors
            grads = _kvsim.causal_attention_backward(
                q.numpy(), k.numpy(), v.numpy(), out.numpy(), lse.numpy(),
                dout.detach().contiguous().numpy(), bounds.numpy(), ctx.scale, ctx.threads)
            return (*(torch.from_numpy(g) for g in grads), None, None, None)

    return CausalAttention


_FUNCTION = []


def causal_attention(q, k, v, bounds, scale=None, threads=None):
    """softmax(scale · q kᵀ + causal mask) v within each item (item n: tokens bounds[n] ..
    bounds[n+1]-1; no token attends another item's); query head h reads key/value head
    h // (heads / kv_heads). q [tokens, heads, d], k and v [tokens, kv_heads, d]: float32 CPU
    tensors; scale defaults to 1/sqrt(d); threads to PyTorch's (the bytes do not depend on it).
    Returns [tokens, heads, d]."""
    import torch

    if not _FUNCTION:
        _FUNCTION.append(_function())
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.device.type != "cpu" or x.dtype != torch.float32:
            raise ValueError(f"causal_attention: {name} must be a float32 CPU tensor, not "
                             f"{x.dtype} on {x.device}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    bounds = torch.as_tensor(bounds, dtype=torch.int64).contiguous()
    return _FUNCTION[0].apply(q, k, v, bounds, float(scale),
                              int(threads or torch.get_num_threads()))
