// fastv: FastV (Chen et al. 2024, "An image is worth 1/2 tokens after layer 2", Sec. 4): at
// layer K of the prefill, image tokens are ranked by the last prompt token's attention in layer
// K - 1, averaged over heads, and the lowest R of them are dropped from layer K and every deeper
// layer (token drop: they have no KV entries there). Layers before K keep everything; decoding
// appends without eviction.
// The image span comes from the trace's `modality` (every image or video token of the prompt),
// never from a fixed 576. FastV keeps round(N · (1 - R)) image tokens with Python's round (half
// to even), as its token-drop code does (FastV's modeling_llama.py,
// `topk(round(FASTV_image_token_length * (1 - FASTV_r)))`); the demo's 576 · 0.5 = 288 is the
// same either way.
#include <cmath>

#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class FastV final : public Policy {
 public:
  FastV(const ParamSet& p, const SampleInfo&)
      : layer_k_(static_cast<int>(p.get_int("K"))), ratio_(p.get_float("R") / 100) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    if (view.layer() == layer_k_ - 1) {
      std::vector<int> images;
      for (int j = 0; j < view.prompt_len(); ++j)
        if (view.modality()[j] != 0) images.push_back(j);
      // nearbyint in the default rounding mode rounds half to even, as Python's round().
      const int keep = static_cast<int>(std::nearbyint(images.size() * (1 - ratio_)));
      const auto kept = top_positions(images, last_token_attention(view), keep);
      for (int j : images)
        if (!std::binary_search(kept.begin(), kept.end(), j)) dropped_.push_back(j);
    }
    if (view.layer() < layer_k_ || dropped_.empty()) return;
    cache.evict_positions_if(
        [&](int pos) { return std::binary_search(dropped_.begin(), dropped_.end(), pos); });
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}

 private:
  int layer_k_;
  double ratio_;
  std::vector<int> dropped_;  // sorted positions
};

const PolicyRegistration reg({
    .name = "fastv",
    .summary = "Drops the R% least-attended image tokens (by the last prompt token in layer K-1) "
               "from layer K on.",
    .provenance = "Chen et al. 2024, FastV, Sec. 4 (K = 2, R = 50%)",
    .params = {{"K", ParamType::kInt, "2", "first layer without the dropped tokens", 1, 1e9},
               {"R", ParamType::kFloat, "50", "share of image tokens dropped, %", 0, 100}},
    .needs = {.prefill_column_sums = false, .last_row_head_mean = true},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<FastV>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
