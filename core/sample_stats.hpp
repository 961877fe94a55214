// Statistics of a whole sample that some policies need before any layer is compressed (e.g.
// MEDA's layer budgets depend on the entropy of every layer). The engine computes them in a
// first pass over the layers; in a live model they are available once the prefill has run.
#pragma once

#include <array>
#include <map>
#include <vector>

#include "core/layer_attention.hpp"
#include "traces/kvtrace.hpp"

namespace kvsim {

// One layer's prompt-attention entropies (nats), each in two readings of "head-averaged":
// `*_of_mean` is the entropy of the attention averaged over the query heads (MEDA Sec. 3.2: "A is
// average attention across multi-heads"), `*_mean_of_heads` the mean over heads of each head's
// entropy; by concavity the first is never below the second.
//   cross-modal (MEDA E_CM, Eq. 4-6): mean over text queries of the entropy of their attention
//   restricted (renormalised) to vision keys + the same for vision queries over text keys.
//   `cross_modal_unmasked_*` is Eq. 4 as printed, Softmax(Q_T K_V^T / sqrt(D)) over every vision
//   key of the prompt, later ones included (no causal mask); `cross_modal_*` keeps the causal
//   mask (earlier keys only), and skips rows with no such key;
//   full: mean entropy of the causal attention rows of the prompt.
struct LayerEntropies {
  double cross_modal_of_mean = 0, cross_modal_mean_of_heads = 0;
  double cross_modal_unmasked_of_mean = 0, cross_modal_unmasked_mean_of_heads = 0;
  double full_of_mean = 0, full_mean_of_heads = 0;
};

// The six entropies in declaration order (how a compact trace stores them), and back.
std::array<double, 6> entropy_array(const LayerEntropies& e);
LayerEntropies entropies_of_array(const std::array<double, 6>& a);
// A compact trace's stored entropies; throws std::logic_error when it has none.
LayerEntropies stored_entropies(const StoredPromptStats& stored);

struct SampleStats {
  std::vector<LayerEntropies> layers;  // [L], with AttentionNeeds::sample_entropies
  // With AttentionNeeds::sample_window_sums: for each window W, layer l and query head h, the
  // column sums Σ_r p_{P-W+r, j} of the last min(W, P) prompt rows (summed in double, in row
  // order), [L][h * P + j]. The same numbers in replay and live.
  std::map<int, std::vector<std::vector<double>>> window_sums;
  // The [P] sums of window W, layer l, query head h; throws when W was not requested.
  const double* window_column_sums(int window, int layer, int h, int prompt_len) const;
};

// Σ of the last min(W, P) prefill rows of each query head, [H * P]; `att` must keep at least
// that many rows (AttentionNeeds::prefill_window).
std::vector<double> window_column_sums(const LayerAttention& att, int window);

// The prompt rows of one block of layer_entropies: every head's logits of a block are held at
// once, at most 2^26 floats (256 MiB, per thread), and at most 64 rows.
int entropy_block_rows(int heads, int prompt_len);

// One layer's entropies, computed with blocked GEMMs, the heads of each KV group in one product
// (threads over row blocks, deterministic).
LayerEntropies layer_entropies(const TraceInfo& trace, const SampleInfo& sample,
                               const LayerTensors& t, int threads);

// The same from scalar loops, for the plain reference.
LayerEntropies layer_entropies_naive(const TraceInfo& trace, const SampleInfo& sample,
                                     const LayerTensors& t);

// Reads every layer of a sample and computes its entropies.
SampleStats compute_sample_stats(const TraceReader& reader, const SampleInfo& sample, int threads,
                                 bool naive = false);

// Appends one layer's share of what `needs` asks of the whole sample (layers in order).
// The window sums copy the layer's tensors (their LayerAttention owns its rows); the entropies read
// them in place.
void add_layer_stats(SampleStats& stats, const TraceInfo& trace, const SampleInfo& sample,
                     const LayerTensors& tensors, const AttentionNeeds& needs, int threads,
                     bool naive);

// Reads every layer of a sample and computes what `needs` asks of the whole sample (its
// sample_entropies and sample_window_sums); `naive` uses the plain reference computations.
SampleStats compute_sample_stats(const TraceReader& reader, const SampleInfo& sample,
                                 const AttentionNeeds& needs, int threads, bool naive = false);

}  // namespace kvsim
