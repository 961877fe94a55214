// A policy that is one prompt scorer and one selection, written the way kvpress's ScorerPress
// (kvpress/presses/scorer_press.py) and kvsim's Python ScorerPolicy are: the registration states
// how to score, scorer_policy() does the rest. At the end of each layer's prefill the scorer gives
// every prompt entry of every KV head a score (higher is kept; kUnscored protects an entry, e.g. an
// observation window); when the prompt exceeds the budget each head keeps its protected entries
// and the budget's best others, ties to the newer (selection.hpp), per head or head-adaptive; the
// entries it does not keep are dropped, or merged when the scorer says so; a layer may keep more
// or fewer than the budget (per-layer selection). Decoding appends (the `decode` switch wraps it:
// policies/decode_mode.cpp); the scores stay the policy's eviction scores, so a capped decode
// evicts by them.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "policies/merging.hpp"
#include "policies/policy.hpp"

namespace kvsim {

// [kv head][prompt position]: a layer's prompt scores.
using PromptScores = std::vector<std::vector<double>>;

// What a scorer policy reads of its parameters once per sample.
struct PromptScorer {
  std::function<PromptScores(const LayerView&)> score;  // called at the end of each prefill
  std::optional<MergeKind> merge;                       // merge the unselected entries instead
  std::vector<std::string> notes;  // what it adjusted for this sample (Policy::notes)
  // Also score a prompt the budget holds, so that a capped decode evicts by the scores there too
  // (knorm); otherwise such a prompt is not scored (a scorer may need more than it has).
  bool within_budget = false;
  // Per-layer selection: the entries this layer keeps (protected ones included) when the prompt
  // exceeds the budget; unset, every layer keeps the budget (PyramidKV's pyramid sets it).
  std::function<int(const LayerView&)> layer_keep;
  // Scores the position a decode step appended (the scores hold one more entry per step), so that
  // a capped decode evicts by them; unset, the scores stay the prompt's (generated tokens have
  // none and are not evicted by score).
  std::function<void(const LayerView&, int position, PromptScores&)> score_decoded;
  // Its own selection in place of the per-head or head-adaptive one: the entries each KV head
  // keeps of a prompt that exceeds the budget, from the layer's scores (Ada-KV's safeguards).
  std::function<std::vector<std::vector<std::uint8_t>>(const PromptScores&, int budget)> select;
};
// Builds the scorer from the policy's parameters, the sample and the budget's entries.
using MakePromptScorer =
    std::function<PromptScorer(const ParamSet& params, const SampleInfo& sample, int budget)>;

// kPerHead: each KV head keeps its own best (keep_top_scores). kHeadAdaptive: kvpress's
// AdaKVPress, a floor of int(alpha · budget) per head and the rest of heads · budget jointly
// (keep_head_adaptive), alpha being the policy's `alpha` parameter.
enum class ScorerSelection { kPerHead, kHeadAdaptive };

// The registration of a scorer policy: `info` as the policy states it (its params must hold
// budget_param(), and `alpha` for kHeadAdaptive), with `create` filled.
PolicyInfo scorer_policy(PolicyInfo info, MakePromptScorer make_scorer,
                         ScorerSelection selection = ScorerSelection::kPerHead);

// The score of every KV head by a per-head scorer (e.g. key_norm_scores).
PromptScores each_kv_head(const LayerView& view,
                          const std::function<std::vector<double>(const LayerView&, int)>& score);

}  // namespace kvsim
