#include "core/sample_stats.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "core/kernels/kernels.hpp"
#include "core/parallel.hpp"

namespace kvsim {

namespace {

// Softmax of scale·x_j over the keys j < n with mask(j), written to p (0 off the mask), and its
// entropy; false when no key passes the mask.
template <typename Mask>
bool masked_softmax(const float* x, int n, double scale, Mask mask, double* p, double& entropy) {
  double mx = -INFINITY;
  for (int j = 0; j < n; ++j)
    if (mask(j)) mx = std::max(mx, scale * x[j]);
  if (mx == -INFINITY) return false;
  double z = 0, zy = 0;
  for (int j = 0; j < n; ++j) {
    if (!mask(j)) {
      p[j] = 0;
      continue;
    }
    const double y = scale * x[j] - mx;
    p[j] = std::exp(y);
    z += p[j];
    zy += p[j] * y;
  }
  for (int j = 0; j < n; ++j) p[j] /= z;
  entropy = std::log(z) - zy / z;  // -Σ p log p with p = e^y / z
  return true;
}

double entropy_of(const double* p, int n, double total) {
  double h = 0;
  for (int j = 0; j < n; ++j)
    if (p[j] > 0) h -= p[j] / total * std::log(p[j] / total);
  return h;
}

// One prompt row i: its heads' probabilities summed (cross-modal causal, cross-modal over every
// prompt key, full), and the sums of the heads' own entropies. Logits cover keys 0..P-1. The plain
// statement, with masks over every key (layer_entropies_naive); layer_entropies uses
// FastRowAccumulator, the same arithmetic on the keys the masks pass.
class RowAccumulator {
 public:
  explicit RowAccumulator(int P) : P_(P), cm_(P), cm_all_(P), full_(P), tmp_(P) {}
  void start(int i) {
    i_ = i;
    std::fill(cm_.begin(), cm_.end(), 0.0);
    std::fill(cm_all_.begin(), cm_all_.end(), 0.0);
    std::fill(full_.begin(), full_.end(), 0.0);
    cm_heads_ = cm_all_heads_ = full_heads_ = 0;
    heads_ = 0;
    cm_valid_ = cm_all_valid_ = false;
  }
  void add_head(const float* logits, double scale, const std::vector<std::uint8_t>& modality) {
    const bool text_query = modality[i_] == 0;
    auto other = [&](int j) { return (modality[j] == 0) != text_query; };
    ++heads_;
    add(logits, i_ + 1, scale, other, cm_, cm_heads_, cm_valid_);          // causal
    add(logits, P_, scale, other, cm_all_, cm_all_heads_, cm_all_valid_);  // Eq. 4, unmasked
    bool valid = false;
    add(
        logits, i_ + 1, scale, [](int) { return true; }, full_, full_heads_, valid);
  }
  // Cross-modal causal (of the mean, mean of heads), full (the same), cross-modal unmasked (the
  // same); a cross-modal pair is NaN when the row has no key of the other modality.
  void finish(double out[6]) const {
    out[0] = cm_valid_ ? entropy_of(cm_.data(), P_, heads_) : NAN;
    out[1] = cm_valid_ ? cm_heads_ / heads_ : NAN;
    out[2] = entropy_of(full_.data(), P_, heads_);
    out[3] = full_heads_ / heads_;
    out[4] = cm_all_valid_ ? entropy_of(cm_all_.data(), P_, heads_) : NAN;
    out[5] = cm_all_valid_ ? cm_all_heads_ / heads_ : NAN;
  }

 private:
  template <typename Mask>
  void add(const float* logits, int n, double scale, Mask mask, std::vector<double>& sum,
           double& entropy_sum, bool& valid) {
    double h = 0;
    if (!masked_softmax(logits, n, scale, mask, tmp_.data(), h)) return;
    valid = true;
    entropy_sum += h;
    for (int j = 0; j < n; ++j) sum[j] += tmp_[j];
  }

  int P_;
  std::vector<double> cm_, cm_all_, full_, tmp_;
  int i_ = 0, heads_ = 0;
  double cm_heads_ = 0, cm_all_heads_ = 0, full_heads_ = 0;
  bool cm_valid_ = false, cm_all_valid_ = false;
};

// RowAccumulator's statement with the work its masks skip left out: the cross-modal softmaxes run
// over the list of the other modality's keys (most rows of a media prompt have a few dozen), the
// full one over the causal keys only, the maxima taken over floats (scale > 0 and rounding are
// monotone: max scale·x = scale·max x). Each softmax is the vector kernel softmax_entropy (vector
// exponentials and lane sums in float64): equal to the plain statement to rounding, and the same
// bytes for any thread count on one machine (each row is one thread's).
class FastRowAccumulator {
 public:
  FastRowAccumulator(int P, const std::vector<std::uint8_t>& modality)
      : modality_(modality), cm_(P, 0.0), cm_all_(P, 0.0), full_(P, 0.0), tmp_(P), gathered_(P) {
    for (int j = 0; j < P; ++j) (modality[j] == 0 ? text_ : media_).push_back(j);
  }
  void start(int i) {
    clear();
    i_ = i;
    other_ = modality_[i] == 0 ? &media_ : &text_;
    causal_other_ =
        static_cast<int>(std::upper_bound(other_->begin(), other_->end(), i) - other_->begin());
    cm_heads_ = cm_all_heads_ = full_heads_ = 0;
    heads_ = 0;
    cm_valid_ = cm_all_valid_ = false;
  }
  void add_head(const float* logits, double scale) {
    ++heads_;
    const int* other = other_->data();
    if (causal_other_ > 0) {  // cross-modal, causal
      cm_valid_ = true;
      cm_heads_ += listed_softmax(logits, other, causal_other_, scale, cm_.data());
    }
    if (!other_->empty()) {  // Eq. 4, unmasked
      cm_all_valid_ = true;
      cm_all_heads_ +=
          listed_softmax(logits, other, static_cast<int>(other_->size()), scale, cm_all_.data());
    }
    full_heads_ += causal_softmax(logits, i_ + 1, scale, full_.data());
  }
  void finish(double out[6]) const {
    out[0] = cm_valid_ ? listed_entropy(cm_.data(), causal_other_) : NAN;
    out[1] = cm_valid_ ? cm_heads_ / heads_ : NAN;
    double h = 0;
    for (int j = 0; j <= i_; ++j)
      if (full_[j] > 0) h -= full_[j] / heads_ * std::log(full_[j] / heads_);
    out[2] = h;
    out[3] = full_heads_ / heads_;
    out[4] = cm_all_valid_ ? listed_entropy(cm_all_.data(), static_cast<int>(other_->size())) : NAN;
    out[5] = cm_all_valid_ ? cm_all_heads_ / heads_ : NAN;
  }

 private:
  // Zeroes what the last row wrote (its causal keys and its other-modality keys).
  void clear() {
    if (other_ == nullptr) return;
    std::fill(full_.begin(), full_.begin() + i_ + 1, 0.0);
    for (int j : *other_) cm_[j] = cm_all_[j] = 0.0;
  }
  // masked_softmax over the keys keys[0..n) (ascending), gathered, each probability added to
  // sum; the row's entropy.
  double listed_softmax(const float* x, const int* keys, int n, double scale, double* sum) {
    for (int m = 0; m < n; ++m) gathered_[m] = x[keys[m]];
    const double h = kernels_.softmax_entropy(gathered_.data(), n, scale, tmp_.data(), nullptr);
    for (int m = 0; m < n; ++m) sum[keys[m]] += tmp_[m];
    return h;
  }
  // The same over keys 0..n-1.
  double causal_softmax(const float* x, int n, double scale, double* sum) {
    return kernels_.softmax_entropy(x, n, scale, tmp_.data(), sum);
  }
  double listed_entropy(const double* p, int n) const {
    double h = 0;
    for (int m = 0; m < n; ++m) {
      const double v = p[(*other_)[m]];
      if (v > 0) h -= v / heads_ * std::log(v / heads_);
    }
    return h;
  }

  const std::vector<std::uint8_t>& modality_;
  std::vector<int> text_, media_;  // the prompt's text keys and its other keys, ascending
  const std::vector<int>* other_ = nullptr;
  int causal_other_ = 0;  // how many of *other_ are <= i
  std::vector<double> cm_, cm_all_, full_, tmp_;
  std::vector<float> gathered_;  // the listed keys' logits
  const kernels::Table& kernels_ = kernels::active();
  int i_ = 0, heads_ = 0;
  double cm_heads_ = 0, cm_all_heads_ = 0, full_heads_ = 0;
  bool cm_valid_ = false, cm_all_valid_ = false;
};

using RowEntropies = std::array<double, 6>;

// Means over rows: cross-modal = mean over text rows + mean over vision rows (rows without a
// cross-modal key skipped); full = mean over all rows. rows[i] as written by finish().
LayerEntropies reduce_rows(const std::vector<RowEntropies>& rows,
                           const std::vector<std::uint8_t>& modality) {
  double sum[2][4] = {}, full[2] = {};
  long count[2][2] = {};  // [modality][causal, unmasked]
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const int vision = modality[i] != 0;
    for (int u = 0; u < 2; ++u)
      if (!std::isnan(rows[i][4 * u])) {
        sum[vision][2 * u] += rows[i][4 * u];
        sum[vision][2 * u + 1] += rows[i][4 * u + 1];
        ++count[vision][u];
      }
    full[0] += rows[i][2];
    full[1] += rows[i][3];
  }
  auto mean = [&](int m, int k) { return count[m][k / 2] ? sum[m][k] / count[m][k / 2] : 0.0; };
  LayerEntropies e;
  e.cross_modal_of_mean = mean(0, 0) + mean(1, 0);
  e.cross_modal_mean_of_heads = mean(0, 1) + mean(1, 1);
  e.cross_modal_unmasked_of_mean = mean(0, 2) + mean(1, 2);
  e.cross_modal_unmasked_mean_of_heads = mean(0, 3) + mean(1, 3);
  e.full_of_mean = rows.empty() ? 0 : full[0] / rows.size();
  e.full_mean_of_heads = rows.empty() ? 0 : full[1] / rows.size();
  return e;
}

}  // namespace

int entropy_block_rows(int heads, int prompt_len) {
  return std::clamp((1 << 26) / std::max(1, heads * prompt_len), 1, 64);
}

LayerEntropies layer_entropies(const TraceInfo& trace, const SampleInfo& sample,
                               const LayerTensors& t, int threads) {
  const int P = sample.prompt_len, H = trace.num_heads, Hkv = trace.num_kv_heads,
            d = trace.head_dim, group = H / Hkv;
  // A block holds every head's logits of its rows (row i needs all heads at once: the
  // head-averaged distributions), at most 256 MiB of floats. The heads of one KV group are one
  // product, group x rows queries against the group's keys, so the keys are read (and packed)
  // once per block and group, not once per head; at 64 MiB a 32k prompt's blocks held 18 rows,
  // and the packing of every key for each 126-row product took the compaction from 1.27x its
  // GEMM floor to 1.55x (2 layers, 2 threads).
  const int block = entropy_block_rows(H, P), blocks = (P + block - 1) / block;
  const int workers = std::max(1, std::min(threads, blocks));
  std::vector<RowEntropies> rows(P);
  openblas_set_num_threads(1);
  // Each worker takes every workers-th block with buffers of its own; a row's result depends on
  // its row only, so on no thread count.
  parallel_for(workers, workers, [&](int w) {
    std::vector<float> queries(static_cast<std::size_t>(group) * block * d);
    std::vector<float> logits(static_cast<std::size_t>(H) * block * P);
    FastRowAccumulator acc(P, sample.modality);
    for (int b = w; b < blocks; b += workers) {
      const int i0 = b * block, n = std::min(block, P - i0);  // Eq. 4 sees every key
      for (int g = 0; g < Hkv; ++g) {
        for (int hh = 0; hh < group; ++hh)
          for (int r = 0; r < n; ++r)
            std::copy_n(&t.q(i0 + r, g * group + hh, 0), d,
                        &queries[(static_cast<std::size_t>(hh) * n + r) * d]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, group * n, P, d, 1.0f, queries.data(),
                    d, t.k.data() + static_cast<std::size_t>(g) * d, Hkv * d, 0.0f,
                    &logits[static_cast<std::size_t>(g) * group * n * P], P);
      }
      for (int r = 0; r < n; ++r) {
        acc.start(i0 + r);
        for (int h = 0; h < H; ++h)
          acc.add_head(&logits[(static_cast<std::size_t>(h) * n + r) * P], trace.scale);
        acc.finish(rows[i0 + r].data());
      }
    }
  });
  return reduce_rows(rows, sample.modality);
}

LayerEntropies layer_entropies_naive(const TraceInfo& trace, const SampleInfo& sample,
                                     const LayerTensors& t) {
  const int P = sample.prompt_len, H = trace.num_heads, Hkv = trace.num_kv_heads,
            d = trace.head_dim;
  std::vector<RowEntropies> rows(P);
  std::vector<float> logits(P);
  RowAccumulator acc(P);
  for (int i = 0; i < P; ++i) {
    acc.start(i);
    for (int h = 0; h < H; ++h) {
      for (int j = 0; j < P; ++j) {
        double dot = 0;
        for (int e = 0; e < d; ++e)
          dot += static_cast<double>(t.q(i, h, e)) * t.k(j, h / (H / Hkv), e);
        logits[j] = static_cast<float>(dot);
      }
      acc.add_head(logits.data(), trace.scale, sample.modality);
    }
    acc.finish(rows[i].data());
  }
  return reduce_rows(rows, sample.modality);
}

std::array<double, 6> entropy_array(const LayerEntropies& e) {
  return {e.cross_modal_of_mean,
          e.cross_modal_mean_of_heads,
          e.cross_modal_unmasked_of_mean,
          e.cross_modal_unmasked_mean_of_heads,
          e.full_of_mean,
          e.full_mean_of_heads};
}

LayerEntropies entropies_of_array(const std::array<double, 6>& a) {
  return {a[0], a[1], a[2], a[3], a[4], a[5]};
}

LayerEntropies stored_entropies(const StoredPromptStats& stored) {
  if (!stored.has_entropies)
    throw std::logic_error("the prompt entropies are not stored in this compact trace");
  return entropies_of_array(stored.entropies);
}

SampleStats compute_sample_stats(const TraceReader& reader, const SampleInfo& sample, int threads,
                                 bool naive) {
  return compute_sample_stats(reader, sample, AttentionNeeds{.sample_entropies = true}, threads,
                              naive);
}

std::vector<double> window_column_sums(const LayerAttention& att, int window) {
  const int P = att.prompt_len(), H = att.num_heads(), rows = std::min(window, P);
  if (att.prefill_window() < rows)
    throw std::logic_error("window column sums: the layer keeps " +
                           std::to_string(att.prefill_window()) + " prefill rows, not " +
                           std::to_string(rows));
  std::vector<double> sums(static_cast<std::size_t>(H) * P, 0.0);
  for (int h = 0; h < H; ++h)
    for (int r = att.prefill_window() - rows; r < att.prefill_window(); ++r) {
      const float* row = att.prefill_window_row(h, r);
      double* out = &sums[static_cast<std::size_t>(h) * P];
      for (int j = 0; j < P; ++j) out[j] += row[j];
    }
  return sums;
}

const double* SampleStats::window_column_sums(int window, int layer, int h, int prompt_len) const {
  const auto it = window_sums.find(window);
  if (it == window_sums.end() || layer < 0 || layer >= static_cast<int>(it->second.size()))
    throw std::logic_error("sample statistics: the column sums of the last " +
                           std::to_string(window) + " prompt rows of layer " +
                           std::to_string(layer) + " were not requested");
  return &it->second[layer][static_cast<std::size_t>(h) * prompt_len];
}

void add_layer_stats(SampleStats& stats, const TraceInfo& trace, const SampleInfo& sample,
                     const LayerTensors& tensors, const AttentionNeeds& needs, int threads,
                     bool naive) {
  if (needs.sample_entropies)
    stats.layers.push_back(tensors.stored ? stored_entropies(*tensors.stored)
                           : naive        ? layer_entropies_naive(trace, sample, tensors)
                                          : layer_entropies(trace, sample, tensors, threads));
  if (needs.sample_window_sums.empty()) return;
  // Only the window rows, whatever else the run computes, so replay and live sum the same floats.
  AttentionNeeds rows_only;
  for (int w : needs.sample_window_sums)
    rows_only.prefill_window = std::max(rows_only.prefill_window, w);
  const LayerAttention att =
      naive ? LayerAttention(LayerAttention::Naive{}, trace, sample, tensors, rows_only)
            : LayerAttention(LayerAttention::PromptOnly{}, trace, sample, tensors, rows_only,
                             threads);
  for (int w : needs.sample_window_sums) stats.window_sums[w].push_back(window_column_sums(att, w));
}

SampleStats compute_sample_stats(const TraceReader& reader, const SampleInfo& sample,
                                 const AttentionNeeds& needs, int threads, bool naive) {
  SampleStats stats;
  LayerTensors t;
  for (int l = 0; l < reader.info().num_layers; ++l) {
    reader.read_layer_into(sample, l, t);
    add_layer_stats(stats, reader.info(), sample, t, needs, threads, naive);
  }
  return stats;
}

}  // namespace kvsim
