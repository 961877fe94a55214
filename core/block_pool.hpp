// Large scratch blocks of floats, kept for the next layer: glibc maps a block above its mmap
// threshold (at most 32 MiB) afresh at every allocation, and the kernel then faults in and zeroes
// each of its pages at first touch; at 32k tokens a layer's [H, G, T] decode probabilities and
// [H, window, P] window rows are 236 MiB each, and those faults took a tenth of a compact replay
// (docs/measurement_log.md). A block handed back is kept and handed out again, uninitialised, to
// the next request it can hold.
#pragma once

#include <cstddef>
#include <memory>

namespace kvsim {

struct PooledBlockReturn {
  std::size_t capacity = 0;  // floats the block holds
  void operator()(float* block) const;
};
using PooledBlock = std::unique_ptr<float[], PooledBlockReturn>;

// A block of at least `count` floats (at most twice that when kept), uninitialised: a kept block
// holds what its last user wrote. When no kept block fits, the kept blocks smaller than `count`
// are released before a new one is allocated.
PooledBlock take_pooled_block(std::size_t count);

// Releases every kept block (their memory returns to the system).
void release_pooled_blocks();
// How many blocks are kept now.
std::size_t kept_pooled_blocks();

}  // namespace kvsim
