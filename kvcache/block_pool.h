// The paged KV cache's bookkeeping: which blocks are free and which are held.
//
// Pure CPU metadata, owned by the scheduler thread; the K/V bytes live in the
// worker's backend, indexed by the same block ids. Allocation is all or
// nothing and answers "does not fit" as a value, so the scheduler can wait or
// preempt.
//
// Thread safety: not thread-safe; one owner (the scheduler thread).
#ifndef TANDEM_KVCACHE_BLOCK_POOL_H_
#define TANDEM_KVCACHE_BLOCK_POOL_H_

#include <cstdint>
#include <deque>
#include <span>
#include <vector>

namespace tandem::kvcache {

using BlockId = int32_t;

class BlockPool {
 public:
  explicit BlockPool(int32_t blocks);

  int32_t total_blocks() const { return static_cast<int32_t>(in_use_.size()); }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }

  // Appends `count` blocks to `out` and returns true, or returns false and
  // changes nothing when fewer than `count` are free. Blocks come out in
  // free-list order (lowest ids first on a fresh pool).
  bool Allocate(int32_t count, std::vector<BlockId>* out);

  // Returns blocks to the free list. REQUIRES: each is held (checked: a
  // double free is a bookkeeping bug that would corrupt another sequence).
  void Free(std::span<const BlockId> blocks);

 private:
  std::deque<BlockId> free_;
  std::vector<bool> in_use_;
};

}  // namespace tandem::kvcache

#endif  // TANDEM_KVCACHE_BLOCK_POOL_H_
