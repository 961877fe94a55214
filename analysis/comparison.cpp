#include "analysis/comparison.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <stdexcept>

#include "sim/core/csv_format.hpp"
#include "sim/core/run_labels.hpp"

namespace kvsim {

int SampleTable::index(const std::string& policy) const {
  const auto it = std::find(policies.begin(), policies.end(), policy);
  return it == policies.end() ? -1 : static_cast<int>(it - policies.begin());
}

SampleTable per_sample_values(const std::vector<std::string>& policy,
                              const std::vector<std::string>& sample,
                              const std::vector<double>& value, const std::vector<double>& weight,
                              bool pool_seeds) {
  if (policy.size() != sample.size() || value.size() != sample.size() ||
      (!weight.empty() && weight.size() != sample.size()))
    throw std::invalid_argument("compare: the columns differ in length");
  // (run label, sample) -> Σ w·v, Σ w
  std::map<std::pair<std::string, std::string>, std::pair<double, double>> sums;
  std::vector<std::string> runs;
  for (std::size_t i = 0; i < policy.size(); ++i) {
    if (sample[i] == "all" || std::isnan(value[i])) continue;
    const double w = weight.empty() || std::isnan(weight[i]) ? 1.0 : weight[i];
    auto& s = sums[{policy[i], sample[i]}];
    s.first += w * value[i];
    s.second += w;
    if (std::find(runs.begin(), runs.end(), policy[i]) == runs.end()) runs.push_back(policy[i]);
  }
  SampleTable t;
  for (const auto& [key, _] : sums)
    if (std::find(t.samples.begin(), t.samples.end(), key.second) == t.samples.end())
      t.samples.push_back(key.second);
  std::sort(t.samples.begin(), t.samples.end());
  std::map<std::string, std::size_t> sample_index;
  for (std::size_t i = 0; i < t.samples.size(); ++i) sample_index[t.samples[i]] = i;
  // A seed group's value on a sample: the mean over its runs that have one.
  std::vector<std::vector<double>> total, count;
  for (const std::string& run : runs) {
    const std::string group = pool_seeds ? seed_group_of(run) : "";
    const std::string name = group.empty() ? run : group;
    int p = t.index(name);
    if (p < 0) {
      p = static_cast<int>(t.policies.size());
      t.policies.push_back(name);
      t.seeds.push_back(0);
      total.emplace_back(t.samples.size(), 0.0);
      count.emplace_back(t.samples.size(), 0.0);
    }
    ++t.seeds[p];
    double run_total = 0, run_count = 0;
    for (const auto& [key, s] : sums) {
      if (key.first != run || s.second <= 0) continue;
      const std::size_t j = sample_index.at(key.second);
      total[p][j] += s.first / s.second;
      count[p][j] += 1;
      run_total += s.first / s.second;
      run_count += 1;
    }
    if (t.run_means.size() <= static_cast<std::size_t>(p)) t.run_means.resize(p + 1);
    t.run_means[p].push_back(run_count > 0 ? run_total / run_count : NAN);
  }
  for (std::size_t p = 0; p < t.policies.size(); ++p) {
    t.values.emplace_back(t.samples.size(), NAN);
    for (std::size_t j = 0; j < t.samples.size(); ++j)
      if (count[p][j] > 0) t.values[p][j] = total[p][j] / count[p][j];
  }
  return t;
}

MeanSummary summarize(const SampleTable& table, int policy, const BootstrapOptions& options) {
  MeanSummary out;
  if (policy < 0) return out;  // no value in the table
  std::vector<double> values;
  for (double v : table.values.at(policy))
    if (!std::isnan(v)) values.push_back(v);
  out.n = static_cast<long>(values.size());
  out.mean = mean_sd(values).mean;
  out.interval = bootstrap_mean(values, options);
  if (table.seeds.at(policy) > 1) out.seed_sd = mean_sd(table.run_means.at(policy)).sd;
  return out;
}

std::optional<bool> higher_is_better(const std::string& metric) {
  auto has = [&](const char* word) { return metric.find(word) != std::string::npos; };
  for (const char* lower : {"error", "kl", "nll", "ppl", "miss", "evicted", "regret", "bytes",
                            "cache_size", "kv_fraction", "ms_per_token"})
    if (has(lower)) return false;
  for (const char* higher : {"recall", "answer", "accuracy", "agree", "match", "hit_", "overlap",
                             "loglik", "contains", "exact"})
    if (has(higher)) return true;
  return std::nullopt;
}

ComparisonTable compare_to_reference(const SampleTable& table, const std::string& metric,
                                     const std::string& reference,
                                     const std::vector<std::string>& policies,
                                     const PairedOptions& options) {
  auto known = [&] {
    std::string s;
    for (const auto& p : table.policies) s += (s.empty() ? "" : ", ") + p;
    return s;
  };
  const int ref = table.index(reference);
  if (ref < 0)
    throw std::invalid_argument("compare: no reference '" + reference + "' among the policies (" +
                                known() + ")");
  ComparisonTable out{metric, reference, options.higher_is_better, {}};
  std::vector<std::string> names = policies;
  if (names.empty())
    for (const auto& p : table.policies)
      if (p != reference) names.push_back(p);
  for (const std::string& name : names) {
    const int p = table.index(name);
    if (p < 0)
      throw std::invalid_argument("compare: no policy '" + name + "' (the table has: " + known() +
                                  ")");
    if (p == ref) continue;
    out.rows.push_back(
        compare_paired(name, table.values[p], reference, table.values[ref], options));
  }
  holm_adjust(out.rows, options);
  return out;
}

namespace {

std::string number(double x, const char* format = "%.9g") {
  if (std::isnan(x)) return "";
  char s[48];
  std::snprintf(s, sizeof s, format, x);
  return s;
}

}  // namespace

std::string comparison_csv(const ComparisonTable& t) {
  std::string out =
      "policy,reference,metric,higher_is_better,n,test,mean,reference_mean,difference,ci_low,"
      "ci_high,wins,ties,losses,effect_size,p_value,p_holm,detectable,verdict\n";
  for (const PairedComparison& c : t.rows) {
    out += csv_quote(c.label) + "," + csv_quote(c.reference) + "," + csv_quote(t.metric) + "," +
           (t.higher_is_better ? "1" : "0") + "," + std::to_string(c.n) + "," +
           (c.binary ? "mcnemar" : "sign_flip");
    for (double x : {c.mean, c.reference_mean, c.difference, c.interval.low, c.interval.high})
      out += "," + number(x);
    out += "," + std::to_string(c.wins) + "," + std::to_string(c.ties) + "," +
           std::to_string(c.losses);
    for (double x : {c.effect_size, c.p_value, c.p_holm, c.detectable}) out += "," + number(x);
    out += "," + c.verdict + "\n";
  }
  return out;
}

std::string comparison_text(const ComparisonTable& t, const PairedOptions& options) {
  std::size_t w = 14;
  for (const auto& c : t.rows) w = std::max(w, c.label.size());
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line,
                "%s (%s is better) against %s: paired over samples, 95%% bootstrap interval of "
                "the difference, Holm over %zu comparison(s) at alpha %.3g\n",
                t.metric.c_str(), t.higher_is_better ? "higher" : "lower", t.reference.c_str(),
                t.rows.size(), options.alpha);
  out += line;
  std::snprintf(line, sizeof line, "%-*s %5s %9s %9s %9s %21s %13s %7s %9s %9s %10s  %s\n",
                static_cast<int>(w), "policy", "n", "mean", "ref", "diff", "diff_95%",
                "win/tie/loss", "d_z", "p", "p_holm", "detectable", "verdict");
  out += line;
  for (const PairedComparison& c : t.rows) {
    const std::string interval = c.interval.valid() ? number(c.interval.low, "%.4f") + " to " +
                                                          number(c.interval.high, "%.4f")
                                                    : "-";
    const std::string wtl =
        std::to_string(c.wins) + "/" + std::to_string(c.ties) + "/" + std::to_string(c.losses);
    std::snprintf(
        line, sizeof line, "%-*s %5ld %9.4f %9.4f %+9.4f %21s %13s %7s %9.3g %9.3g %10s  %s\n",
        static_cast<int>(w), c.label.c_str(), c.n, c.mean, c.reference_mean, c.difference,
        interval.c_str(), wtl.c_str(),
        std::isnan(c.effect_size) ? "-" : number(c.effect_size, "%+.2f").c_str(), c.p_value,
        c.p_holm, std::isnan(c.detectable) ? "-" : number(c.detectable, "%.4f").c_str(),
        c.verdict.c_str());
    out += line;
  }
  out +=
      "verdict: better / worse than the reference where Holm's adjusted p < alpha, else no "
      "difference shown (never an order); detectable: the smallest difference n samples detect "
      "with 80% power\n";
  return out;
}

}  // namespace kvsim
