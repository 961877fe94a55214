// The kernels of kernels.hpp as templates over an xsimd architecture; each kernels_<isa>.cpp
// instantiates them for its instruction set, compiled with that set's flags. Everything here has
// internal linkage, so no function compiled for a wider set can be picked by the linker for code
// that runs on a narrower one.
#pragma once

#include <cmath>
#include <xsimd/xsimd.hpp>

#include "core/kernels/kernels.hpp"

namespace kvsim::kernels {
namespace {

// max x[0..n) (-inf when n = 0).
template <class Arch>
float max_of(const float* x, int n) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  float mx = -INFINITY;
  int i = 0;
  if (n >= W) {
    batch m = batch::load_unaligned(x);
    for (i = W; i + W <= n; i += W) m = xsimd::max(m, batch::load_unaligned(x + i));
    alignas(64) float lanes[W];
    m.store_aligned(lanes);
    for (float v : lanes) mx = mx < v ? v : mx;
  }
  for (; i < n; ++i) mx = mx < x[i] ? x[i] : mx;
  return mx;
}

// softmax_inplace, and with `sum` each probability also added to sum[i] in the pass that writes
// it (softmax_accumulate).
template <class Arch>
float softmax_into(float* x, int n, float scale, float* sum) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  const float mx = max_of<Arch>(x, n);
  int i = 0;
  const batch bs(scale), bm(scale * mx);
  batch acc(0.0f);
  for (i = 0; i + W <= n; i += W) {
    const batch e = xsimd::exp(xsimd::fms(batch::load_unaligned(x + i), bs, bm));
    e.store_unaligned(x + i);
    acc += e;
  }
  double total = xsimd::hadd(acc);
  for (; i < n; ++i) total += x[i] = std::exp(x[i] * scale - scale * mx);
  const float inv = static_cast<float>(1.0 / total);
  const batch binv(inv);
  if (sum == nullptr) {
    for (i = 0; i + W <= n; i += W) (batch::load_unaligned(x + i) * binv).store_unaligned(x + i);
    for (; i < n; ++i) x[i] *= inv;
  } else {
    for (i = 0; i + W <= n; i += W) {
      const batch p = batch::load_unaligned(x + i) * binv;
      p.store_unaligned(x + i);
      (batch::load_unaligned(sum + i) + p).store_unaligned(sum + i);
    }
    for (; i < n; ++i) sum[i] += x[i] *= inv;
  }
  return static_cast<float>(scale * mx + std::log(total));
}

template <class Arch>
float softmax_inplace(float* x, int n, float scale) {
  return softmax_into<Arch>(x, n, scale, nullptr);
}

template <class Arch>
float softmax_accumulate(float* x, int n, float scale, float* sum) {
  return softmax_into<Arch>(x, n, scale, sum);
}

template <class Arch>
void accumulate(float* acc, const float* x, int n) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  int i = 0;
  for (; i + W <= n; i += W)
    (batch::load_unaligned(acc + i) + batch::load_unaligned(x + i)).store_unaligned(acc + i);
  for (; i < n; ++i) acc[i] += x[i];
}

template <class Arch>
void axpy(float a, const float* x, float* y, int n) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  const batch ba(a);
  int i = 0;
  // With FMA available the compiler fuses the multiply and the add (C++'s default contraction).
  for (; i + W <= n; i += W)
    (batch::load_unaligned(y + i) + ba * batch::load_unaligned(x + i)).store_unaligned(y + i);
  for (; i < n; ++i) y[i] += a * x[i];
}

template <class Arch>
float sum_of_squares(const float* x, int n) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  batch acc(0.0f);
  int i = 0;
  for (; i + W <= n; i += W) {
    const batch b = batch::load_unaligned(x + i);
    acc += b * b;
  }
  float s = xsimd::hadd(acc);
  for (; i < n; ++i) s += x[i] * x[i];
  return s;
}

// Lanes at or past `valid` of a block: false.
template <class Arch>
xsimd::batch_bool<float, Arch> lanes_below(int valid) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  alignas(64) float index[W];
  for (int l = 0; l < W; ++l) index[l] = static_cast<float>(l);
  return batch::load_aligned(index) < batch(static_cast<float>(valid));
}

// Σ_d q[d]·kt[d][j..j+W): one block of a row's scores.
template <class Arch>
xsimd::batch<float, Arch> row_scores(const float* q, const float* kt, int stride, int dim, int j) {
  using batch = xsimd::batch<float, Arch>;
  batch s(0.0f);
  for (int d = 0; d < dim; ++d) s += batch(q[d]) * batch::load_unaligned(kt + d * stride + j);
  return s;
}

template <class Arch>
float attention_row(const float* q, const float* kt, const float* vt, int stride, int dim, int n,
                    float scale, float* p, float* out) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  const int blocks = (n + W - 1) / W;
  const batch bscale(scale), minus_inf(-INFINITY);
  batch m = minus_inf;
  for (int b = 0; b < blocks; ++b) {
    batch s = row_scores<Arch>(q, kt, stride, dim, b * W) * bscale;
    if (b == blocks - 1) s = xsimd::select(lanes_below<Arch>(n - b * W), s, minus_inf);
    s.store_unaligned(p + b * W);
    m = xsimd::max(m, s);
  }
  alignas(64) float lanes[W];
  m.store_aligned(lanes);
  float mx = -INFINITY;
  for (float v : lanes) mx = mx < v ? v : mx;
  const batch bm(mx);
  batch acc(0.0f);
  for (int b = 0; b < blocks; ++b) {
    const batch e = xsimd::exp(batch::load_unaligned(p + b * W) - bm);  // exp(-inf) = 0
    e.store_unaligned(p + b * W);
    acc += e;
  }
  const float sum = xsimd::hadd(acc), inv = 1.0f / sum;
  for (int d = 0; d < dim; ++d) {
    batch o(0.0f);
    for (int b = 0; b < blocks; ++b)
      o += batch::load_unaligned(p + b * W) * batch::load_unaligned(vt + d * stride + b * W);
    out[d] = xsimd::hadd(o) * inv;
  }
  return mx + std::log(sum);
}

template <class Arch>
void attention_row_backward(const float* q, const float* dout, float row_dot, float lse,
                            const float* kt, const float* vt, int stride, int dim, int n,
                            float scale, float* ds, float* dq, float* dkt, float* dvt) {
  using batch = xsimd::batch<float, Arch>;
  constexpr int W = static_cast<int>(batch::size);
  const int blocks = (n + W - 1) / W;
  const batch bscale(scale), blse(lse), brow(row_dot), zero(0.0f);
  for (int b = 0; b < blocks; ++b) {
    const int j = b * W;
    batch p = xsimd::exp(xsimd::fms(row_scores<Arch>(q, kt, stride, dim, j), bscale, blse));
    if (b == blocks - 1) p = xsimd::select(lanes_below<Arch>(n - j), p, zero);
    const batch g = p * (row_scores<Arch>(dout, vt, stride, dim, j) - brow);
    g.store_unaligned(ds + j);
    const batch gs = g * bscale;
    for (int d = 0; d < dim; ++d) {
      float* k = dkt + d * stride + j;
      float* v = dvt + d * stride + j;
      (batch::load_unaligned(k) + batch(q[d]) * gs).store_unaligned(k);
      (batch::load_unaligned(v) + batch(dout[d]) * p).store_unaligned(v);
    }
  }
  for (int d = 0; d < dim; ++d) {
    batch a(0.0f);
    for (int b = 0; b < blocks; ++b)
      a += batch::load_unaligned(ds + b * W) * batch::load_unaligned(kt + d * stride + b * W);
    dq[d] = scale * xsimd::hadd(a);
  }
}

// The row softmax of the prompt entropies (core/sample_stats.cpp), in float64: y_j = scale·x_j −
// scale·max x, e_j = exp(y_j), z = Σ e_j; the probabilities e_j / z added to sum[j] (or, with sum
// null, written over e); returns the row's entropy log z − Σ e_j·y_j / z. Vector exponentials:
// glibc's scalar exp was about a third of the compaction with entropies.
template <class Arch>
double softmax_entropy(const float* x, int n, double scale, double* e, double* sum) {
  using dbatch = xsimd::batch<double, Arch>;
  constexpr int D = static_cast<int>(dbatch::size);
  const double mx = scale * max_of<Arch>(x, n);  // scale > 0: the largest y is 0
  int j = 0;
  const dbatch bs(scale), bm(mx);
  dbatch bz(0.0), bzy(0.0);
  for (j = 0; j + D <= n; j += D) {
    const dbatch y = dbatch::load_unaligned(x + j) * bs - bm;
    const dbatch ey = xsimd::exp(y);
    ey.store_unaligned(e + j);
    bz += ey;
    bzy += ey * y;
  }
  double z = xsimd::hadd(bz), zy = xsimd::hadd(bzy);
  for (; j < n; ++j) {
    const double y = scale * x[j] - mx;
    e[j] = std::exp(y);
    z += e[j];
    zy += e[j] * y;
  }
  const double inv = 1.0 / z;
  const dbatch binv(inv);
  if (sum == nullptr) {
    for (j = 0; j + D <= n; j += D) (dbatch::load_unaligned(e + j) * binv).store_unaligned(e + j);
    for (; j < n; ++j) e[j] *= inv;
  } else {
    for (j = 0; j + D <= n; j += D)
      (dbatch::load_unaligned(sum + j) + dbatch::load_unaligned(e + j) * binv)
          .store_unaligned(sum + j);
    for (; j < n; ++j) sum[j] += e[j] * inv;
  }
  return std::log(z) - zy * inv;
}

template <class Arch>
Table make_table(const char* name) {
  static_assert(xsimd::batch<float, Arch>::size <= kAttentionLanes);
  return {name,
          &softmax_inplace<Arch>,
          &softmax_accumulate<Arch>,
          &accumulate<Arch>,
          &axpy<Arch>,
          &sum_of_squares<Arch>,
          &attention_row<Arch>,
          &attention_row_backward<Arch>,
          &softmax_entropy<Arch>};
}

}  // namespace
}  // namespace kvsim::kernels
