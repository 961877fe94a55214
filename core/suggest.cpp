#include "core/suggest.hpp"

#include <algorithm>

namespace kvsim {

namespace {

// Optimal string alignment distance (Damerau-Levenshtein without reused substrings).
int edit_distance(const std::string& a, const std::string& b) {
  const std::size_t n = a.size(), m = b.size();
  std::vector<std::vector<int>> d(n + 1, std::vector<int>(m + 1));
  for (std::size_t i = 0; i <= n; ++i) d[i][0] = static_cast<int>(i);
  for (std::size_t j = 0; j <= m; ++j) d[0][j] = static_cast<int>(j);
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

}  // namespace

std::string nearest_name(const std::string& given, const std::vector<std::string>& known) {
  std::string best;
  int best_distance = 0;
  for (const auto& name : known) {
    if (name == given) continue;
    const int limit = std::max<int>(1, std::max(given.size(), name.size()) / 3);
    const int distance = edit_distance(given, name);
    if (distance <= limit && (best.empty() || distance < best_distance)) {
      best = name;
      best_distance = distance;
    }
  }
  return best;
}

std::string did_you_mean(const std::string& given, const std::vector<std::string>& known) {
  const std::string nearest = nearest_name(given, known);
  return nearest.empty() ? "" : " (did you mean '" + nearest + "'?)";
}

}  // namespace kvsim
