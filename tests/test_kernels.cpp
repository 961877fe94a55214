// The run-time dispatched vector kernels (core/kernels/): every instruction set this CPU
// supports against the scalar loop of its contract, on lengths around every lane count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "core/kernels/kernels.hpp"
#include "core/layer_attention.hpp"

namespace kvsim {
namespace {

std::vector<float> random_values(int n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

const int kLengths[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 704};

TEST(Kernels, EverySupportedSetFollowsItsScalarContract) {
  const auto tables = kernels::supported();
  ASSERT_FALSE(tables.empty());
  EXPECT_STREQ(tables.front()->name, "baseline");
  for (const kernels::Table* t : tables)
    for (int n : kLengths) {
      SCOPED_TRACE(std::string(t->name) + ", n = " + std::to_string(n));
      auto x = random_values(n, n, 4.0f);
      const float scale = 0.25f;
      double mx = -INFINITY, sum = 0;
      for (float v : x) mx = std::max(mx, scale * static_cast<double>(v));
      for (float v : x) sum += std::exp(scale * static_cast<double>(v) - mx);
      std::vector<float> p = x;
      const float lse = t->softmax_inplace(p.data(), n, scale);
      EXPECT_NEAR(lse, mx + std::log(sum), 1e-5 * (1 + std::abs(mx)));
      double total = 0;
      for (int i = 0; i < n; ++i) {
        EXPECT_NEAR(p[i], std::exp(scale * x[i] - mx) / sum, 2e-6);
        total += p[i];
      }
      EXPECT_NEAR(total, 1.0, 1e-5);
      // softmax_accumulate: the same probabilities and lse, each added to the sums, to the bit.
      std::vector<float> q = x, sums = random_values(n, 500 + n, 1.0f), sums0 = sums;
      EXPECT_EQ(t->softmax_accumulate(q.data(), n, scale, sums.data()), lse);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(q[i], p[i]);
        EXPECT_EQ(sums[i], sums0[i] + p[i]);
      }
      // accumulate is exact whatever the lane count; axpy within one rounding of the fused form.
      auto acc = random_values(n, 100 + n, 1.0f), y = random_values(n, 200 + n, 1.0f);
      const auto add = random_values(n, 300 + n, 1.0f);
      auto acc0 = acc, y0 = y;
      t->accumulate(acc.data(), add.data(), n);
      t->axpy(-0.75f, add.data(), y.data(), n);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(acc[i], acc0[i] + add[i]);
        EXPECT_NEAR(y[i], y0[i] + -0.75 * add[i], 1e-6 * (1 + std::abs(y0[i])));
      }
      double squares = 0;
      for (float v : add) squares += static_cast<double>(v) * v;
      EXPECT_NEAR(t->sum_of_squares(add.data(), n), squares, 1e-5 * squares);
    }
}

TEST(Kernels, SoftmaxOfTwoLogitsByHand) {
  // logits 2 and 0 at scale 0.5: p = e^1 / (e^1 + 1) = 0.731059, 0.268941; lse = log(e + 1).
  for (const kernels::Table* t : kernels::supported()) {
    float x[2] = {2.0f, 0.0f};
    EXPECT_NEAR(t->softmax_inplace(x, 2, 0.5f), std::log(std::exp(1.0) + 1.0), 1e-6) << t->name;
    EXPECT_NEAR(x[0], 0.7310586, 1e-6) << t->name;
    EXPECT_NEAR(x[1], 0.2689414, 1e-6) << t->name;
  }
}

TEST(Kernels, SoftmaxEntropyFollowsItsScalarContract) {
  // Float64 throughout: each set within a few units in the last place of the plain loop, lengths
  // around every lane count; logits spread over 60 units so that some exponentials underflow far
  // below the largest.
  for (const kernels::Table* t : kernels::supported())
    for (int n : kLengths) {
      SCOPED_TRACE(std::string(t->name) + ", n = " + std::to_string(n));
      const auto x = random_values(n, 400 + n, 20.0f);
      const double scale = 0.3;
      float top = x[0];
      for (float v : x) top = std::max(top, v);
      double z = 0, zy = 0;
      std::vector<double> e(n);
      for (int j = 0; j < n; ++j) {
        const double y = scale * x[j] - scale * top;
        e[j] = std::exp(y);
        z += e[j];
        zy += e[j] * y;
      }
      const double entropy = std::log(z) - zy / z;
      std::vector<double> scratch(n), sum(n, 0.5);
      EXPECT_NEAR(t->softmax_entropy(x.data(), n, scale, scratch.data(), sum.data()), entropy,
                  1e-14 * (1 + entropy));
      for (int j = 0; j < n; ++j) EXPECT_NEAR(sum[j], 0.5 + e[j] / z, 1e-15) << j;
      std::vector<double> p(n);
      EXPECT_NEAR(t->softmax_entropy(x.data(), n, scale, p.data(), nullptr), entropy,
                  1e-14 * (1 + entropy));
      for (int j = 0; j < n; ++j) EXPECT_NEAR(p[j], e[j] / z, 1e-15 * (1 + e[j] / z)) << j;
    }
}

TEST(Kernels, SoftmaxEntropyOfThreeLogitsByHand) {
  // logits 4, 0, 0 at scale 0.5: y = 0, -2, -2; z = 1 + 2e^-2 = 1.270671; p = 0.786986,
  // 0.106507, 0.106507; entropy log z - 2·(-2)e^-2 / z = 0.239545 + 0.426028 = 0.665573.
  for (const kernels::Table* t : kernels::supported()) {
    const float x[3] = {4.0f, 0.0f, 0.0f};
    double p[3], sum[3] = {1, 1, 1};
    EXPECT_NEAR(t->softmax_entropy(x, 3, 0.5, p, sum), 0.665573, 1e-6) << t->name;
    EXPECT_NEAR(sum[0], 1.786986, 1e-6) << t->name;
    EXPECT_NEAR(sum[1], 1.106507, 1e-6) << t->name;
    EXPECT_NEAR(sum[2], 1.106507, 1e-6) << t->name;
  }
}

// One attention row by its contract, in double: the scores, p, out, lse; and the backward's dq,
// dkt and dvt increments.
struct AttentionRowReference {
  std::vector<double> p, out, dq, dkt, dvt;
  double lse = 0;
  AttentionRowReference(const std::vector<float>& q, const std::vector<float>& kt,
                        const std::vector<float>& vt, const std::vector<float>& dout, int stride,
                        int dim, int n, double scale) {
    std::vector<double> s(n);
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < n; ++j) {
      for (int d = 0; d < dim; ++d) s[j] += static_cast<double>(q[d]) * kt[d * stride + j];
      mx = std::max(mx, scale * s[j]);
    }
    for (int j = 0; j < n; ++j) sum += std::exp(scale * s[j] - mx);
    lse = mx + std::log(sum);
    p.resize(n);
    out.assign(dim, 0.0);
    for (int j = 0; j < n; ++j) p[j] = std::exp(scale * s[j] - lse);
    for (int d = 0; d < dim; ++d)
      for (int j = 0; j < n; ++j) out[d] += p[j] * vt[d * stride + j];
    double row_dot = 0;
    for (int d = 0; d < dim; ++d) row_dot += static_cast<double>(dout[d]) * out[d];
    dq.assign(dim, 0.0);
    dkt.assign(static_cast<std::size_t>(dim) * stride, 0.0);
    dvt = dkt;
    for (int j = 0; j < n; ++j) {
      double dp = 0;
      for (int d = 0; d < dim; ++d) dp += static_cast<double>(dout[d]) * vt[d * stride + j];
      const double ds = p[j] * (dp - row_dot);
      for (int d = 0; d < dim; ++d) {
        dq[d] += scale * ds * kt[d * stride + j];
        dkt[d * stride + j] += scale * q[d] * ds;
        dvt[d * stride + j] += static_cast<double>(dout[d]) * p[j];
      }
    }
  }
};

TEST(Kernels, AttentionRowsFollowTheirContract) {
  const int dim = 8;
  for (const kernels::Table* t : kernels::supported())
    for (int n : kLengths) {
      SCOPED_TRACE(std::string(t->name) + ", n = " + std::to_string(n));
      const int stride = n + kernels::kAttentionLanes + 3;
      const auto q = random_values(dim, n, 1.5f), dout = random_values(dim, 50 + n, 1.0f);
      auto kt = random_values(dim * stride, 10 + n, 1.5f);
      const auto vt = random_values(dim * stride, 20 + n, 1.0f);
      const float scale = 1.0f / std::sqrt(8.0f);
      const AttentionRowReference ref(q, kt, vt, dout, stride, dim, n, scale);
      std::vector<float> p(stride), out(dim), ds(stride), dq(dim);
      const float lse = t->attention_row(q.data(), kt.data(), vt.data(), stride, dim, n, scale,
                                         p.data(), out.data());
      EXPECT_NEAR(lse, ref.lse, 1e-5 * (1 + std::abs(ref.lse)));
      for (int d = 0; d < dim; ++d) EXPECT_NEAR(out[d], ref.out[d], 2e-6 * (1 + std::sqrt(n)));
      // The backward adds into dkt and dvt, past n only zeros (the masked lanes).
      std::vector<float> dkt(dim * stride, 0.25f), dvt(dim * stride, -0.5f);
      float row_dot = 0;
      for (int d = 0; d < dim; ++d) row_dot += dout[d] * out[d];
      t->attention_row_backward(q.data(), dout.data(), row_dot, lse, kt.data(), vt.data(), stride,
                                dim, n, scale, ds.data(), dq.data(), dkt.data(), dvt.data());
      for (int d = 0; d < dim; ++d) {
        EXPECT_NEAR(dq[d], ref.dq[d], 1e-5 * (1 + std::sqrt(n)));
        for (int j = 0; j < stride; ++j) {
          EXPECT_NEAR(dkt[d * stride + j], 0.25 + ref.dkt[d * stride + j], 1e-5) << d << "," << j;
          EXPECT_NEAR(dvt[d * stride + j], -0.5 + ref.dvt[d * stride + j], 1e-5) << d << "," << j;
        }
      }
    }
}

TEST(Kernels, AttentionRowOfTwoKeysByHand) {
  // q·k = 2 and 0 at scale 0.5 (dim 1): p = 0.731059, 0.268941 (as the softmax above); out =
  // 0.731059·3 + 0.268941·(-1) = 1.924234.
  for (const kernels::Table* t : kernels::supported()) {
    std::vector<float> kt(2 + kernels::kAttentionLanes, 0.0f), vt = kt;
    kt[0] = 2.0f;
    vt[0] = 3.0f;
    vt[1] = -1.0f;
    const float q = 1.0f;
    std::vector<float> p(kt.size());
    float out = 0;
    EXPECT_NEAR(t->attention_row(&q, kt.data(), vt.data(), static_cast<int>(kt.size()), 1, 2, 0.5f,
                                 p.data(), &out),
                std::log(std::exp(1.0) + 1.0), 1e-6)
        << t->name;
    EXPECT_NEAR(out, 1.924234, 1e-6) << t->name;
  }
}

TEST(Kernels, TheWidestSupportedSetIsActive) {
  if (std::getenv("KVSIM_SIMD")) GTEST_SKIP() << "KVSIM_SIMD chooses the set";
  EXPECT_EQ(&kernels::active(), kernels::supported().back());
  // The public wrapper goes through the active table.
  float x[3] = {1, 2, 3}, y[3] = {1, 2, 3};
  EXPECT_EQ(softmax_inplace(x, 3, 1.0f), kernels::active().softmax_inplace(y, 3, 1.0f));
}

TEST(Kernels, CompiledSetsIncludeTheWiderX86Sets) {
  const auto sets = kernels::compiled();
#if defined(__x86_64__)
  EXPECT_EQ(sets, (std::vector<std::string>{"baseline", "avx2", "avx512"}));
#else
  EXPECT_EQ(sets, (std::vector<std::string>{"baseline"}));
#endif
}

}  // namespace
}  // namespace kvsim
