// knorm: key-norm eviction (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for
// KV Cache Compression", arXiv 2406.11430), as kvpress's KnormPress runs it
// (kvpress/presses/knorm_press.py: score = -‖k_j‖): at the end of the prefill each KV head keeps
// the B prompt entries whose keys (after the rotary embedding, as the trace stores them) have the
// smallest L2 norm, ties to the newer; no attention is read. Decoding appends without eviction,
// as kvpress's prefill presses do (`decode` changes that: policies/decode_mode.cpp).
#include "policies/policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

class Knorm final : public Policy {
 public:
  Knorm(const ParamSet& p, const SampleInfo& s)
      : budget_(resolve_budget(p, s.prompt_len, "knorm")) {}

  void on_prefill(const LayerView& view, KvCache& cache) override {
    const int P = view.prompt_len();
    scores_.assign(cache.kv_heads(), {});
    for (int g = 0; g < cache.kv_heads(); ++g) {
      scores_[g] = key_norm_scores(view, g);
      if (P > budget_) cache.keep_only(g, keep_top_scores(scores_[g], budget_));
    }
  }

  void on_decode(const LayerView&, const StepAttention&, KvCache&) override {}
  const std::vector<double>* eviction_scores(int, int g) const override {
    return g < static_cast<int>(scores_.size()) ? &scores_[g] : nullptr;
  }

 private:
  int budget_;
  std::vector<std::vector<double>> scores_;  // [kv head][prompt position]: -‖k‖
};

const PolicyRegistration reg({
    .name = "knorm",
    .summary = "Keeps the prompt entries whose keys have the smallest L2 norm; no attention read.",
    .provenance = "Devoto et al. 2024 (arXiv 2406.11430); NVIDIA/kvpress "
                  "kvpress/presses/knorm_press.py (KnormPress)",
    .params = {budget_param(), budget_rounding_param(false)},
    .switches = {.decode = true, .question = true},
    .needs = {},
    .lookahead = false,
    .merges = false,
    .needs_for = {},
    .create = [](const ParamSet& p, const SampleInfo& s) -> std::unique_ptr<Policy> {
      return std::make_unique<Knorm>(p, s);
    },
});

}  // namespace
}  // namespace kvsim
