#include "sim/replay/output_error.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "core/parallel.hpp"
#include "sim/replay/engine.hpp"

namespace kvsim {

namespace {
// Steps per GEMM: with 64 (the demo's whole generation) the union grows by at most the generated
// tokens, and the values are gathered once per layer rather than once per 16 steps (measured
// faster on the demo than 16 or 32).
constexpr int kBlockSteps = 64;
}  // namespace

void DeferredOutputError::add(int step, int g, bool complement, const std::int32_t* positions,
                              int n, const double* scales, double ref2, double vnorm2) {
  Head& head = heads_[g];
  const int group = ref_.group_size();
  head.rows.push_back(
      {step, n, complement, head.positions.size(), head.scales.size(), ref2, vnorm2});
  head.positions.insert(head.positions.end(), positions, positions + n);
  head.scales.insert(head.scales.end(), scales, scales + group);
}

void DeferredOutputError::finish(std::vector<std::vector<StepMetrics>>& steps) const {
  const int Hkv = static_cast<int>(heads_.size()), threads = std::max(1, std::min(threads_, Hkv));
  // Heads in contiguous ranges, one per thread; each range reuses its scratch for every block.
  parallel_for(threads, threads, [&](int t) {
    Scratch scratch;
    for (int g = Hkv * t / threads; g < Hkv * (t + 1) / threads; ++g) {
      const auto& rows = heads_[g].rows;
      for (std::size_t b = 0; b < rows.size(); b += kBlockSteps) {
        const auto count = std::min<std::size_t>(kBlockSteps, rows.size() - b);
        finish_block(g, &rows[b], static_cast<int>(count), scratch, steps);
      }
    }
  });
}

void DeferredOutputError::finish_block(int g, const Row* rows, int count, Scratch& scratch,
                                       std::vector<std::vector<StepMetrics>>& steps) const {
  gather_columns(g, rows, count, scratch);
  fill_weights(g, rows, count, scratch);
  const int u = static_cast<int>(scratch.columns.size()), m = count * ref_.group_size(),
            d = ref_.head_dim();
  std::vector<float>& o_hat = scratch.o_hat;
  o_hat.assign(static_cast<std::size_t>(m) * d, 0.0f);  // the result when nothing is listed
  if (u > 0)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, u, 1.0f, scratch.weights.data(), u,
                scratch.values.data(), d, 0.0f, o_hat.data(), d);
  write_errors(g, rows, count, scratch, steps);
}

void DeferredOutputError::gather_columns(int g, const Row* rows, int count,
                                         Scratch& scratch) const {
  const Head& head = heads_[g];
  const int d = ref_.head_dim(), T = ref_.total_len();
  constexpr std::int32_t kListed = -2;
  std::vector<std::int32_t>& column_of = scratch.column_of;
  column_of.assign(T, -1);
  for (int b = 0; b < count; ++b)
    for (int e = 0; e < rows[b].n; ++e) column_of[head.positions[rows[b].positions + e]] = kListed;
  std::vector<std::int32_t>& columns = scratch.columns;
  columns.clear();
  for (int j = 0; j < T; ++j)
    if (column_of[j] == kListed) {
      column_of[j] = static_cast<std::int32_t>(columns.size());
      columns.push_back(j);
    }
  const int u = static_cast<int>(columns.size());
  scratch.values.resize(static_cast<std::size_t>(u) * d);
  const auto& v = ref_.tensors().v;
  for (int c = 0; c < u; ++c)
    std::copy_n(&v(columns[c], g, 0), d, &scratch.values[std::size_t(c) * d]);
}

void DeferredOutputError::fill_weights(int g, const Row* rows, int count, Scratch& scratch) const {
  // Attended rows: the renormalised weights, as shared_step_attention hands them to policies.
  // Complement rows: the full-cache probabilities of the missing positions.
  const Head& head = heads_[g];
  const int group = ref_.group_size(), u = static_cast<int>(scratch.columns.size());
  std::vector<float>& weights = scratch.weights;
  weights.assign(static_cast<std::size_t>(count) * group * u, 0.0f);
  std::vector<std::int32_t>& row_columns = scratch.row_columns;
  for (int b = 0; b < count; ++b) {
    const Row& row = rows[b];
    const std::int32_t* positions = &head.positions[row.positions];
    // The row's columns once for the whole group.
    row_columns.resize(row.n);
    for (int e = 0; e < row.n; ++e) row_columns[e] = scratch.column_of[positions[e]];
    for (int r = 0; r < group; ++r) {
      const float* pf = att_.decode_probs(row.step, g * group + r);
      const double scale = row.complement ? 1.0 : head.scales[row.scales + r];
      float* out = &weights[(static_cast<std::size_t>(b) * group + r) * u];
      for (int e = 0; e < row.n; ++e)
        out[row_columns[e]] = static_cast<float>(pf[positions[e]] * scale);
    }
  }
}

void DeferredOutputError::write_errors(int g, const Row* rows, int count, Scratch& scratch,
                                       std::vector<std::vector<StepMetrics>>& steps) const {
  const Head& head = heads_[g];
  const int group = ref_.group_size(), d = ref_.head_dim();
  for (int b = 0; b < count; ++b) {
    const Row& row = rows[b];
    double err2 = 0;
    for (int r = 0; r < group; ++r) {
      const int h = g * group + r;
      const float* o = ref_.full_output(row.step, h);
      float* oh = &scratch.o_hat[(static_cast<std::size_t>(b) * group + r) * d];
      if (row.complement) {
        const float* o_att = att_.full_output(row.step, h);
        const float rescale = static_cast<float>(head.scales[row.scales + r]);
        for (int i = 0; i < d; ++i) oh[i] = (o_att[i] - oh[i]) * rescale;
      }
      for (int i = 0; i < d; ++i) err2 += (o[i] - oh[i]) * (o[i] - oh[i]);
    }
    StepMetrics& metrics = steps[g][row.step];
    metrics.output_rel_error = static_cast<float>(std::sqrt(err2 / row.ref2));
    metrics.output_value_error = static_cast<float>(std::sqrt(err2 / row.vnorm2));
  }
}

}  // namespace kvsim
