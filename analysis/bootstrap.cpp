#include "analysis/bootstrap.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "sim/core/splitmix.hpp"

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
