#include "policies/merging.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace kvsim {

namespace {

// Rows of unit keys (raw keys divided by their norm; zero stays zero) of the given positions.
std::vector<float> unit_keys(const LayerView& view, int g, const std::vector<int>& pos, int d) {
  std::vector<float> out(pos.size() * d);
  for (std::size_t i = 0; i < pos.size(); ++i) {
    const float* k = view.key(pos[i], g);
    double norm = 0;
    for (int e = 0; e < d; ++e) norm += static_cast<double>(k[e]) * k[e];
    const float inv = norm > 0 ? static_cast<float>(1 / std::sqrt(norm)) : 0.0f;
    for (int e = 0; e < d; ++e) out[i * d + e] = k[e] * inv;
  }
  return out;
}

struct Member {
  int position;
  float similarity;
};

// `row(position)` gives the d floats of a key or a value.
template <typename Row>
std::vector<float> combine(Row row, int kept, const std::vector<Member>& members, int d,
                           MergeKind kind) {
  std::vector<double> sum(d);
  const float* xk = row(kept);
  for (int e = 0; e < d; ++e) sum[e] = xk[e];
  double denominator = 1;
  for (const Member& m : members) {
    // KVCache-Factory's weight: the cosine mapped to [0, 1], kept above 1e-6.
    const double w = std::max((1.0 + m.similarity) / 2, 1e-6);
    denominator += kind == MergeKind::kSimilarityWeighted ? w : 1.0;
    const float* xm = row(m.position);
    for (int e = 0; e < d; ++e) {
      const double xi = xm[e], xj = xk[e];
      sum[e] += kind == MergeKind::kAverage              ? xi
                : kind == MergeKind::kPivotal            ? (xi + xj) / 2
                : kind == MergeKind::kSimilarityWeighted ? w * xi
                                                         : m.similarity * xi;
    }
  }
  std::vector<float> out(d);
  for (int e = 0; e < d; ++e) out[e] = static_cast<float>(sum[e] / denominator);
  return out;
}

}  // namespace

void merge_unselected(const LayerView& view, KvCache& cache, int g,
                      const std::vector<std::uint8_t>& keep, MergeKind kind) {
  const int d = cache.head_dim();
  std::vector<int> kept, less;
  for (int e = 0; e < cache.size(g); ++e) (keep[e] ? kept : less).push_back(cache.position(g, e));
  if (less.empty()) return;
  if (kept.empty()) {  // nothing to merge into: plain eviction
    cache.keep_only(g, keep);
    return;
  }
  const std::vector<float> kk = unit_keys(view, g, kept, d), kl = unit_keys(view, g, less, d);
  std::vector<float> sim(less.size() * kept.size());
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(less.size()),
              static_cast<int>(kept.size()), d, 1.0f, kl.data(), d, kk.data(), d, 0.0f, sim.data(),
              static_cast<int>(kept.size()));
  std::vector<int> target(less.size());
  std::vector<std::vector<Member>> members(kept.size());
  for (std::size_t i = 0; i < less.size(); ++i) {
    const float* row = &sim[i * kept.size()];
    int best = 0;
    for (std::size_t j = 1; j < kept.size(); ++j)
      if (row[j] >= row[best]) best = static_cast<int>(j);  // ties: the newer kept entry
    target[i] = best;
    members[best].push_back({less[i], row[best]});
  }
  std::vector<std::vector<float>> merged_k(kept.size()), merged_v(kept.size());
  for (std::size_t j = 0; j < kept.size(); ++j) {
    if (members[j].empty()) continue;
    merged_k[j] = combine([&](int p) { return view.key(p, g); }, kept[j], members[j], d, kind);
    merged_v[j] = view.has_values() ? combine([&](int p) { return view.value(p, g); }, kept[j],
                                              members[j], d, kind)
                                    : std::vector<float>(d, 0.0f);
  }
  for (std::size_t i = 0; i < less.size(); ++i) {
    const auto& pos = cache.positions(g);
    const auto index = [&](int p) {
      return static_cast<int>(std::lower_bound(pos.begin(), pos.end(), p) - pos.begin());
    };
    cache.merge(g, index(less[i]), index(kept[target[i]]), merged_k[target[i]].data(),
                merged_v[target[i]].data());
  }
}

ParamSpec prompt_merge_param() {
  return {"merge",
          ParamType::kChoice,
          "none",
          "KVCache-Factory's --merge: none (evict), pivot ((k_j + Σ (k_i + k_j) / 2) / (n + 1)) or "
          "weighted ((k_j + Σ w_i k_i) / (1 + Σ w_i), w_i = (1 + cos) / 2): the prompt entries not "
          "kept join their most key-similar kept entry",
          0,
          0,
          {"none", "pivot", "weighted"}};
}

std::optional<MergeKind> read_prompt_merge(const ParamSet& p, const std::string& policy,
                                           const char* needs) {
  const std::string& m = p.get_string("merge");
  if (needs && m != "none")
    throw std::invalid_argument(policy + ": parameter 'merge' = " + m + " needs " + needs +
                                " (KVCache-Factory merges once, after the prompt)");
  if (m == "pivot") return MergeKind::kPivotal;
  if (m == "weighted") return MergeKind::kSimilarityWeighted;
  return std::nullopt;
}

bool merges_by_param(const ParamSet& p) {
  const auto it = p.values().find("merge");
  return it != p.values().end() && it->second != "none";
}

void keep_or_merge(const LayerView& view, KvCache& cache, int g,
                   const std::vector<std::uint8_t>& keep, std::optional<MergeKind> kind) {
  if (kind)
    merge_unselected(view, cache, g, keep, *kind);
  else
    cache.keep_only(g, keep);
}

}  // namespace kvsim
