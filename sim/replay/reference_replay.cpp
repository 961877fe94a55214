#include "sim/replay/reference_replay.hpp"

#include <cmath>

#include "core/naive_attention.hpp"

namespace kvsim {

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
      const auto full = naive_causal_row(t_ref, s, h, g, s + 1, att.scale(), d, &full_lse);
      std::vector<double> logit(n, -INFINITY);
      double mx = -INFINITY;
      for (int e = 0; e < n; ++e) {
        if (!cache.attended(g, e)) continue;
        const float* k =
            cache.merged_key(g, e) ? cache.merged_key(g, e) : &t.k(cache.position(g, e), g, 0);
        logit[e] = att.scale() * naive_dot(&t.q(s, h, 0), k, d);
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
        vn += full[j] * std::sqrt(naive_dot(&t_ref.v(j, g, 0), &t_ref.v(j, g, 0), d));
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
