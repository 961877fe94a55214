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

TEST(Half, FirstNonFinite) {
  std::vector<float> x(100, 1.0f);
  EXPECT_EQ(first_non_finite(x.data(), x.size()), 100u);
  x[37] = NAN;
  x[80] = INFINITY;
  EXPECT_EQ(first_non_finite(x.data(), x.size()), 37u);
}

}  // namespace
}  // namespace kvsim
