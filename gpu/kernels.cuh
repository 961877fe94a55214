// CUDA kernels of the live decoder, on raw device pointers, and their launchers. Each one has a
// CPU reference in sim/live/cpu_backend.cpp that tests/test_gpu.cpp compares it against.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvsim::gpu {

// out[r, :] = table[ids[r], :]
void launch_embed(const float* table, const std::int32_t* ids, int rows, int dim, float* out,
                  cudaStream_t s);
// RMSNorm per row.
void launch_rms_norm(const float* x, const float* w, int rows, int dim, float eps, float* out,
                     cudaStream_t s);
// y[r, j] += bias[j]
void launch_add_bias(float* y, const float* bias, int rows, int n, cudaStream_t s);
// Rotate-half RoPE in place on x[rows, heads, d].
// positions[r * axes + axis[f]] (axis null: axes = 1, plain RoPE; see Backend::rope).
void launch_rope(float* x, int rows, int heads, int d, const std::int32_t* positions, int axes,
                 const std::int32_t* axis, const float* inv_freq, cudaStream_t s);
void launch_swiglu(const float* gate, const float* up, std::size_t n, float* out, cudaStream_t s);
void launch_add(float* x, const float* y, std::size_t n, cudaStream_t s);
// Row softmax of scores[rows, cols] (row i keeps columns 0..i: causal), in place.
void launch_causal_softmax(float* scores, int rows, int cols, cudaStream_t s);
// out[i, :] = rows[index[i], :] for i < n (rows of d floats).
void launch_gather_rows(const float* rows, const std::int32_t* index, int n, int d, float* out,
                        cudaStream_t s);

// Decode attention of one token over a compacted, per-KV-head cache of varying lengths.
// Head g's rows start at k + g * capacity * d (same for v); lengths[g] rows are valid; mask
// (may be null) holds capacity flags per KV head, 0 = not attended. q[H, d] -> out[H, d];
// probs[h * capacity + e] = softmax probability of entry e for query head h.
struct DecodeAttentionArgs {
  const float* q;
  const float* k;
  const float* v;
  const std::int32_t* lengths;  // [Hkv], device
  const std::uint8_t* mask;     // [Hkv, capacity] or null, device
  int heads, kv_heads, d, capacity, max_length;
  float scale;
  float* out;    // [H, d]
  float* probs;  // [H, capacity]
  // Scratch sized by decode_attention_scratch_floats().
  float* scratch;
  int chunk = 0;  // entries per block; chosen by launch_decode_attention
};
std::size_t decode_attention_scratch_floats(int heads, int d, int max_length);
void launch_decode_attention(const DecodeAttentionArgs& a, cudaStream_t s);

}  // namespace kvsim::gpu
