// Statistics of a whole sample that some policies need before any layer is compressed (e.g.
// MEDA's layer budgets depend on the entropy of every layer). The engine computes them in a
// first pass over the layers; in a live model they are available once the prefill has run.
#pragma once

#include <vector>

#include "traces/kvtrace.hpp"

namespace kvsim {

struct SampleStats {
  // Per layer, from the prompt's causal attention, averaged over query heads:
  // cross-modal entropy E_CM (MEDA Eq. 4-6) = mean over text queries of the entropy of their
  // softmax restricted to earlier vision keys + the same for vision queries over earlier text
  // keys (rows with no such key are skipped);
  std::vector<double> cross_modal_entropy;
  // and the mean entropy of the full causal attention rows of the prompt.
  std::vector<double> attention_entropy;
};

// One layer's two entropies, computed with blocked GEMMs (threads over heads, deterministic).
void layer_entropies(const TraceInfo& trace, const SampleInfo& sample, const LayerTensors& t,
                     int threads, double& cross_modal, double& full);

// The same from scalar loops, for the plain reference.
void layer_entropies_naive(const TraceInfo& trace, const SampleInfo& sample, const LayerTensors& t,
                           double& cross_modal, double& full);

// Reads every layer of a sample and fills both vectors.
SampleStats compute_sample_stats(const TraceReader& reader, const SampleInfo& sample, int threads,
                                 bool naive = false);

}  // namespace kvsim
