// vtw: Visual Token Withdrawal (Lin et al. 2024, "Boosting Multimodal Large Language Models with
// Visual Tokens Withdrawal", Sec. 3): every vision token is removed from layer K on, prefill and
// decoding alike; earlier layers keep everything. The baseline of ST3's Table 1.
// `K` is a layer index or a percentage of the layer count (default 50%: K = L/2, rounded up).
#include <algorithm>

#include "policies/policy.hpp"

namespace kvsim {
namespace {

class Vtw final : public Policy {
 public:
  explicit Vtw(const ParamSet& p) : layer_k_(p.get_size("K")) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    if (view.layer() < layer_k_.resolve(view.num_layers())) return;
    cache.evict_positions_if([&](int pos) { return view.modality()[pos] != 0; });
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}

 private:
  Size layer_k_;
};

const PolicyRegistration reg({
    .name = "vtw",
    .summary = "Withdraws every vision token from layer K on.",
    .provenance = "Lin et al. 2024, VTW, Sec. 3 (K = L/2)",
    .params = {{"K", ParamType::kSize, "50%",
                "first layer without vision tokens: an index, or a percentage of the layers "
                "(rounded up)",
                0, 1e9}},
    .create = [](const ParamSet& p, const SampleInfo&) -> std::unique_ptr<Policy> {
      return std::make_unique<Vtw>(p);
    },
});

}  // namespace
}  // namespace kvsim
