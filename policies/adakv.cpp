// adakv: Ada-KV head-adaptive budget allocation (Feng et al. 2024, Sec. 3-4, Algorithm 1) around
// any prompt scorer (default SnapKV's): within a layer the KV heads share Hkv · B entries. Each
// head keeps its observation window and at least floor(α · (B - w)) of its own best entries; the
// remaining Hkv · (B - w) - Hkv · floor(α · (B - w)) go to the highest scores across all heads
// jointly. GQA-aware: a KV head's score is the mean over its query heads (SnapKV) or their sum
// (h2o scorer). `safeguard = kvpress` is kvpress's AdaKVPress (kvpress/presses/adakv_press.py):
// each head keeps its int(α · B) best entries, the window (which SnapKVPress scores with the
// maximum) among them, so its own prefix floor is max(0, int(α · B) - w); the rest is the same
// joint top-k. Decoding appends without eviction (`decode` changes that:
// policies/decode_mode.cpp). Ties keep the newer position, then the lower head.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <tuple>

#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class AdaKV final : public Policy {
 public:
  AdaKV(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "adakv")),
        alpha_(p.get_float("alpha")),
        h2o_scores_(p.get_string("scorer") == "h2o"),
        kvpress_safeguard_(p.get_string("safeguard") == "kvpress"),
        scoring_(read_snapkv_scoring(p, "adakv", budget_, s.prompt_len)) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len(), w = scoring_.window, prefix = P - w, heads = cache.kv_heads();
    scores_.clear();
    if (P <= budget_) return;
    const int per_head = budget_ - w;
    const int floor_n = kvpress_safeguard_ ? std::max(0, static_cast<int>(alpha_ * budget_) - w)
                                           : static_cast<int>(std::floor(alpha_ * per_head));
    std::vector<std::vector<double>>& score = scores_;
    score.assign(heads, {});
    std::vector<std::vector<std::uint8_t>> keep(heads);
    using Candidate = std::tuple<double, int, int>;  // score, position, head
    std::vector<Candidate> pool;
    for (int g = 0; g < heads; ++g) {
      score[g] = h2o_scores_ ? prompt_column_scores(view, g) : snapkv_scores(view, g, scoring_);
      score[g].resize(prefix);
      keep[g] = keep_top_scores(score[g], floor_n);  // the per-head floor
      keep[g].resize(P, 1);                          // the window
      for (int j = 0; j < prefix; ++j)
        if (!keep[g][j]) pool.emplace_back(score[g][j], j, g);
    }
    const std::size_t extra = static_cast<std::size_t>(heads) * (per_head - floor_n);
    auto better = [](const Candidate& a, const Candidate& b) {
      if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
      if (std::get<1>(a) != std::get<1>(b)) return std::get<1>(a) > std::get<1>(b);
      return std::get<2>(a) < std::get<2>(b);
    };
    if (extra < pool.size())
      std::nth_element(pool.begin(), pool.begin() + extra, pool.end(), better);
    for (std::size_t i = 0; i < std::min(extra, pool.size()); ++i)
      keep[std::get<2>(pool[i])][std::get<1>(pool[i])] = 1;
    for (int g = 0; g < heads; ++g) {
      cache.keep_only(g, keep[g]);
      score[g].resize(P, kUnscored);  // the window has no score
    }
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(scores_.size()) ? &scores_[g] : nullptr;
  }

 private:
  int budget_;
  double alpha_;
  bool h2o_scores_, kvpress_safeguard_;
  SnapKVScoring scoring_;
  std::vector<std::vector<double>> scores_;  // [kv head][prompt position] of the last prefill
};

const PolicyRegistration reg({
    .name = "adakv",
    .summary = "Head-adaptive selection: the layer's KV heads share Hkv x B entries, with a floor "
               "of alpha per head, around a prompt scorer.",
    .provenance = "Feng et al. 2024, Ada-KV, Sec. 3-4 / Algorithm 1 (alpha = 0.2)",
    .params = concat(
        {
            budget_param(),
            decode_mode_param(),
            {"alpha", ParamType::kFloat, "0.2", "per-head floor, share of B - window", 0, 1},
            {"safeguard",
             ParamType::kChoice,
             "prefix",
             "prefix (each head's floor(alpha (B - w)) best prefix entries, kvsim's reading of "
             "Alg. 1) or kvpress (its int(alpha B) best, window included, as AdaKVPress)",
             0,
             0,
             {"prefix", "kvpress"}},
            {"scorer",
             ParamType::kChoice,
             "snapkv",
             "snapkv (window votes, pooled) or h2o (prompt column sums)",
             0,
             0,
             {"snapkv", "h2o"}},
        },
        snapkv_scoring_params()),
    .needs = {},
    .lookahead = false,
    .merges = false,
    .needs_for =
        [](const ParamSet& p) {
          AttentionNeeds n = snapkv_needs(p);
          n.prefill_column_sums = p.get_string("scorer") == "h2o";
          return n;
        },
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<AdaKV>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
