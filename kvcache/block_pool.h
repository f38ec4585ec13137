// The paged KV cache's blocks: reference counts, the free list in eviction
// order, and the index of cached full blocks.
//
// A block is held while its reference count is positive. A block whose count
// drops to zero joins the free list; if it is cached (registered under a
// BlockHash) it stays findable there until it is evicted, which happens only
// when an allocation takes it. The free list is the eviction order: blocks
// are taken from its head; uncached blocks join at the head (nothing is lost
// by reusing them), cached ones at the tail (least recently used first).
//
// Pure CPU metadata (the K/V bytes live in the worker's backend, indexed by
// the same ids). Thread safety: none; one owner (the scheduler thread).
#ifndef TANDEM_KVCACHE_BLOCK_POOL_H_
#define TANDEM_KVCACHE_BLOCK_POOL_H_

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_event.h"

namespace tandem::kvcache {

using BlockId = int32_t;

class BlockPool {
 public:
  // `block_size`: tokens per block (cached blocks keep their tokens).
  BlockPool(int32_t blocks, int32_t block_size);

  int32_t total_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t block_size() const { return block_size_; }
  // Blocks with no holder, cached or not (all of them can be allocated).
  int32_t free_blocks() const { return free_count_; }
  int32_t used_blocks() const { return total_blocks() - free_count_; }
  int32_t cached_blocks() const { return static_cast<int32_t>(index_.size()); }
  int64_t evictions() const { return evictions_; }

  // Takes `count` blocks from the head of the free list, each with one
  // reference, evicting cached ones; appends them to `out`. Returns false and
  // changes nothing when fewer than `count` are free.
  bool Allocate(int32_t count, std::vector<BlockId>* out);

  // Adds a reference (a cache hit or a fork); a free block leaves the free list.
  void Acquire(BlockId block);

  // Drops one reference from each block, in order; blocks reaching zero join
  // the free list. REQUIRES: each is held (checked: a double release is a
  // bookkeeping bug that would corrupt another sequence).
  void Release(std::span<const BlockId> blocks);

  // Registers a held, full block under `hash` with its `tokens`. Returns
  // false (and changes nothing) when another block already holds that hash.
  // `parent`: the key of the block before it in its sequence (none for a
  // sequence's first block), for the event journal.
  bool Cache(BlockId block, const BlockHash& hash, std::span<const TokenId> tokens,
             std::optional<BlockHash> parent = std::nullopt);

  // The cached block with this hash and these tokens, if any.
  std::optional<BlockId> Find(const BlockHash& hash, std::span<const TokenId> tokens) const;

  int32_t ref_count(BlockId block) const { return blocks_[static_cast<size_t>(block)].refs; }
  bool is_cached(BlockId block) const { return blocks_[static_cast<size_t>(block)].cached; }
  // The free list from head (next to allocate) to tail, for tests.
  std::vector<BlockId> FreeListOrder() const;

  // --- the event journal (kvcache/kv_event.h) ---
  // From now on, every block that enters or leaves the index is journaled.
  // A run of blocks stored one after another in one sequence is one event.
  void RecordEvents() { record_events_ = true; }
  // The events since the last call, in order; clears the journal.
  std::vector<KvEvent> TakeEvents();
  // The index as it is: AllCleared, then every cached block stored with its
  // parent, a block after its parent when that is cached too. For a
  // receiver that lost events; clears the journal, which this replaces.
  std::vector<KvEvent> SnapshotEvents();

 private:
  struct Block {
    int32_t refs = 0;
    bool cached = false;
    BlockHash hash;
    std::optional<BlockHash> parent;  // when cached: the block before it (none: first)
    BlockId prev = -1;                // free-list links, when free
    BlockId next = -1;
    bool in_free_list = false;
  };

  void Unlink(BlockId b);
  void PushFront(BlockId b);
  void PushBack(BlockId b);
  void Evict(BlockId b);

  int32_t block_size_;
  std::vector<Block> blocks_;
  std::vector<TokenId> tokens_;  // block_size tokens per cached block
  BlockId head_ = -1;
  BlockId tail_ = -1;
  int32_t free_count_ = 0;
  int64_t evictions_ = 0;
  absl::flat_hash_map<BlockHash, BlockId> index_;
  bool record_events_ = false;
  std::vector<KvEvent> events_;
};

}  // namespace tandem::kvcache

#endif  // TANDEM_KVCACHE_BLOCK_POOL_H_
