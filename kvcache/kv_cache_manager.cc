#include "kvcache/kv_cache_manager.h"

#include <algorithm>

#include "common/check.h"

namespace tandem::kvcache {

KvCacheManager::KvCacheManager(int32_t blocks, int32_t block_size, bool prefix_caching)
    : prefix_caching_(prefix_caching), pool_(blocks, block_size) {}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats s;
  s.total_blocks = pool_.total_blocks();
  s.used_blocks = pool_.used_blocks();
  s.cached_blocks = pool_.cached_blocks();
  s.prefix_queried_tokens = queried_tokens_;
  s.prefix_hit_tokens = hit_tokens_;
  s.evictions = pool_.evictions();
  s.sliding_released = sliding_released_;
  return s;
}

void KvCacheManager::EnableSlidingRelease(int32_t window,
                                          std::function<void(std::span<const BlockId>)> release) {
  TANDEM_CHECK(window > 0 && sequences_.empty(),
               "sliding release needs a window and must start before any sequence");
  window_ = window;
  release_ = std::move(release);
  released_.assign(static_cast<size_t>(total_blocks()), 0);
}

bool KvCacheManager::Allocate(int32_t count, std::vector<BlockId>* out) {
  const size_t first = out->size();
  if (!pool_.Allocate(count, out)) return false;
  if (!released_.empty()) {
    for (size_t i = first; i < out->size(); ++i) released_[static_cast<size_t>((*out)[i])] = 0;
  }
  return true;
}

void KvCacheManager::ReleaseBehindWindow(Sequence& seq) {
  if (window_ == 0) return;
  // Position p reads keys from p + 1 - window_ on, and every later position
  // of the sequence is at least `filled`: blocks wholly below filled + 1 -
  // window_ are never read again in the sliding layers. Released only below
  // the window of the last block boundary instead, (filled rounded down to
  // a block) + 1 - window_: a later request that resends this sequence's
  // tokens resumes there at best (a partly filled block is never cached),
  // and its match must not be cut (FindPrefix). At most one block more is
  // kept.
  const int32_t boundary = seq.filled / block_size() * block_size();
  const int32_t behind = std::min(static_cast<int32_t>(seq.blocks.size()),
                                  std::max(0, boundary + 1 - window_) / block_size());
  std::vector<BlockId> released;
  for (int32_t i = seq.passed; i < behind; ++i) {
    const BlockId b = seq.blocks[static_cast<size_t>(i)];
    if (released_[static_cast<size_t>(b)] != 0 || pool_.ref_count(b) != 1) continue;
    released_[static_cast<size_t>(b)] = 1;
    released.push_back(b);
  }
  seq.passed = std::max(seq.passed, behind);
  if (released.empty()) return;
  sliding_released_ += static_cast<int64_t>(released.size());
  release_(released);
}

PrefixMatch KvCacheManager::FindPrefix(std::span<const TokenId> tokens,
                                       const std::string& salt) const {
  PrefixMatch match;
  if (!prefix_caching_ || tokens.empty()) return match;
  const size_t bs = static_cast<size_t>(block_size());
  const size_t max_blocks = (tokens.size() - 1) / bs;  // leave one token to compute
  BlockHash hash = RootHash(salt);
  for (size_t i = 0; i < max_blocks; ++i) {
    const std::span<const TokenId> block = tokens.subspan(i * bs, bs);
    hash = ChainHash(hash, block);
    const std::optional<BlockId> found = pool_.Find(hash, block);
    if (!found.has_value()) break;
    match.blocks.push_back(*found);
  }
  // With sliding-window layers whose pages may have been given back: the
  // first computed position, match.tokens, reads keys from match.tokens + 1
  // - window_ on; a match whose window reaches a released block ends before
  // that block (shorter matches' windows start lower, so they need it too).
  for (;;) {
    const size_t end = match.blocks.size();
    if (window_ == 0 || end == 0) break;
    const size_t from =
        static_cast<size_t>(std::max<int64_t>(0, static_cast<int64_t>(end * bs) + 1 - window_)) /
        bs;
    size_t last_released = end;
    for (size_t i = from; i < end; ++i) {
      if (released_[static_cast<size_t>(match.blocks[i])] != 0) last_released = i;
    }
    if (last_released == end) break;
    match.blocks.resize(last_released);
  }
  match.tokens = static_cast<int32_t>(match.blocks.size() * bs);
  return match;
}

bool KvCacheManager::Admit(SequenceId id, const std::string& salt, std::span<const TokenId> prompt,
                           const PrefixMatch& match, int32_t tokens_to_hold) {
  TANDEM_CHECK(!sequences_.contains(id), "admitting a sequence twice");
  const int32_t matched = static_cast<int32_t>(match.blocks.size());
  const int32_t needed = std::max(0, BlocksFor(tokens_to_hold) - matched);
  // Reusing a free cached block takes it off the free list too.
  int32_t free_matched = 0;
  for (BlockId b : match.blocks) free_matched += pool_.ref_count(b) == 0 ? 1 : 0;
  if (needed > pool_.free_blocks() - free_matched) return false;

  Sequence seq;
  seq.last_hash = RootHash(salt);
  const size_t bs = static_cast<size_t>(block_size());
  for (int32_t i = 0; i < matched; ++i) {
    pool_.Acquire(match.blocks[static_cast<size_t>(i)]);
    seq.blocks.push_back(match.blocks[static_cast<size_t>(i)]);
    seq.last_hash = ChainHash(seq.last_hash, prompt.subspan(static_cast<size_t>(i) * bs, bs));
  }
  TANDEM_CHECK(Allocate(needed, &seq.blocks), "the pool shrank while admitting");
  seq.committed = matched;
  seq.filled = match.tokens;
  sequences_.emplace(id, std::move(seq));
  queried_tokens_ += static_cast<int64_t>(prompt.size());
  hit_tokens_ += match.tokens;
  return true;
}

bool KvCacheManager::Reserve(SequenceId id, int32_t tokens) {
  auto it = sequences_.find(id);
  TANDEM_CHECK(it != sequences_.end(), "reserving for an unknown sequence");
  Sequence& seq = it->second;
  const int32_t needed = std::max(0, BlocksFor(tokens) - static_cast<int32_t>(seq.blocks.size()));
  // The block that receives the next token is partly filled and shared:
  // writing it in place would change the other holders' KV.
  const int32_t partial = seq.filled / block_size();
  const bool copy_on_write = tokens > seq.filled && seq.filled % block_size() != 0 &&
                             pool_.ref_count(seq.blocks[static_cast<size_t>(partial)]) > 1;
  if (needed + (copy_on_write ? 1 : 0) > pool_.free_blocks()) return false;
  if (copy_on_write) {
    std::vector<BlockId> fresh;
    Allocate(1, &fresh);
    BlockId& slot = seq.blocks[static_cast<size_t>(partial)];
    copies_.push_back({slot, fresh[0]});
    const BlockId shared = slot;
    slot = fresh[0];
    pool_.Release({&shared, 1});
  }
  TANDEM_CHECK(Allocate(needed, &seq.blocks), "the pool shrank while reserving");
  return true;
}

void KvCacheManager::Commit(SequenceId id, std::span<const TokenId> tokens, int32_t computed) {
  auto it = sequences_.find(id);
  TANDEM_CHECK(it != sequences_.end(), "committing an unknown sequence");
  Sequence& seq = it->second;
  seq.filled = computed;
  ReleaseBehindWindow(seq);
  if (!prefix_caching_) return;
  const int32_t full = computed / block_size();
  const size_t bs = static_cast<size_t>(block_size());
  for (int32_t i = seq.committed; i < full; ++i) {
    const std::span<const TokenId> block = tokens.subspan(static_cast<size_t>(i) * bs, bs);
    const std::optional<BlockHash> parent =
        i == 0 ? std::nullopt : std::optional<BlockHash>(seq.last_hash);
    seq.last_hash = ChainHash(seq.last_hash, block);
    // When another block already holds this prefix (two sequences computed
    // it at once), ours simply stays out of the index.
    pool_.Cache(seq.blocks[static_cast<size_t>(i)], seq.last_hash, block, parent);
  }
  seq.committed = std::max(seq.committed, full);
}

void KvCacheManager::Fork(SequenceId parent, SequenceId child) {
  auto it = sequences_.find(parent);
  TANDEM_CHECK(it != sequences_.end(), "forking an unknown sequence");
  TANDEM_CHECK(!sequences_.contains(child), "forking into an existing sequence");
  Sequence copy = it->second;
  for (BlockId b : copy.blocks) pool_.Acquire(b);
  sequences_.emplace(child, std::move(copy));
}

void KvCacheManager::Release(SequenceId id) {
  auto it = sequences_.find(id);
  if (it == sequences_.end()) return;
  // Last blocks first, so that a prefix's first blocks (the most shareable)
  // are the last to be evicted.
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.Release(reversed);
  sequences_.erase(it);
}

const std::vector<BlockId>& KvCacheManager::BlockTable(SequenceId id) const {
  auto it = sequences_.find(id);
  TANDEM_CHECK(it != sequences_.end(), "the block table of an unknown sequence");
  return it->second.blocks;
}

std::vector<BlockCopy> KvCacheManager::TakeCopies() {
  std::vector<BlockCopy> out;
  out.swap(copies_);
  return out;
}

}  // namespace tandem::kvcache
