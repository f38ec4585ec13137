#include "kvcache/block_hash.h"

namespace tandem::kvcache {
namespace {

// splitmix64's finalizer: a bijective 64-bit mixer with full avalanche.
uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Two independent 64-bit lanes, each absorbing every word through the mixer.
struct Hasher {
  uint64_t a = 0x243F6A8885A308D3ull;  // digits of pi: arbitrary, distinct
  uint64_t b = 0x13198A2E03707344ull;

  void Absorb(uint64_t word) {
    a = Mix64(a ^ word) + 0x9E3779B97F4A7C15ull;
    b = Mix64(b + word * 0xD6E8FEB86659FD93ull) ^ 0xA0761D6478BD642Full;
  }
  BlockHash Finish() const { return {Mix64(a), Mix64(b ^ a)}; }
};

}  // namespace

BlockHash RootHash(std::string_view salt) {
  Hasher h;
  h.Absorb(salt.size());
  for (unsigned char c : salt) h.Absorb(c);
  return h.Finish();
}

BlockHash ChainHash(const BlockHash& parent, std::span<const TokenId> tokens) {
  Hasher h;
  h.Absorb(parent.high);
  h.Absorb(parent.low);
  h.Absorb(tokens.size());
  for (TokenId t : tokens) h.Absorb(static_cast<uint32_t>(t));
  return h.Finish();
}

}  // namespace tandem::kvcache
