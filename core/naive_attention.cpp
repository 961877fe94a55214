// LayerAttention's plain reference (its Naive constructor) and the scalar attention it and the
// reference replay (sim/replay/reference_replay.cpp) are computed with.
#include "core/naive_attention.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/layer_attention.hpp"

namespace kvsim {

double naive_dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

std::vector<double> naive_causal_row(const LayerTensors& t, int pos, int h, int g, int n,
                                     double scale, int d, double* lse) {
  std::vector<double> p(n);
  double mx = -INFINITY;
  for (int j = 0; j < n; ++j)
    mx = std::max(mx, p[j] = scale * naive_dot(&t.q(pos, h, 0), &t.k(j, g, 0), d));
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += p[j] = std::exp(p[j] - mx);
  for (auto& x : p) x /= sum;
  if (lse) *lse = mx + std::log(sum);
  return p;
}

LayerAttention::LayerAttention(Naive, const TraceInfo& trace, const SampleInfo& sample,
                               LayerTensors tensors, const AttentionNeeds& needs)
    : LayerAttention(Shape{}, trace, sample, std::move(tensors), needs) {
  if (tensors_.stored)
    throw std::logic_error("the plain reference needs every prompt query, not a compact trace");
  if (window_ > 0) allocate_window_rows();
  if (tensors_.layer < needs.text_query_layers) {
    text_colsum_.assign(P_, 0.0f);
    text_colmax_.assign(P_, 0.0f);
    for (int i : text_query_rows()) {
      std::vector<double> mean(i + 1, 0.0);
      for (int h = 0; h < H_; ++h) {
        const auto p =
            naive_causal_row(tensors_, i, h, h / group_size(), i + 1, scale_, d_, nullptr);
        for (int j = 0; j <= i; ++j) mean[j] += p[j] / H_;
      }
      for (int j = 0; j <= i; ++j) {
        text_colsum_[j] += static_cast<float>(mean[j]);
        text_colmax_[j] = std::max(text_colmax_[j], static_cast<float>(mean[j]));
      }
    }
  }
  for (int h = 0; h < H_; ++h) {
    const int g = h / group_size();
    for (int i = (want_colsums_ || want_rounded_colsums_ ? 0 : P_ - window_); i < P_; ++i) {
      const auto p = naive_causal_row(tensors_, i, h, g, i + 1, scale_, d_, nullptr);
      for (int j = 0; j <= i; ++j) {
        if (want_colsums_)
          colsums_[static_cast<std::size_t>(h) * P_ + j] += static_cast<float>(p[j]);
        if (want_rounded_colsums_)
          rounded_colsums_[static_cast<std::size_t>(h) * P_ + j] +=
              round_to_dtype(static_cast<float>(p[j]), sample_.dtype);
        if (i >= P_ - window_)
          window_rows_[(static_cast<std::size_t>(h) * window_ + i - (P_ - window_)) * P_ + j] =
              static_cast<float>(p[j]);
      }
    }
    for (int t = 0; t < G_; ++t) {
      double lse = 0;
      const auto p = naive_causal_row(tensors_, P_ + t, h, g, P_ + t + 1, scale_, d_, &lse);
      float* row = &decode_probs_[(static_cast<std::size_t>(h) * G_ + t) * T_];
      double mass = 0;
      for (std::size_t j = 0; j < p.size(); ++j) mass += row[j] = static_cast<float>(p[j]);
      std::fill(row + p.size(), row + T_, 0.0f);
      decode_mass_[static_cast<std::size_t>(t) * H_ + h] = mass;
      decode_lse_[static_cast<std::size_t>(t) * H_ + h] = static_cast<float>(lse);
      if (!tensors_.has_v()) continue;
      for (int i = 0; i < d_; ++i) {
        double o = 0;
        for (std::size_t j = 0; j < p.size(); ++j) o += p[j] * tensors_.v(j, g, i);
        full_output_[(static_cast<std::size_t>(t) * H_ + h) * d_ + i] = static_cast<float>(o);
      }
    }
  }
  compute_output_norms();
}

}  // namespace kvsim
