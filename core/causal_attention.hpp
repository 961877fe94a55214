// Causal self-attention of packed sequences (several items' tokens back to back, none padded),
// forward and backward, computed row by row with the run-time dispatched vector kernels and
// never materialising a [length × length] score matrix: what training the assembled VLM's decoder
// spends most of its time on (8-dimensional heads, so the batched products a framework launches
// are mostly overhead). Grouped-query heads are read in place: query head h reads key/value head
// h / (heads / kv_heads), as repeat_interleave would give it.
//
// Each (item, key/value head) pair is one task, computed by one thread in a fixed order, so the
// results are the same bytes whatever the thread count (on one machine: the instruction set the
// kernels use, KVSIM_SIMD, changes the rounding).
#pragma once

#include <cstdint>

namespace kvsim {

struct PackedAttention {
  int tokens = 0, heads = 0, kv_heads = 0, dim = 0;
  // Item n holds tokens bounds[n]..bounds[n+1]-1; bounds[0] = 0, bounds[items] = tokens.
  const std::int64_t* bounds = nullptr;
  int items = 0;
  // Throws std::invalid_argument naming what is inconsistent.
  void check() const;
};

// Layouts: q, out, dout, dq [tokens, heads, dim]; k, v, dk, dv [tokens, kv_heads, dim]; lse
// [tokens, heads].
// out[i,h] = Σ_{j from the item's first token to i} softmax_j(scale·q_i·k_j) v_j,
// lse[i,h] = log Σ_j exp(scale·q_i·k_j).
void causal_attention_forward(const PackedAttention& shape, const float* q, const float* k,
                              const float* v, float scale, float* out, float* lse, int threads);

// The gradients of a loss with respect to q, k and v, given dout = ∂loss/∂out and the forward's
// out and lse (the probabilities are recomputed, as FlashAttention's backward does:
// dS = P ∘ (dP − rowsum(dout ∘ out)), dq = scale·dS·K, dk = scale·dSᵀ·Q, dv = Pᵀ·dout).
void causal_attention_backward(const PackedAttention& shape, const float* q, const float* k,
                               const float* v, const float* out, const float* lse,
                               const float* dout, float scale, float* dq, float* dk, float* dv,
                               int threads);

}  // namespace kvsim
