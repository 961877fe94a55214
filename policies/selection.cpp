#include "policies/selection.hpp"

#include <algorithm>
#include <cmath>
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
  if (extra + 1 == static_cast<int>(free.size())) {
    // One to drop (a decode step's eviction): the worst in the same order, in one pass.
    const auto worst =
        std::min_element(free.begin(), free.end(), [&](int a, int b) { return better(b, a); });
    std::iter_swap(worst, free.end() - 1);
  } else if (extra < static_cast<int>(free.size())) {
    std::nth_element(free.begin(), free.begin() + extra, free.end(), better);
  }
  for (int i = 0; i < std::min<int>(extra, free.size()); ++i) mask[free[i]] = 1;
  return mask;
}

int lowest_score_entry(const std::vector<std::int32_t>& positions, const double* score,
                       int entries) {
  int worst = 0;
  double worst_score = score[positions[0]];
  for (int e = 1; e < entries; ++e) {
    const double s = score[positions[e]];
    if (s < worst_score) worst = e, worst_score = s;
  }
  return worst;
}

namespace {
// Text first: every text score lifted above the largest vision score, each order preserved.
std::vector<double> lift_text(std::span<const double> scores,
                              std::span<const std::uint8_t> is_text) {
  double top = 0, low = 0;
  for (std::size_t e = 0; e < scores.size(); ++e) {
    top = std::max(top, scores[e]);
    low = std::min(low, scores[e]);
  }
  std::vector<double> lifted(scores.begin(), scores.end());
  for (std::size_t e = 0; e < lifted.size(); ++e)
    if (is_text[e]) lifted[e] += (top - low) + 1;
  return lifted;
}
}  // namespace

std::vector<std::uint8_t> keep_text_prior(std::span<const double> scores,
                                          std::span<const std::uint8_t> is_text, int keep,
                                          std::span<const std::uint8_t> forced) {
  return keep_top_scores(lift_text(scores, is_text), keep, forced);
}

std::vector<std::uint8_t> keep_with_quotas(std::span<const double> scores,
                                           std::span<const std::uint8_t> is_text, int text_quota,
                                           int vision_quota) {
  std::vector<std::uint8_t> keep(scores.size(), 0);
  for (const bool text : {true, false}) {
    std::vector<std::size_t> idx;
    std::vector<double> s;
    for (std::size_t e = 0; e < scores.size(); ++e)
      if (static_cast<bool>(is_text[e]) == text) idx.push_back(e), s.push_back(scores[e]);
    const auto k = keep_top_scores(s, text ? text_quota : vision_quota);
    for (std::size_t i = 0; i < idx.size(); ++i) keep[idx[i]] = k[i];
  }
  return keep;
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

namespace {

// Hands `need` whole entries to the layers by the largest fractional part of `share`, on top of
// its floor (ties to the lower layer), up to `cap` each; returns the floors with them.
std::vector<int> round_by_largest_remainder(const std::vector<double>& share, long need, int cap) {
  const int L = static_cast<int>(share.size());
  std::vector<int> out(L);
  long given = 0;
  for (int l = 0; l < L; ++l) given += out[l] = static_cast<int>(std::floor(share[l] + 1e-9));
  std::vector<int> order(L);
  for (int l = 0; l < L; ++l) order[l] = l;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return share[a] - out[a] > share[b] - out[b]; });
  for (int l : order) {
    if (given >= need) break;
    if (out[l] < cap) ++out[l], ++given;
  }
  return out;
}

}  // namespace

std::vector<int> allocate_layer_budgets(const std::vector<double>& weights, long total, int cap,
                                        int floor) {
  const int L = static_cast<int>(weights.size());
  total = std::min<long>(total, static_cast<long>(cap) * L);
  floor = static_cast<int>(std::min<long>({floor, cap, L > 0 ? total / L : 0}));
  std::vector<double> share(L, 0.0);
  std::vector<std::uint8_t> fixed(L, 0);  // held at the cap or at the floor
  double left = static_cast<double>(total);
  for (bool changed = true; changed;) {  // each round fixes at least one layer or ends
    changed = false;
    double wsum = 0;
    for (int l = 0; l < L; ++l)
      if (!fixed[l]) wsum += weights[l];
    int free_layers = 0;
    for (int l = 0; l < L; ++l) free_layers += !fixed[l];
    for (int l = 0; l < L; ++l)
      if (!fixed[l]) share[l] = wsum > 0 ? weights[l] / wsum * left : left / free_layers;
    for (int l = 0; l < L; ++l)
      if (!fixed[l] && (share[l] > cap || share[l] < floor)) {
        share[l] = share[l] > cap ? cap : floor;
        fixed[l] = 1, left -= share[l];
        changed = true;
      }
  }
  return round_by_largest_remainder(share, total, cap);
}

void hold_layer_total(std::vector<int>& sizes, long total, int floor) {
  const int L = static_cast<int>(sizes.size());
  long sum = 0;
  for (int x : sizes) sum += x;
  if (sum <= total || L == 0) return;
  floor = std::max<long>(1, std::min<long>(floor, total / L));
  long room = 0;  // what the layers hold above the floor
  for (int x : sizes) room += std::max(0, x - floor);
  const long keep = std::max(0L, room - (sum - total));  // of the room, what stays
  std::vector<double> share(L);
  for (int l = 0; l < L; ++l)
    share[l] = room > 0 ? static_cast<double>(std::max(0, sizes[l] - floor)) * keep / room : 0.0;
  const std::vector<int> above = round_by_largest_remainder(share, keep, total);
  for (int l = 0; l < L; ++l) sizes[l] = std::min(sizes[l], floor + above[l]);
}

std::vector<double> text_prior_priority(std::span<const double> scores,
                                        std::span<const std::uint8_t> is_text,
                                        std::span<const std::uint8_t> forced) {
  std::vector<double> out = lift_text(scores, is_text);  // the very values keep_text_prior ranks
  if (!forced.empty())
    for (std::size_t e = 0; e < out.size(); ++e)
      if (forced[e]) out[e] = kUnscored;
  return out;
}

std::vector<std::vector<std::uint8_t>> keep_by_scores(
    const std::vector<std::vector<double>>& scores, int keep, double alpha,
    const std::vector<std::vector<std::uint8_t>>& forced) {
  if (alpha >= 0) return keep_head_adaptive(scores, keep, alpha, forced);
  std::vector<std::vector<std::uint8_t>> kept;
  for (std::size_t g = 0; g < scores.size(); ++g)
    kept.push_back(keep_top_scores(scores[g], keep, forced[g]));
  return kept;
}

std::vector<std::vector<std::uint8_t>> keep_head_adaptive(
    const std::vector<std::vector<double>>& scores, int keep, double alpha,
    const std::vector<std::vector<std::uint8_t>>& forced) {
  const int heads = static_cast<int>(scores.size());
  const int floor_n = static_cast<int>(alpha * keep);
  std::vector<std::vector<std::uint8_t>> kept(heads);
  long left = static_cast<long>(heads) * keep;
  struct Candidate {
    double score;
    int entry, head;
  };
  std::vector<Candidate> pool;
  for (int g = 0; g < heads; ++g) {
    const int forced_n =
        static_cast<int>(std::count(forced[g].begin(), forced[g].end(), std::uint8_t{1}));
    kept[g] = keep_top_scores(scores[g], forced_n + floor_n, forced[g]);
    left -= std::count(kept[g].begin(), kept[g].end(), std::uint8_t{1});
    for (int j = 0; j < static_cast<int>(scores[g].size()); ++j)
      if (!kept[g][j]) pool.push_back({scores[g][j], j, g});
  }
  const auto better = [](const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.entry != b.entry) return a.entry > b.entry;
    return a.head < b.head;
  };
  const std::size_t take = static_cast<std::size_t>(std::max(0L, left));
  if (take < pool.size()) std::nth_element(pool.begin(), pool.begin() + take, pool.end(), better);
  pool.resize(std::min(take, pool.size()));
  for (const auto& c : pool) kept[c.head][c.entry] = 1;
  return kept;
}

}  // namespace kvsim
