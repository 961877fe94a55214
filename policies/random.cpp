// random: the floor every selection must beat. At the end of the prefill each KV head keeps its
// protected entries (the first `sinks` and the last `window` prompt positions, the window clamped
// to the budget less the sinks as SnapKV's observation window is) and a uniform random choice of
// the others up to the budget, drawn per (sample, layer, KV head) from `seed`.
// UniPruneBench and VTC-Bench report random token selection as the baseline that many published
// VLM compression methods fail to beat; kvsim draws it with the same budget semantics as the
// other budgeted policies, so that it sits in the same tables.
//
// The draw is a priority u in [0, 1) per (seed, sample, layer, KV head, position) from a
// counter-based hash (policies/random_priority.hpp): keeping the highest priorities is a uniform
// choice of a subset of that size, and the same inputs give the same set whatever the thread
// count, the other policies of the run or the order of the samples. Decoding appends, like the
// other prefill-only policies; under `decode = cap` the excess goes by the same priorities (the
// generated tokens drawn alike, the window sliding with the newest position), so every decode
// eviction too is a uniform choice among the evictable entries. The sample is its name, or the
// context_id that several questions on one context share (context_draw_key): the context is then
// compressed to one set whichever question follows it.
#include <stdexcept>

#include "policies/random_priority.hpp"
#include "policies/scorer_policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

PromptScorer random_scorer(const ParamSet& p, const SampleInfo& s, int budget) {
  const int sinks = static_cast<int>(p.get_int("sinks"));
  int window = static_cast<int>(p.get_int("window"));
  if (budget < sinks)
    throw std::invalid_argument("random: budget (" + std::to_string(budget) +
                                " entries) is below parameter 'sinks' = " + std::to_string(sinks));
  PromptScorer scorer{.within_budget = true};
  // A window the budget cannot hold shrinks to what is left after the sinks, so that the floor
  // keeps the newest entries where the SnapKV family's clamped window keeps them
  // (read_snapkv_scoring); the run's notes say so.
  if (budget < sinks + window && budget < s.prompt_len) {
    scorer.notes.push_back(
        "random: budget (" + std::to_string(budget) +
        " entries) is below parameters 'sinks' + 'window' = " + std::to_string(sinks + window) +
        ": window clamped to " + std::to_string(budget - sinks));
    window = budget - sinks;
  }
  const RandomPriority draw(static_cast<std::uint64_t>(p.get_int("seed")), context_draw_key(s));
  // The protected entries are unscored, the others drawn.
  scorer.score = [=](const LayerView& view) {
    const int P = view.prompt_len();
    const auto forced = sink_and_recent_mask(P, sinks, window);
    return each_kv_head(view, [&](const LayerView& v, int g) {
      std::vector<double> score(P);
      for (int j = 0; j < P; ++j) score[j] = forced[j] ? kUnscored : draw(v.layer(), g, j);
      return score;
    });
  };
  // The new position is protected while in the window; the one the window leaves is drawn, so
  // that `decode = cap` evicts by the same uniform draw.
  scorer.score_decoded = [=](const LayerView& view, int position, PromptScores& scores) {
    for (std::size_t g = 0; g < scores.size(); ++g) {
      const int head = static_cast<int>(g);
      auto& score = scores[g];
      score.resize(position + 1, kUnscored);
      score[position] = window > 0 ? kUnscored : draw(view.layer(), head, position);
      const int left = position - window;
      if (window > 0 && left >= sinks) score[left] = draw(view.layer(), head, left);
    }
  };
  return scorer;
}

const PolicyRegistration reg(scorer_policy(
    {
        .name = "random",
        .summary =
            "The floor: keeps a seeded uniform random choice of the prompt entries per (sample, "
            "layer, KV head), beside optional sinks and a recent window.",
        .provenance = "kvsim; the random baseline of UniPruneBench and VTC-Bench",
        .params = {budget_param(),
                   budget_rounding_param(false),
                   {"seed", ParamType::kInt, "0",
                    "the draw: each seed a different uniform choice (replay --seeds runs several)",
                    0, 2147483647.0},
                   {"sinks", ParamType::kInt, "0", "first positions always kept", 0, 1e9},
                   {"window", ParamType::kInt, "0", "most recent positions always kept", 0, 1e9}},
        .switches = {.decode = true, .question = true},
    },
    random_scorer));

}  // namespace
}  // namespace kvsim
