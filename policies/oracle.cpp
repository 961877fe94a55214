// oracle: evicts the entries that will receive the least attention in the remaining decode steps
// of the trace (sum of full-cache probabilities over those steps and over the query heads of the
// KV head), ties toward the older. It reads the future, so it is an upper reference for what a
// score-based policy could achieve at the same budget, not a deployable method; results label it
// "lookahead".
#include <algorithm>

#include "policies/policy.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class Oracle final : public Policy {
 public:
  Oracle(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "oracle")) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    // future_[g][t * T + j] = Σ_{t' >= t} Σ_r p_full[t', g*group + r, j] (suffix sums, exact).
    const int G = view.gen_len(), T = view.prompt_len() + G, group = view.group_size();
    T_ = T;
    // Every row but the last (zero) is overwritten below: reuse the storage across layers.
    future_.resize(cache.kv_heads());
    for (auto& f : future_) {
      f.resize(static_cast<std::size_t>(G + 1) * T);
      std::fill(f.end() - T, f.end(), 0.0);
    }
    for (int g = 0; g < cache.kv_heads(); ++g)
      for (int t = G - 1; t >= 0; --t) {
        double* cur = &future_[g][static_cast<std::size_t>(t) * T];
        const double* next = cur + T;
        const float* first = view.future_decode_probs(t, g * group);
        for (int j = 0; j < T; ++j) cur[j] = next[j] + first[j];
        for (int r = 1; r < group; ++r) {
          const float* p = view.future_decode_probs(t, g * group + r);
          for (int j = 0; j < T; ++j) cur[j] += p[j];
        }
      }
    trim(cache, 0);
  }

  void on_decode(const LayerView&, const StepAttention& att, KvCache& cache) override {
    trim(cache, att.step + 1);
  }

  int capacity(int, int) const override { return budget_; }

 private:
  void trim(KvCache& cache, int from_step) const {
    for (int g = 0; g < cache.kv_heads(); ++g) {
      const int n = cache.size(g);
      if (n <= budget_) continue;
      const double* fut = &future_[g][static_cast<std::size_t>(from_step) * T_];
      if (n == budget_ + 1) {  // a decode step's new token: drop the single worst, in one pass
        const int one[1] = {lowest_score_entry(cache.positions(g), fut, n)};
        cache.evict(g, one);
        continue;
      }
      std::vector<double> s(n);
      for (int e = 0; e < n; ++e) s[e] = fut[cache.position(g, e)];
      cache.keep_only(g, keep_top_scores(s, budget_));
    }
  }
  int budget_;
  int T_ = 0;
  std::vector<std::vector<double>> future_;
};

const PolicyRegistration reg({
    .name = "oracle",
    .summary = "Upper reference (lookahead): keeps the entries the remaining decode steps will "
               "attend most.",
    .provenance = "kvsim (offline reference: future full-cache attention mass)",
    .params = {budget_param()},
    .needs = {},
    .lookahead = true,
    .merges = false,
    .needs_for = {},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Oracle>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
