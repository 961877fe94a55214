// Key and value geometry of one layer's prompt, for `kvsim stats`: how close each key is to its
// nearest neighbour, and whether keys that are alike carry values that are alike — the premise
// of the merging methods (MEDA Sec. 3.3, LOOK-M), which merge an evicted entry into the kept
// entry with the most similar key and average the values with it.
#pragma once

#include <vector>

#include "traces/kvtrace.hpp"

namespace kvsim {

struct KeySimilarity {
  // By the key's modality (0 text, 1 vision): the cosine of every prompt key to its most similar
  // other prompt key of the same KV head (any modality), pooled over KV heads.
  std::vector<double> nearest[2];
  // Pearson correlation of cos(k_i, k_j) and cos(v_i, v_j) over the pairs i < j of prompt
  // positions both of that modality, pooled over KV heads; NaN without values or without two
  // pairs that differ. Zero-norm vectors have cosine 0 with every vector.
  double key_value_correlation[2] = {NAN, NAN};
};

KeySimilarity key_similarity(const TraceInfo& trace, const SampleInfo& sample,
                             const LayerTensors& t, int threads);

// The q-quantile of `values` by linear interpolation between order statistics (NaN if empty).
double quantile(std::vector<double> values, double q);

}  // namespace kvsim
