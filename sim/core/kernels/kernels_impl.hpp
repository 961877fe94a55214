// The kernels of kernels.hpp as templates over an xsimd architecture; each kernels_<isa>.cpp
// instantiates them for its instruction set, compiled with that set's flags. Everything here has
// internal linkage, so no function compiled for a wider set can be picked by the linker for code
// that runs on a narrower one.
#pragma once

#include <cmath>
#include <xsimd/xsimd.hpp>

#include "sim/core/kernels/kernels.hpp"

namespace kvsim::kernels {
namespace {

template <class Arch>
float softmax_inplace(float* x, int n, float scale) {
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
  const batch bs(scale), bm(scale * mx);
  batch acc(0.0f);
  for (i = 0; i + W <= n; i += W) {
    const batch e = xsimd::exp(xsimd::fms(batch::load_unaligned(x + i), bs, bm));
    e.store_unaligned(x + i);
    acc += e;
  }
  double sum = xsimd::hadd(acc);
  for (; i < n; ++i) sum += x[i] = std::exp(x[i] * scale - scale * mx);
  const float inv = static_cast<float>(1.0 / sum);
  const batch binv(inv);
  for (i = 0; i + W <= n; i += W) (batch::load_unaligned(x + i) * binv).store_unaligned(x + i);
  for (; i < n; ++i) x[i] *= inv;
  return static_cast<float>(scale * mx + std::log(sum));
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

template <class Arch>
Table make_table(const char* name) {
  return {name, &softmax_inplace<Arch>, &accumulate<Arch>, &axpy<Arch>, &sum_of_squares<Arch>};
}

}  // namespace
}  // namespace kvsim::kernels
