// Merging unselected entries into kept ones instead of dropping them (LOOK-M, MEDA). Every
// unselected entry joins the kept entry whose key is most cosine-similar to it (similarities
// against the kept keys as they were before any merge; equal similarities pick the newer kept
// entry; a zero-norm key has cosine 0 with every key), then each kept entry j with members N_j
// becomes, for keys and values alike:
//   average:  (k_j + Σ_i k_i) / (|N_j| + 1)                         (MEDA Eq. 12, LOOK-M)
//   pivotal:  (k_j + Σ_i (k_i + k_j) / 2) / (|N_j| + 1)             (LOOK-M, pivot-first mean)
//   weighted: (k_j + Σ_i s_i k_i) / (|N_j| + 1), s_i the cosine     (LOOK-M)
#pragma once

#include <cstdint>
#include <vector>

#include "policies/policy.hpp"

namespace kvsim {

enum class MergeKind { kAverage, kPivotal, kWeighted };

// Merges every entry of KV head g with keep[e] == 0 into its nearest kept entry (keep has one
// flag per current entry). Without values in the trace, merged values are zero.
void merge_unselected(const LayerView& view, KvCache& cache, int g,
                      const std::vector<std::uint8_t>& keep, MergeKind kind);

}  // namespace kvsim
