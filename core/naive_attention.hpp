// Plain attention in double precision, one dot product per query-key pair, no BLAS: the reference
// the fast paths are checked against (LayerAttention's Naive constructor, the reference replay).
#pragma once

#include <vector>

#include "traces/kvtrace.hpp"

namespace kvsim {

double naive_dot(const float* a, const float* b, int d);

// Softmax of scale·q·k_j over keys 0..n-1 of KV head g for query head h at position pos, in
// double; *lse receives its log-sum-exp when lse is given.
std::vector<double> naive_causal_row(const LayerTensors& t, int pos, int h, int g, int n,
                                     double scale, int d, double* lse);

}  // namespace kvsim
