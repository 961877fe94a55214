// Where the live model's arithmetic runs. The decoder (sim/live/model.cpp) is written once against
// this interface; a backend supplies float32 buffers, the operations of a LLaMA-style layer, and
// the compacted KV cache that eviction edits. Two implementations: the CPU reference
// (sim/live/cpu_backend.cpp: plain loops plus BLAS, obviously correct) and CUDA (gpu/).
//
// Pointers passed to operations live in the backend's memory (alloc); arguments documented as
// "host" are ordinary host memory. All matrices are row-major.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kvsim::live {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // --- memory ---
  virtual float* alloc(std::size_t n) = 0;  // n floats, zeroed
  virtual void release(float* p) = 0;
  virtual void upload(float* dst, const float* host, std::size_t n) = 0;
  virtual void download(float* host, const float* src, std::size_t n) = 0;
  virtual void synchronize() {}

  // --- layer operations ---
  // out[r, :] = table[ids[r], :] (ids on the host).
  virtual void embed(const float* table, const std::int32_t* ids, int rows, int dim,
                     float* out) = 0;
  // out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w (RMSNorm).
  virtual void rms_norm(const float* x, const float* w, int rows, int dim, float eps,
                        float* out) = 0;
  // y[rows, n] = x[rows, k] · W[n, k]^T + bias[n] (bias may be null).
  virtual void linear(const float* x, int rows, int k, const float* w, int n, const float* bias,
                      float* y) = 0;
  // Rotary embedding in place, rotate-half convention (transformers' LLaMA): x[rows, heads, d].
  // Frequency i of row r turns by positions[r * axes + axis[i]] * inv_freq[i]: axes = 1 is plain
  // RoPE (axis null), axes = 3 is M-RoPE (temporal, height, width ids per token; axis[d/2] says
  // which one each frequency reads). positions, axis and inv_freq[d/2] are host arrays.
  virtual void rope(float* x, int rows, int heads, int d, const std::int32_t* positions, int axes,
                    const std::int32_t* axis, const float* inv_freq) = 0;
  // out = silu(gate) * up, elementwise.
  virtual void swiglu(const float* gate, const float* up, std::size_t n, float* out) = 0;
  virtual void add(float* x, const float* y, std::size_t n) = 0;  // x += y
  // Causal attention of a prompt: q[P, H, d], k and v [P, Hkv, d] -> out[P, H, d].
  virtual void causal_attention(const float* q, const float* k, const float* v, int P, int H,
                                int Hkv, int d, float scale, float* out) = 0;

  // --- the KV cache: per (layer, KV head) an ordered list of (key, value) rows ---
  virtual void cache_reset(int layers, int kv_heads, int d, int capacity) = 0;
  // The head's rows become rows[0..n) of k and v (host, stride floats between rows).
  virtual void cache_assign(int layer, int g, const float* k, const float* v, int n,
                            std::size_t stride) = 0;
  // Appends one row (backend memory, d floats each).
  virtual void cache_append(int layer, int g, const float* k, const float* v) = 0;
  // Keeps the listed rows, in ascending order, and frees the others.
  virtual void cache_keep(int layer, int g, const std::vector<int>& rows) = 0;
  // Overwrites row e (host vectors of d floats): a merged entry.
  virtual void cache_write(int layer, int g, int e, const float* k, const float* v) = 0;
  virtual int cache_rows(int layer, int g) const = 0;
  // Copies row e out (host vectors of d floats): tests and diagnostics.
  virtual void cache_read(int layer, int g, int e, float* k, float* v) const = 0;
  // One query token q[H, d] over the cache of `layer` (query head h reads KV head h / group):
  // out[H, d] = softmax(scale q·K^T) V over the rows with attended[g][e] != 0 (all rows when
  // attended[g] is empty). probs[g] (host) receives [group, rows] probabilities, 0 on rows not
  // attended.
  virtual void decode_attention(int layer, const float* q, int H, float scale,
                                const std::vector<std::vector<std::uint8_t>>& attended, float* out,
                                std::vector<std::vector<float>>& probs) = 0;
};

std::unique_ptr<Backend> make_cpu_backend();
// Throws std::runtime_error when kvsim was built without CUDA or no device is visible. The backend
// runs on visible device `device % count` (one per MPI rank of a node: its local rank), and is
// used from the thread that made it.
std::unique_ptr<Backend> make_cuda_backend(int device = 0);
bool cuda_available();  // built with CUDA and at least one device present
// "cpu" or "cuda"; `device` as for make_cuda_backend (the CPU backend ignores it).
std::unique_ptr<Backend> make_backend(const std::string& name, int device = 0);

}  // namespace kvsim::live
