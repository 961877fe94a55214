#include "sim/sample_stats.hpp"

#include <cblas.h>

#include <cmath>

#include "sim/parallel.hpp"

namespace kvsim {

namespace {

// Entropy of softmax(x_j) over the keys j < n with mask(j) true; false if there is none.
template <typename Mask>
bool masked_entropy(const float* x, int n, double scale, Mask mask, double& entropy) {
  double mx = -INFINITY;
  for (int j = 0; j < n; ++j)
    if (mask(j)) mx = std::max(mx, scale * x[j]);
  if (mx == -INFINITY) return false;
  double z = 0, zx = 0;
  for (int j = 0; j < n; ++j) {
    if (!mask(j)) continue;
    const double y = scale * x[j] - mx, e = std::exp(y);
    z += e;
    zx += e * y;
  }
  entropy = std::log(z) - zx / z;  // -Σ p log p with p = e^y / z
  return true;
}

struct RowSums {
  double text = 0, vision = 0, full = 0;
  long text_rows = 0, vision_rows = 0, full_rows = 0;
  void add_row(const float* logits, int i, double scale,
               const std::vector<std::uint8_t>& modality) {
    const bool text_query = modality[i] == 0;
    double h = 0;
    if (masked_entropy(
            logits, i + 1, scale, [&](int j) { return (modality[j] == 0) != text_query; }, h)) {
      (text_query ? text : vision) += h;
      ++(text_query ? text_rows : vision_rows);
    }
    masked_entropy(
        logits, i + 1, scale, [](int) { return true; }, h);
    full += h;
    ++full_rows;
  }
};

void finish(const std::vector<RowSums>& per_head, double& cross_modal, double& full) {
  cross_modal = full = 0;
  for (const auto& s : per_head) {
    cross_modal +=
        (s.text_rows ? s.text / s.text_rows : 0) + (s.vision_rows ? s.vision / s.vision_rows : 0);
    full += s.full_rows ? s.full / s.full_rows : 0;
  }
  cross_modal /= per_head.size();
  full /= per_head.size();
}

}  // namespace

void layer_entropies(const TraceInfo& trace, const SampleInfo& sample, const LayerTensors& t,
                     int threads, double& cross_modal, double& full) {
  const int P = sample.prompt_len, H = trace.num_heads, Hkv = trace.num_kv_heads,
            d = trace.head_dim;
  std::vector<RowSums> sums(H);
  openblas_set_num_threads(1);
  parallel_for(H, threads, [&](int h) {
    constexpr int kBlock = 64;
    const int g = h / (H / Hkv);
    std::vector<float> logits(static_cast<std::size_t>(kBlock) * P);
    for (int i0 = 0; i0 < P; i0 += kBlock) {
      const int rows = std::min(kBlock, P - i0), keys = i0 + rows;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, 1.0f, &t.q(i0, h, 0),
                  H * d, t.k.data() + static_cast<std::size_t>(g) * d, Hkv * d, 0.0f, logits.data(),
                  keys);
      for (int r = 0; r < rows; ++r)
        sums[h].add_row(&logits[static_cast<std::size_t>(r) * keys], i0 + r, trace.scale,
                        sample.modality);
    }
  });
  finish(sums, cross_modal, full);
}

void layer_entropies_naive(const TraceInfo& trace, const SampleInfo& sample, const LayerTensors& t,
                           double& cross_modal, double& full) {
  const int P = sample.prompt_len, H = trace.num_heads, Hkv = trace.num_kv_heads,
            d = trace.head_dim;
  std::vector<RowSums> sums(H);
  std::vector<float> row(P);
  for (int h = 0; h < H; ++h)
    for (int i = 0; i < P; ++i) {
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int e = 0; e < d; ++e)
          dot += static_cast<double>(t.q(i, h, e)) * t.k(j, h / (H / Hkv), e);
        row[j] = static_cast<float>(dot);
      }
      sums[h].add_row(row.data(), i, trace.scale, sample.modality);
    }
  finish(sums, cross_modal, full);
}

SampleStats compute_sample_stats(const TraceReader& reader, const SampleInfo& sample, int threads,
                                 bool naive) {
  SampleStats stats;
  LayerTensors t;
  for (int l = 0; l < reader.info().num_layers; ++l) {
    reader.read_layer_into(sample, l, t);
    double cm = 0, full = 0;
    if (naive)
      layer_entropies_naive(reader.info(), sample, t, cm, full);
    else
      layer_entropies(reader.info(), sample, t, threads, cm, full);
    stats.cross_modal_entropy.push_back(cm);
    stats.attention_entropy.push_back(full);
  }
  return stats;
}

}  // namespace kvsim
