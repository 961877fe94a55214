#include "sim/replay/bounds.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvsim {

namespace {

// Group-mean full-cache attention of KV head g at step t on position j.
double group_mean(const LayerAttention& ref, int t, int g, int j) {
  const int group = ref.group_size();
  double s = 0;
  for (int r = 0; r < group; ++r) s += ref.decode_probs(t, g * group + r)[j];
  return s / group;
}

}  // namespace

double attention_decay_rate(const LayerAttention& ref, int g) {
  const int G = ref.gen_len(), P = ref.prompt_len();
  if (G < 2) return NAN;
  const double t_mean = (G - 1) / 2.0;
  double t_var = 0;
  for (int t = 0; t < G; ++t) t_var += (t - t_mean) * (t - t_mean);
  std::vector<double> rates;
  for (int j = 0; j < P; ++j) {
    double y_mean = 0;
    std::vector<double> y(G);
    for (int t = 0; t < G; ++t)
      y_mean += (y[t] = std::log(std::max(group_mean(ref, t, g, j), 1e-300))) / G;
    double cov = 0;
    for (int t = 0; t < G; ++t) cov += (t - t_mean) * (y[t] - y_mean);
    rates.push_back(1 - std::exp(cov / t_var));
  }
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

std::vector<TheoremCheck> check_theorem_2_1(const LayerAttention& ref, const LayerResult& result,
                                            double epsilon) {
  std::vector<TheoremCheck> out;
  for (std::size_t g = 0; g < result.evicted.size(); ++g) {
    TheoremCheck c;
    c.kv_head = static_cast<int>(g);
    std::vector<int> evicted;
    for (const auto& e : result.evicted[g])
      if (e.step == -1) evicted.push_back(e.position);
    c.evicted = static_cast<int>(evicted.size());
    c.lambda = attention_decay_rate(ref, c.kv_head);
    if (!evicted.empty() && ref.has_text_query_stats()) {
      c.attn_max = INFINITY;
      for (int j : evicted)
        c.attn_max = std::min<double>(c.attn_max, ref.text_query_column_max()[j]);
      if (c.lambda > 0 && c.lambda < 1 && c.attn_max > 0)
        c.k_bound = std::log(epsilon / c.attn_max) / std::log(1 - c.lambda);
      c.loss = 0;
      for (int t = 0; t < ref.gen_len(); ++t) {
        double mass = 0;
        for (int j : evicted) mass += group_mean(ref, t, c.kv_head, j);
        c.loss = std::max(c.loss, mass);
      }
    }
    out.push_back(c);
  }
  return out;
}

LayerCheck bounds_check(double epsilon) {
  char eps[32];
  std::snprintf(eps, sizeof eps, "%.17g", epsilon);
  return {
      .name = std::string("bounds epsilon=") + eps,
      .needs = [](const TraceInfo& t) { return AttentionNeeds{.text_query_layers = t.num_layers}; },
      .record_flushes = true,
      .check =
          [epsilon](const LayerAttention& measured, LayerResult& result) {
            result.theorem = check_theorem_2_1(measured, result, epsilon);
          }};
}

}  // namespace kvsim
