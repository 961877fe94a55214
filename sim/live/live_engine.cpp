#include "sim/live/live_engine.hpp"

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace kvsim::live {

std::int32_t argmax(const std::vector<float>& logits) {
  std::int32_t best = 0;
  for (std::size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = static_cast<std::int32_t>(i);
  return best;
}

AttentionNeeds LiveEngine::live_needs(const std::vector<PolicyConfig>& policies,
                                      const ModelConfig& config) {
  const int layers = config.num_hidden_layers;
  AttentionNeeds needs;
  for (const auto& p : policies) {
    if (p.info->lookahead)
      throw std::invalid_argument("policy '" + p.label +
                                  "' reads future attention (lookahead): it has no live run");
    // The backends hold one cache per KV head; on a multi-head model the two readings coincide.
    if (p.query_head_caches() && config.num_key_value_heads < config.num_attention_heads)
      throw std::invalid_argument(
          "policy '" + p.label +
          "': caches = query_head (one cache per query head) is replay-only on a GQA model (" +
          std::to_string(config.num_attention_heads) + " query heads, " +
          std::to_string(config.num_key_value_heads) +
          " KV heads): the live backends hold one cache per KV head; set caches=kv_head");
    for (int l = 0; l < layers; ++l)
      if (p.attention_source(l) != l)
        throw std::invalid_argument(
            "policy '" + p.label + "': layer " + std::to_string(l) +
            " inherits the attention of layer " + std::to_string(p.attention_source(l)) +
            " (QK heredity), which the live path does not run; use it in replay");
    needs.merge(p.needs());
  }
  if (needs.key_ranking) throw std::invalid_argument("key ranking is a replay diagnostic");
  return needs;
}

bool LiveEngine::needs_question_after(const std::vector<PolicyConfig>& policies) {
  for (const auto& p : policies)
    if (p.appends_question()) return true;
  return false;
}

void check_prompt_fits_model(const PromptSample& p, const ModelConfig& c, const std::string& where,
                             const std::string& model) {
  if (p.embed_dim != 0 && p.embed_dim != c.hidden_size)
    throw std::invalid_argument(
        where + "inputs_embeds rows have " + std::to_string(p.embed_dim) + " columns, " +
        (model.empty() ? "the model's hidden_size" : "the hidden_size of " + model) + " is " +
        std::to_string(c.hidden_size));
  std::vector<bool> embedded(p.info.token_ids.size(), false);
  for (int e : p.embed_positions()) embedded[e] = true;
  auto check = [&](const std::vector<std::int32_t>& ids, const char* what, bool skip) {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if ((!skip || !embedded[i]) && (ids[i] < 0 || ids[i] >= c.vocab_size))
        throw std::invalid_argument(
            where + what + " id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
            " is outside the vocabulary" + (model.empty() ? "" : " of " + model) + " [0, " +
            std::to_string(c.vocab_size) + ")");
  };
  check(p.info.token_ids, "token", true);
  check(p.reference_ids, "reference token", false);
}

namespace {

// The prompt's positions against the model: M-RoPE ids exactly when the model uses them, and
// prompt + decode steps within max_position_embeddings (unless allowed beyond) and the sliding
// window (which the live path does not implement).
void check_positions(const PromptSample& prompt, const ModelConfig& c, int gen_len,
                     bool beyond_max_positions) {
  const int P = prompt.info.prompt_len, T = P + gen_len;
  const std::string where = "sample '" + prompt.info.name + "': ";
  if (c.mrope() && prompt.position_ids.empty())
    throw std::invalid_argument(where +
                                "the model uses M-RoPE (rope_scaling.mrope_section) and the "
                                "prompt has no position_ids [P, 3] (kvsim.capture.hf writes them)");
  if (!c.mrope() && !prompt.position_ids.empty())
    throw std::invalid_argument(where +
                                "the prompt has M-RoPE position_ids, but the model uses plain "
                                "RoPE (no rope_scaling.mrope_section)");
  if (prompt.position_ids.size() != (c.mrope() ? 3u * P : 0u))
    throw std::invalid_argument(where + "position_ids hold " +
                                std::to_string(prompt.position_ids.size()) + " ids, expected [" +
                                std::to_string(P) + ", 3]");
  if (c.max_position_embeddings > 0 && T > c.max_position_embeddings && !beyond_max_positions)
    throw std::invalid_argument(where + std::to_string(P) + " prompt tokens + " +
                                std::to_string(gen_len) + " decode steps = " + std::to_string(T) +
                                " positions exceed the model's max_position_embeddings of " +
                                std::to_string(c.max_position_embeddings) +
                                " (--allow-beyond-max-positions runs it anyway)");
  if (c.sliding_window > 0 && T > c.sliding_window)
    throw std::invalid_argument(
        where + std::to_string(T) + " tokens exceed the model's sliding_window of " +
        std::to_string(c.sliding_window) + ", which the live path does not implement");
}

// The trace header a capture of this model writes.
TraceInfo trace_info_of(const Model& model) {
  const ModelConfig& c = model.config();
  TraceInfo t;
  t.model = c.model_type;
  t.num_layers = c.num_hidden_layers;
  t.num_heads = c.num_attention_heads;
  t.num_kv_heads = c.num_key_value_heads;
  t.head_dim = c.head_dim;
  t.scale = model.scale();
  t.scale_given = true;
  t.rope_theta = c.rope_theta;
  return t;
}

// The prompt's sample extended by gen_len generated positions (their token ids unknown: they
// differ from run to run).
SampleInfo with_generated(SampleInfo s, int gen_len) {
  const int T = s.prompt_len + gen_len;
  s.gen_len = gen_len;
  s.modality.resize(T, 0);
  s.segment.resize(T, static_cast<std::uint8_t>(Segment::kGenerated));
  if (!s.media_id.empty()) s.media_id.resize(T, -1);
  s.token_ids.resize(T, -1);
  s.has_v = true;
  s.dtype = DType::kFloat32;
  return s;
}

// A prefill's [P, heads, d] rows in a [T, heads, d] tensor, the decode rows zero.
xt::xtensor<float, 3> padded_rows(const xt::xtensor<float, 3>& x, int T) {
  auto out =
      xt::xtensor<float, 3>::from_shape({static_cast<std::size_t>(T), x.shape(1), x.shape(2)});
  out.fill(0.0f);
  std::copy(x.begin(), x.end(), out.begin());
  return out;
}

}  // namespace

PreparedPrompt LiveEngine::prepare(const PromptSample& prompt, int gen_len,
                                   const AttentionNeeds& needs, bool question_after,
                                   int prompt_tail) {
  const ModelConfig& c = model_.config();
  const int P = prompt.info.prompt_len, T = P + gen_len;
  check_prompt_fits_model(prompt, c, "sample '" + prompt.info.name + "': ");
  check_positions(prompt, c, gen_len, beyond_max_positions_);
  PreparedPrompt pp;
  pp.prompt = prompt;
  pp.trace = trace_info_of(model_);
  const SampleInfo& s = pp.sample = with_generated(prompt.info, gen_len);

  PrefillResult pre = model_.prefill(prompt.info.token_ids, prompt.embed_positions(),
                                     prompt.inputs_embeds, prompt.position_ids);
  // Decode step t feeds position P + t, or, under M-RoPE, the prompt's largest id + 1 + t on all
  // three axes (transformers' rope_deltas).
  if (c.mrope())
    pp.decode_position_offset =
        *std::max_element(prompt.position_ids.begin(), prompt.position_ids.end()) + 1 - P;
  pp.first_logits = std::move(pre.logits);
  for (auto& t : pre.layers) {
    LayerTensors full;
    full.layer = t.layer;
    full.q = padded_rows(t.q, T), full.k = padded_rows(t.k, T), full.v = padded_rows(t.v, T);
    t = LayerTensors{};
    pp.layers.push_back(std::make_unique<LayerAttention>(LayerAttention::PromptOnly{}, pp.trace, s,
                                                         std::move(full), needs, threads_));
  }
  pp.prompt_tail = prompt_tail;
  const int fed = prompt_tail != 0 ? prompt_tail_length(s, prompt_tail)
                  : question_after ? question_length(s)
                                   : 0;
  // Under a prompt tail every policy compresses the prompt less it: the sample's statistics are
  // those of that part, as replay computes them.
  if (needs.sample_entropies || !needs.sample_window_sums.empty()) {
    const SampleInfo compressed = context_only(s, prompt_tail != 0 ? fed : 0);
    for (const auto& layer : pp.layers)
      add_layer_stats(pp.stats, pp.trace, compressed, layer->tensors(), needs, threads_, false);
  }
  if (fed > 0) prepare_fed(pp, fed, needs);
  return pp;
}

void LiveEngine::prepare_fed(PreparedPrompt& pp, int fed, const AttentionNeeds& needs) const {
  const SampleInfo& s = pp.sample;
  const int P = s.prompt_len;
  const std::string what =
      pp.prompt_tail != 0 ? "prompt tail" : "question (appended after compression)";
  for (int i = P - fed; i < P; ++i)
    if (s.modality[i] != static_cast<std::uint8_t>(Modality::kText))
      throw std::invalid_argument("sample '" + s.name + "': its " + what + ", the last " +
                                  std::to_string(fed) + " prompt positions, holds a vision " +
                                  "token at " + std::to_string(i) +
                                  ": tokens fed after compression are text tokens");
  // The first P - Q rows of the one prefill are what a prefill of the context alone computes
  // (causal attention): the context's statistics come from them.
  pp.question = fed;
  pp.context = context_only(s, pp.question);
  for (const auto& layer : pp.layers)
    pp.context_layers.push_back(std::make_unique<LayerAttention>(
        LayerAttention::PromptOnly{}, pp.trace, pp.context, layer->tensors(), needs, threads_));
}

namespace {

// What the backend holds for one (layer, KV head): the positions of its rows, in cache order,
// and how many of the cache's merge records have been applied to them.
struct HeldRows {
  std::vector<std::int32_t> positions;
  std::size_t merges_applied = 0;
};

// Applies a policy's edits of one layer's KvCache to the backend: compacts away the rows whose
// positions left the cache, and rewrites the rows that absorbed a merge since the last call.
void sync_layer(Backend& b, int layer, const KvCache& cache, std::vector<HeldRows>& held) {
  for (int g = 0; g < cache.kv_heads(); ++g) {
    const auto& now = cache.positions(g);
    HeldRows& h = held[g];
    if (now != h.positions) {
      std::vector<int> keep;
      std::size_t j = 0;
      for (std::size_t i = 0; i < h.positions.size() && j < now.size(); ++i)
        if (h.positions[i] == now[j]) keep.push_back(static_cast<int>(i)), ++j;
      if (j != now.size())
        throw std::logic_error("layer " + std::to_string(layer) + ", KV head " + std::to_string(g) +
                               ": the policy's cache holds a position the " +
                               "backend never stored");
      b.cache_keep(layer, g, keep);
      h.positions = now;
    }
    const auto& merges = cache.merges(g);
    std::vector<std::int32_t> absorbed;
    for (; h.merges_applied < merges.size(); ++h.merges_applied)
      absorbed.push_back(merges[h.merges_applied].into_position);
    std::sort(absorbed.begin(), absorbed.end());
    absorbed.erase(std::unique(absorbed.begin(), absorbed.end()), absorbed.end());
    for (std::int32_t pos : absorbed) {
      const auto it = std::lower_bound(now.begin(), now.end(), pos);
      if (it == now.end() || *it != pos) continue;  // since merged away itself
      const int e = static_cast<int>(it - now.begin());
      b.cache_write(layer, g, e, cache.merged_key(g, e), cache.merged_value(g, e));
    }
  }
}

}  // namespace

namespace {

// The policy side of a run: one instance, one KvCache and one list of backend rows per layer.
// `sample` and `layers` are the prompt's, or the context's when the question is appended after
// compression (its positions are then the first decode steps).
class PolicyLoop {
 public:
  PolicyLoop(Backend& b, const TraceInfo& trace, const SampleInfo& sample,
             std::vector<std::unique_ptr<LayerAttention>>& layers, const SampleStats& stats,
             const PolicyConfig& config, bool check)
      : b_(b), trace_(trace), sample_(sample), layers_(layers), config_(config), check_(check) {
    if (!stats.layers.empty() || !stats.window_sums.empty()) stats_ = &stats;
  }

  // Each layer's instance first sees the prefill of layers 0..l-1 on scratch caches, so it holds
  // exactly the cross-layer information replay's single instance has when it reaches layer l.
  void prefill(std::vector<KvCache>& caches) {
    const int L = static_cast<int>(layers_.size()), P = sample_.prompt_len;
    const int Hkv = trace_.num_kv_heads, d = trace_.head_dim;
    std::vector<std::int32_t> prompt(P);
    for (int i = 0; i < P; ++i) prompt[i] = i;
    rows_.assign(L, std::vector<HeldRows>(Hkv, HeldRows{prompt, 0}));
    for (int l = 0; l < L; ++l) {
      policies_.push_back(config_.info->create(config_.params, known_before_decoding(sample_)));
      for (int lower = 0; lower < l; ++lower) {
        KvCache scratch(Hkv, d);
        scratch.fill_prompt(P);
        scratch.set_step(-1);
        policies_[l]->on_prefill(view(lower), scratch);
      }
      caches.emplace_back(Hkv, d);
      caches[l].fill_prompt(P);
      caches[l].set_step(-1);
      policies_[l]->on_prefill(view(l), caches[l]);
      if (check_) check_capacity(*policies_[l], caches[l], l, "the prefill", config_.label);
      sync_layer(b_, l, caches[l], rows_[l]);
    }
  }

  // Decode step t of layer l, whose token the backend has just appended: attends, lets the
  // policy update, applies its edits. Returns the rows held while attending.
  std::int64_t decode(int l, int t, const float* q, float scale, float* out, KvCache& cache) {
    const int position = sample_.prompt_len + t;
    cache.set_step(t);
    masks_.resize(cache.kv_heads());
    std::int64_t held = 0;
    for (int g = 0; g < cache.kv_heads(); ++g) {
      cache.append(g, position);
      rows_[l][g].positions.push_back(position);
      masks_[g].clear();
      if (cache.attended_size(g) < cache.size(g))
        for (int e = 0; e < cache.size(g); ++e) masks_[g].push_back(cache.attended(g, e));
      held += cache.size(g);
    }
    StepAttention sa;
    sa.group = trace_.group_size();
    sa.step = t;
    sa.position = position;
    b_.decode_attention(l, q, trace_.num_heads, scale, masks_, out, sa.probs);
    policies_[l]->on_decode(view(l, position + 1), sa, cache);
    if (check_) check_capacity(*policies_[l], cache, l, "a decode step", config_.label);
    sync_layer(b_, l, cache, rows_[l]);
    return held;
  }

  // What the layers' instances noted (Policy::notes), each distinct note once in the order first
  // noted: an instance also sees the lower layers' prefills, so a note may come from several.
  std::vector<std::string> notes() const {
    std::vector<std::string> out;
    for (const auto& policy : policies_)
      for (const std::string& n : policy->notes())
        if (std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
    return out;
  }

 private:
  // The layer's view, `visible` positions existing (the prompt by default).
  LayerView view(int l, int visible = -1) const {
    LayerView v(*layers_[l], false, stats_);
    if (visible >= 0) v.set_horizon(visible);
    return v;
  }
  Backend& b_;
  const TraceInfo& trace_;
  const SampleInfo& sample_;
  std::vector<std::unique_ptr<LayerAttention>>& layers_;
  const PolicyConfig config_;  // a copy: sized per sample (sized_for_split)
  bool check_;
  const SampleStats* stats_ = nullptr;
  std::vector<std::unique_ptr<Policy>> policies_;
  std::vector<std::vector<HeldRows>> rows_;  // [layer][g]
  std::vector<std::vector<std::uint8_t>> masks_;
};

}  // namespace

namespace {

// The run's split of the prompt: question = append or a prompt tail loads and compresses the
// context's rows and feeds the question's (or tail's) tokens as the first steps (kvpress's
// order), the answer's steps following at the same positions. Checks the options against the
// prepared prompt.
PromptSplit checked_split(const PreparedPrompt& pp, const RunOptions& o) {
  if (o.steps > pp.sample.gen_len)
    throw std::invalid_argument("run of " + std::to_string(o.steps) +
                                " steps on a prompt prepared for " +
                                std::to_string(pp.sample.gen_len));
  if (o.forced && static_cast<int>(o.forced->size()) < o.steps)
    throw std::invalid_argument("teacher forcing needs " + std::to_string(o.steps) +
                                " tokens, got " + std::to_string(o.forced->size()));
  const PromptSplit split =
      o.policy ? prompt_split(*o.policy, pp.sample, pp.prompt_tail) : PromptSplit{};
  if (split.fed > 0 && (pp.context_layers.empty() || pp.question != split.fed))
    throw std::logic_error("policy '" + o.policy->label + "' compresses the prompt less its last " +
                           std::to_string(split.fed) +
                           " positions: prepare the prompt with question_after or its tail");
  return split;
}

// The backend's cache holds the first `context` prompt rows of every layer, with room for
// `capacity` rows.
void load_prompt_rows(Backend& b, const ModelConfig& c,
                      const std::vector<std::unique_ptr<LayerAttention>>& layers, int context,
                      int capacity) {
  const int Hkv = c.num_key_value_heads, d = c.head_dim;
  b.cache_reset(c.num_hidden_layers, Hkv, d, capacity);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerTensors& t = layers[l]->tensors();
    for (int g = 0; g < Hkv; ++g)
      b.cache_assign(l, g, &t.k(0, g, 0), &t.v(0, g, 0), context,
                     static_cast<std::size_t>(Hkv) * d);
  }
}

// One forward pass of a run at a time: attends through the policy loop, or the full cache
// without one, and records the token's q/k/v rows where they are read again (`history`).
class DecodePass {
 public:
  DecodePass(Model& model, std::vector<std::unique_ptr<LayerAttention>>& layers, PolicyLoop* loop,
             bool history)
      : model_(model), layers_(layers), loop_(loop), history_(history) {
    const ModelConfig& c = model.config();
    hq_.resize(static_cast<std::size_t>(c.num_attention_heads) * c.head_dim);
    hk_.resize(static_cast<std::size_t>(c.num_key_value_heads) * c.head_dim);
    hv_.resize(hk_.size());
  }
  // Feeds rec.input at rec.position (step u of the run; the model sees position + `offset`):
  // the logits; rec.kv_entries counts the entries attended, summed over layers and KV heads.
  std::vector<float> feed(StepRecord& rec, int u, int offset, std::vector<KvCache>& caches) {
    Backend& b = model_.backend();
    const int H = model_.config().num_attention_heads, Hkv = model_.config().num_key_value_heads,
              d = model_.config().head_dim;
    auto attend = [&](int l, const float* q, const float* k, const float* v, float* out) {
      for (int g = 0; g < Hkv; ++g)
        b.cache_append(l, g, k + static_cast<std::size_t>(g) * d,
                       v + static_cast<std::size_t>(g) * d);
      if (history_) {  // the recorded rows merging policies read, and what capture writes
        b.download(hq_.data(), q, hq_.size());
        b.download(hk_.data(), k, hk_.size());
        b.download(hv_.data(), v, hv_.size());
        layers_[l]->set_token_row(rec.position, hq_.data(), hk_.data(), hv_.data());
      }
      if (loop_) {
        rec.kv_entries += loop_->decode(l, u, q, model_.scale(), out, caches[l]);
        return;
      }
      b.decode_attention(l, q, H, model_.scale(), {}, out, probs_);
      for (int g = 0; g < Hkv; ++g) rec.kv_entries += b.cache_rows(l, g);
    };
    return model_.decode(rec.input, rec.position + offset, attend);
  }

 private:
  Model& model_;
  std::vector<std::unique_ptr<LayerAttention>>& layers_;
  PolicyLoop* loop_;
  bool history_;
  std::vector<float> hq_, hk_, hv_;
  std::vector<std::vector<float>> probs_;
};

}  // namespace

RunResult LiveEngine::run(PreparedPrompt& pp, const RunOptions& o) {
  Backend& b = model_.backend();
  const ModelConfig& c = model_.config();
  const int L = c.num_hidden_layers, Hkv = c.num_key_value_heads, d = c.head_dim,
            P = pp.sample.prompt_len;
  const PromptSplit split = checked_split(pp, o);
  const bool append = split.fed > 0;
  const int Q = split.fed, context = P - Q;
  std::vector<std::unique_ptr<LayerAttention>>& layers = append ? pp.context_layers : pp.layers;
  load_prompt_rows(b, c, layers, context, P + o.steps);
  RunResult r;
  r.bytes_per_entry = 2ll * d * static_cast<std::int64_t>(sizeof(float));
  r.prompt_kv_entries = static_cast<std::int64_t>(L) * Hkv * context;
  r.question_steps = Q;
  std::unique_ptr<PolicyLoop> loop;
  if (o.policy) {
    loop = std::make_unique<PolicyLoop>(b, pp.trace, append ? pp.context : pp.sample, layers,
                                        pp.stats, sized_for_split(*o.policy, pp.sample, split),
                                        o.check_invariants);
    loop->prefill(r.caches);
  }
  DecodePass pass(model_, layers, loop.get(), o.record || (o.policy && o.policy->merges()));
  if (!append) {
    r.first_logits = pp.first_logits;
    r.predicted.push_back(argmax(pp.first_logits));
  }
  // Step u feeds position context + u: the question's tokens (u < Q), then the answer's.
  for (int u = 0; u < Q + o.steps; ++u) {
    const int t = u - Q;  // the answer's step
    StepRecord rec;
    rec.input = t < 0      ? pp.prompt.info.token_ids[context + u]
                : o.forced ? (*o.forced)[t]
                           : r.predicted[t];
    rec.position = context + u;
    const auto start = std::chrono::steady_clock::now();
    std::vector<float> logits = pass.feed(rec, u, pp.decode_position_offset, r.caches);
    b.synchronize();
    rec.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.peak_kv_entries = std::max(r.peak_kv_entries, rec.kv_entries);
    if (t < 0) {
      if (u == Q - 1) {  // the question's last token: the answer's first distribution
        r.predicted.push_back(argmax(logits));
        r.first_logits = std::move(logits);
      }
      continue;
    }
    r.steps.push_back(rec);
    r.predicted.push_back(argmax(logits));
    if (o.keep_logits) r.logits.push_back(std::move(logits));
  }
  if (loop) r.policy_notes = loop->notes();
  return r;
}

}  // namespace kvsim::live
