#include "kvcache/block_pool.h"

#include <gtest/gtest.h>

namespace tandem::kvcache {
namespace {

TEST(BlockPoolTest, AllocatesLowestIdsFirstAndAllOrNothing) {
  BlockPool pool(4);
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.Allocate(3, &a));
  EXPECT_EQ(a, (std::vector<BlockId>{0, 1, 2}));
  std::vector<BlockId> b;
  EXPECT_FALSE(pool.Allocate(2, &b));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.free_blocks(), 1);
  pool.Free(std::vector<BlockId>{1});
  ASSERT_TRUE(pool.Allocate(2, &b));
  EXPECT_EQ(b, (std::vector<BlockId>{3, 1}));  // free-list order: 3 was free before 1
  EXPECT_EQ(pool.free_blocks(), 0);
}

TEST(BlockPoolDeathTest, DoubleFreeAborts) {
  BlockPool pool(2);
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.Allocate(1, &a));
  pool.Free(a);
  EXPECT_DEATH(pool.Free(a), "not held");
}

}  // namespace
}  // namespace tandem::kvcache
