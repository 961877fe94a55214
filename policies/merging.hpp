// Merging unselected entries into kept ones instead of dropping them (LOOK-M, MEDA). Every
// unselected entry joins the kept entry whose key is most cosine-similar to it (similarities
// against the kept keys as they were before any merge; equal similarities pick the newer kept
// entry; a zero-norm key has cosine 0 with every key), then each kept entry j with members N_j
// becomes, for keys and values alike:
//   average:  (k_j + Σ_i k_i) / (|N_j| + 1)                         (MEDA Eq. 12, LOOK-M)
//   pivotal:  (k_j + Σ_i (k_i + k_j) / 2) / (|N_j| + 1)             (LOOK-M, pivot-first mean)
//   weighted: (k_j + Σ_i s_i k_i) / (|N_j| + 1), s_i the cosine     (LOOK-M)
//   similarity-weighted: (k_j + Σ_i w_i k_i) / (1 + Σ_i w_i), w_i = max((1 + s_i) / 2, 1e-6)
//                                                                     (KVCache-Factory)
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "policies/policy.hpp"

namespace kvsim {

enum class MergeKind { kAverage, kPivotal, kWeighted, kSimilarityWeighted };

// Merges every entry of KV head g with keep[e] == 0 into its nearest kept entry (keep has one
// flag per current entry). Without values in the trace, merged values are zero.
void merge_unselected(const LayerView& view, KvCache& cache, int g,
                      const std::vector<std::uint8_t>& keep, MergeKind kind);

// KVCache-Factory's `--merge` (pyramidkv/pyramidkv_utils.py, merge_kv), for the policies that
// compress the prompt once (snapkv, pyramidkv, h2o in oneshot mode, streamingllm with compress =
// prefill): none, pivot (kPivotal) or weighted (kSimilarityWeighted). The prompt entries a policy
// does not keep join their most key-similar kept entry, the window included.
ParamSpec prompt_merge_param();
// The kind `merge` names; nullopt for none. `needs`, when given, is the setting without which the
// policy does not compress the prompt once (e.g. "mode = oneshot"): merging then is an error
// naming `policy` and it (KVCache-Factory merges once, after the prompt).
std::optional<MergeKind> read_prompt_merge(const ParamSet& p, const std::string& policy = "",
                                           const char* needs = nullptr);
// Whether a policy's `merge` parameter (if it declares one) merges (PolicyInfo::merges_for).
bool merges_by_param(const ParamSet& p);
// keep_only(g, keep), or merge_unselected with `kind` when set.
void keep_or_merge(const LayerView& view, KvCache& cache, int g,
                   const std::vector<std::uint8_t>& keep, std::optional<MergeKind> kind);

}  // namespace kvsim
