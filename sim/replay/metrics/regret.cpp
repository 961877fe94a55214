// The `regret` column: how much attention mass the policy loses against the best cache of the
// same size, when a regret reference (the oracle) ran beside it.
#include <algorithm>

#include "sim/replay/step_metric.hpp"

namespace kvsim {
namespace {

// The reference for `r` among the layer's results: one matched to r's label (a reference that
// held exactly what the policy held), else an unmatched one whose budget resolved to the same
// count (LayerResult::budget_entries); either with as many cache heads. A reference declares
// itself and the policy it matches by PolicyInfo::regret_reference_for.
const LayerResult* reference_for(const LayerResult& r, const std::vector<LayerResult>& results,
                                 const std::vector<PolicyConfig>& policies) {
  auto is_reference = [&](const LayerResult& o) {
    return static_cast<bool>(policies[o.policy_index].info->regret_reference_for);
  };
  auto match_of = [&](const LayerResult& o) {
    const PolicyConfig& c = policies[o.policy_index];
    return c.info->regret_reference_for(c.params);
  };
  auto find = [&](bool matched) {
    return std::find_if(results.begin(), results.end(), [&](const LayerResult& o) {
      if (!is_reference(o) || o.steps.size() != r.steps.size()) return false;
      return matched ? match_of(o) == policies[r.policy_index].label
                     : match_of(o).empty() && r.budget_entries >= 0 &&
                           o.budget_entries == r.budget_entries;
    });
  };
  auto found = find(true);
  if (found == results.end()) found = find(false);
  return found == results.end() ? nullptr : &*found;
}

// regret = the reference's mass recall minus the policy's, per (KV head, step).
void set_regret(std::vector<LayerResult>& results, const std::vector<PolicyConfig>& policies,
                const ObservedColumns& at) {
  for (auto& r : results) {
    const LayerResult* reference = reference_for(r, results, policies);
    if (!reference) continue;
    for (std::size_t g = 0; g < r.steps.size(); ++g)
      for (std::size_t t = 0; t < r.steps[g].size(); ++t)
        at.at(r, g, t, 0) = reference->steps[g][t].mass_recall - r.steps[g][t].mass_recall;
  }
}

const StepMetricRegistration reg({
    .name = "regret",
    .description = "mass recall of the oracle replayed beside the policy minus the policy's",
    .columns = {{"regret"}},
    .always = true,
    .across_policies = set_regret,
});

}  // namespace
}  // namespace kvsim
