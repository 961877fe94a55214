#include "sim/replay/reference_replay.hpp"

#include <cmath>

namespace kvsim {

namespace {

double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Softmax of scale·q·k_j over keys 0..n-1 of KV head g, in double.
std::vector<double> causal_row(const LayerTensors& t, int pos, int h, int g, int n, double scale,
                               int d, double* lse) {
  std::vector<double> p(n);
  double mx = -INFINITY;
  for (int j = 0; j < n; ++j)
    mx = std::max(mx, p[j] = scale * dot(&t.q(pos, h, 0), &t.k(j, g, 0), d));
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += p[j] = std::exp(p[j] - mx);
  for (auto& x : p) x /= sum;
  if (lse) *lse = mx + std::log(sum);
  return p;
}

}  // namespace

LayerAttention::LayerAttention(Naive, const TraceInfo& trace, const SampleInfo& sample,
                               LayerTensors tensors, const AttentionNeeds& needs)
    : LayerAttention(Shape{}, trace, sample, std::move(tensors), needs) {
  if (tensors_.stored)
    throw std::logic_error("the plain reference needs every prompt query, not a compact trace");
  if (tensors_.layer < needs.text_query_layers) {
    text_colsum_.assign(P_, 0.0f);
    text_colmax_.assign(P_, 0.0f);
    for (int i : text_query_rows()) {
      std::vector<double> mean(i + 1, 0.0);
      for (int h = 0; h < H_; ++h) {
        const auto p = causal_row(tensors_, i, h, h / group_size(), i + 1, scale_, d_, nullptr);
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
      const auto p = causal_row(tensors_, i, h, g, i + 1, scale_, d_, nullptr);
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
      const auto p = causal_row(tensors_, P_ + t, h, g, P_ + t + 1, scale_, d_, &lse);
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

namespace {

// Recomputes the step's softmax over the attended entries from q·k (merged keys included).
void plain_step_attention(const LayerAttention& att, const LayerAttention& ref,
                          const KvCache& cache, int step, StepAttention& out,
                          std::vector<StepMetrics>& metrics) {
  const auto& t = att.tensors();
  const auto& t_ref = ref.tensors();
  const int Hkv = att.num_kv_heads(), group = att.group_size(), d = att.head_dim();
  const int s = att.prompt_len() + step;
  out.step = step;
  out.position = s;
  out.group = group;
  out.probs.assign(Hkv, {});
  for (int g = 0; g < Hkv; ++g) {
    const int n = cache.size(g);
    out.probs[g].assign(static_cast<std::size_t>(group) * n, 0.0f);
    double recall = 0, err2 = 0, ref2 = 0, vnorm2 = 0;
    for (int r = 0; r < group; ++r) {
      const int h = g * group + r;
      double full_lse = 0;
      const auto full = causal_row(t_ref, s, h, g, s + 1, att.scale(), d, &full_lse);
      std::vector<double> logit(n, -INFINITY);
      double mx = -INFINITY;
      for (int e = 0; e < n; ++e) {
        if (!cache.attended(g, e)) continue;
        const float* k =
            cache.merged_key(g, e) ? cache.merged_key(g, e) : &t.k(cache.position(g, e), g, 0);
        logit[e] = att.scale() * dot(&t.q(s, h, 0), k, d);
        mx = std::max(mx, logit[e]);
        recall += full[cache.position(g, e)];
      }
      double sum = 0;
      for (int e = 0; e < n; ++e) sum += cache.attended(g, e) ? std::exp(logit[e] - mx) : 0.0;
      float* p = &out.probs[g][static_cast<std::size_t>(r) * n];
      for (int e = 0; e < n; ++e)
        p[e] = cache.attended(g, e) ? static_cast<float>(std::exp(logit[e] - mx) / sum) : 0.0f;
      if (!t.has_v()) continue;
      double vn = 0;  // Σ_j p_j ‖v_j‖
      for (int j = 0; j <= s; ++j)
        vn += full[j] * std::sqrt(dot(&t_ref.v(j, g, 0), &t_ref.v(j, g, 0), d));
      vnorm2 += vn * vn;
      for (int i = 0; i < d; ++i) {
        double o = 0, o_hat = 0;
        for (int j = 0; j <= s; ++j) o += full[j] * t_ref.v(j, g, i);
        for (int e = 0; e < n; ++e) {
          if (!cache.attended(g, e)) continue;
          const float* v = cache.merged_value(g, e) ? cache.merged_value(g, e)
                                                    : &t.v(cache.position(g, e), g, 0);
          o_hat += std::exp(logit[e] - mx) / sum * v[i];
        }
        err2 += (o - o_hat) * (o - o_hat);
        ref2 += o * o;
      }
    }
    metrics[g].cache_size = n;
    metrics[g].attended_size = cache.attended_size(g);
    metrics[g].mass_recall = static_cast<float>(recall / group);
    metrics[g].output_rel_error = t.has_v() ? static_cast<float>(std::sqrt(err2 / ref2)) : NAN;
    metrics[g].output_value_error = t.has_v() ? static_cast<float>(std::sqrt(err2 / vnorm2)) : NAN;
  }
}

}  // namespace

std::vector<LayerResult> reference_replay(const TraceReader& reader, const std::string& sample_name,
                                          const PolicyConfig& policy, int layers) {
  const SampleInfo sample = reader.read_sample(sample_name);
  const TraceInfo& info = reader.info();
  auto instance = policy.info->create(policy.params, known_before_decoding(sample));
  const int L = layers < 0 ? info.num_layers : std::min(layers, info.num_layers);
  SampleStats stats;
  const AttentionNeeds needs = policy.needs();
  if (needs.sample_entropies || !needs.sample_window_sums.empty())
    stats = compute_sample_stats(reader, sample, needs, 1, true);
  std::vector<LayerResult> out;
  for (int l = 0; l < L; ++l) {
    const LayerAttention att(LayerAttention::Naive{}, info, sample, reader.read_layer(sample, l),
                             policy.needs());
    const int src = policy.attention_source(l);
    std::unique_ptr<LayerAttention> heir;
    if (src != l) {
      LayerTensors mixed = reader.read_layer(sample, src);
      mixed.layer = l;
      mixed.v = att.tensors().v;
      heir = std::make_unique<LayerAttention>(LayerAttention::Naive{}, info, sample,
                                              std::move(mixed), policy.needs());
    }
    out.push_back(replay_layer(*instance, heir ? *heir : att, att, policy.info->lookahead, &stats,
                               dtype_bytes(sample.dtype), {}, {plain_step_attention, {}}));
    out.back().sample = sample_name;
  }
  return out;
}

}  // namespace kvsim
