// Reproducible random numbers that depend only on their inputs: SplitMix64 (Steele, Lea and Flood,
// "Fast splittable pseudorandom number generators", OOPSLA 2014), as a hash of coordinates and as
// a stream. Used where the same inputs must give the same bytes on every platform and thread
// count (std::uniform_*_distribution is implementation-defined, so it is never used for results).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace kvsim {

// SplitMix64's finaliser (its output function without the increment): mixes one 64-bit word.
constexpr std::uint64_t splitmix_mix(std::uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// SplitMix64's output function of one 64-bit state.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  return splitmix_mix(x + 0x9e3779b97f4a7c15ULL);
}

// FNV-1a, 64-bit: the hash of names and keys (a random draw's sample, a sweep item's file, a live
// run's fingerprint). `h` continues an earlier hash (the offset basis starts one), so hashing
// parts in turn equals hashing their concatenation.
inline constexpr std::uint64_t kFnv1aOffset = 0xcbf29ce484222325ULL;
// The start the result stores' keys were made with (sweep items and progress, live parts): FNV's
// offset basis in decimal less its last digit. Any start hashes as well; this one is kept so that
// the folders earlier versions wrote keep resuming.
inline constexpr std::uint64_t kStoreKeyOffset = 1469598103934665603ULL;
inline std::uint64_t fnv1a64(const std::string& text, std::uint64_t h = kFnv1aOffset) {
  for (const unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// 16 lower-case hex digits of a 64-bit hash (file names, fingerprints).
inline std::string hex16(std::uint64_t h) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// u in [0, 1) from the top 53 bits of x.
constexpr double unit_interval(std::uint64_t x) {
  return static_cast<double>(x >> 11) * 0x1.0p-53;
}

// The SplitMix64 stream: state advances by the golden gamma, each output is splitmix64(state).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    const std::uint64_t out = splitmix64(state_);
    state_ += 0x9e3779b97f4a7c15ULL;
    return out;
  }
  // An index in [0, n): the high 64 bits of next() * n (Lemire's multiply-shift, without the
  // rejection step: the bias is below n / 2^64).
  std::uint64_t below(std::uint64_t n) {
    return static_cast<std::uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }

 private:
  std::uint64_t state_;
};

}  // namespace kvsim
