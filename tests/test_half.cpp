#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "traces/half.hpp"

namespace kvsim {
namespace {

TEST(Half, VectorConversionMatchesScalarOnEveryBitPattern) {
  std::vector<std::uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> out(all.size());
  const std::size_t bad = half_to_float(all.data(), out.data(), all.size());
  EXPECT_EQ(bad, 0x7C00u);  // +Inf is the first non-finite pattern
  for (int i = 0; i < 65536; ++i) {
    const float ref = half_to_float_scalar(static_cast<std::uint16_t>(i));
    if (std::isnan(ref))
      EXPECT_TRUE(std::isnan(out[i])) << i;
    else
      EXPECT_EQ(std::memcmp(&ref, &out[i], 4), 0) << i;
  }
  EXPECT_EQ(half_to_float_scalar(0x3C00), 1.0f);
  EXPECT_EQ(half_to_float_scalar(0xC000), -2.0f);
  EXPECT_EQ(half_to_float_scalar(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
}

TEST(Half, RoundTripAndRounding) {
  // Every finite half survives half -> float -> half.
  for (int i = 0; i < 65536; ++i) {
    const auto h = static_cast<std::uint16_t>(i);
    if ((h & 0x7C00u) == 0x7C00u) continue;
    EXPECT_EQ(float_to_half_scalar(half_to_float_scalar(h)), h) << i;
  }
  EXPECT_EQ(float_to_half_scalar(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even
  EXPECT_EQ(float_to_half_scalar(70000.0f), 0x7C00);                      // overflow -> Inf
  const std::vector<float> x = {0.1f, -3.75f, 65504.0f, 1e-7f, 2.5e-5f, 1.0f, 7.0f, -0.0f, 1234.5f};
  std::vector<std::uint16_t> v(x.size());
  float_to_half(x.data(), v.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) EXPECT_EQ(v[i], float_to_half_scalar(x[i])) << x[i];
}

TEST(Half, AddThroughHalfIsRoundingThenAdding) {
  // acc[i] += half(x[i]) in one pass: the bytes of round_through_half and a plain sum, on lengths
  // around the vector width, with ties to even, subnormals, overflow and signed zeros among x.
  std::vector<float> x = {
      0.1f,     -3.75f, 65504.0f, 1e-7f, 2.5e-5f,     1.0f + std::ldexp(1.0f, -11),
      70000.0f, -0.0f,  1234.5f,  3e-8f, 0.33333334f, -1e-5f};
  for (int i = 0; i < 29; ++i) x.push_back(std::ldexp(1.0f + i / 29.0f, -(i % 20)));
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{8},
                        std::size_t{9}, std::size_t{16}, std::size_t{17}, x.size()}) {
    std::vector<float> acc(n), want(n), rounded(n);
    for (std::size_t i = 0; i < n; ++i) acc[i] = want[i] = 0.5f - 0.25f * static_cast<float>(i);
    round_through_half(x.data(), rounded.data(), n);
    for (std::size_t i = 0; i < n; ++i) want[i] += rounded[i];
    add_through_half(acc.data(), x.data(), n);
    for (std::size_t i = 0; i < n; ++i)
      EXPECT_EQ(std::memcmp(&acc[i], &want[i], 4), 0) << "n = " << n << ", i = " << i;
  }
  // By hand: 1 + 2^-11 rounds to 1 (tie to even), 0.1 to 0.0999755859375 (1638 / 2^14).
  float acc[2] = {2.0f, 0.0f};
  const float in[2] = {1.0f + std::ldexp(1.0f, -11), 0.1f};
  add_through_half(acc, in, 2);
  EXPECT_EQ(acc[0], 3.0f);
  EXPECT_EQ(acc[1], 0.0999755859375f);
}

TEST(Half, FirstNonFinite) {
  std::vector<float> x(100, 1.0f);
  EXPECT_EQ(first_non_finite(x.data(), x.size()), 100u);
  x[37] = NAN;
  x[80] = INFINITY;
  EXPECT_EQ(first_non_finite(x.data(), x.size()), 37u);
}

}  // namespace
}  // namespace kvsim
