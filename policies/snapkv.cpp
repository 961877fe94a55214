// snapkv: SnapKV (Li et al., NeurIPS 2024, Sec. 4.2, Listing 1).
//
// At the end of the prefill, for j < P - window:
//   score(j) = mean over the query heads of the KV head of
//              Σ over the last `window` prompt queries i of p_ij (causal, full cache),
// then pooled along positions (size `kernel`, stride 1, same padding; max or average). Keep the
// window plus the top B - window prefix entries, ties to the newer position. Decoding appends
// without eviction, as in the paper (the cache grows by one entry per step); `decode = cap |
// every:N` holds the prefill's size instead (policies/decode_mode.cpp), by these scores for cap.
// Reading chosen: summing over the window (the original repository) rather than averaging
// (kvpress) ranks identically, so it is not a parameter; average pooling counts padding as zeros
// (F.avg_pool1d's default in the reference code).
#include "policies/merging.hpp"
#include "policies/policy.hpp"
#include "policies/scorer_policy.hpp"
#include "policies/scorers.hpp"
#include "policies/selection.hpp"

namespace kvsim {
namespace {

const PolicyRegistration reg(scorer_policy(
    {
        .name = "snapkv",
        .summary =
            "Observation-window voting at the end of the prefill, pooled; no decode eviction.",
        .provenance = "Li et al. 2024, SnapKV, Sec. 4.2 / Listing 1",
        .params = concat({budget_param(), budget_rounding_param(false), prompt_merge_param()},
                         snapkv_scoring_params()),
        .switches = {.decode = true, .caches = true, .question = true},
        .merges_for = merges_by_param,
        .needs_for = snapkv_needs,
    },
    [](const ParamSet& p, const SampleInfo& s, int budget) {
      const SnapKVScoring scoring = read_snapkv_scoring(p, "snapkv", budget, s.prompt_len);
      PromptScorer scorer{
          .score = [scoring](const LayerView& view) { return snapkv_prompt_scores(view, scoring); },
          .merge = read_prompt_merge(p)};
      if (!scoring.clamped.empty()) scorer.notes.push_back(scoring.clamped);
      return scorer;
    }));

}  // namespace
}  // namespace kvsim
