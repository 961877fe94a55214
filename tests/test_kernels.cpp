// The run-time dispatched vector kernels (sim/core/kernels/): every instruction set this CPU supports
// against the scalar loop of its contract, on lengths around every lane count.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <random>

#include "sim/core/kernels/kernels.hpp"
#include "sim/core/layer_attention.hpp"

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
