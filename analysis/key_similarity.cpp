#include "analysis/key_similarity.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/parallel.hpp"

namespace kvsim {

namespace {

// Rows of x [P, heads, d] for head g, scaled to unit norm (zero rows stay zero), as [P, d].
std::vector<float> unit_rows(const xt::xtensor<float, 3>& x, int g, int P) {
  const int d = static_cast<int>(x.shape(2));
  std::vector<float> out(static_cast<std::size_t>(P) * d);
  for (int i = 0; i < P; ++i) {
    const float* r = &x(i, g, 0);
    double n2 = 0;
    for (int e = 0; e < d; ++e) n2 += static_cast<double>(r[e]) * r[e];
    const double inv = n2 > 0 ? 1 / std::sqrt(n2) : 0.0;
    for (int e = 0; e < d; ++e)
      out[static_cast<std::size_t>(i) * d + e] = static_cast<float>(r[e] * inv);
  }
  return out;
}

std::vector<float> gram(const std::vector<float>& u, int P, int d) {
  std::vector<float> s(static_cast<std::size_t>(P) * P);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, P, P, d, 1.0f, u.data(), d, u.data(), d,
              0.0f, s.data(), P);
  return s;
}

// Running sums of a Pearson correlation.
struct Pearson {
  double n = 0, x = 0, y = 0, xx = 0, yy = 0, xy = 0;
  void add(double a, double b) { n += 1, x += a, y += b, xx += a * a, yy += b * b, xy += a * b; }
  void add(const Pearson& o) { n += o.n, x += o.x, y += o.y, xx += o.xx, yy += o.yy, xy += o.xy; }
  double value() const {
    const double cx = xx - x * x / n, cy = yy - y * y / n, cxy = xy - x * y / n;
    return n >= 2 && cx > 0 && cy > 0 ? cxy / std::sqrt(cx * cy) : NAN;
  }
};

struct HeadResult {
  std::vector<double> nearest[2];
  Pearson pearson[2];
};

}  // namespace

KeySimilarity key_similarity(const TraceInfo& trace, const SampleInfo& sample,
                             const LayerTensors& t, int threads) {
  const int P = sample.prompt_len, Hkv = trace.num_kv_heads, d = trace.head_dim;
  std::vector<HeadResult> heads(Hkv);
  openblas_set_num_threads(1);
  parallel_for(Hkv, threads, [&](int g) {
    const std::vector<float> sk = gram(unit_rows(t.k, g, P), P, d);
    const std::vector<float> sv =
        t.has_v() ? gram(unit_rows(t.v, g, P), P, d) : std::vector<float>{};
    HeadResult& r = heads[g];
    for (int i = 0; i < P; ++i) {
      const int mi = sample.modality[i] != 0;
      const float* row = &sk[static_cast<std::size_t>(i) * P];
      double best = -INFINITY;
      for (int j = 0; j < P; ++j)
        if (j != i) best = std::max(best, static_cast<double>(row[j]));
      if (P > 1) r.nearest[mi].push_back(best);
      if (sv.empty()) continue;
      for (int j = i + 1; j < P; ++j)
        if ((sample.modality[j] != 0) == mi)
          r.pearson[mi].add(row[j], sv[static_cast<std::size_t>(i) * P + j]);
    }
  });
  KeySimilarity out;
  for (int m = 0; m < 2; ++m) {
    Pearson total;
    for (const HeadResult& r : heads) {
      out.nearest[m].insert(out.nearest[m].end(), r.nearest[m].begin(), r.nearest[m].end());
      total.add(r.pearson[m]);
    }
    out.key_value_correlation[m] = t.has_v() ? total.value() : NAN;
  }
  return out;
}

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = q * (v.size() - 1);
  const std::size_t lo = static_cast<std::size_t>(std::floor(pos));
  const std::size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - lo) * (v[hi] - v[lo]);
}

}  // namespace kvsim
