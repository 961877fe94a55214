// The pool of large scratch blocks: a block handed back is handed out again to a request it can
// hold (at most twice its size), small blocks are left to the heap, and a request no kept block
// fits releases the kept blocks smaller than it.
#include <gtest/gtest.h>

#include "core/block_pool.hpp"

namespace kvsim::test {
namespace {

TEST(BlockPool, HandsBackBlocksToRequestsTheyFit) {
  release_pooled_blocks();
  const std::size_t big = std::size_t{4} << 20;  // 16 MiB of floats
  float* first = nullptr;
  {
    PooledBlock block = take_pooled_block(big);
    first = block.get();
    block[big - 1] = 1.0f;  // all of it is usable
  }
  EXPECT_EQ(kept_pooled_blocks(), 1u);
  {
    const PooledBlock block = take_pooled_block(big - 100);  // fits: the same block
    EXPECT_EQ(block.get(), first);
    EXPECT_EQ(kept_pooled_blocks(), 0u);
  }
  {
    const PooledBlock block = take_pooled_block(big / 3);  // more than twice too big: a new one
    EXPECT_NE(block.get(), first);
    EXPECT_EQ(kept_pooled_blocks(), 1u);
  }
  EXPECT_EQ(kept_pooled_blocks(), 2u);
  {
    const PooledBlock small = take_pooled_block(1000);  // left to the heap, never kept
  }
  EXPECT_EQ(kept_pooled_blocks(), 2u);
  {
    const PooledBlock block = take_pooled_block(big);
    EXPECT_EQ(block.get(), first);
    EXPECT_EQ(kept_pooled_blocks(), 1u);                    // the big / 3 one
    const PooledBlock larger = take_pooled_block(2 * big);  // none fits: the smaller released
    EXPECT_EQ(kept_pooled_blocks(), 0u);
  }
  EXPECT_EQ(kept_pooled_blocks(), 2u);
  release_pooled_blocks();
  EXPECT_EQ(kept_pooled_blocks(), 0u);
}

}  // namespace
}  // namespace kvsim::test
