// Compact traces (kvtrace-v1.md, "Compact traces"): a trace that keeps, of each prompt's queries,
// only the rows that attention windows need, and stores the statistics replay computes from the
// others, as LayerAttention computes them. Teacher-forced, those statistics never depend on the
// policy, so every replay of a full trace recomputes the same numbers; a compact trace computes
// them once. Replay of a compact trace gives the full trace's results byte for byte.
#pragma once

#include <functional>
#include <string>

#include "traces/kvtrace.hpp"

namespace kvsim {

struct CompactOptions {
  int window = 64;  // keep the query rows of windows up to this many prompt rows (> 0)
  // Store every layer's prompt entropies (MEDA's layer budgets): a pass over all P² logits of
  // every head, unmasked, which costs several replays of the prompt; without them a policy that
  // needs them is refused on the compact trace.
  bool entropies = true;
  // Widths W of the window group sums to store, with the last prompt row's head mean (the window
  // statistics of LayerAttention): a replay whose policies read only these computes no window
  // rows. Ascending, each at most `window`; empty: none stored (the rows are computed).
  std::vector<int> window_widths;
  int threads = 1;
};

// The first query row a compact trace keeps of a sample: the start of the prefill block holding
// the first row of a `window`-row window of its context (or of its prompt without a question), so
// that the window's rows are computed with the products a full trace uses.
int compact_first_row(const SampleInfo& sample, int window);

// The sample's metadata as a compact trace written with `window` records it.
SampleInfo compact_sample(SampleInfo sample, int window);

// One layer's stored statistics, computed from its full tensors: column sums (plain and rounded to
// the dtype) and text-query statistics of the prompt, and of the context when the sample has a
// question, their window statistics when `trace` lists widths (compact_window_widths), and (with
// `entropies`) the layer's entropies. `full` is returned unchanged.
StoredPromptStats prompt_stats_of_layer(const TraceInfo& trace, const SampleInfo& sample,
                                        LayerTensors& full, bool entropies, int threads);

// The layer a compact trace stores: the query rows from compact.compact_first_row, the keys and
// values, the statistics, and the full cache's results at the decode steps (with values and
// decode steps). `compact` comes from compact_sample().
LayerTensors compact_layer(const TraceInfo& trace, const SampleInfo& compact, LayerTensors full,
                           bool entropies, int threads);

// Writes `out_path` (through `<out_path>.partial`): every sample of `in` compacted. `progress` is
// called after each layer with the number of layers done so far. `in` must be a full trace.
void write_compact_trace(const TraceReader& in, const std::string& out_path,
                         const CompactOptions& options,
                         const std::function<void(long layers_done)>& progress = {});

}  // namespace kvsim
