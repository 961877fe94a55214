#include "core/block_pool.hpp"

#include <map>
#include <mutex>

namespace kvsim {
namespace {

// Blocks smaller than this come from the heap's own free lists: not worth keeping.
constexpr std::size_t kSmallestKept = (1u << 20) / sizeof(float);

struct Pool {
  std::mutex mutex;
  std::multimap<std::size_t, float*> kept;  // by capacity
  ~Pool() {
    for (const auto& [capacity, block] : kept) delete[] block;
  }
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

void PooledBlockReturn::operator()(float* block) const {
  if (block == nullptr) return;
  if (capacity < kSmallestKept) {
    delete[] block;
    return;
  }
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  p.kept.emplace(capacity, block);
}

PooledBlock take_pooled_block(std::size_t count) {
  if (count >= kSmallestKept) {
    Pool& p = pool();
    const std::lock_guard lock(p.mutex);
    // A kept block at most twice the size asked for (a far larger one waits for its own size).
    const auto fit = p.kept.lower_bound(count);
    if (fit != p.kept.end() && fit->first / 2 <= count) {
      PooledBlock block(fit->second, PooledBlockReturn{fit->first});
      p.kept.erase(fit);
      return block;
    }
    for (auto it = p.kept.begin(); it != fit;) {  // the blocks smaller than count
      delete[] it->second;
      it = p.kept.erase(it);
    }
  }
  return PooledBlock(new float[count], PooledBlockReturn{count});
}

void release_pooled_blocks() {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  for (const auto& [capacity, block] : p.kept) delete[] block;
  p.kept.clear();
}

std::size_t kept_pooled_blocks() {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  return p.kept.size();
}

}  // namespace kvsim
