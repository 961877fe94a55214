// A LLaMA-style decoder (LLaMA, Mistral, Qwen2) over a Backend: the one model code path of both
// backends. Attention in decode steps is delegated to the caller, which owns the KV cache and the
// eviction policy (sim/live/live_engine.hpp).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "sim/live/backend.hpp"
#include "sim/live/checkpoint.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim::live {

struct PrefillResult {
  std::vector<LayerTensors> layers;  // per layer, q/k/v of the prompt after RoPE, [P, ., d]
  std::vector<float> logits;         // [vocab]: the distribution of the first generated token
};

class Model {
 public:
  Model(const Checkpoint& checkpoint, Backend& backend);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  float scale() const;  // 1/sqrt(head_dim)

  // Runs the prompt with full causal attention. embeds: [rows, hidden] host rows that replace
  // the token embeddings at positions embed_positions (precomputed image features).
  // position_ids: for an M-RoPE model, [P, 3] (temporal, height, width per token, row-major);
  // otherwise empty (token i is at position i).
  PrefillResult prefill(const std::vector<std::int32_t>& token_ids,
                        const std::vector<int>& embed_positions = {},
                        const std::vector<float>& embeds = {},
                        const std::vector<std::int32_t>& position_ids = {});

  // One decode token at `position` (an M-RoPE model: all three ids equal it, as transformers'
  // Qwen2-VL continues after the prompt's largest id). For every layer,
  // attend(layer, q, k, v, out) receives the token's q[H, d], k and v [Hkv, d] (backend memory,
  // after RoPE) and must write out[H, d].
  using AttendFn =
      std::function<void(int layer, const float* q, const float* k, const float* v, float* out)>;
  std::vector<float> decode(std::int32_t token, int position, const AttendFn& attend);

 private:
  struct LayerWeights {
    float *attn_norm, *wq, *wk, *wv, *wo, *bq = nullptr, *bk = nullptr, *bv = nullptr,
                                          *bo = nullptr;
    float *mlp_norm, *w_gate, *w_up, *w_down;
  };
  float* upload(const HostTensor& t);
  struct Scratch;  // activation buffers for `rows` tokens
  // positions: `rows` ids, or 3 per row for an M-RoPE model.
  void attention_block(
      int layer, int rows, const std::int32_t* positions, Scratch& s,
      const std::function<void(const float*, const float*, const float*, float*)>& attend);
  void mlp_block(int layer, int rows, Scratch& s);
  std::vector<float> logits(const float* hidden_row);
  void check_tokens(const std::vector<std::int32_t>& ids) const;

  ModelConfig config_;
  Backend& backend_;
  std::vector<float*> owned_;
  float *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
  std::vector<LayerWeights> layers_;
  std::vector<float> inv_freq_;
  std::vector<std::int32_t> mrope_axis_;  // [d/2]: the position id each frequency reads; M-RoPE
  std::unique_ptr<Scratch> decode_scratch_;
  float *norm_row_ = nullptr, *logits_ = nullptr;
};

}  // namespace kvsim::live
