// `kvsim stats`: observation metrics of attention itself (no policy), per sample, layer and head,
// as the five papers measure them. Written to an HDF5 file whose layout is documented in
// docs/outputs.md ("kvsim stats") and in each dataset's `doc` attribute.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "traces/kvtrace.hpp"

namespace kvsim {

struct StatsOptions {
  double epsilon = 1e-4;                                            // HAE Eq. 7
  std::vector<double> concentration = {0.8, 0.9};                   // mass shares (MadaKV, A-VL)
  std::vector<double> ppci = {0.3, 0.5};                            // A-VL Eq. 2 p values
  std::vector<double> dap_r = {0.001, 0.0012, 0.0015, 0.002};       // HAE Sec. 4.4
  double dap_alpha = 0.0005;                                        // HAE Sec. 4.4
  std::vector<double> key_quantiles = {0.1, 0.25, 0.5, 0.75, 0.9};  // nearest-key cosine
  int threads = 1;
};

// Every metric of one sample; arrays are row-major with the shapes given.
struct SampleAttentionStats {
  int layers = 0, heads = 0, steps = 0;
  std::vector<double> sparsity_causal;      // [L, H, 3]: all, text keys, vision keys
  std::vector<double> sparsity_masked;      // [L, H, 3]: the paper code's reading (zeros count)
  std::vector<double> concentration;        // [L, H, n_x, 2]: text, vision
  std::vector<double> cumulative_variance;  // [L, H, 2]: text, vision
  std::vector<double> modality_share;       // [L, H, 2]: text, vision
  std::vector<double> entropy;              // [L]
  std::vector<double> cross_modal_entropy;  // [L]
  std::vector<double> entropy_mean_of_heads, cross_modal_entropy_mean_of_heads;  // [L]
  std::vector<double> layer_cosine;                                              // [L, L]
  std::vector<double> ppci_layers;            // [n_p, L]: vs layer 0
  std::vector<double> ppci_steps;             // [n_p, L, G]: vs decode step 0
  std::vector<double> segment_share;          // [L, G, 4]: system, image, user, generated
  std::vector<double> dap_agreement;          // [n_r, L]
  std::vector<double> key_nearest_cosine;     // [L, 2, n_q]: text, vision keys
  std::vector<double> key_value_correlation;  // [L, 2]: text, vision pairs
};

SampleAttentionStats compute_attention_stats(const TraceReader& reader, const SampleInfo& sample,
                                             const StatsOptions& options,
                                             const std::function<void()>& on_layer = {});

// The datasets of one sample's stats, as the results file holds them: name, data, shape
// (row-major), and the `doc` attribute naming the axes.
struct StatsDataset {
  const char* name;
  const std::vector<double>* data;
  std::vector<std::size_t> shape;
  std::string doc;
};
std::vector<StatsDataset> stats_datasets(const SampleAttentionStats& s, const StatsOptions& o);

// Writes `path` (through path.partial, renamed when complete).
void write_attention_stats(
    const std::string& path, const TraceReader& reader, const StatsOptions& options,
    const std::vector<std::pair<std::string, SampleAttentionStats>>& samples);

// The console digest of `kvsim stats`: per band of layers (the first, middle and last third, or
// each layer when there are fewer than three), the share of causal prompt attention entries ≤ ε
// and the share of prompt attention mass on vision keys, each averaged over the band's layers and
// heads; the mean over samples and their range, with the sample count. NaN values (no key of a
// modality) are left out; "-" where none is left.
std::string stats_digest(const std::vector<std::pair<std::string, SampleAttentionStats>>& samples,
                         double epsilon);

// The metric primitives, exposed for the tests.
// A-VL Eq. 2: |T1 ∩ T2| / k with k = ceil(p·N) and T the top-k of each (ties to the later index).
double ppci(const std::vector<double>& a, const std::vector<double>& b, double p);
// Smallest fraction of the values whose largest members hold `share` of their sum (0 if empty).
double concentration(std::vector<double> values, double share);
double cosine_similarity(const std::vector<double>& a, const std::vector<double>& b);
double population_variance(const std::vector<double>& values);

}  // namespace kvsim
