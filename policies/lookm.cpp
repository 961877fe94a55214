// lookm: LOOK-M (Wan et al. 2024, "Look-Once Optimization in KV Cache for Efficient Multimodal
// Long-Context Inference", Sec. 3): at the end of the prefill, text-prior eviction by cumulative
// prompt attention — every text entry outranks every vision entry, each modality ordered by the
// column sums of the prompt attention (summed over the KV head's query heads) — keeping the
// `sinks` first positions, the M = floor(recent_ratio · B) most recent and the best of the rest
// up to B; then the evicted entries are merged into their most key-similar kept entry
// (merging.hpp): none, average, pivotal or weighted. Decoding appends without eviction
// ("look once").
// Readings chosen: recent:important = 3:1 (recent_ratio = 0.75, the ratio MEDA Sec. 4.4 reports
// following LOOK-M); 4 sinks (the released non-text variants protect the first 4 positions with an
// infinite score); every evicted entry is merged (the released average and weighted variants
// merge only the entries whose head-averaged best similarity reaches the mean, the pivot variant
// all of them, and the paper does not filter).
// `text = all` is the released text-prior code (SUSTechBruce/LOOK-M, LLaVA-mix_merge_v1/llava/
// model/kv_token_merge/modify_llama.py, TextPivotMerge_LayerWise): image spans and the recent
// window are pushed below every text score, the top int(P * hh_ratio) of the rest chosen, and
// then every entry whose shifted score is >= 0 kept -- every text entry, so the cache exceeds the
// budget when the prompt holds more text than the heavy-hitter share; no sinks; heavy and recent
// int(P * ratio) each (the `lookm:released` preset: recent_ratio 0.5, sinks 0, merge pivotal).
#include <algorithm>
#include <cmath>

#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

// budget_rounding = parts: recent_ratio is the recent part's share.
double recent_share(const ParamSet& p) {
  return p.get_float("recent_ratio");
}

class LookM final : public Policy {
 public:
  LookM(const ParamSet& p, const SampleInfo& s)
      : split_(resolve_budget_split(p, s.prompt_len, "lookm", recent_share)),
        budget_(split_.total),
        recent_(split_.recent >= 0
                    ? split_.recent  // budget_rounding = parts
                    : static_cast<int>(std::floor(p.get_float("recent_ratio") * budget_ + 1e-9))),
        sinks_(static_cast<int>(p.get_int("sinks"))),
        keep_all_text_(p.get_string("text") == "all"),
        released_arithmetic_(p.get_string("arithmetic") == "released"),
        merge_(p.get_string("merge")) {
    // `forced = fit` (equal memory): the sinks and the recent window never exceed the budget;
    // the sinks give way first, as the window is the method's 3:1 share of it.
    if (p.get_string("forced") == "fit" && sinks_ + recent_ > budget_) {
      const int sinks = std::max(0, budget_ - recent_);
      note("lookm: forced = fit: the " + std::to_string(sinks_) + " sinks and the " +
           std::to_string(recent_) + "-entry recent window exceed the budget of " +
           std::to_string(budget_) + ": " + std::to_string(sinks) + " sinks kept");
      sinks_ = sinks;
    }
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    priority_.assign(cache.kv_heads(), {});
    if (P <= budget_) return;
    std::vector<std::uint8_t> is_text(P);
    for (int j = 0; j < P; ++j) is_text[j] = view.modality()[j] == 0;
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const auto forced = sink_and_recent_mask(P, sinks_, recent_);
      const std::vector<double> score = released_arithmetic_
                                            ? released_scores(view, g, is_text, forced)
                                            : prompt_column_scores(view, g);
      auto keep = released_arithmetic_ ? keep_top_older_first(score, budget_, forced)
                                       : keep_text_prior(score, is_text, budget_, forced);
      if (keep_all_text_)
        for (int j = 0; j < P; ++j) keep[j] |= is_text[j];
      priority_[g] = text_prior_priority(score, is_text, forced);
      if (merge_ == "none")
        cache.keep_only(g, keep);
      else
        merge_unselected(view, cache, g, keep,
                         merge_ == "average"   ? MergeKind::kAverage
                         : merge_ == "pivotal" ? MergeKind::kPivotal
                                               : MergeKind::kWeighted);
    }
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
  // The text-prior order it kept by (`decode = cap` evicts by it).
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(priority_.size()) ? &priority_[g] : nullptr;
  }

 private:
  // The released code's scores in its own arithmetic (TextPivotMerge_LayerWise with a float16
  // model): attention weights cast to the trace's dtype, hh_score = their column sums rounded to
  // it (attn.sum(0).sum(1)), then image spans and the recent window shifted by -65516 in that
  // dtype (-65504 in float16, whose spacing there is 32: every image score below 16 becomes
  // exactly -65504). With GQA the query heads' scores are summed and rounded again.
  static std::vector<double> released_scores(const LayerView& view, int g,
                                             const std::vector<std::uint8_t>& is_text,
                                             const std::vector<std::uint8_t>& forced) {
    const int P = view.prompt_len(), group = view.group_size();
    const DType dtype = view.dtype();
    const float shift = round_to_dtype(-65516.0f, dtype);
    std::vector<double> score(P);
    for (int j = 0; j < P; ++j) {
      float s = 0;
      for (int r = 0; r < group; ++r)
        s += round_to_dtype(view.prefill_column_sums_rounded(g * group + r)[j], dtype);
      s = round_to_dtype(s, dtype);
      // The released mask covers image spans and the recent window; sinks (kvsim's) stay forced.
      if (!is_text[j] || forced[j]) s = round_to_dtype(s + shift, dtype);
      score[j] = s;
    }
    return score;
  }

  // torch.topk over the entries outside the window, ties to the older position (as its CUDA
  // kernel returns them), the forced entries kept besides: `keep` in all.
  static std::vector<std::uint8_t> keep_top_older_first(const std::vector<double>& score, int keep,
                                                        const std::vector<std::uint8_t>& forced) {
    std::vector<std::uint8_t> out(forced.begin(), forced.end());
    std::vector<int> order;
    for (int j = 0; j < static_cast<int>(score.size()); ++j)
      if (!forced[j]) order.push_back(j);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score[a] > score[b]; });
    const int forced_count = static_cast<int>(std::count(forced.begin(), forced.end(), 1));
    const int chosen = std::clamp(keep - forced_count, 0, static_cast<int>(order.size()));
    for (int k = 0; k < chosen; ++k) out[order[k]] = 1;
    return out;
  }

  BudgetSplit split_;  // declared before budget_ and recent_, which it initialises
  int budget_, recent_, sinks_;
  bool keep_all_text_, released_arithmetic_;
  std::string merge_;
  std::vector<std::vector<double>> priority_;  // [kv head][prompt position] of the last prefill
};

const PolicyRegistration reg({
    .name = "lookm",
    .summary = "Text-prior eviction by cumulative prompt attention plus a recent window, merging "
               "evicted entries into their most similar kept key.",
    .provenance = "Wan et al. 2024, LOOK-M, Sec. 3 (text-prior, A/P/W-merge)",
    .params = {budget_param(),
               budget_rounding_param(true),
               {"recent_ratio", ParamType::kFloat, "0.75", "share of B kept as the recent window",
                0, 1},
               {"sinks", ParamType::kInt, "4", "first positions always kept", 0, 1e9},
               {"forced",
                ParamType::kChoice,
                "keep",
                "keep (the sinks and the recent window are kept even when together they exceed "
                "the budget) or fit (fewer sinks, so that they never do: equal memory)",
                0,
                0,
                {"keep", "fit"}},
               {"text",
                ParamType::kChoice,
                "prior",
                "prior (text outranks vision within the budget) or all (every text entry kept "
                "beyond it, as the released code's keep-mask score >= 0)",
                0,
                0,
                {"prior", "all"}},
               {"arithmetic",
                ParamType::kChoice,
                "exact",
                "exact (column sums in double, ties to the newer) or released (the released "
                "code's: weights and sums in the trace's dtype, images and window shifted by "
                "-65516 there, torch.topk's ties to the older: in float16 every image below "
                "score 16 ties)",
                0,
                0,
                {"exact", "released"}},
               {"merge",
                ParamType::kChoice,
                "average",
                "merging of evicted entries",
                0,
                0,
                {"none", "average", "pivotal", "weighted"}}},
    .switches = {.decode = true},
    .needs = {.prefill_column_sums = true, .prefill_window = 0},
    .merges = true,
    .needs_for =
        [](const ParamSet& p) {
          AttentionNeeds n{.prefill_column_sums = true};
          n.prefill_column_sums_rounded = p.get_string("arithmetic") == "released";
          return n;
        },
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<LookM>(p, s);
    },
    // At equal memory the text outranks vision within the budget instead of beyond it, and the
    // sinks and window fit in it.
    .equal_memory = [](const ParamSet&) -> std::map<std::string, std::string> {
      return {{"text", "prior"}, {"forced", "fit"}};
    },
    .recent_share = recent_share,
});

}  // namespace
}  // namespace kvsim
