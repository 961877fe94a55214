#include "policies/selection.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

namespace kvsim {

std::vector<std::uint8_t> keep_top_scores(std::span<const double> scores, int keep,
                                          std::span<const std::uint8_t> forced) {
  const int n = static_cast<int>(scores.size());
  std::vector<std::uint8_t> mask(n, 0);
  if (keep >= n) {
    std::fill(mask.begin(), mask.end(), 1);
    return mask;
  }
  std::vector<int> free;
  int kept = 0;
  for (int e = 0; e < n; ++e) {
    if (!forced.empty() && forced[e]) {
      mask[e] = 1;
      ++kept;
    } else {
      free.push_back(e);
    }
  }
  const int extra = std::max(0, keep - kept);
  if (extra == 0) return mask;
  // Strict total order: higher score first, then the later entry (newer position) first.
  auto better = [&](int a, int b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a > b;
  };
  if (extra < static_cast<int>(free.size()))
    std::nth_element(free.begin(), free.begin() + extra, free.end(), better);
  for (int i = 0; i < std::min<int>(extra, free.size()); ++i) mask[free[i]] = 1;
  return mask;
}

std::vector<int> top_positions(const std::vector<int>& positions, const std::vector<double>& score,
                               int k) {
  std::vector<double> s(positions.size());
  for (std::size_t i = 0; i < positions.size(); ++i) s[i] = score[positions[i]];
  const auto keep = keep_top_scores(s, k);
  std::vector<int> out;
  for (std::size_t i = 0; i < positions.size(); ++i)
    if (keep[i]) out.push_back(positions[i]);
  return out;
}

std::vector<std::uint8_t> sink_and_recent_mask(int n, int sinks, int recent) {
  std::vector<std::uint8_t> m(n, 0);
  for (int e = 0; e < std::min(n, sinks); ++e) m[e] = 1;
  for (int e = std::max(0, n - recent); e < n; ++e) m[e] = 1;
  return m;
}

std::vector<double> pool_max(std::span<const double> x, int kernel) {
  if (kernel < 1 || kernel % 2 == 0) throw std::invalid_argument("pooling kernel must be odd");
  const int n = static_cast<int>(x.size()), r = kernel / 2;
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) {
    double m = x[i];
    for (int j = std::max(0, i - r); j <= std::min(n - 1, i + r); ++j) m = std::max(m, x[j]);
    out[i] = m;
  }
  return out;
}

std::vector<double> pool_avg(std::span<const double> x, int kernel) {
  if (kernel < 1 || kernel % 2 == 0) throw std::invalid_argument("pooling kernel must be odd");
  const int n = static_cast<int>(x.size()), r = kernel / 2;
  std::vector<double> out(n);
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = std::max(0, i - r); j <= std::min(n - 1, i + r); ++j) s += x[j];
    out[i] = s / kernel;
  }
  return out;
}

}  // namespace kvsim
