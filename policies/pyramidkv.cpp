// pyramidkv: PyramidKV (Cai et al. 2024, "Pyramidal Information Funneling", Sec. 3) as its
// reference implementation computes it (KVCache-Factory, pyramidkv_utils.py): SnapKV scoring with
// per-layer budgets that decrease linearly from the bottom layer to the top. With B the budget
// (window included), w the window and β:
//   min = (B - w) // β,  max = 2 (B - w) - min;  if max >= P - w: max = P - w, min = 2 (B - w) -
//   max steps = (max - min) // (L - 1),  layer l keeps the window + the top (max - l · steps)
//   prefix entries by SnapKV score,
// The reference floors `steps`, so its layers keep more than L · B in all (11% more on the demo
// trace); kvsim's default `rounding = exact` spaces the budgets by the real step
// (max - min) / (L - 1) and hands out the rounding remainders by largest fraction (ties to the
// lower layer), so they sum to exactly L · B; `rounding = reference` reproduces the floor.
// Fall-backs, as in the reference:
// a prompt no longer than B is not compressed; one shorter than 2 (B - w) keeps the window + the
// top B - w in every layer (uniform, as SnapKV).
// `rounding = kvpress` is kvpress's PyramidKVPress (kvpress/presses/pyramidkv_press.py,
// get_layer_budget), a different rule on the real budget B = P (1 - ratio): min = B / β,
// max = 2 B - min (if max >= P - w: max = P - w, min = 2 B - max); unless P >= max >= min >= w
// (then every layer keeps round(B), as SnapKV), layer l keeps round(max - l (max - min) / (L - 1))
// entries in all, the window among them (Python's round: half to even). Decoding appends without
// eviction (`decode` changes that: policies/decode_mode.cpp).
#include <algorithm>
#include <cmath>

#include "policies/merging.hpp"
#include "policies/scorer_policy.hpp"
#include "policies/scorers.hpp"

namespace kvsim {
namespace {

// The entries each layer keeps, window included (the pyramid above).
struct PyramidBudgets {
  int budget, beta, window;
  bool reference_rounding, kvpress_rounding;
  double real_budget;  // kvpress's B = P (1 - ratio), before rounding

  int layer_keep(const LayerView& view) const {
    const int layer = view.layer(), layers = view.num_layers(), P = view.prompt_len();
    return kvpress_rounding ? std::max(kvpress_layer_keep(layer, layers, P), window)
                            : prefix_budget(layer, layers, P) + window;
  }

  // kvpress's entries kept in all by layer l (window included). nearbyint rounds half to even.
  int kvpress_layer_keep(int layer, int layers, int P) const {
    const double B = real_budget, w = window;
    double lo = B / beta, hi = 2 * B - lo;
    if (hi >= P - w) {
      hi = P - w;
      lo = 2 * B - hi;
    }
    if (!(P >= hi && hi >= lo && lo >= w) || layers <= 1)
      return static_cast<int>(std::nearbyint(B));
    return static_cast<int>(std::nearbyint(hi - layer * (hi - lo) / (layers - 1)));
  }

  // Prefix entries (beyond the window) layer l keeps.
  int prefix_budget(int layer, int layers, int P) const {
    const int w = window, base = budget - w;
    if (P < 2 * base) return base;  // uniform fall-back of the reference
    int lo = base / beta, hi = 2 * base - lo;
    if (hi >= P - w) {
      hi = P - w;
      lo = 2 * base - hi;
    }
    if (layers <= 1) return base;
    if (reference_rounding) return hi - layer * ((hi - lo) / (layers - 1));
    std::vector<double> real(layers);
    std::vector<int> out(layers);
    long total = 0;
    for (int l = 0; l < layers; ++l) {
      real[l] = hi - l * static_cast<double>(hi - lo) / (layers - 1);
      total += out[l] = static_cast<int>(std::floor(real[l] + 1e-9));
    }
    std::vector<int> order(layers);
    for (int l = 0; l < layers; ++l) order[l] = l;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return real[a] - out[a] > real[b] - out[b]; });
    for (long i = 0; i < static_cast<long>(layers) * base - total; ++i) ++out[order[i]];
    return out[layer];
  }
};

PromptScorer pyramid_scorer(const ParamSet& p, const SampleInfo& s, int budget) {
  const SnapKVScoring scoring = read_snapkv_scoring(p, "pyramidkv", budget, s.prompt_len);
  const PyramidBudgets budgets{.budget = budget,
                               .beta = static_cast<int>(p.get_int("beta")),
                               .window = scoring.window,
                               .reference_rounding = p.get_string("rounding") == "reference",
                               .kvpress_rounding = p.get_string("rounding") == "kvpress",
                               .real_budget = p.get_size("budget").unrounded(
                                   s.prompt_len, parse_rounding(p.get_string("budget_rounding")))};
  PromptScorer scorer{
      .score = [scoring](const LayerView& view) { return snapkv_prompt_scores(view, scoring); },
      .merge = read_prompt_merge(p),
      .layer_keep = [budgets](const LayerView& view) { return budgets.layer_keep(view); }};
  if (!scoring.clamped.empty()) scorer.notes.push_back(scoring.clamped);
  return scorer;
}

const PolicyRegistration reg(scorer_policy(
    {
        .name = "pyramidkv",
        .summary = "SnapKV scores with layer budgets decreasing linearly with depth (total L x B).",
        .provenance = "Cai et al. 2024, PyramidKV, Sec. 3; KVCache-Factory pyramidkv_utils.py",
        .params = concat(
            {
                budget_param(),
                budget_rounding_param(false),
                prompt_merge_param(),
                {"beta", ParamType::kInt, "20", "pyramid steepness β (min = (B - w) / β)", 1, 1e9},
                {"rounding",
                 ParamType::kChoice,
                 "exact",
                 "exact (budgets sum to L x B), reference (KVCache-Factory's floored step) or "
                 "kvpress (PyramidKVPress's layer budgets on the real budget, window included)",
                 0,
                 0,
                 {"exact", "reference", "kvpress"}},
            },
            snapkv_scoring_params()),
        .switches = {.decode = true, .caches = true, .question = true},
        .merges_for = merges_by_param,
        .needs_for = snapkv_needs,
    },
    pyramid_scorer));

}  // namespace
}  // namespace kvsim
