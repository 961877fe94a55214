#include "analysis/bootstrap.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "core/splitmix.hpp"

namespace kvsim {

double quantile_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return NAN;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

Interval bootstrap_ratio(const std::vector<double>& num, const std::vector<double>& den,
                         const BootstrapOptions& options) {
  if (num.size() != den.size()) throw std::invalid_argument("bootstrap: sizes differ");
  const std::size_t n = num.size();
  if (n < 2 || options.resamples < 1) return {};
  SplitMix64 draw(options.seed);
  std::vector<double> stats(options.resamples);
  for (double& s : stats) {
    double a = 0, b = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::size_t k = draw.below(n);
      a += num[k];
      b += den[k];
    }
    s = a / b;
  }
  std::sort(stats.begin(), stats.end());
  const double tail = (1 - options.level) / 2;
  return {quantile_sorted(stats, tail), quantile_sorted(stats, 1 - tail)};
}

Interval bootstrap_mean(const std::vector<double>& values, const BootstrapOptions& options) {
  return bootstrap_ratio(values, std::vector<double>(values.size(), 1.0), options);
}

CrossedBootstrap crossed_bootstrap(const std::vector<std::vector<double>>& d,
                                   const BootstrapOptions& options) {
  if (d.empty() || d[0].empty())
    throw std::invalid_argument("crossed bootstrap: no seeds or no items");
  CrossedBootstrap out;
  out.seeds = static_cast<int>(d.size());
  out.items = static_cast<int>(d[0].size());
  double total = 0;
  for (std::size_t s = 0; s < d.size(); ++s) {
    if (d[s].size() != d[0].size())
      throw std::invalid_argument("crossed bootstrap: seed " + std::to_string(s) + " has " +
                                  std::to_string(d[s].size()) + " items, seed 0 has " +
                                  std::to_string(d[0].size()) + " (every seed answers every item)");
    for (double x : d[s]) {
      if (!std::isfinite(x))
        throw std::invalid_argument("crossed bootstrap: seed " + std::to_string(s) +
                                    " has a value that is not a finite number");
      total += x;
    }
  }
  const std::size_t S = d.size(), n = d[0].size();
  out.mean = total / static_cast<double>(S * n);
  if (S < 2 || n < 2 || options.resamples < 1) return out;
  SplitMix64 draw(options.seed);
  std::vector<double> means(options.resamples);
  std::vector<std::size_t> seeds(S), items(n);
  long at_or_below = 0, at_or_above = 0;
  for (double& m : means) {
    for (auto& s : seeds) s = draw.below(S);
    for (auto& i : items) i = draw.below(n);
    double sum = 0;
    for (std::size_t s : seeds)
      for (std::size_t i : items) sum += d[s][i];
    m = sum / static_cast<double>(S * n);
    at_or_below += m <= 0;
    at_or_above += m >= 0;
  }
  out.standard_error = mean_sd(means).sd;
  std::sort(means.begin(), means.end());
  const double tail = (1 - options.level) / 2;
  out.interval = {quantile_sorted(means, tail), quantile_sorted(means, 1 - tail)};
  out.p_value = std::min(1.0, 2.0 * static_cast<double>(std::min(at_or_below, at_or_above) + 1) /
                                  static_cast<double>(options.resamples + 1));
  return out;
}

std::string interval_text(const Interval& i) {
  if (!i.valid()) return "-";
  char s[48];
  std::snprintf(s, sizeof s, "%.4f-%.4f", i.low, i.high);
  return s;
}

MeanSd mean_sd(const std::vector<double>& values) {
  MeanSd out;
  if (values.empty()) return out;
  double sum = 0;
  for (double v : values) sum += v;
  out.mean = sum / static_cast<double>(values.size());
  if (values.size() < 2) return out;
  double ss = 0;
  for (double v : values) ss += (v - out.mean) * (v - out.mean);
  out.sd = std::sqrt(ss / static_cast<double>(values.size() - 1));
  return out;
}

}  // namespace kvsim
