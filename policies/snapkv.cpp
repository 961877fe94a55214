// snapkv: SnapKV (Li et al., NeurIPS 2024, Sec. 4.2, Listing 1).
//
// At the end of the prefill, for j < P - window:
//   score(j) = mean over the query heads of the KV head of
//              Σ over the last `window` prompt queries i of p_ij (causal, full cache),
// then pooled along positions (size `kernel`, stride 1, same padding; max or average). Keep the
// window plus the top B - window prefix entries, ties to the newer position. Decoding appends
// without eviction, as in the paper (the cache grows by one entry per step); `decode = cap |
// every:N` holds the prefill's size instead (policies/decode_mode.cpp), by these scores for cap.
// Reading chosen: summing over the window (the original repository) rather than averaging
// (kvpress) ranks identically, so it is not a parameter; average pooling counts padding as zeros
// (F.avg_pool1d's default in the reference code).
#include <stdexcept>

#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class SnapKV final : public Policy {
 public:
  SnapKV(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "snapkv")),
        scoring_(read_snapkv_scoring(p, "snapkv", budget_, s.prompt_len)),
        merge_(read_prompt_merge(p)) {
    if (!scoring_.clamped.empty()) note(scoring_.clamped);
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    scores_.clear();
    if (P <= budget_) return;
    const int prefix = P - scoring_.window;
    scores_.resize(cache.kv_heads());
    for (int g = 0; g < cache.kv_heads(); ++g) {
      std::vector<double>& score = scores_[g];
      score = snapkv_scores(view, g, scoring_);
      score.resize(P, kUnscored);  // window entries are forced: they have no score
      std::vector<std::uint8_t> forced(P, 0);
      for (int j = prefix; j < P; ++j) forced[j] = 1;
      keep_or_merge(view, cache, g, keep_top_scores(score, budget_, forced), merge_);
    }
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}

  int capacity(int, int) const override { return -1; }  // grows during decoding by design
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(scores_.size()) ? &scores_[g] : nullptr;
  }

 private:
  int budget_;
  SnapKVScoring scoring_;
  std::optional<MergeKind> merge_;
  std::vector<std::vector<double>> scores_;  // [kv head][prompt position] of the last prefill
};

const PolicyRegistration reg({
    .name = "snapkv",
    .summary = "Observation-window voting at the end of the prefill, pooled; no decode eviction.",
    .provenance = "Li et al. 2024, SnapKV, Sec. 4.2 / Listing 1",
    .params = concat({budget_param(), budget_rounding_param(false), prompt_merge_param()},
                     snapkv_scoring_params()),
    .switches = {.decode = true, .caches = true, .question = true},
    .needs = {},
    .lookahead = false,
    .merges = false,
    .merges_for = merges_by_param,
    .needs_for = snapkv_needs,
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<SnapKV>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
