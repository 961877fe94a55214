// A reproducible uniform draw per (seed, sample, layer, KV head, position), for the random floor:
// a counter-based hash (SplitMix64's output function over the fields chained in turn:
// core/splitmix.hpp), so that a draw depends on nothing but its coordinates: not on threads,
// not on the order in which samples or layers are replayed, not on the other policies of a run.
#pragma once

#include <cstdint>
#include <string>

#include "core/splitmix.hpp"

namespace kvsim {

class RandomPriority {
 public:
  RandomPriority(std::uint64_t seed, const std::string& sample)
      : base_(splitmix64(splitmix64(seed) ^ fnv1a64(sample))) {}
  // u in [0, 1) with 53 random bits.
  double operator()(int layer, int kv_head, int position) const {
    std::uint64_t x = splitmix64(base_ ^ static_cast<std::uint32_t>(layer));
    x = splitmix64(x ^ static_cast<std::uint32_t>(kv_head));
    x = splitmix64(x ^ static_cast<std::uint32_t>(position));
    return unit_interval(x);
  }

 private:
  std::uint64_t base_;
};

}  // namespace kvsim
