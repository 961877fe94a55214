#include "sim/live/model.hpp"

#include <cmath>
#include <stdexcept>

namespace kvsim::live {

// Activation buffers for a block of `rows` tokens, in backend memory.
struct Model::Scratch {
  Backend& b;
  float *x, *h, *q, *k, *v, *att, *o, *gate, *up, *act;
  Scratch(Backend& backend, const ModelConfig& c, int rows) : b(backend) {
    const std::size_t n = rows, D = c.hidden_size, I = c.intermediate_size;
    const std::size_t qd = static_cast<std::size_t>(c.num_attention_heads) * c.head_dim;
    const std::size_t kvd = static_cast<std::size_t>(c.num_key_value_heads) * c.head_dim;
    x = b.alloc(n * D), h = b.alloc(n * D), o = b.alloc(n * D);
    q = b.alloc(n * qd), att = b.alloc(n * qd), k = b.alloc(n * kvd), v = b.alloc(n * kvd);
    gate = b.alloc(n * I), up = b.alloc(n * I), act = b.alloc(n * I);
  }
  ~Scratch() {
    for (float* p : {x, h, q, k, v, att, o, gate, up, act}) b.release(p);
  }
};

float* Model::upload(const HostTensor& t) {
  float* p = backend_.alloc(t.data.size());
  backend_.upload(p, t.data.data(), t.data.size());
  owned_.push_back(p);
  return p;
}

Model::Model(const Checkpoint& ck, Backend& backend) : config_(ck.config), backend_(backend) {
  const auto& c = config_;
  const std::int64_t D = c.hidden_size, I = c.intermediate_size, V = c.vocab_size;
  const std::int64_t qd = static_cast<std::int64_t>(c.num_attention_heads) * c.head_dim;
  const std::int64_t kvd = static_cast<std::int64_t>(c.num_key_value_heads) * c.head_dim;
  embed_ = upload(ck.get("model.embed_tokens.weight", {V, D}));
  final_norm_ = upload(ck.get("model.norm.weight", {D}));
  lm_head_ = c.tie_word_embeddings ? embed_ : upload(ck.get("lm_head.weight", {V, D}));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    LayerWeights w;
    w.attn_norm = upload(ck.get(p + "input_layernorm.weight", {D}));
    w.wq = upload(ck.get(p + "self_attn.q_proj.weight", {qd, D}));
    w.wk = upload(ck.get(p + "self_attn.k_proj.weight", {kvd, D}));
    w.wv = upload(ck.get(p + "self_attn.v_proj.weight", {kvd, D}));
    w.wo = upload(ck.get(p + "self_attn.o_proj.weight", {D, qd}));
    if (c.qkv_bias) {
      w.bq = upload(ck.get(p + "self_attn.q_proj.bias", {qd}));
      w.bk = upload(ck.get(p + "self_attn.k_proj.bias", {kvd}));
      w.bv = upload(ck.get(p + "self_attn.v_proj.bias", {kvd}));
    }
    if (c.o_bias) w.bo = upload(ck.get(p + "self_attn.o_proj.bias", {D}));
    w.mlp_norm = upload(ck.get(p + "post_attention_layernorm.weight", {D}));
    w.w_gate = upload(ck.get(p + "mlp.gate_proj.weight", {I, D}));
    w.w_up = upload(ck.get(p + "mlp.up_proj.weight", {I, D}));
    w.w_down = upload(ck.get(p + "mlp.down_proj.weight", {D, I}));
    layers_.push_back(w);
  }
  // inv_freq[i] = theta^(-2i/d), computed in float32 as transformers does.
  for (int i = 0; i < c.head_dim / 2; ++i)
    inv_freq_.push_back(
        static_cast<float>(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim)));
  // M-RoPE (transformers' apply_multimodal_rotary_pos_emb): the cos/sin halves are split by
  // mrope_section and chunk j takes axis j % 3, so frequency i reads the axis whose section
  // holds it.
  for (int axis = 0; axis < static_cast<int>(c.mrope_section.size()); ++axis)
    mrope_axis_.insert(mrope_axis_.end(), c.mrope_section[axis], axis);
}

Model::~Model() {
  decode_scratch_.reset();
  for (float* p : owned_) backend_.release(p);
}

float Model::scale() const {
  return static_cast<float>(1.0 / std::sqrt(config_.head_dim));
}

void Model::check_tokens(const std::vector<std::int32_t>& ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= config_.vocab_size)
      throw std::invalid_argument("token id " + std::to_string(ids[i]) + " at position " +
                                  std::to_string(i) + " is outside the vocabulary [0, " +
                                  std::to_string(config_.vocab_size) + ")");
}

void Model::attention_block(
    int layer, int rows, const std::int32_t* positions, Scratch& s,
    const std::function<void(const float*, const float*, const float*, float*)>& attend) {
  const auto& c = config_;
  const LayerWeights& w = layers_[layer];
  const int D = c.hidden_size, H = c.num_attention_heads, Hkv = c.num_key_value_heads,
            d = c.head_dim;
  backend_.rms_norm(s.x, w.attn_norm, rows, D, static_cast<float>(c.rms_norm_eps), s.h);
  backend_.linear(s.h, rows, D, w.wq, H * d, w.bq, s.q);
  backend_.linear(s.h, rows, D, w.wk, Hkv * d, w.bk, s.k);
  backend_.linear(s.h, rows, D, w.wv, Hkv * d, w.bv, s.v);
  const int axes = c.mrope() ? 3 : 1;
  const std::int32_t* axis = c.mrope() ? mrope_axis_.data() : nullptr;
  backend_.rope(s.q, rows, H, d, positions, axes, axis, inv_freq_.data());
  backend_.rope(s.k, rows, Hkv, d, positions, axes, axis, inv_freq_.data());
  attend(s.q, s.k, s.v, s.att);
  backend_.linear(s.att, rows, H * d, w.wo, D, w.bo, s.o);
  backend_.add(s.x, s.o, static_cast<std::size_t>(rows) * D);
}

void Model::mlp_block(int layer, int rows, Scratch& s) {
  const auto& c = config_;
  const LayerWeights& w = layers_[layer];
  const int D = c.hidden_size, I = c.intermediate_size;
  backend_.rms_norm(s.x, w.mlp_norm, rows, D, static_cast<float>(c.rms_norm_eps), s.h);
  backend_.linear(s.h, rows, D, w.w_gate, I, nullptr, s.gate);
  backend_.linear(s.h, rows, D, w.w_up, I, nullptr, s.up);
  backend_.swiglu(s.gate, s.up, static_cast<std::size_t>(rows) * I, s.act);
  backend_.linear(s.act, rows, I, w.w_down, D, nullptr, s.o);
  backend_.add(s.x, s.o, static_cast<std::size_t>(rows) * D);
}

std::vector<float> Model::logits(const float* hidden_row) {
  const int D = config_.hidden_size, V = config_.vocab_size;
  if (!logits_) {
    norm_row_ = backend_.alloc(D), logits_ = backend_.alloc(V);
    owned_.push_back(norm_row_), owned_.push_back(logits_);
  }
  backend_.rms_norm(hidden_row, final_norm_, 1, D, static_cast<float>(config_.rms_norm_eps),
                    norm_row_);
  backend_.linear(norm_row_, 1, D, lm_head_, V, nullptr, logits_);
  std::vector<float> host(V);
  backend_.download(host.data(), logits_, V);
  return host;
}

PrefillResult Model::prefill(const std::vector<std::int32_t>& prompt_ids,
                             const std::vector<int>& embed_positions,
                             const std::vector<float>& embeds,
                             const std::vector<std::int32_t>& position_ids) {
  // Positions with precomputed embeddings may carry an id outside the language model's
  // vocabulary (LLaVA's image token): they are embedded as token 0, then overwritten.
  std::vector<std::int32_t> ids = prompt_ids;
  for (int p : embed_positions) ids[p] = 0;
  check_tokens(ids);
  const auto& c = config_;
  const int P = static_cast<int>(ids.size()), D = c.hidden_size, H = c.num_attention_heads,
            Hkv = c.num_key_value_heads, d = c.head_dim;
  if (P == 0) throw std::invalid_argument("empty prompt");
  if (embeds.size() != embed_positions.size() * D)
    throw std::invalid_argument("inputs_embeds holds " + std::to_string(embeds.size()) +
                                " floats, expected " + std::to_string(embed_positions.size()) +
                                " rows of hidden_size " + std::to_string(D));
  Scratch s(backend_, c, P);
  backend_.embed(embed_, ids.data(), P, D, s.x);
  for (std::size_t r = 0; r < embed_positions.size(); ++r)
    backend_.upload(s.x + static_cast<std::size_t>(embed_positions[r]) * D, &embeds[r * D], D);
  const std::size_t axes = c.mrope() ? 3 : 1;
  if (position_ids.size() != (c.mrope() ? axes * P : 0))
    throw std::invalid_argument(
        c.mrope() ? "the model uses M-RoPE and needs position_ids [" + std::to_string(P) +
                        ", 3], got " + std::to_string(position_ids.size()) + " values"
                  : std::string("position_ids are for M-RoPE models; this one uses plain RoPE"));
  std::vector<std::int32_t> positions = position_ids;
  if (!c.mrope())
    for (int i = 0; i < P; ++i) positions.push_back(i);
  PrefillResult result;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    LayerTensors t;
    t.layer = l;
    const std::size_t rows = P;
    t.q = xt::xtensor<float, 3>::from_shape({rows, std::size_t(H), std::size_t(d)});
    t.k = xt::xtensor<float, 3>::from_shape({rows, std::size_t(Hkv), std::size_t(d)});
    t.v = xt::xtensor<float, 3>::from_shape({rows, std::size_t(Hkv), std::size_t(d)});
    attention_block(l, P, positions.data(), s,
                    [&](const float* q, const float* k, const float* v, float* out) {
                      backend_.download(t.q.data(), q, t.q.size());
                      backend_.download(t.k.data(), k, t.k.size());
                      backend_.download(t.v.data(), v, t.v.size());
                      backend_.causal_attention(q, k, v, P, H, Hkv, d, scale(), out);
                    });
    mlp_block(l, P, s);
    result.layers.push_back(std::move(t));
  }
  result.logits = logits(s.x + static_cast<std::size_t>(P - 1) * D);
  return result;
}

std::vector<float> Model::decode(std::int32_t token, int position, const AttendFn& attend) {
  check_tokens({token});
  if (!decode_scratch_) decode_scratch_ = std::make_unique<Scratch>(backend_, config_, 1);
  Scratch& s = *decode_scratch_;
  backend_.embed(embed_, &token, 1, config_.hidden_size, s.x);
  const std::int32_t positions[3] = {position, position, position};
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    attention_block(l, 1, positions, s,
                    [&](const float* q, const float* k, const float* v, float* out) {
                      attend(l, q, k, v, out);
                    });
    mlp_block(l, 1, s);
  }
  return logits(s.x);
}

}  // namespace kvsim::live
