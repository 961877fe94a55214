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
#include <cmath>

#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class LookM final : public Policy {
 public:
  LookM(const ParamSet& p, const SampleInfo& s)
      : split_(resolve_budget_split(p, s.prompt_len, "lookm")),
        budget_(split_.total),
        recent_(split_.recent >= 0
                    ? split_.recent  // budget_rounding = parts
                    : static_cast<int>(std::floor(p.get_float("recent_ratio") * budget_ + 1e-9))),
        sinks_(static_cast<int>(p.get_int("sinks"))),
        keep_all_text_(p.get_string("text") == "all"),
        merge_(p.get_string("merge")) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    priority_.assign(cache.kv_heads(), {});
    if (P <= budget_) return;
    std::vector<std::uint8_t> is_text(P);
    for (int j = 0; j < P; ++j) is_text[j] = view.modality()[j] == 0;
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const std::vector<double> score = prompt_column_scores(view, g);
      const auto forced = sink_and_recent_mask(P, sinks_, recent_);
      auto keep = keep_text_prior(score, is_text, budget_, forced);
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
  BudgetSplit split_;  // declared before budget_ and recent_, which it initialises
  int budget_, recent_, sinks_;
  bool keep_all_text_;
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
               decode_mode_param(),
               {"recent_ratio", ParamType::kFloat, "0.75", "share of B kept as the recent window",
                0, 1},
               {"sinks", ParamType::kInt, "4", "first positions always kept", 0, 1e9},
               {"text",
                ParamType::kChoice,
                "prior",
                "prior (text outranks vision within the budget) or all (every text entry kept "
                "beyond it, as the released code's keep-mask score >= 0)",
                0,
                0,
                {"prior", "all"}},
               {"merge",
                ParamType::kChoice,
                "average",
                "merging of evicted entries",
                0,
                0,
                {"none", "average", "pivotal", "weighted"}}},
    .needs = {.prefill_column_sums = true, .prefill_window = 0},
    .lookahead = false,
    .merges = true,
    .needs_for = {},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<LookM>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
