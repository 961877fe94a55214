#include "policies/scorer_policy.hpp"

#include <stdexcept>

#include "policies/selection.hpp"

namespace kvsim {
namespace {

class ScorerPolicy final : public Policy {
 public:
  ScorerPolicy(const ParamSet& p, const SampleInfo& s, const std::string& name,
               const MakePromptScorer& make_scorer, ScorerSelection selection)
      : budget_(resolve_budget(p, s.prompt_len, name)),
        alpha_(selection == ScorerSelection::kHeadAdaptive ? p.get_float("alpha") : -1.0),
        scorer_(make_scorer(p, s, budget_)) {
    for (auto& text : scorer_.notes) note(std::move(text));
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const bool within = view.prompt_len() <= budget_;
    scores_.clear();
    if (within && !scorer_.within_budget) return;
    scores_ = scorer_.score(view);
    if (within) return;
    const int keep_n = scorer_.layer_keep ? scorer_.layer_keep(view) : budget_;
    const auto keep = scorer_.select ? scorer_.select(scores_, keep_n) : select(keep_n);
    for (int g = 0; g < cache.kv_heads(); ++g)
      keep_or_merge(view, cache, g, keep[g], scorer_.merge);
  }

  void on_decode(const LayerView& view, const StepAttention& att, KvCache&) override {
    if (scorer_.score_decoded && !scores_.empty())
      scorer_.score_decoded(view, att.position, scores_);
  }
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(scores_.size()) ? &scores_[g] : nullptr;
  }

 private:
  // Each head's protected entries (kUnscored) and the best others: per head, or head-adaptive.
  std::vector<std::vector<std::uint8_t>> select(int keep_n) const {
    std::vector<std::vector<std::uint8_t>> forced(scores_.size());
    for (std::size_t g = 0; g < scores_.size(); ++g)
      for (double s : scores_[g]) forced[g].push_back(s == kUnscored);
    return keep_by_scores(scores_, keep_n, alpha_, forced);
  }

  int budget_;
  double alpha_;  // < 0: per head
  PromptScorer scorer_;
  PromptScores scores_;
};

}  // namespace

PolicyInfo scorer_policy(PolicyInfo info, MakePromptScorer make_scorer, ScorerSelection selection) {
  const auto declares = [&](const char* name) {
    for (const auto& spec : info.params)
      if (spec.name == name) return true;
    return false;
  };
  if (!declares("budget") || (selection == ScorerSelection::kHeadAdaptive && !declares("alpha")))
    throw std::logic_error("scorer_policy " + info.name +
                           ": its parameters must declare 'budget' (and 'alpha' when "
                           "head-adaptive)");
  info.create = [name = info.name, make = std::move(make_scorer), selection](
                    const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
    return std::make_unique<ScorerPolicy>(p, s, name, make, selection);
  };
  return info;
}

PromptScores each_kv_head(const LayerView& view,
                          const std::function<std::vector<double>(const LayerView&, int)>& score) {
  PromptScores scores(view.num_kv_heads());
  for (int g = 0; g < view.num_kv_heads(); ++g) scores[g] = score(view, g);
  return scores;
}

}  // namespace kvsim
