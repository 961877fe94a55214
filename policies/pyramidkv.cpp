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
#include <stdexcept>

#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class PyramidKV final : public Policy {
 public:
  PyramidKV(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "pyramidkv")),
        beta_(static_cast<int>(p.get_int("beta"))),
        reference_rounding_(p.get_string("rounding") == "reference"),
        kvpress_rounding_(p.get_string("rounding") == "kvpress"),
        real_budget_(p.get_size("budget").unrounded(
            s.prompt_len, parse_rounding(p.get_string("budget_rounding")))),
        scoring_(read_snapkv_scoring(p, "pyramidkv", budget_, s.prompt_len)),
        merge_(read_prompt_merge(p)) {
    if (!scoring_.clamped.empty()) note(scoring_.clamped);
  }

  // kvpress's entries kept in all by layer l (window included). nearbyint rounds half to even.
  int kvpress_layer_keep(int layer, int layers, int P) const {
    const double B = real_budget_, w = scoring_.window;
    double lo = B / beta_, hi = 2 * B - lo;
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
    const int w = scoring_.window, base = budget_ - w;
    if (P < 2 * base) return base;  // uniform fall-back of the reference
    int lo = base / beta_, hi = 2 * base - lo;
    if (hi >= P - w) {
      hi = P - w;
      lo = 2 * base - hi;
    }
    if (layers <= 1) return base;
    if (reference_rounding_) return hi - layer * ((hi - lo) / (layers - 1));
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

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    scores_.clear();
    if (P <= budget_) return;  // P = B keeps everything in every layer either way
    const int keep =
        kvpress_rounding_
            ? std::max(kvpress_layer_keep(view.layer(), view.num_layers(), P), scoring_.window)
            : prefix_budget(view.layer(), view.num_layers(), P) + scoring_.window;
    scores_.resize(cache.kv_heads());
    for (int g = 0; g < cache.kv_heads(); ++g) {
      std::vector<double>& score = scores_[g];
      score = snapkv_scores(view, g, scoring_);
      score.resize(P, kUnscored);
      std::vector<std::uint8_t> window(P, 0);
      for (int j = P - scoring_.window; j < P; ++j) window[j] = 1;
      keep_or_merge(view, cache, g, keep_top_scores(score, keep, window), merge_);
    }
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(scores_.size()) ? &scores_[g] : nullptr;
  }

 private:
  int budget_, beta_;
  bool reference_rounding_, kvpress_rounding_;
  double real_budget_;
  SnapKVScoring scoring_;
  std::optional<MergeKind> merge_;
  std::vector<std::vector<double>> scores_;  // [kv head][prompt position] of the last prefill
};

const PolicyRegistration reg({
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
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<PyramidKV>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
