// What the prefix index gained or lost: the journal a cache-aware router
// rebuilds a daemon's cached blocks from (server/kv_event_publisher.h sends
// it; docs/operations.md, "KV events", has the wire format).
//
// Events come in the order the index changed. A block is "stored" when it
// enters the index (its tokens' KV is computed and findable by a later
// prompt) and "removed" when it leaves it (evicted for another allocation).
#ifndef TANDEM_KVCACHE_KV_EVENT_H_
#define TANDEM_KVCACHE_KV_EVENT_H_

#include <optional>
#include <vector>

#include "kvcache/block_hash.h"

namespace tandem::kvcache {

struct KvEvent {
  enum class Kind {
    kStored,      // `hashes` entered the index, each the child of the one before
    kRemoved,     // `hashes` left the index
    kAllCleared,  // nothing is cached any more (what came before is void)
  };
  Kind kind = Kind::kStored;
  std::vector<BlockHash> hashes;
  // kStored: the block before the first of `hashes` in its sequence; none
  // for a sequence's first block (its parent is the cache salt's root).
  std::optional<BlockHash> parent;
  // kStored: the blocks' tokens, block_size per hash, in order.
  std::vector<TokenId> tokens;
};

}  // namespace tandem::kvcache

#endif  // TANDEM_KVCACHE_KV_EVENT_H_
