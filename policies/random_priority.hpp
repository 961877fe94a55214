// A reproducible uniform draw per (seed, sample, layer, KV head, position), for the random floor:
// a counter-based hash (SplitMix64's finaliser, Steele et al. 2014, over the fields chained in
// turn), so that a draw depends on nothing but its coordinates: not on threads, not on the order
// in which samples or layers are replayed, not on the other policies of a run.
#pragma once

#include <cstdint>
#include <string>

namespace kvsim {

// SplitMix64's output function of one 64-bit state.
constexpr std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// FNV-1a of a name, 64-bit.
inline std::uint64_t fnv1a64(const std::string& text) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

class RandomPriority {
 public:
  RandomPriority(std::uint64_t seed, const std::string& sample)
      : base_(splitmix64(splitmix64(seed) ^ fnv1a64(sample))) {}
  // u in [0, 1) with 53 random bits.
  double operator()(int layer, int kv_head, int position) const {
    std::uint64_t x = splitmix64(base_ ^ static_cast<std::uint32_t>(layer));
    x = splitmix64(x ^ static_cast<std::uint32_t>(kv_head));
    x = splitmix64(x ^ static_cast<std::uint32_t>(position));
    return static_cast<double>(x >> 11) * 0x1.0p-53;
  }

 private:
  std::uint64_t base_;
};

}  // namespace kvsim
