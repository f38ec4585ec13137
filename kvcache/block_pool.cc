#include "kvcache/block_pool.h"

#include "common/check.h"

namespace tandem::kvcache {

BlockPool::BlockPool(int32_t blocks) : in_use_(static_cast<size_t>(blocks), false) {
  for (BlockId b = 0; b < blocks; ++b) free_.push_back(b);
}

bool BlockPool::Allocate(int32_t count, std::vector<BlockId>* out) {
  if (count > free_blocks()) return false;
  for (int32_t i = 0; i < count; ++i) {
    const BlockId b = free_.front();
    free_.pop_front();
    in_use_[static_cast<size_t>(b)] = true;
    out->push_back(b);
  }
  return true;
}

void BlockPool::Free(std::span<const BlockId> blocks) {
  for (BlockId b : blocks) {
    TANDEM_CHECK(b >= 0 && b < total_blocks() && in_use_[static_cast<size_t>(b)],
                 "freeing a KV block that is not held");
    in_use_[static_cast<size_t>(b)] = false;
    free_.push_back(b);
  }
}

}  // namespace tandem::kvcache
