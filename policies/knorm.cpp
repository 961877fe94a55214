// knorm: key-norm eviction (Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for
// KV Cache Compression", arXiv 2406.11430), as kvpress's KnormPress runs it
// (kvpress/presses/knorm_press.py: score = -‖k_j‖): at the end of the prefill each KV head keeps
// the B prompt entries whose keys (after the rotary embedding, as the trace stores them) have the
// smallest L2 norm, ties to the newer; no attention is read. Decoding appends without eviction,
// as kvpress's prefill presses do (`decode` changes that: policies/decode_mode.cpp).
#include "policies/scorer_policy.hpp"
#include "policies/scorers.hpp"

namespace kvsim {
namespace {

const PolicyRegistration reg(scorer_policy(
    {
        .name = "knorm",
        .summary = "Keeps the prompt entries whose keys have the smallest L2 norm; no attention "
                   "read.",
        .provenance = "Devoto et al. 2024 (arXiv 2406.11430); NVIDIA/kvpress "
                      "kvpress/presses/knorm_press.py (KnormPress)",
        .params = {budget_param(), budget_rounding_param(false)},
        .switches = {.decode = true, .question = true},
    },
    [](const ParamSet&, const SampleInfo&, int) {
      return PromptScorer{
          .score = [](const LayerView& view) { return each_kv_head(view, key_norm_scores); },
          .within_budget = true};
    }));

}  // namespace
}  // namespace kvsim
