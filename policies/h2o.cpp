// h2o: Heavy-Hitter Oracle (Zhang et al., NeurIPS 2023, Sec. 3-4, Algorithm 1).
//
// score(j) = attention probability received by j accumulated over every query so far: all rows of
// the causal prompt attention, then each decode step's attention over the retained set, summed
// over the query heads of the KV head. After the prefill and after each decode step, while more
// than B entries are held: keep the `recent` most recent entries and, of the others, the highest
// scores; ties evict the older position.
// Reading chosen: `recent` is a percentage of B rounded down (H2O's recent_ratio * budget).
// `mode = oneshot` is KVCache-Factory's H2O: prompt column sums decide once at the end of the
// prefill and decoding appends without eviction. `normalize = queries` divides a prompt entry's
// column sum by the number of prompt queries that could see it (P - j), as kvpress's
// ObservedAttentionPress does (kvpress/presses/observed_attention_press.py); decode-step
// attention, in cumulative mode, is added unnormalised.
#include <algorithm>
#include <cmath>

#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

// budget_rounding = parts: `recent` as the share of the budget (the reference code sizes both
// parts as ratios of the prompt, so a count has no share).
double recent_share(const ParamSet& p) {
  const Size r = p.get_size("recent");
  if (r.percent) return r.value / 100.0;
  throw std::invalid_argument(
      "h2o: budget_rounding = parts needs 'recent' as a percentage of the "
      "budget (the reference code sizes both parts as ratios of the "
      "prompt), not '" +
      p.get_string("recent") + "'");
}

class H2O final : public Policy {
 public:
  H2O(const ParamSet& p, const SampleInfo& s)
      : split_(resolve_budget_split(p, s.prompt_len, "h2o", recent_share)),
        budget_(split_.total),
        oneshot_(p.get_string("mode") == "oneshot"),
        per_query_(p.get_string("normalize") == "queries"),
        merge_(read_prompt_merge(p, "h2o", oneshot_ ? nullptr : "mode = oneshot")) {
    check_question_once(p, "h2o", !oneshot_);
    const Size r = p.get_size("recent");
    recent_ = r.percent ? static_cast<int>(std::floor(r.value / 100.0 * budget_ + 1e-9))
                        : static_cast<int>(r.value);
    if (split_.recent >= 0) recent_ = split_.recent;  // budget_rounding = parts
    recent_ = std::min(recent_, budget_);
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    scores_.assign(cache.kv_heads(), std::vector<double>(view.prompt_len(), 0.0));
    const int P = view.prompt_len(), group = view.group_size();
    for (int g = 0; g < cache.kv_heads(); ++g)
      for (int r = 0; r < group; ++r) {
        const float* col = view.prefill_column_sums(g * group + r);
        for (int j = 0; j < P; ++j) scores_[g][j] += col[j];
      }
    if (per_query_)
      for (auto& s : scores_)
        for (int j = 0; j < P; ++j) s[j] /= P - j;
    trim(cache, &view);
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache& cache) override {
    if (oneshot_) return;
    for (int g = 0; g < cache.kv_heads(); ++g) {
      scores_[g].resize(view.visible_len(), 0.0);  // the positions that exist so far
      const int n = cache.size(g);
      for (int r = 0; r < att.group; ++r) {
        const float* p = att.head(g, r, n);
        for (int e = 0; e < n; ++e) scores_[g][cache.position(g, e)] += p[e];
      }
    }
    trim(cache);
  }

  int capacity(int, int) const override { return oneshot_ ? -1 : budget_; }
  const std::vector<double>* eviction_scores(int, int g) const override { return &scores_[g]; }

 private:
  // Evicts down to the budget; at the prefill (`prefill` set) the unkept entries may merge.
  void trim(KvCache& cache, const LayerView* prefill = nullptr) const {
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const int n = cache.size(g);
      if (n <= budget_) continue;
      if (n == budget_ + 1 && n - recent_ > 0) {  // one new token: evict the single lowest
        const int one[1] = {lowest_score_entry(cache.positions(g), scores_[g].data(), n - recent_)};
        cache.evict(g, one);
        continue;
      }
      std::vector<double> s(n);
      for (int e = 0; e < n; ++e) s[e] = scores_[g][cache.position(g, e)];
      const auto keep = keep_top_scores(s, budget_, sink_and_recent_mask(n, 0, recent_));
      if (prefill)
        keep_or_merge(*prefill, cache, g, keep, merge_);
      else
        cache.keep_only(g, keep);
    }
  }
  BudgetSplit split_;  // declared before budget_, which it initialises
  int budget_;
  bool oneshot_;
  bool per_query_;
  int recent_ = 0;
  std::optional<MergeKind> merge_;
  std::vector<std::vector<double>> scores_;  // [kv head][position]
};

const PolicyRegistration reg({
    .name = "h2o",
    .summary = "Heavy hitters: cumulative attention received (prefill + every decode step) plus "
               "a recent window.",
    .provenance = "Zhang et al. 2023, H2O, Sec. 4 / Algorithm 1",
    .params = {budget_param(),
               budget_rounding_param(true),
               prompt_merge_param(),
               {"recent", ParamType::kSize, "50%",
                "most recent entries always kept: a count, or a percentage of the budget "
                "(rounded down)",
                0, 1e9},
               {"mode",
                ParamType::kChoice,
                "cumulative",
                "cumulative (paper: every step accumulates and evicts) or oneshot (prompt scores "
                "at the prefill only)",
                0,
                0,
                {"cumulative", "oneshot"}},
               {"normalize",
                ParamType::kChoice,
                "none",
                "none (sums) or queries (a prompt entry's sum divided by the P - j queries that "
                "see it, kvpress's ObservedAttentionPress)",
                0,
                0,
                {"none", "queries"}}},
    .switches = {.caches = true, .question = true},
    .needs = {.prefill_column_sums = true, .prefill_window = 0},
    .merges_for = merges_by_param,
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<H2O>(p, s);
    },
    // The one-shot reading grows while decoding; at equal memory H2O evicts as its paper does.
    .equal_memory = [](const ParamSet&) -> std::map<std::string, std::string> {
      return {{"mode", "cumulative"}};
    },
    .recent_share = recent_share,
});

}  // namespace
}  // namespace kvsim
