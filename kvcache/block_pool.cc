#include "kvcache/block_pool.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "common/check.h"

namespace tandem::kvcache {

BlockPool::BlockPool(int32_t blocks, int32_t block_size)
    : block_size_(block_size),
      blocks_(static_cast<size_t>(blocks)),
      tokens_(static_cast<size_t>(blocks) * static_cast<size_t>(block_size)) {
  for (BlockId b = 0; b < blocks; ++b) PushBack(b);
}

void BlockPool::Unlink(BlockId b) {
  Block& block = blocks_[static_cast<size_t>(b)];
  TANDEM_CHECK(block.in_free_list, "unlinking a block that is not free");
  if (block.prev >= 0) {
    blocks_[static_cast<size_t>(block.prev)].next = block.next;
  } else {
    head_ = block.next;
  }
  if (block.next >= 0) {
    blocks_[static_cast<size_t>(block.next)].prev = block.prev;
  } else {
    tail_ = block.prev;
  }
  block.prev = block.next = -1;
  block.in_free_list = false;
  --free_count_;
}

void BlockPool::PushFront(BlockId b) {
  Block& block = blocks_[static_cast<size_t>(b)];
  block.prev = -1;
  block.next = head_;
  if (head_ >= 0) blocks_[static_cast<size_t>(head_)].prev = b;
  head_ = b;
  if (tail_ < 0) tail_ = b;
  block.in_free_list = true;
  ++free_count_;
}

void BlockPool::PushBack(BlockId b) {
  Block& block = blocks_[static_cast<size_t>(b)];
  block.next = -1;
  block.prev = tail_;
  if (tail_ >= 0) blocks_[static_cast<size_t>(tail_)].next = b;
  tail_ = b;
  if (head_ < 0) head_ = b;
  block.in_free_list = true;
  ++free_count_;
}

void BlockPool::Evict(BlockId b) {
  Block& block = blocks_[static_cast<size_t>(b)];
  if (!block.cached) return;
  index_.erase(block.hash);
  block.cached = false;
  ++evictions_;
  if (!record_events_) return;
  if (events_.empty() || events_.back().kind != KvEvent::Kind::kRemoved) {
    events_.emplace_back().kind = KvEvent::Kind::kRemoved;
  }
  events_.back().hashes.push_back(block.hash);
}

bool BlockPool::Allocate(int32_t count, std::vector<BlockId>* out) {
  if (count > free_count_) return false;
  for (int32_t i = 0; i < count; ++i) {
    const BlockId b = head_;
    Unlink(b);
    Evict(b);
    blocks_[static_cast<size_t>(b)].refs = 1;
    out->push_back(b);
  }
  return true;
}

void BlockPool::Acquire(BlockId b) {
  Block& block = blocks_[static_cast<size_t>(b)];
  if (block.refs == 0) Unlink(b);
  ++block.refs;
}

void BlockPool::Release(std::span<const BlockId> blocks) {
  for (BlockId b : blocks) {
    TANDEM_CHECK(b >= 0 && b < total_blocks() && blocks_[static_cast<size_t>(b)].refs > 0,
                 "releasing a KV block that is not held");
    Block& block = blocks_[static_cast<size_t>(b)];
    if (--block.refs > 0) continue;
    if (block.cached) {
      PushBack(b);
    } else {
      PushFront(b);
    }
  }
}

bool BlockPool::Cache(BlockId b, const BlockHash& hash, std::span<const TokenId> tokens,
                      std::optional<BlockHash> parent) {
  Block& block = blocks_[static_cast<size_t>(b)];
  TANDEM_CHECK(block.refs > 0 && static_cast<int32_t>(tokens.size()) == block_size_,
               "only held, full blocks can be cached");
  if (block.cached) return block.hash == hash;
  if (!index_.emplace(hash, b).second) return false;
  block.cached = true;
  block.hash = hash;
  block.parent = parent;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<std::ptrdiff_t>(b) * block_size_);
  if (record_events_) {
    // The next block of the run the last event stored extends it.
    const bool extends = !events_.empty() && events_.back().kind == KvEvent::Kind::kStored &&
                         parent.has_value() && events_.back().hashes.back() == *parent;
    if (!extends) {
      KvEvent& stored = events_.emplace_back();
      stored.kind = KvEvent::Kind::kStored;
      stored.parent = parent;
    }
    events_.back().hashes.push_back(hash);
    events_.back().tokens.insert(events_.back().tokens.end(), tokens.begin(), tokens.end());
  }
  return true;
}

std::vector<KvEvent> BlockPool::TakeEvents() {
  std::vector<KvEvent> out;
  out.swap(events_);
  return out;
}

std::vector<KvEvent> BlockPool::SnapshotEvents() {
  events_.clear();
  std::vector<KvEvent> out(1);
  out[0].kind = KvEvent::Kind::kAllCleared;
  // Parents first: from each cached block, up its cached ancestors not
  // listed yet, then down again.
  absl::flat_hash_set<BlockHash> listed;
  std::vector<BlockId> chain;
  for (const auto& [hash, start] : index_) {
    chain.clear();
    for (BlockId b = start; !listed.contains(blocks_[static_cast<size_t>(b)].hash);) {
      chain.push_back(b);
      const std::optional<BlockHash>& parent = blocks_[static_cast<size_t>(b)].parent;
      auto up = parent.has_value() ? index_.find(*parent) : index_.end();
      if (up == index_.end()) break;
      b = up->second;
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const Block& block = blocks_[static_cast<size_t>(*it)];
      KvEvent& stored = out.emplace_back();
      stored.kind = KvEvent::Kind::kStored;
      stored.hashes = {block.hash};
      stored.parent = block.parent;
      const auto first = tokens_.begin() + static_cast<std::ptrdiff_t>(*it) * block_size_;
      stored.tokens.assign(first, first + block_size_);
      listed.insert(block.hash);
    }
  }
  return out;
}

std::optional<BlockId> BlockPool::Find(const BlockHash& hash,
                                       std::span<const TokenId> tokens) const {
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  const auto first = tokens_.begin() + static_cast<std::ptrdiff_t>(it->second) * block_size_;
  if (!std::equal(tokens.begin(), tokens.end(), first, first + block_size_)) return std::nullopt;
  return it->second;
}

std::vector<BlockId> BlockPool::FreeListOrder() const {
  std::vector<BlockId> order;
  for (BlockId b = head_; b >= 0; b = blocks_[static_cast<size_t>(b)].next) order.push_back(b);
  return order;
}

}  // namespace tandem::kvcache
