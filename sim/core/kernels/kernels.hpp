// Vector kernels of the replay's own loops (BLAS does the products), compiled once per x86
// instruction set and chosen at run time, so one binary runs on every x86-64 machine of a cluster
// and uses the widest vector units each one has (AVX-512, AVX2 + FMA, else the baseline: SSE2 on
// x86-64; other targets get only the baseline, xsimd's widest set under the default flags).
#pragma once

#include <string>
#include <vector>

namespace kvsim::kernels {

// One instruction set's kernels. Contract of each: the scalar loop in its comment, with rounding
// that may differ between instruction sets (lane count, fused multiply-add) but never between runs.
struct Table {
  const char* name;  // "baseline", "avx2", "avx512"
  // x[i] = exp(scale·x[i] - m) / Σ, m = scale·max x; returns log Σ_i exp(scale·x[i]).
  float (*softmax_inplace)(float* x, int n, float scale);
  // acc[i] += x[i]
  void (*accumulate)(float* acc, const float* x, int n);
  // y[i] += a·x[i]
  void (*axpy)(float a, const float* x, float* y, int n);
  // Σ x[i]²
  float (*sum_of_squares)(const float* x, int n);
};

// The kernels in use: the widest instruction set this CPU and its OS support, or the one named by
// the environment variable KVSIM_SIMD (baseline, avx2, avx512), which must be supported.
const Table& active();
// Every instruction set this CPU supports, narrowest first (tests compare them).
std::vector<const Table*> supported();
// The instruction sets this binary was built with, narrowest first.
std::vector<std::string> compiled();

}  // namespace kvsim::kernels
