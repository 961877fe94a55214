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
  // softmax_inplace, then sum[i] += x[i]: the same bytes, the row read once less.
  float (*softmax_accumulate)(float* x, int n, float scale, float* sum);
  // acc[i] += x[i]
  void (*accumulate)(float* acc, const float* x, int n);
  // y[i] += a·x[i]
  void (*axpy)(float a, const float* x, float* y, int n);
  // Σ x[i]²
  float (*sum_of_squares)(const float* x, int n);

  // One query row of causal attention (core/causal_attention.hpp) over its n keys and values,
  // stored transposed: kt[d·stride + j], vt likewise, readable (and, in the backward, writable)
  // up to column n rounded up to the lane count; p: scratch of that many floats.
  // Forward: p_j = softmax_j(scale·Σ_d q[d]·kt[d][j]), out[d] = Σ_j p_j·vt[d][j]; returns the log
  // of the softmax's denominator, log Σ_j exp(scale·q·k_j).
  float (*attention_row)(const float* q, const float* kt, const float* vt, int stride, int dim,
                         int n, float scale, float* p, float* out);
  // Backward, given lse (the forward's return) and row_dot = Σ_d dout[d]·out[d]:
  // p_j = exp(scale·q·k_j − lse), ds_j = p_j·(Σ_d dout[d]·vt[d][j] − row_dot);
  // dq[d] = scale·Σ_j ds_j·kt[d][j], dkt[d][j] += scale·q[d]·ds_j, dvt[d][j] += dout[d]·p_j.
  void (*attention_row_backward)(const float* q, const float* dout, float row_dot, float lse,
                                 const float* kt, const float* vt, int stride, int dim, int n,
                                 float scale, float* ds, float* dq, float* dkt, float* dvt);

  // A row's softmax and entropy in float64 (the prompt entropies): y_j = scale·x_j − scale·max x,
  // e_j = exp(y_j), z = Σ_j e_j; e_j / z added to sum[j], or written to e[j] when sum is null
  // (e: scratch of n doubles); returns log z − Σ_j e_j·y_j / z. n ≥ 1, scale > 0.
  double (*softmax_entropy)(const float* x, int n, double scale, double* e, double* sum);
};

// The lane count every Table's attention rows may read and write past n (the widest set's).
constexpr int kAttentionLanes = 16;

// The kernels in use: the widest instruction set this CPU and its OS support, or the one named by
// the environment variable KVSIM_SIMD (baseline, avx2, avx512), which must be supported.
const Table& active();
// Every instruction set this CPU supports, narrowest first (tests compare them).
std::vector<const Table*> supported();
// The instruction sets this binary was built with, narrowest first.
std::vector<std::string> compiled();

}  // namespace kvsim::kernels
