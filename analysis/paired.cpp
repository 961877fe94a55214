#include "analysis/paired.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "core/splitmix.hpp"

namespace kvsim {

double mcnemar_exact_p(long b, long c) {
  const long n = b + c;
  if (n == 0) return 1.0;
  const long k = std::min(b, c);
  // Σ_{i <= k} C(n, i) / 2^n in logs (n may be in the thousands).
  double tail = 0;
  for (long i = 0; i <= k; ++i)
    tail += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) -
                     n * std::log(2.0));
  return std::min(1.0, 2 * tail);
}

double sign_flip_p(const std::vector<double>& d, const PairedOptions& options) {
  const std::size_t n = d.size();
  if (n == 0) return 1.0;
  const double observed = std::fabs(std::accumulate(d.begin(), d.end(), 0.0));
  double scale = 0;
  for (double x : d) scale += std::fabs(x);
  const double reach = observed - 1e-12 * scale;  // a pattern equal to the observed one counts
  if (n <= static_cast<std::size_t>(options.exact_up_to)) {
    long hits = 0;
    const std::uint64_t patterns = std::uint64_t{1} << n;
    for (std::uint64_t m = 0; m < patterns; ++m) {
      double s = 0;
      for (std::size_t i = 0; i < n; ++i) s += (m >> i) & 1 ? -d[i] : d[i];
      hits += std::fabs(s) >= reach;
    }
    return static_cast<double>(hits) / static_cast<double>(patterns);
  }
  SplitMix64 draw(options.bootstrap.seed ^ 0x5157u);
  long hits = 0;
  for (int r = 0; r < options.permutations; ++r) {
    double s = 0;
    std::uint64_t bits = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (i % 64 == 0) bits = draw.next();
      s += (bits >> (i % 64)) & 1 ? -d[i] : d[i];
    }
    hits += std::fabs(s) >= reach;
  }
  return (1.0 + hits) / (1.0 + options.permutations);
}

double normal_quantile(double p) {
  if (!(p > 0 && p < 1)) throw std::invalid_argument("normal_quantile: p must be in (0, 1)");
  // Bisection on the CDF Φ(x) = erfc(−x/√2)/2, to double precision.
  double lo = -40, hi = 40;
  for (int i = 0; i < 200 && hi - lo > 1e-15; ++i) {
    const double mid = (lo + hi) / 2;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

PairedComparison compare_paired(const std::string& label, const std::vector<double>& values,
                                const std::string& reference_label,
                                const std::vector<double>& reference,
                                const PairedOptions& options) {
  if (values.size() != reference.size())
    throw std::invalid_argument("compare: " + label + " and " + reference_label +
                                " have different numbers of samples");
  PairedComparison c;
  c.label = label;
  c.reference = reference_label;
  std::vector<double> v, r, d;
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isnan(values[i]) && !std::isnan(reference[i])) {
      v.push_back(values[i]);
      r.push_back(reference[i]);
      d.push_back(values[i] - reference[i]);
    }
  c.n = static_cast<long>(d.size());
  if (c.n == 0) {
    c.verdict = "no difference shown";
    return c;
  }
  const auto is01 = [](double x) { return x == 0.0 || x == 1.0; };
  c.binary = std::all_of(v.begin(), v.end(), is01) && std::all_of(r.begin(), r.end(), is01);
  c.mean = mean_sd(v).mean;
  c.reference_mean = mean_sd(r).mean;
  const MeanSd diff = mean_sd(d);
  c.difference = diff.mean;
  c.interval = bootstrap_mean(d, options.bootstrap);
  long above = 0, below = 0;
  for (double x : d) above += x > 0, below += x < 0;
  c.ties = c.n - above - below;
  c.wins = options.higher_is_better ? above : below;
  c.losses = options.higher_is_better ? below : above;
  if (diff.sd > 0) {
    c.effect_size = diff.mean / diff.sd;
    c.detectable = (normal_quantile(1 - options.alpha / 2) + normal_quantile(options.power)) *
                   diff.sd / std::sqrt(static_cast<double>(c.n));
  }
  c.p_value = c.binary ? mcnemar_exact_p(above, below) : sign_flip_p(d, options);
  c.p_holm = c.p_value;
  c.verdict = "no difference shown";
  return c;
}

void holm_adjust(std::vector<PairedComparison>& family, const PairedOptions& options) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < family.size(); ++i)
    if (!std::isnan(family[i].p_value)) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return family[a].p_value < family[b].p_value;
  });
  const double m = static_cast<double>(order.size());
  double running = 0;
  for (std::size_t k = 0; k < order.size(); ++k) {
    PairedComparison& c = family[order[k]];
    running = std::max(running, std::min(1.0, (m - static_cast<double>(k)) * c.p_value));
    c.p_holm = running;
  }
  for (PairedComparison& c : family) {
    const bool shown = !std::isnan(c.p_holm) && c.p_holm < options.alpha && c.difference != 0;
    const bool higher = c.difference > 0;
    c.verdict = !shown                               ? "no difference shown"
                : higher == options.higher_is_better ? "better"
                                                     : "worse";
  }
}

}  // namespace kvsim
