#include "core/causal_attention.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/kernels/kernels.hpp"
#include "core/parallel.hpp"

namespace kvsim {

void PackedAttention::check() const {
  if (tokens < 0 || heads <= 0 || kv_heads <= 0 || dim <= 0 || items < 0)
    throw std::invalid_argument("attention: sizes must be positive (tokens " +
                                std::to_string(tokens) + ", heads " + std::to_string(heads) +
                                ", kv_heads " + std::to_string(kv_heads) + ", dim " +
                                std::to_string(dim) + ")");
  if (heads % kv_heads != 0)
    throw std::invalid_argument("attention: " + std::to_string(heads) +
                                " query heads are not a multiple of " + std::to_string(kv_heads) +
                                " key/value heads");
  if (bounds[0] != 0 || bounds[items] != tokens)
    throw std::invalid_argument("attention: the items' bounds must run from 0 to the " +
                                std::to_string(tokens) + " tokens");
  for (int n = 0; n < items; ++n)
    if (bounds[n + 1] < bounds[n])
      throw std::invalid_argument("attention: item " + std::to_string(n) + " ends (token " +
                                  std::to_string(bounds[n + 1]) + ") before it starts (token " +
                                  std::to_string(bounds[n]) + ")");
}

namespace {

// One (item, key/value head) task: the item's keys and values transposed to [dim][stride], so
// that every loop over key positions runs along contiguous memory, each row padded with zeros
// for the kernels' last, partly masked vector block.
struct Task {
  const PackedAttention& s;
  int group, first, length, stride;
  std::vector<float> kt, vt;

  Task(const PackedAttention& shape, const float* k, const float* v, int task)
      : s(shape),
        group(task % shape.kv_heads),
        first(static_cast<int>(shape.bounds[task / shape.kv_heads])),
        length(static_cast<int>(shape.bounds[task / shape.kv_heads + 1]) - first),
        stride(length + kernels::kAttentionLanes),
        kt(transposed(k)),
        vt(transposed(v)) {}

  std::size_t columns() const { return static_cast<std::size_t>(s.dim) * stride; }
  std::size_t column(int d, int j) const { return static_cast<std::size_t>(d) * stride + j; }
  // Where token `first + j`'s row of key/value head `group` starts in k-shaped arrays.
  std::size_t kv_row(int j) const {
    return (static_cast<std::size_t>(first + j) * s.kv_heads + group) * s.dim;
  }
  // Where token `first + i`'s row of query head `h` of this group starts in q-shaped arrays.
  std::size_t q_row(int i, int h) const {
    return static_cast<std::size_t>(first + i) * s.heads + group * (s.heads / s.kv_heads) + h;
  }
  std::vector<float> transposed(const float* x) const {
    std::vector<float> t(columns(), 0.0f);
    for (int j = 0; j < length; ++j)
      for (int d = 0; d < s.dim; ++d) t[column(d, j)] = x[kv_row(j) + d];
    return t;
  }
};

}  // namespace

void causal_attention_forward(const PackedAttention& shape, const float* q, const float* k,
                              const float* v, float scale, float* out, float* lse, int threads) {
  shape.check();
  const kernels::Table& kn = kernels::active();
  const int D = shape.dim;
  parallel_for(shape.items * shape.kv_heads, threads, [&](int id) {
    const Task t(shape, k, v, id);
    std::vector<float> p(t.stride);
    for (int h = 0; h < shape.heads / shape.kv_heads; ++h)
      for (int i = 0; i < t.length; ++i) {
        const std::size_t row = t.q_row(i, h);
        lse[row] = kn.attention_row(q + row * D, t.kt.data(), t.vt.data(), t.stride, D, i + 1,
                                    scale, p.data(), out + row * D);
      }
  });
}

void causal_attention_backward(const PackedAttention& shape, const float* q, const float* k,
                               const float* v, const float* out, const float* lse,
                               const float* dout, float scale, float* dq, float* dk, float* dv,
                               int threads) {
  shape.check();
  const kernels::Table& kn = kernels::active();
  const int D = shape.dim;
  parallel_for(shape.items * shape.kv_heads, threads, [&](int id) {
    const Task t(shape, k, v, id);
    std::vector<float> dkt(t.columns(), 0.0f), dvt(t.columns(), 0.0f), ds(t.stride);
    for (int h = 0; h < shape.heads / shape.kv_heads; ++h)
      for (int i = 0; i < t.length; ++i) {
        const std::size_t at = t.q_row(i, h) * D;
        float row_dot = 0.0f;
        for (int d = 0; d < D; ++d) row_dot += dout[at + d] * out[at + d];
        kn.attention_row_backward(q + at, dout + at, row_dot, lse[t.q_row(i, h)], t.kt.data(),
                                  t.vt.data(), t.stride, D, i + 1, scale, ds.data(), dq + at,
                                  dkt.data(), dvt.data());
      }
    for (int j = 0; j < t.length; ++j)
      for (int d = 0; d < D; ++d) {
        dk[t.kv_row(j) + d] = dkt[t.column(d, j)];
        dv[t.kv_row(j) + d] = dvt[t.column(d, j)];
      }
  });
}

}  // namespace kvsim
