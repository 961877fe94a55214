#include "analysis/seed_comparison.hpp"

#include <cmath>
#include <stdexcept>

#include "analysis/bootstrap.hpp"

namespace kvsim {

namespace {

void require_same_shape(const SeedItemValues& p, const SeedItemValues& ref) {
  bool same = p.cells.size() == ref.cells.size();
  for (std::size_t s = 0; same && s < p.cells.size(); ++s)
    same = p.cells[s].size() == ref.cells[s].size() && p.cells[s].size() == ref.cells[0].size();
  if (!same || ref.cells.empty())
    throw std::invalid_argument("compare over seeds: " + p.label + " and " + ref.label +
                                " must hold the same seeds and items (a value per seed and item)");
}

// The items every seed answered under both policies.
std::vector<std::size_t> complete_items(const SeedItemValues& p, const SeedItemValues& ref) {
  std::vector<std::size_t> items;
  for (std::size_t i = 0; i < ref.cells[0].size(); ++i) {
    bool complete = true;
    for (std::size_t s = 0; s < ref.cells.size(); ++s)
      complete = complete && std::isfinite(p.cells[s][i]) && std::isfinite(ref.cells[s][i]);
    if (complete) items.push_back(i);
  }
  return items;
}

PairedComparison compare_one(const SeedItemValues& p, const SeedItemValues& ref,
                             const PairedOptions& options) {
  require_same_shape(p, ref);
  PairedComparison c;
  c.label = p.label;
  c.reference = ref.label;
  c.verdict = "no difference shown";
  const std::vector<std::size_t> items = complete_items(p, ref);
  const std::size_t S = ref.cells.size();
  c.n = static_cast<long>(items.size());
  c.seeds = static_cast<long>(S);
  if (items.empty()) return c;
  std::vector<std::vector<double>> d(S, std::vector<double>(items.size()));
  std::vector<double> by_item(items.size(), 0.0);
  double sum = 0, ref_sum = 0;
  for (std::size_t s = 0; s < S; ++s)
    for (std::size_t k = 0; k < items.size(); ++k) {
      const double v = p.cells[s][items[k]], r = ref.cells[s][items[k]];
      d[s][k] = v - r;
      by_item[k] += (v - r) / static_cast<double>(S);
      sum += v, ref_sum += r;
    }
  const double cells = static_cast<double>(S * items.size());
  c.mean = sum / cells;
  c.reference_mean = ref_sum / cells;
  const CrossedBootstrap b = crossed_bootstrap(d, options.bootstrap);
  c.difference = b.mean;
  c.interval = b.interval;
  c.p_value = b.p_value;
  c.p_holm = b.p_value;
  c.standard_error = b.standard_error;
  long above = 0, below = 0;
  for (double x : by_item) above += x > 0, below += x < 0;
  c.ties = c.n - above - below;
  c.wins = options.higher_is_better ? above : below;
  c.losses = options.higher_is_better ? below : above;
  const MeanSd items_sd = mean_sd(by_item);
  if (items_sd.sd > 0) c.effect_size = items_sd.mean / items_sd.sd;
  c.smallest_p = 2.0 / (options.bootstrap.resamples + 1.0);
  return c;
}

}  // namespace

std::vector<PairedComparison> compare_over_seeds(const std::vector<SeedItemValues>& policies,
                                                 const SeedItemValues& reference,
                                                 const PairedOptions& options) {
  std::vector<PairedComparison> family;
  for (const SeedItemValues& p : policies) family.push_back(compare_one(p, reference, options));
  holm_adjust(family, options);
  long tested = 0;
  for (const PairedComparison& c : family) tested += !std::isnan(c.p_value);
  const double first_step = options.alpha / static_cast<double>(std::max(tested, 1L));
  for (PairedComparison& c : family) {
    c.family_size = tested;
    if (std::isnan(c.p_value) || !(c.standard_error > 0) || !(c.smallest_p < first_step)) continue;
    c.detectable =
        (normal_quantile(1 - first_step / 2) + normal_quantile(options.power)) * c.standard_error;
  }
  return family;
}

}  // namespace kvsim
