// Keys of full KV blocks in the prefix index.
//
// A block's key chains its parent's key with its token ids: key(0) =
// SHA-256(root(salt), tokens of block 0), key(i) = SHA-256(key(i-1), tokens
// of block i). So equal keys mean equal token prefixes and equal salts.
// SHA-256 because the index serves one request's KV to another on a key
// match: with a fast non-cryptographic hash, a client could craft a prompt
// whose chain collides with another tenant's prefix and be served that
// tenant's KV (the index also compares each block's own tokens, which stops
// accidental collisions but not a crafted collision of the parent chain).
//
// Bytes hashed (little-endian):
//   root(salt)     = SHA-256("tandem.kv.root" || u64 len(salt) || salt)
//   chain(p, toks) = SHA-256(p (32 bytes) || u64 len(toks) || i32 tokens...)
#ifndef TANDEM_KVCACHE_BLOCK_HASH_H_
#define TANDEM_KVCACHE_BLOCK_HASH_H_

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>

namespace tandem::kvcache {

using TokenId = int32_t;

struct BlockHash {
  // The SHA-256 digest as four little-endian 64-bit words.
  std::array<uint64_t, 4> words{};

  bool operator==(const BlockHash&) const = default;

  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.words[0], b.words[1]);  // already uniform
  }
};

// The chain's starting point for a cache salt ("" for no salt).
BlockHash RootHash(std::string_view salt);

// The key of a block with `tokens` after a block keyed `parent`.
BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens);

}  // namespace tandem::kvcache

#endif  // TANDEM_KVCACHE_BLOCK_HASH_H_
