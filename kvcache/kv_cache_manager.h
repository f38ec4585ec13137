// Per-sequence block tables over a BlockPool, with automatic prefix caching.
//
// A sequence's tokens live in its block table: token p in slot p % block_size
// of block table[p / block_size]. When a block fills with computed tokens it
// is registered in the prefix index under the chained hash of (its parent,
// its tokens, the sequence's cache salt), whether the tokens came from the
// prompt or from decoding; so a later request that starts with the same
// tokens (a resent conversation, a shared system prompt) reuses those blocks
// instead of recomputing them. Blocks of finished or preempted sequences stay
// cached while unreferenced and are evicted least-recently-used only when an
// allocation needs them.
//
// Every operation that can fail for lack of blocks answers with a value and
// changes nothing, so the scheduler can wait or preempt.
//
// Thread safety: none; owned by the scheduler thread.
#ifndef TANDEM_KVCACHE_KV_CACHE_MANAGER_H_
#define TANDEM_KVCACHE_KV_CACHE_MANAGER_H_

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "kvcache/block_hash.h"
#include "kvcache/block_pool.h"

namespace tandem::kvcache {

using SequenceId = uint64_t;

// The cached blocks that hold a prompt's first `tokens` tokens.
struct PrefixMatch {
  int32_t tokens = 0;
  std::vector<BlockId> blocks;
};

// A block to duplicate in the backend before the next step runs (copy-on-write).
struct BlockCopy {
  BlockId from;
  BlockId to;
};

struct KvCacheStats {
  int32_t total_blocks = 0;
  int32_t used_blocks = 0;    // held by at least one sequence
  int32_t cached_blocks = 0;  // in the prefix index (held or not)
  int64_t prefix_queried_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t evictions = 0;
  // Blocks whose sliding-window layers' pages were given back
  // (EnableSlidingRelease), counted each time.
  int64_t sliding_released = 0;
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t blocks, int32_t block_size, bool prefix_caching = true);

  int32_t block_size() const { return pool_.block_size(); }
  int32_t total_blocks() const { return pool_.total_blocks(); }
  int32_t free_blocks() const { return pool_.free_blocks(); }
  int32_t BlocksFor(int32_t tokens) const { return (tokens + block_size() - 1) / block_size(); }
  KvCacheStats stats() const;
  const BlockPool& pool() const { return pool_; }

  // The longest block-aligned prefix of `tokens` whose blocks are cached under
  // `salt`, always leaving at least one token to compute (the next token's
  // logits need it). Does not reserve anything.
  PrefixMatch FindPrefix(std::span<const TokenId> tokens, const std::string& salt) const;

  // Registers a new sequence holding `match`'s blocks (a prefix of its
  // tokens, already computed) plus enough new blocks for `tokens_to_hold`
  // tokens. Counts the lookup in the statistics. Returns false and changes
  // nothing when the pool is short. REQUIRES: `id` is not registered.
  bool Admit(SequenceId id, const std::string& salt, std::span<const TokenId> prompt,
             const PrefixMatch& match, int32_t tokens_to_hold);

  // Grows a registered sequence's table to hold `tokens` tokens, copying a
  // shared, partly filled last block first (copy-on-write, queued for
  // TakeCopies). Returns false and changes nothing when the pool is short.
  bool Reserve(SequenceId id, int32_t tokens);

  // Records that the sequence's first `computed` tokens (`tokens`) have their
  // KV in its blocks: blocks that filled up enter the prefix index.
  void Commit(SequenceId id, std::span<const TokenId> tokens, int32_t computed);

  // A new sequence sharing all of `parent`'s blocks (parallel samples of one
  // prompt). Shared full blocks are never written again; a shared partly
  // filled last block is copied by whichever sequence writes it first.
  void Fork(SequenceId parent, SequenceId child);

  // Drops the sequence and its references. Its cached blocks stay findable.
  void Release(SequenceId id);

  bool Has(SequenceId id) const { return sequences_.contains(id); }
  const std::vector<BlockId>& BlockTable(SequenceId id) const;

  // Block copies needed before the next step, in order; clears the queue.
  std::vector<BlockCopy> TakeCopies();

  // Sliding-window layers (Gemma 2 and 3): a position p of those layers
  // attends only to positions (p - window, p]. Once a sequence has computed
  // a whole window past a block (counted from its last block boundary, so
  // that a resent conversation's match stays whole), none of its later
  // positions reads that block in those layers; from then on, each such
  // block the sequence holds alone (a block shared with another sequence is
  // kept) is passed to `release`, once, from Commit, so the backend can give
  // those layers' pages back. The block stays held and, when full, in the prefix index
  // (its other layers are intact); FindPrefix never ends a match where the
  // window of its first computed position would read a released block. A
  // block is whole again once it is allocated anew (whoever takes it writes
  // it before reading). REQUIRES: window > 0, before any sequence.
  void EnableSlidingRelease(int32_t window, std::function<void(std::span<const BlockId>)> release);
  // Whether `block`'s sliding-window layers' pages were given back.
  bool sliding_released(BlockId block) const {
    return !released_.empty() && released_[static_cast<size_t>(block)] != 0;
  }

  // The prefix index's event journal (BlockPool::RecordEvents).
  void RecordEvents() { pool_.RecordEvents(); }
  std::vector<KvEvent> TakeEvents() { return pool_.TakeEvents(); }
  std::vector<KvEvent> SnapshotEvents() { return pool_.SnapshotEvents(); }

 private:
  struct Sequence {
    std::vector<BlockId> blocks;
    BlockHash last_hash;    // key of the last committed block (or the salt's root)
    int32_t committed = 0;  // full blocks already considered for the index
    int32_t filled = 0;     // tokens known to be written (for copy-on-write)
    int32_t passed = 0;     // leading blocks a window behind, already considered for release
  };

  // pool_.Allocate, with the blocks taken marked whole (not released).
  bool Allocate(int32_t count, std::vector<BlockId>* out);
  // The sequence's blocks that fell a window behind since the last call:
  // those it holds alone are marked released and given to release_.
  void ReleaseBehindWindow(Sequence& seq);

  bool prefix_caching_;
  BlockPool pool_;
  absl::flat_hash_map<SequenceId, Sequence> sequences_;
  std::vector<BlockCopy> copies_;
  int64_t queried_tokens_ = 0;
  int64_t hit_tokens_ = 0;
  // Sliding-window release (EnableSlidingRelease); window_ 0: off.
  int32_t window_ = 0;
  std::function<void(std::span<const BlockId>)> release_;
  std::vector<uint8_t> released_;  // per block: its sliding layers' pages were given back
  int64_t sliding_released_ = 0;
};

}  // namespace tandem::kvcache

#endif  // TANDEM_KVCACHE_KV_CACHE_MANAGER_H_
