// replay --metrics diagnostics (--diagnostics): how much of the full cache's attention the
// policy's cache still holds at each decode step, against the layer's own full-cache attention
// averaged over the KV head's query heads (its key ranking, LayerAttention::key_ranking).
#include <algorithm>
#include <cmath>

#include "sim/replay/step_metric.hpp"

namespace kvsim {
namespace {

enum Column { kHitTop, kHitMass90, kMissesTop, kEvictedMass, kCumulativeEvictedMass };

class Diagnostics : public StepObserver {
 public:
  void observe(const LayerAttention& ref, const KvCache& cache, int step, int g,
               const float* previous, float* values) override {
    const int s = ref.prompt_len() + step, group = ref.group_size();
    stored_.assign(s + 1, 0);
    for (int e = 0; e < cache.size(g); ++e) stored_[cache.position(g, e)] = 1;
    const std::int32_t* order = ref.key_ranking(step, g);
    const int top = ref.top_count(step, g), m90 = ref.mass90_count(step, g);
    int hits = 0, hits90 = 0;
    for (int i = 0; i < std::max(top, m90); ++i) {
      if (!stored_[order[i]]) continue;
      hits += i < top;
      hits90 += i < m90;
    }
    double evicted = 0;
    for (int r = 0; r < group; ++r) {
      const float* p = ref.decode_probs(step, g * group + r);
      for (int j = 0; j <= s; ++j)
        if (!stored_[j]) evicted += p[j];
    }
    values[kHitTop] = static_cast<float>(hits) / top;
    values[kHitMass90] = static_cast<float>(hits90) / m90;
    values[kMissesTop] = static_cast<float>(top - hits);
    values[kEvictedMass] = static_cast<float>(evicted / group);
    values[kCumulativeEvictedMass] =
        values[kEvictedMass] + (previous ? previous[kCumulativeEvictedMass] : 0.0f);
  }

 private:
  std::vector<std::uint8_t> stored_;  // per position up to the step's: still stored
};

const StepMetricRegistration reg({
    .name = "diagnostics",
    .description = "hit rates of the top keys, irrecoverable misses and evicted attention mass",
    // Column meanings: docs/outputs.md.
    .columns = {{"hit_rate_top10"},
                {"hit_rate_mass90"},
                {"misses_top10", true},
                {"evicted_mass"},
                {"cumulative_evicted_mass"}},
    .needs = {.key_ranking = true},
    .observer = [] { return std::make_unique<Diagnostics>(); },
});

}  // namespace
}  // namespace kvsim
