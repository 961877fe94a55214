// decode = grow | cap | every:N: what a policy that compresses only the prompt does while decoding.
//
// Prefill-only policies (SnapKV, PyramidKV, Ada-KV, MadaKV, LOOK-M, MEDA, knorm) append every
// generated token, so at an equal nominal budget they hold more memory than policies that evict
// while decoding (H2O, TOVA, StreamingLLM, the oracle). The mode wraps such a policy:
//   grow     the paper's behaviour: nothing happens while decoding (no wrapper).
//   cap      after each decode step a KV head holds no more than its target, the size the policy
//            itself left it at (after its prefill, or lower if the policy later compressed it):
//            the excess goes by the policy's own eviction scores, lowest first, among the entries
//            scored (the prompt entries it ranked: LOOK-M and MEDA in their text-prior order,
//            MadaKV by ψ; windows, sinks and generated tokens are unscored), ties to the older;
//            then, or for a policy without scores, the oldest.
//   every:N  kvpress's DecodingPress (kvpress/presses/generation/decoding_press.py): the cache
//            grows for N decode steps, then every KV head is re-compressed to its target, keeping
//            the entries the N queries since the last compression attended most (renormalised
//            attention summed over the steps and the KV head's query heads), ties to the newer.
// Decode-time evictions never merge; the policy's own hooks still run first at every step.
#include <cmath>
#include <map>
#include <stdexcept>

#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

struct DecodeMode {
  enum Kind { kGrow, kCap, kEvery } kind = kGrow;
  int every = 0;  // kEvery: steps between compressions
};

// Throws std::invalid_argument with the rule when `text` is not grow, cap or every:N (N >= 1).
DecodeMode parse_decode_mode(const std::string& text) {
  if (text == "grow") return {};
  if (text == "cap") return {DecodeMode::kCap, 0};
  const std::string prefix = "every:";
  if (text.rfind(prefix, 0) == 0) {
    const std::string n = text.substr(prefix.size());
    char* end = nullptr;
    const long v = std::strtol(n.c_str(), &end, 10);
    if (!n.empty() && *end == '\0' && v >= 1 && v <= 1000000)
      return {DecodeMode::kEvery, static_cast<int>(v)};
  }
  throw std::invalid_argument("is not grow, cap or every:N with N a whole number >= 1");
}

class DecodeModeWrapper final : public Policy {
 public:
  DecodeModeWrapper(std::unique_ptr<Policy> inner, DecodeMode mode)
      : inner_(std::move(inner)), mode_(mode) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    inner_->on_prefill(view, cache);
    auto& target = targets_[view.layer()];
    target.resize(cache.kv_heads());
    for (int g = 0; g < cache.kv_heads(); ++g) target[g] = cache.size(g);
    votes_.assign(cache.kv_heads(), {});
    since_ = 0;
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    if (mode_.kind == DecodeMode::kEvery) add_votes(att, cache);  // before any edit
    inner_->on_decode(view, att, cache);
    auto& target = targets_[view.layer()];
    for (int g = 0; g < cache.kv_heads(); ++g) target[g] = std::min(target[g], cache.size(g));
    if (mode_.kind == DecodeMode::kCap) {
      for (int g = 0; g < cache.kv_heads(); ++g)
        if (cache.size(g) > target[g])
          cache.keep_only(g, cap_keep(view.layer(), g, cache, target[g]));
      return;
    }
    if (++since_ < mode_.every) return;
    for (int g = 0; g < cache.kv_heads(); ++g) {
      if (cache.size(g) > target[g]) {
        std::vector<double> s(cache.size(g));
        for (int e = 0; e < cache.size(g); ++e) s[e] = vote(g, cache.position(g, e));
        cache.keep_only(g, keep_top_scores(s, target[g]));
      }
      votes_[g].clear();
    }
    since_ = 0;
  }

  int capacity(int layer, int g) const override {
    const auto it = targets_.find(layer);
    if (it == targets_.end()) return inner_->capacity(layer, g);
    const int own = it->second[g] + (mode_.kind == DecodeMode::kEvery ? mode_.every - 1 : 0);
    const int inner = inner_->capacity(layer, g);
    return inner < 0 ? own : std::min(inner, own);
  }
  const std::vector<double>* eviction_scores(int layer, int g) const override {
    return inner_->eviction_scores(layer, g);
  }
  const std::vector<std::string>& notes() const override { return inner_->notes(); }

 private:
  // cap: the policy's scored entries by score (ties to the older), then the unscored by age.
  std::vector<std::uint8_t> cap_keep(int layer, int g, const KvCache& cache, int target) const {
    const std::vector<double>* scores = inner_->eviction_scores(layer, g);
    std::vector<double> s(cache.size(g), kUnscored);
    if (scores)
      for (int e = 0; e < cache.size(g); ++e) {
        const std::size_t pos = static_cast<std::size_t>(cache.position(g, e));
        if (pos < scores->size() && std::isfinite((*scores)[pos])) s[e] = (*scores)[pos];
      }
    return keep_top_scores(s, target);
  }

  void add_votes(const StepAttention& att, const KvCache& cache) {
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const int n = cache.size(g);
      auto& v = votes_[g];
      if (v.size() < static_cast<std::size_t>(att.position) + 1) v.resize(att.position + 1, 0.0);
      for (int r = 0; r < att.group; ++r) {
        const float* p = att.head(g, r, n);
        for (int e = 0; e < n; ++e) v[cache.position(g, e)] += p[e];
      }
    }
  }
  double vote(int g, int position) const {
    const auto& v = votes_[g];
    return static_cast<std::size_t>(position) < v.size() ? v[position] : 0.0;
  }

  std::unique_ptr<Policy> inner_;
  DecodeMode mode_;
  std::map<int, std::vector<int>> targets_;  // [layer][kv head]
  std::vector<std::vector<double>> votes_;   // [kv head][position], every:N
  int since_ = 0;                            // decode steps since the last compression
};

}  // namespace

ParamSpec decode_mode_param() {
  ParamSpec spec{"decode", ParamType::kString, "grow",
                 "while decoding: grow (the paper: append every token), cap (hold what the "
                 "prefill left, evicting by the policy's own scores, else the oldest) or every:N "
                 "(re-compress to that size every N steps by the attention of the last N "
                 "queries, as kvpress's DecodingPress)"};
  spec.check = [](const std::string& value) -> std::string {
    try {
      parse_decode_mode(value);
      return "";
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
  };
  return spec;
}

std::unique_ptr<Policy> apply_decode_mode(std::unique_ptr<Policy> policy, const ParamSet& params) {
  const DecodeMode mode = parse_decode_mode(params.get_string("decode"));
  if (mode.kind == DecodeMode::kGrow) return policy;
  return std::make_unique<DecodeModeWrapper>(std::move(policy), mode);
}

}  // namespace kvsim
