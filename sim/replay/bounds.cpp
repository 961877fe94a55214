#include "sim/replay/bounds.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>

#include "core/csv_format.hpp"
#include "sim/run/result_files.hpp"

namespace kvsim {

namespace {

constexpr const char* kBoundsKey = "bounds";  // its record in LayerResult::checked

BoundsRecord& record_of(LayerResult& result) {
  std::any& slot = result.checked[kBoundsKey];
  if (!slot.has_value()) slot = BoundsRecord{};
  return std::any_cast<BoundsRecord&>(slot);
}

// Corollary 2.1's comparison at one decode step, for policies that expose their scores.
void record_flushes(const Policy& policy, int layer, int step,
                    const std::vector<std::vector<std::int32_t>>& before, const KvCache& cache,
                    LayerResult& result) {
  for (int g = 0; g < cache.kv_heads(); ++g) {
    const std::vector<double>* scores = policy.eviction_scores(layer, g);
    if (!scores) continue;  // this head has no scores; another may
    const auto& after = cache.positions(g);
    std::vector<std::int32_t> removed;
    std::set_difference(before[g].begin(), before[g].end(), after.begin(), after.end(),
                        std::back_inserter(removed));
    if (removed.empty()) continue;
    FlushEvent e{step, g, static_cast<int>(removed.size()), 0, 0};
    // Positions the policy never scored (beyond its vector) count as not removable by score.
    const auto score_at = [&](int p) {
      return static_cast<std::size_t>(p) < scores->size() ? (*scores)[p] : INFINITY;
    };
    for (int p : removed)
      if (std::isfinite(score_at(p))) e.realized += score_at(p);
    std::vector<double> held;
    for (int p : before[g]) held.push_back(score_at(p));
    std::partial_sort(held.begin(), held.begin() + e.removed, held.end());
    for (int i = 0; i < e.removed; ++i) e.greedy += held[i];
    record_of(result).flushes.push_back(e);
  }
}

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
      .after_decode = record_flushes,
      .check =
          [epsilon](const LayerAttention& measured, LayerResult& result) {
            record_of(result).theorem = check_theorem_2_1(measured, result, epsilon);
          }};
}

const BoundsRecord* bounds_record(const LayerResult& result) {
  const auto it = result.checked.find(kBoundsKey);
  return it == result.checked.end() ? nullptr : std::any_cast<BoundsRecord>(&it->second);
}

BoundsCsvWriter::BoundsCsvWriter(const std::string& path, const std::vector<PolicyConfig>& policies,
                                 double epsilon)
    : path_(path), epsilon_(epsilon) {
  for (const auto& p : policies) labels_.push_back(p.label);
  out_ = header();
}

const char* BoundsCsvWriter::header() {
  return "check,policy,sample,layer,kv_head,step,evicted,lambda,attn_max,k_bound,epsilon,loss,"
         "bound,premise,holds\n";
}

void BoundsCsvWriter::write(const LayerResult& r) {
  const std::string prefix = csv_quote(labels_[r.policy_index]) + "," + csv_quote(r.sample) + "," +
                             std::to_string(r.layer) + ",";
  const BoundsRecord* record = bounds_record(r);
  if (!record) return;
  for (const TheoremCheck& c : record->theorem) {
    if (c.evicted == 0) continue;  // nothing evicted at the prefill: the theorem says nothing
    const bool premise = !std::isnan(c.k_bound) && c.evicted <= c.k_bound;
    const bool holds = c.loss < epsilon_;
    out_ += "theorem_2_1," + prefix + std::to_string(c.kv_head) + ",," + std::to_string(c.evicted) +
            ",";
    for (double x : {c.lambda, c.attn_max, c.k_bound, epsilon_, c.loss, epsilon_}) {
      append_float(out_, x);
      out_ += ",";
    }
    out_ += std::string(premise ? "true" : "false") + "," + (holds ? "true" : "false") + "\n";
    ++theorem_rows;
    theorem_failures += premise && !holds;
  }
  for (const FlushEvent& e : record->flushes) {
    const bool holds = e.realized <= e.greedy + 1e-12;
    out_ += "corollary_2_1," + prefix + std::to_string(e.kv_head) + "," + std::to_string(e.step) +
            "," + std::to_string(e.removed) + ",,,,,";
    append_float(out_, e.realized);
    out_ += ",";
    append_float(out_, e.greedy);
    out_ += std::string(",true,") + (holds ? "true" : "false") + "\n";
    ++flushes;
    corollary_failures += !holds;
  }
}

void BoundsCsvWriter::close() {
  write_whole(path_, out_);
}

}  // namespace kvsim
