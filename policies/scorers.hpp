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
  std::string clamped;     // when the window was clamped to the budget: what to note, else empty
};

// The declarations of SnapKV's window/kernel/pooling/group_reduce parameters (defaults 32, 7, max,
// mean), shared by
// every policy that scores with SnapKV.
std::vector<ParamSpec> snapkv_scoring_params();
// Reads them and checks them against the budget: the kernel must be odd (errors name the policy).
// A budget that does not exceed the window (and keeps less than the prompt) clamps the window to
// the budget, so the newest `budget` prompt entries are kept, as kvpress's SnapKVPress keeps its
// n_kept newest when they are all in the window; `clamped` then says so.
SnapKVScoring read_snapkv_scoring(const ParamSet& p, const std::string& policy, int budget,
                                  int prompt_len);
// The statistics SnapKV scoring needs: the window group sums of `window` rows for the mean, the
// last `window` prompt rows themselves for the max.
AttentionNeeds snapkv_needs(const ParamSet& p);

// SnapKV (Li et al. 2024, Sec. 4.2): for prompt positions j < P - window, the mean (or, with
// group_max, the max) over the KV head's query heads of Σ over the last `window` prompt queries
// of p_ij, pooled along positions. Needs snapkv_needs.
std::vector<double> snapkv_scores(const LayerView& view, int kv_head, const SnapKVScoring& s);
// snapkv_scores of every KV head over the whole prompt, the window's entries kUnscored (kept by
// every selection): the prompt scores of the SnapKV family.
std::vector<std::vector<double>> snapkv_prompt_scores(const LayerView& view,
                                                      const SnapKVScoring& s);

// Σ over all causal prompt rows of p_ij, summed over the KV head's query heads (H2O's prompt
// scores). Needs AttentionNeeds::prefill_column_sums.
std::vector<double> prompt_column_scores(const LayerView& view, int kv_head);

// -‖k_j‖ for every prompt position j of KV head g: kvpress's KnormPress score (small key norms are
// kept). Reads the keys only.
std::vector<double> key_norm_scores(const LayerView& view, int kv_head);

// kvpress's ExpectedAttentionPress (kvpress/presses/expected_attention_press.py): the attention
// that future queries are expected to pay each prompt key, the queries modelled as a Gaussian.
struct ExpectedAttentionScoring {
  int future_positions = 512;  // n_future_positions: positions P .. P + n - 1 averaged over
  int sinks = 4;               // n_sink: excluded from the statistics, always kept
  bool covariance = true;      // use_covariance
  bool value_norm = true;      // use_vnorm
  double epsilon = 0;          // added before the value-norm rescaling
  double rope_theta = 0;       // 0: the trace's rope_theta attribute
};
std::vector<ParamSpec> expected_attention_params();
ExpectedAttentionScoring read_expected_attention(const ParamSet& p);
// Scores [kv head][prompt position]. Per query head, the mean μ and covariance Σ (population) of
// the queries at positions sinks .. P-1 with their rotary embedding undone (what kvpress computes
// as hidden states times W_q), both turned by R̄, the mean rotation of positions P .. P + n - 1;
// per key z_j = s μ̄·k_j + s²/2 k_jᵀ Σ̄ k_j (s the trace's scale; kvpress writes 1/√d, the same for
// every model it supports), softmax over the keys after the sinks, averaged over the KV head's
// query heads, times ‖v_j‖ (plus epsilon first). The sinks score the maximum over every head.
// Throws (naming `policy`) when no rotary base is known or the prompt holds no key after the sinks.
std::vector<std::vector<double>> expected_attention_scores(const LayerView& view,
                                                           const ExpectedAttentionScoring& s,
                                                           const std::string& policy);

// The last prompt token's attention averaged over every query head of the layer (FastV, TOVA,
// A-VL, ST3). Needs AttentionNeeds::last_row_head_mean.
std::vector<double> last_token_attention(const LayerView& view);

}  // namespace kvsim
