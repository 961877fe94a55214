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

#include "policies/policy.hpp"
#include "policies/random_priority.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class RandomEviction final : public Policy {
 public:
  RandomEviction(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "random")),
        sinks_(static_cast<int>(p.get_int("sinks"))),
        window_(static_cast<int>(p.get_int("window"))),
        draw_(static_cast<std::uint64_t>(p.get_int("seed")), context_draw_key(s)) {
    if (budget_ < sinks_)
      throw std::invalid_argument(
          "random: budget (" + std::to_string(budget_) +
          " entries) is below parameter 'sinks' = " + std::to_string(sinks_));
    // A window the budget cannot hold shrinks to what is left after the sinks, so that the floor
    // keeps the newest entries where the SnapKV family's clamped window keeps them
    // (read_snapkv_scoring); the run's notes say so.
    if (budget_ < sinks_ + window_ && budget_ < s.prompt_len) {
      note("random: budget (" + std::to_string(budget_) + " entries) is below parameters " +
           "'sinks' + 'window' = " + std::to_string(sinks_ + window_) + ": window clamped to " +
           std::to_string(budget_ - sinks_));
      window_ = budget_ - sinks_;
    }
  }

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    layer_ = view.layer();
    scores_.assign(cache.kv_heads(), std::vector<double>(P));
    const auto forced = sink_and_recent_mask(P, sinks_, window_);
    for (int g = 0; g < cache.kv_heads(); ++g) {
      for (int j = 0; j < P; ++j) scores_[g][j] = forced[j] ? kUnscored : priority(g, j);
      if (P > budget_) cache.keep_only(g, keep_top_scores(scores_[g], budget_, forced));
    }
  }

  // Scores the new position (protected while in the window) and releases the one the window
  // leaves, so that `decode = cap` evicts by the same uniform draw.
  void on_decode(const LayerView&, const StepAttention& att, KvCache& cache) override {
    const int pos = att.position;
    for (int g = 0; g < cache.kv_heads(); ++g) {
      auto& s = scores_[g];
      s.resize(pos + 1, kUnscored);
      s[pos] = window_ > 0 ? kUnscored : priority(g, pos);
      const int left = pos - window_;
      if (window_ > 0 && left >= sinks_) s[left] = priority(g, left);
    }
  }

  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(scores_.size()) ? &scores_[g] : nullptr;
  }

 private:
  double priority(int g, int position) const { return draw_(layer_, g, position); }

  int budget_, sinks_, window_;
  RandomPriority draw_;
  int layer_ = 0;
  std::vector<std::vector<double>> scores_;  // [kv head][position]: u, or kUnscored if protected
};

const PolicyRegistration reg({
    .name = "random",
    .summary = "The floor: keeps a seeded uniform random choice of the prompt entries per (sample, "
               "layer, KV head), beside optional sinks and a recent window.",
    .provenance = "kvsim; the random baseline of UniPruneBench and VTC-Bench",
    .params = {budget_param(),
               budget_rounding_param(false),
               {"seed", ParamType::kInt, "0",
                "the draw: each seed a different uniform choice (replay --seeds runs several)", 0,
                2147483647.0},
               {"sinks", ParamType::kInt, "0", "first positions always kept", 0, 1e9},
               {"window", ParamType::kInt, "0", "most recent positions always kept", 0, 1e9}},
    .switches = {.decode = true, .question = true},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<RandomEviction>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
