// Scoring: how important each prompt entry is, per KV head, from the layer's shared statistics.
// Selectors (selection.hpp) then decide what to keep; a policy is often one scorer plus one
// selector.
#pragma once

#include <vector>

#include "policies/policy.hpp"

namespace kvsim {

struct SnapKVScoring {
  int window = 32;
  int kernel = 7;
  bool max_pool = true;
  bool group_max = false;  // GQA: max over the KV head's query heads instead of the mean
};

// The declarations of SnapKV's window/kernel/pooling/group_reduce parameters (defaults 32, 7, max,
// mean), shared by
// every policy that scores with SnapKV.
std::vector<ParamSpec> snapkv_scoring_params();
// Reads them and checks them against the budget: odd kernel, budget above the window (unless it
// keeps the whole prompt). Errors name the policy.
SnapKVScoring read_snapkv_scoring(const ParamSet& p, const std::string& policy, int budget,
                                  int prompt_len);
// The statistics SnapKV scoring needs: the last `window` prompt rows.
AttentionNeeds snapkv_needs(const ParamSet& p);

// SnapKV (Li et al. 2024, Sec. 4.2): for prompt positions j < P - window, the mean (or, with
// group_max, the max) over the KV head's query heads of Σ over the last `window` prompt queries
// of p_ij, pooled along positions.
// Needs AttentionNeeds::prefill_window >= window.
std::vector<double> snapkv_scores(const LayerView& view, int kv_head, const SnapKVScoring& s);

// Σ over all causal prompt rows of p_ij, summed over the KV head's query heads (H2O's prompt
// scores). Needs AttentionNeeds::prefill_column_sums.
std::vector<double> prompt_column_scores(const LayerView& view, int kv_head);

// The last prompt token's attention averaged over every query head of the layer (FastV, TOVA,
// A-VL, ST3). Needs AttentionNeeds::prefill_window >= 1.
std::vector<double> last_token_attention(const LayerView& view);

}  // namespace kvsim
