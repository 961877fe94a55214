// IEEE binary16 <-> binary32 conversion for kvtrace float16 datasets.
//
// HDF5 1.10 converts float16 in software at ~20 MB/s; kvsim instead reads the raw 16-bit words
// and converts them here with F16C (about 100x faster), falling back to a portable bit-exact
// routine on CPUs without F16C.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvsim {

// Converts n binary16 words to float. Returns the index of the first NaN/Inf, or n if none.
std::size_t half_to_float(const std::uint16_t* in, float* out, std::size_t n);

// Rounds n floats to binary16 (round to nearest even), as numpy's astype(float16) does.
void float_to_half(const float* in, std::uint16_t* out, std::size_t n);

// out[i] = in[i] rounded to binary16 and back (what a float16 file stores of it); in == out is
// allowed.
void round_through_half(const float* in, float* out, std::size_t n);

// acc[i] += in[i] rounded to binary16 and back: round_through_half, then the sums, in one pass.
void add_through_half(float* acc, const float* in, std::size_t n);

// Scalar versions, used by tests and the fallbacks.
float half_to_float_scalar(std::uint16_t h);
std::uint16_t float_to_half_scalar(float f);

// Returns the index of the first NaN/Inf among n floats, or n if all are finite.
std::size_t first_non_finite(const float* x, std::size_t n);

}  // namespace kvsim
