#include "traces/half.hpp"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kvsim {

float half_to_float_scalar(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1Fu;
  std::uint32_t mant = h & 0x3FFu;
  std::uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);
  } else if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3FFu) << 13);
    }
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint16_t float_to_half_scalar(float f) {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) return sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u);
  if (abs >= 0x477FF000u) return sign | 0x7C00u;  // rounds to >= 65520: overflow to Inf
  if (abs < 0x38800000u) {                        // result is subnormal or zero
    if (abs < 0x33000000u) return sign;
    const std::uint32_t mant = (abs & 0x7FFFFFu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24
    std::uint32_t h = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1u))) ++h;
    return sign | static_cast<std::uint16_t>(h);
  }
  std::uint32_t h = ((abs >> 23) - 112) << 10 | ((abs >> 13) & 0x3FFu);
  const std::uint32_t rem = abs & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<std::uint16_t>(h);
}

namespace {

__attribute__((target("f16c,avx2"))) std::size_t half_to_float_f16c(const std::uint16_t* in,
                                                                    float* out, std::size_t n) {
  std::size_t bad = n;
  const __m256i exp_mask = _mm256_set1_epi32(0x7F800000);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    const __m256 f = _mm256_cvtph_ps(h);
    _mm256_storeu_ps(out + i, f);
    const __m256i e = _mm256_and_si256(_mm256_castps_si256(f), exp_mask);
    if (bad == n &&
        !_mm256_testz_si256(_mm256_cmpeq_epi32(e, exp_mask), _mm256_cmpeq_epi32(e, exp_mask))) {
      for (std::size_t j = i; j < i + 8; ++j)
        if ((in[j] & 0x7C00u) == 0x7C00u) {
          bad = j;
          break;
        }
    }
  }
  for (; i < n; ++i) {
    out[i] = half_to_float_scalar(in[i]);
    if (bad == n && (in[i] & 0x7C00u) == 0x7C00u) bad = i;
  }
  return bad;
}

__attribute__((target("f16c,avx2"))) void float_to_half_f16c(const float* in, std::uint16_t* out,
                                                             std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = float_to_half_scalar(in[i]);
}

// acc[i] += in[i] rounded to binary16 and back, the rounding in registers.
__attribute__((target("f16c,avx2"))) void add_through_half_f16c(float* acc, const float* in,
                                                                std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_cvtph_ps(h)));
  }
  for (; i < n; ++i) acc[i] += half_to_float_scalar(float_to_half_scalar(in[i]));
}

// CPUID rather than __builtin_cpu_supports, which clang 14 does not accept for "f16c": F16C
// (leaf 1, ECX bit 29) and AVX2 (leaf 7, EBX bit 5), with the OS saving the AVX state (OSXSAVE,
// then XCR0 bits 1 and 2).
bool cpu_has_f16c() {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    const bool f16c = c & (1u << 29), osxsave = c & (1u << 27);
    if (!f16c || !osxsave) return false;
    unsigned lo = 0, hi = 0;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return false;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & (1u << 5)) != 0;
  }();
  return has;
}

}  // namespace

std::size_t half_to_float(const std::uint16_t* in, float* out, std::size_t n) {
  if (cpu_has_f16c()) return half_to_float_f16c(in, out, n);
  std::size_t bad = n;
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = half_to_float_scalar(in[i]);
    if (bad == n && (in[i] & 0x7C00u) == 0x7C00u) bad = i;
  }
  return bad;
}

void float_to_half(const float* in, std::uint16_t* out, std::size_t n) {
  if (cpu_has_f16c()) return float_to_half_f16c(in, out, n);
  for (std::size_t i = 0; i < n; ++i) out[i] = float_to_half_scalar(in[i]);
}

std::size_t first_non_finite(const float* x, std::size_t n) {
  // Bit test rather than std::isfinite so that no compiler flag can optimise the check away.
  const auto* bits = reinterpret_cast<const std::uint32_t*>(x);
  std::uint32_t any = 0;
  for (std::size_t i = 0; i < n; ++i)
    any |= static_cast<std::uint32_t>((bits[i] & 0x7F800000u) == 0x7F800000u);
  if (!any) return n;
  for (std::size_t i = 0; i < n; ++i)
    if ((bits[i] & 0x7F800000u) == 0x7F800000u) return i;
  return n;
}

void round_through_half(const float* in, float* out, std::size_t n) {
  constexpr std::size_t kChunk = 1024;
  std::uint16_t half[kChunk];
  for (std::size_t i = 0; i < n; i += kChunk) {
    const std::size_t m = std::min(kChunk, n - i);
    float_to_half(in + i, half, m);
    half_to_float(half, out + i, m);
  }
}

void add_through_half(float* acc, const float* in, std::size_t n) {
  if (cpu_has_f16c()) return add_through_half_f16c(acc, in, n);
  for (std::size_t i = 0; i < n; ++i) acc[i] += half_to_float_scalar(float_to_half_scalar(in[i]));
}

}  // namespace kvsim
