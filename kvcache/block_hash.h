// Keys of full KV blocks in the prefix index.
//
// A block's key chains its parent's key with its token ids: key(0) =
// Mix(Root(salt), tokens of block 0), key(i) = Mix(key(i-1), tokens of block
// i). So equal keys mean equal token prefixes (up to a 128-bit collision,
// which the index also rules out by comparing the block's own tokens), and
// requests with different cache salts never share a key.
#ifndef TANDEM_KVCACHE_BLOCK_HASH_H_
#define TANDEM_KVCACHE_BLOCK_HASH_H_

#include <cstdint>
#include <span>
#include <string_view>

namespace tandem::kvcache {

using TokenId = int32_t;

struct BlockHash {
  uint64_t high = 0;
  uint64_t low = 0;

  bool operator==(const BlockHash&) const = default;

  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.high, b.low);
  }
};

// The chain's starting point for a cache salt ("" for no salt).
BlockHash RootHash(std::string_view salt);

// The key of a block with `tokens` after a block keyed `parent`.
BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens);

}  // namespace tandem::kvcache

#endif  // TANDEM_KVCACHE_BLOCK_HASH_H_
