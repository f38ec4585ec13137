// The paged KV cache's bookkeeping: exact block ids, eviction order, hash
// chaining, cache salts, copy-on-write, the at-least-one-token rule, and a
// randomized test of thousands of operations against a simple model.
#include "kvcache/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "kvcache/kv_cache_manager.h"

namespace tandem::kvcache {
namespace {

using Blocks = std::vector<BlockId>;

std::vector<TokenId> Tokens(int n, int salt = 0) {
  std::vector<TokenId> t;
  for (int i = 0; i < n; ++i) t.push_back(100 + (i * 31 + salt * 7) % 5000);
  return t;
}

// A digest written as hex (as Python's hashlib prints it), as BlockHash words.
BlockHash FromHex(std::string_view hex) {
  BlockHash h;
  for (size_t i = 0; i < 32; ++i) {
    const auto byte =
        static_cast<uint64_t>(std::stoul(std::string(hex.substr(2 * i, 2)), nullptr, 16));
    h.words[i / 8] |= byte << (8 * (i % 8));
  }
  return h;
}

TEST(BlockHashTest, KeysAreSha256OfTheDocumentedBytes) {
  // Expected digests from Python's hashlib over the bytes block_hash.h
  // documents:
  //   root = sha256(b"tandem.kv.root" + pack("<Q", 0))
  //   chain = sha256(root + pack("<Q", 3) + pack("<3i", 1, 2, -3))
  //   sha256(b"tandem.kv.root" + pack("<Q", 5) + b"alice")
  const BlockHash root = RootHash("");
  EXPECT_EQ(root, FromHex("b1fdaf2590b0b031111221fd50c9cd03e0d1924e57d4b7637fddcb5604e13971"));
  const std::vector<TokenId> tokens = {1, 2, -3};
  EXPECT_EQ(ChainHash(root, tokens),
            FromHex("d44f3ca9ade7178345daf4d271c6305247f5fc14095964283d096cfb5f8b6bde"));
  EXPECT_EQ(RootHash("alice"),
            FromHex("01caef2dbecdbec78ae9480e7a6f543c671d1674a87ac79cb7f40a5e66f69d65"));
  // The chain depends on the parent, the order and the count of tokens.
  const std::vector<TokenId> swapped = {2, 1, -3}, shorter = {1, 2};
  EXPECT_NE(ChainHash(root, swapped), ChainHash(root, tokens));
  EXPECT_NE(ChainHash(root, shorter), ChainHash(root, tokens));
  EXPECT_NE(ChainHash(RootHash("alice"), tokens), ChainHash(root, tokens));
}

TEST(BlockPoolTest, AllocatesLowestIdsFirstAndAllOrNothing) {
  BlockPool pool(4, 16);
  Blocks a;
  ASSERT_TRUE(pool.Allocate(3, &a));
  EXPECT_EQ(a, (Blocks{0, 1, 2}));
  Blocks b;
  EXPECT_FALSE(pool.Allocate(2, &b));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(pool.free_blocks(), 1);
  EXPECT_EQ(pool.used_blocks(), 3);
}

TEST(BlockPoolTest, UncachedBlocksAreReusedFirstAndCachedOnesEvictedLeastRecentlyUsedFirst) {
  BlockPool pool(4, 2);
  Blocks held;
  ASSERT_TRUE(pool.Allocate(4, &held));
  const std::vector<TokenId> t0 = {1, 2}, t1 = {3, 4};
  ASSERT_TRUE(pool.Cache(0, BlockHash{0, 1}, t0));
  ASSERT_TRUE(pool.Cache(1, BlockHash{0, 2}, t1));
  pool.Release(Blocks{1});     // cached: tail
  pool.Release(Blocks{2});     // uncached: head
  pool.Release(Blocks{0, 3});  // cached to the tail, uncached to the head
  EXPECT_EQ(pool.FreeListOrder(), (Blocks{3, 2, 1, 0}));
  EXPECT_EQ(pool.cached_blocks(), 2);
  Blocks taken;
  ASSERT_TRUE(pool.Allocate(3, &taken));
  EXPECT_EQ(taken, (Blocks{3, 2, 1}));
  EXPECT_EQ(pool.evictions(), 1);  // block 1 was cached
  EXPECT_FALSE(pool.Find(BlockHash{0, 2}, t1).has_value());
  EXPECT_EQ(pool.Find(BlockHash{0, 1}, t0), 0);
}

TEST(BlockPoolTest, FindChecksTheTokensAndCacheRefusesATakenHash) {
  BlockPool pool(2, 2);
  Blocks held;
  ASSERT_TRUE(pool.Allocate(2, &held));
  const std::vector<TokenId> tokens = {7, 8}, other = {7, 9};
  ASSERT_TRUE(pool.Cache(0, BlockHash{5, 5}, tokens));
  EXPECT_FALSE(pool.Find(BlockHash{5, 5}, other).has_value());  // a hash collision is no match
  EXPECT_FALSE(pool.Cache(1, BlockHash{5, 5}, tokens));
  EXPECT_FALSE(pool.is_cached(1));
}

TEST(BlockPoolTest, AcquiringAFreeCachedBlockTakesItOffTheFreeList) {
  BlockPool pool(3, 1);
  Blocks held;
  ASSERT_TRUE(pool.Allocate(1, &held));
  const std::vector<TokenId> t = {4};
  pool.Cache(0, BlockHash{1, 1}, t);
  pool.Release(held);
  EXPECT_EQ(pool.free_blocks(), 3);
  pool.Acquire(0);
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_EQ(pool.FreeListOrder(), (Blocks{1, 2}));
}

TEST(BlockPoolDeathTest, DoubleReleaseAborts) {
  BlockPool pool(2, 16);
  Blocks a;
  ASSERT_TRUE(pool.Allocate(1, &a));
  pool.Release(a);
  EXPECT_DEATH(pool.Release(a), "not held");
}

TEST(BlockHashTest, ChainsParentsAndSalts) {
  const std::vector<TokenId> block = {1, 2, 3, 4};
  const BlockHash root = RootHash(""), other_root = RootHash("tenant-b");
  EXPECT_NE(root, other_root);
  EXPECT_EQ(ChainHash(root, block), ChainHash(root, block));
  EXPECT_NE(ChainHash(root, block), ChainHash(other_root, block));
  const BlockHash parent_a = ChainHash(root, std::vector<TokenId>{9, 9, 9, 9});
  const BlockHash parent_b = ChainHash(root, std::vector<TokenId>{9, 9, 9, 8});
  EXPECT_NE(ChainHash(parent_a, block), ChainHash(parent_b, block));
}

class KvCacheManagerTest : public ::testing::Test {
 protected:
  // Admits a sequence with its cached prefix; returns the cached token count.
  int32_t Admit(KvCacheManager& kv, SequenceId id, const std::vector<TokenId>& prompt,
                const std::string& salt = "") {
    const PrefixMatch match = kv.FindPrefix(prompt, salt);
    EXPECT_TRUE(kv.Admit(id, salt, prompt, match, static_cast<int32_t>(prompt.size())));
    kv.Commit(id, prompt, static_cast<int32_t>(prompt.size()));
    return match.tokens;
  }
};

TEST_F(KvCacheManagerTest, ASecondRequestReusesTheFirstOnesBlocksExactly) {
  KvCacheManager kv(8, 16);
  const std::vector<TokenId> prompt = Tokens(40);
  EXPECT_EQ(Admit(kv, 1, prompt), 0);
  EXPECT_EQ(kv.BlockTable(1), (Blocks{0, 1, 2}));
  kv.Release(1);
  // Block 2 (partial) is reusable at once; 0 and 1 are cached, 0 evicted last.
  EXPECT_EQ(kv.pool().FreeListOrder(), (Blocks{2, 3, 4, 5, 6, 7, 1, 0}));
  EXPECT_EQ(Admit(kv, 2, prompt), 32);
  EXPECT_EQ(kv.BlockTable(2), (Blocks{0, 1, 2}));
  const KvCacheStats stats = kv.stats();
  EXPECT_EQ(stats.prefix_queried_tokens, 80);
  EXPECT_EQ(stats.prefix_hit_tokens, 32);
  EXPECT_EQ(stats.used_blocks, 3);
  kv.Release(2);
  EXPECT_EQ(kv.free_blocks(), 8);
}

TEST_F(KvCacheManagerTest, AtLeastOneTokenIsAlwaysLeftToCompute) {
  KvCacheManager kv(8, 16);
  const std::vector<TokenId> prompt = Tokens(48);
  Admit(kv, 1, prompt);
  // All three blocks are cached, but a prompt of exactly 32 or 48 of these
  // tokens must still compute its last token.
  EXPECT_EQ(kv.FindPrefix(std::vector<TokenId>(prompt.begin(), prompt.begin() + 48), "").tokens,
            32);
  EXPECT_EQ(kv.FindPrefix(std::vector<TokenId>(prompt.begin(), prompt.begin() + 32), "").tokens,
            16);
  EXPECT_EQ(kv.FindPrefix(std::vector<TokenId>(prompt.begin(), prompt.begin() + 33), "").tokens,
            32);
  EXPECT_EQ(kv.FindPrefix(std::vector<TokenId>(prompt.begin(), prompt.begin() + 16), "").tokens, 0);
}

TEST_F(KvCacheManagerTest, TheSameTokensUnderAnotherParentOrSaltDoNotMatch) {
  KvCacheManager kv(16, 4);
  const std::vector<TokenId> a = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<TokenId> b = a;
  b[0] = 99;  // first block differs, second block's tokens are the same
  Admit(kv, 1, a, "tenant-a");
  EXPECT_EQ(kv.FindPrefix(a, "tenant-a").tokens, 8);
  EXPECT_EQ(kv.FindPrefix(a, "tenant-b").tokens, 0);
  EXPECT_EQ(kv.FindPrefix(a, "").tokens, 0);
  EXPECT_EQ(kv.FindPrefix(b, "tenant-a").tokens, 0);
}

TEST_F(KvCacheManagerTest, BlocksFilledByDecodingEnterTheIndex) {
  KvCacheManager kv(8, 4);
  std::vector<TokenId> tokens = {1, 2, 3};
  ASSERT_TRUE(kv.Admit(1, "", tokens, {}, 3));
  kv.Commit(1, tokens, 3);
  EXPECT_EQ(kv.stats().cached_blocks, 0);
  for (TokenId t : {4, 5, 6}) {  // decode: the block fills at the fourth token
    tokens.push_back(t);
    ASSERT_TRUE(kv.Reserve(1, static_cast<int32_t>(tokens.size())));
    kv.Commit(1, tokens, static_cast<int32_t>(tokens.size()));
  }
  EXPECT_EQ(kv.stats().cached_blocks, 1);
  // The next turn of the conversation starts with prompt + answer.
  const std::vector<TokenId> next_turn = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ(kv.FindPrefix(next_turn, "").tokens, 4);
}

TEST_F(KvCacheManagerTest, ForkSharesBlocksAndCopiesAPartlyFilledOneOnWrite) {
  KvCacheManager kv(6, 16);
  const std::vector<TokenId> prompt = Tokens(20);
  ASSERT_TRUE(kv.Admit(1, "", prompt, {}, 20));
  kv.Commit(1, prompt, 20);
  kv.Fork(1, 2);
  EXPECT_EQ(kv.BlockTable(2), (Blocks{0, 1}));
  EXPECT_EQ(kv.pool().ref_count(0), 2);
  EXPECT_EQ(kv.pool().ref_count(1), 2);
  // The child writes token 20 into block 1, which the parent shares: copy first.
  ASSERT_TRUE(kv.Reserve(2, 21));
  EXPECT_EQ(kv.BlockTable(2), (Blocks{0, 2}));
  EXPECT_EQ(kv.BlockTable(1), (Blocks{0, 1}));
  const std::vector<BlockCopy> copies = kv.TakeCopies();
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].from, 1);
  EXPECT_EQ(copies[0].to, 2);
  EXPECT_EQ(kv.pool().ref_count(1), 1);
  // The parent now owns block 1 alone: no copy.
  ASSERT_TRUE(kv.Reserve(1, 21));
  EXPECT_TRUE(kv.TakeCopies().empty());
  // Full shared blocks are never copied: growing past them takes new blocks.
  ASSERT_TRUE(kv.Reserve(2, 40));
  EXPECT_EQ(kv.BlockTable(2), (Blocks{0, 2, 3}));
  EXPECT_TRUE(kv.TakeCopies().empty());
  kv.Release(1);
  kv.Release(2);
  EXPECT_EQ(kv.free_blocks(), 6);
}

TEST_F(KvCacheManagerTest, WhatDoesNotFitIsRefusedWithoutChangingAnything) {
  KvCacheManager kv(3, 4);
  const std::vector<TokenId> prompt = Tokens(10);
  ASSERT_TRUE(kv.Admit(1, "", prompt, {}, 10));  // 3 blocks
  const std::vector<TokenId> other = Tokens(5, 1);
  EXPECT_FALSE(kv.Admit(2, "", other, {}, 5));
  EXPECT_FALSE(kv.Has(2));
  EXPECT_FALSE(kv.Reserve(1, 13));
  EXPECT_EQ(kv.BlockTable(1).size(), 3u);
  EXPECT_EQ(kv.free_blocks(), 0);
}

TEST_F(KvCacheManagerTest, EvictionFreesSpaceForNewSequencesLeastRecentlyUsedFirst) {
  KvCacheManager kv(4, 2);
  const std::vector<TokenId> a = {1, 2, 3, 4, 5}, b = {6, 7, 8, 9, 10};
  Admit(kv, 1, a);  // blocks 0,1 full (cached), 2 partial
  kv.Release(1);
  Admit(kv, 2, b);  // takes 2, 3, then evicts the least recently used cached block
  EXPECT_EQ(kv.BlockTable(2), (Blocks{2, 3, 1}));
  EXPECT_EQ(kv.stats().evictions, 1);
  EXPECT_EQ(kv.FindPrefix(a, "").tokens, 2);  // block 0, the first of a's prefix, survives
}

// Sliding-window layers (window 6, blocks of 4): a block is released once
// the sequence has computed a whole window past it, exactly once, and only
// while the sequence holds it alone.
TEST_F(KvCacheManagerTest, SlidingReleaseGivesBackBlocksAWholeWindowBehindExactlyOnce) {
  KvCacheManager kv(16, 4);
  std::vector<Blocks> calls;
  kv.EnableSlidingRelease(
      6, [&](std::span<const BlockId> b) { calls.emplace_back(b.begin(), b.end()); });
  std::vector<TokenId> tokens = Tokens(10);
  ASSERT_TRUE(kv.Admit(1, "", tokens, {}, 10));
  kv.Commit(1, tokens, 10);
  // Position 10 reads keys from 5 on, but a request resending these tokens
  // would resume at 8 (the last block boundary), reading from 3: block 0
  // (keys 0-3) is kept.
  EXPECT_TRUE(calls.empty());
  const std::vector<TokenId> more = Tokens(20);
  for (int32_t computed = 11; computed <= 20; ++computed) {
    tokens.push_back(more[static_cast<size_t>(computed - 1)]);
    ASSERT_TRUE(kv.Reserve(1, computed));
    kv.Commit(1, tokens, computed);
  }
  // Computed 12: a resend resumes at 12, reading from 7 (block 0 behind);
  // 16: from 11 (block 1); 20: from 15 (block 2).
  EXPECT_EQ(calls, (std::vector<Blocks>{{0}, {1}, {2}}));
  EXPECT_EQ(kv.stats().sliding_released, 3);
  for (BlockId b : {0, 1, 2}) EXPECT_TRUE(kv.sliding_released(b)) << b;
  for (BlockId b : {3, 4}) EXPECT_FALSE(kv.sliding_released(b)) << b;
  kv.Commit(1, tokens, 20);  // nothing new
  EXPECT_EQ(calls.size(), 3u);
  // Computed 23: keys from 18 on, but a resend resumes at 20, reading from
  // 15: block 3 (keys 12-15) is kept.
  for (int32_t computed = 21; computed <= 23; ++computed) {
    tokens.push_back(static_cast<TokenId>(computed));
    ASSERT_TRUE(kv.Reserve(1, computed));
    kv.Commit(1, tokens, computed);
  }
  EXPECT_EQ(calls, (std::vector<Blocks>{{0}, {1}, {2}}));
  kv.Release(1);
  std::vector<TokenId> next_turn = tokens;
  next_turn.push_back(7);
  EXPECT_EQ(kv.FindPrefix(next_turn, "").tokens, 20);  // the resend's match is whole
}

TEST_F(KvCacheManagerTest, APrefixMatchNeverEndsWhereItsWindowReadsAReleasedBlock) {
  KvCacheManager kv(16, 4);
  kv.EnableSlidingRelease(6, [](std::span<const BlockId>) {});
  const std::vector<TokenId> tokens = Tokens(24);
  ASSERT_TRUE(kv.Admit(1, "", std::span(tokens).first(20), {}, 20));
  kv.Commit(1, std::span(tokens).first(20), 20);  // keys from 15 on: blocks 0-2 released
  kv.Release(1);
  // The whole conversation resent: its first computed position, 20, reads
  // keys 15-19 (blocks 3 and 4, whole).
  const PrefixMatch whole = kv.FindPrefix(std::span(tokens).first(21), "");
  EXPECT_EQ(whole.tokens, 20);
  EXPECT_EQ(whole.blocks, (Blocks{0, 1, 2, 3, 4}));
  // A prompt that shares only 17 tokens: a match of 16 would read keys
  // 11-15 (block 2, released), and every shorter one a released block too.
  std::vector<TokenId> diverging(tokens.begin(), tokens.begin() + 17);
  diverging.push_back(9999);
  EXPECT_EQ(kv.FindPrefix(diverging, "").tokens, 0);
  // Without sliding release the same prompt matches 16 tokens.
  KvCacheManager plain(16, 4);
  ASSERT_TRUE(plain.Admit(1, "", std::span(tokens).first(20), {}, 20));
  plain.Commit(1, std::span(tokens).first(20), 20);
  EXPECT_EQ(plain.FindPrefix(diverging, "").tokens, 16);
}

TEST_F(KvCacheManagerTest, SharedBlocksAreKeptAndAReallocatedBlockIsWholeAgain) {
  KvCacheManager kv(8, 4);
  std::vector<Blocks> calls;
  kv.EnableSlidingRelease(
      6, [&](std::span<const BlockId> b) { calls.emplace_back(b.begin(), b.end()); });
  const std::vector<TokenId> prompt = Tokens(8);
  ASSERT_TRUE(kv.Admit(1, "", prompt, {}, 8));
  kv.Commit(1, prompt, 8);
  EXPECT_TRUE(calls.empty());  // keys from 3 on: block 0 is still read
  kv.Fork(1, 2);               // parallel samples share blocks 0 and 1
  std::vector<TokenId> tokens = prompt;
  auto decode = [&](std::initializer_list<TokenId> more) {
    for (TokenId t : more) {
      tokens.push_back(t);
      ASSERT_TRUE(kv.Reserve(1, static_cast<int32_t>(tokens.size())));
      kv.Commit(1, tokens, static_cast<int32_t>(tokens.size()));
    }
  };
  decode({7, 8, 9, 10});  // computed 12: block 0 behind, but shared
  EXPECT_TRUE(calls.empty());
  kv.Release(2);
  decode({11, 12, 13, 14});
  // Computed 16: block 1 behind, held alone now; block 0 was passed while
  // shared (kept).
  EXPECT_EQ(calls, (std::vector<Blocks>{{1}}));
  EXPECT_FALSE(kv.sliding_released(0));
  EXPECT_TRUE(kv.sliding_released(1));
  kv.Release(1);
  // Another prompt takes every block, the released one among them: whoever
  // takes a block writes it before reading, so it is whole again.
  const std::vector<TokenId> other = Tokens(32, 5);
  ASSERT_TRUE(kv.Admit(3, "", other, {}, 32));
  EXPECT_FALSE(kv.sliding_released(1));
}

// Thousands of random operations against a model that tracks, for every
// block, its holders and the tokens written in it (as the backend would).
// With `window` > 0, also sliding release: a block's sliding-window layers
// (`sliding`, per block) are lost when it is released and whole again when
// written; every key a sequence's next position or a prefix match's first
// computed position reads in those layers must be whole.
void RunRandomOperations(int32_t window) {
  constexpr int32_t kBlocks = 24, kBlockSize = 4;
  std::mt19937 rng(2024);
  KvCacheManager kv(kBlocks, kBlockSize);
  std::vector<std::vector<TokenId>> content(kBlocks, std::vector<TokenId>(kBlockSize, -1));
  std::vector<bool> sliding(kBlocks, true);
  int64_t released = 0;
  if (window > 0) {
    kv.EnableSlidingRelease(window, [&](std::span<const BlockId> blocks) {
      for (BlockId b : blocks) {
        EXPECT_EQ(kv.pool().ref_count(b), 1) << "released block " << b << " is shared";
        EXPECT_TRUE(sliding[static_cast<size_t>(b)]) << "block " << b << " released twice";
        sliding[static_cast<size_t>(b)] = false;
        ++released;
      }
    });
  }
  // The keys [from, to) of these blocks are whole in the sliding layers.
  auto expect_window_whole = [&](const std::vector<BlockId>& table, int32_t to) {
    if (window == 0) return;
    for (int32_t p = std::max(0, to + 1 - window); p < to; ++p) {
      ASSERT_TRUE(sliding[static_cast<size_t>(table[static_cast<size_t>(p / kBlockSize)])])
          << "key " << p << " of a window was released";
    }
  };
  std::map<SequenceId, std::vector<TokenId>> sequences;  // id -> tokens computed
  const std::vector<std::vector<TokenId>> prefixes = {Tokens(9, 1), Tokens(13, 2), Tokens(6, 3)};
  const std::vector<std::string> salts = {"", "t1"};
  std::map<SequenceId, std::string> salt_of;
  SequenceId next = 1;
  int64_t hits = 0;

  auto write = [&](SequenceId id, int32_t from, int32_t to) {
    const auto& table = kv.BlockTable(id);
    for (int32_t p = from; p < to; ++p) {
      const auto block = static_cast<size_t>(table[static_cast<size_t>(p / kBlockSize)]);
      content[block][static_cast<size_t>(p % kBlockSize)] = sequences[id][static_cast<size_t>(p)];
      sliding[block] = true;
    }
  };
  auto apply_copies = [&] {
    for (const BlockCopy& c : kv.TakeCopies()) {
      content[static_cast<size_t>(c.to)] = content[static_cast<size_t>(c.from)];
      sliding[static_cast<size_t>(c.to)] = sliding[static_cast<size_t>(c.from)];
    }
  };
  auto check = [&] {
    std::vector<int32_t> holders(kBlocks, 0);
    for (const auto& [id, tokens] : sequences) {
      const auto& table = kv.BlockTable(id);
      ASSERT_GE(static_cast<int32_t>(table.size()) * kBlockSize,
                static_cast<int32_t>(tokens.size()));
      std::set<BlockId> distinct(table.begin(), table.end());
      ASSERT_EQ(distinct.size(), table.size()) << "a sequence holds a block twice";
      for (BlockId b : table) ++holders[static_cast<size_t>(b)];
      // Every token a sequence computed is in its blocks.
      for (size_t p = 0; p < tokens.size(); ++p) {
        ASSERT_EQ(content[static_cast<size_t>(table[p / kBlockSize])][p % kBlockSize], tokens[p])
            << "sequence " << id << " lost token " << p;
      }
      expect_window_whole(table, static_cast<int32_t>(tokens.size()));
    }
    int32_t free = 0;
    for (BlockId b = 0; b < kBlocks; ++b) {
      ASSERT_EQ(kv.pool().ref_count(b), holders[static_cast<size_t>(b)]) << "block " << b;
      free += holders[static_cast<size_t>(b)] == 0 ? 1 : 0;
    }
    ASSERT_EQ(kv.free_blocks(), free);
    const auto order = kv.pool().FreeListOrder();
    ASSERT_EQ(static_cast<int32_t>(order.size()), free);
    for (BlockId b : order) ASSERT_EQ(holders[static_cast<size_t>(b)], 0) << "free and held";
  };

  for (int op = 0; op < 5000; ++op) {
    const int kind = static_cast<int>(rng() % 10);
    if (kind < 3 || sequences.empty()) {  // admit: a shared prefix plus a random tail
      std::vector<TokenId> prompt = prefixes[rng() % prefixes.size()];
      for (int i = static_cast<int>(rng() % 7); i > 0; --i)
        prompt.push_back(static_cast<TokenId>(rng() % 50));
      const std::string& salt = salts[rng() % salts.size()];
      const PrefixMatch match = kv.FindPrefix(prompt, salt);
      ASSERT_LT(match.tokens, static_cast<int32_t>(prompt.size()));
      for (int32_t p = 0; p < match.tokens; ++p) {  // cached blocks hold exactly these tokens
        ASSERT_EQ(content[static_cast<size_t>(match.blocks[static_cast<size_t>(p / kBlockSize)])]
                         [static_cast<size_t>(p % kBlockSize)],
                  prompt[static_cast<size_t>(p)]);
      }
      expect_window_whole(match.blocks, match.tokens);
      if (::testing::Test::HasFatalFailure()) return;
      hits += match.tokens;
      const SequenceId id = next++;
      if (!kv.Admit(id, salt, prompt, match, static_cast<int32_t>(prompt.size()))) continue;
      sequences[id] = prompt;
      salt_of[id] = salt;
      write(id, match.tokens, static_cast<int32_t>(prompt.size()));
      kv.Commit(id, prompt, static_cast<int32_t>(prompt.size()));
    } else if (kind < 6) {  // decode a few tokens
      auto it = std::next(sequences.begin(), static_cast<long>(rng() % sequences.size()));
      const int32_t before = static_cast<int32_t>(it->second.size());
      const int32_t grow = 1 + static_cast<int32_t>(rng() % 5);
      if (!kv.Reserve(it->first, before + grow)) continue;
      apply_copies();
      for (int32_t i = 0; i < grow; ++i) it->second.push_back(static_cast<TokenId>(rng() % 50));
      write(it->first, before, before + grow);
      kv.Commit(it->first, it->second, before + grow);
    } else if (kind < 7) {  // fork
      auto it = std::next(sequences.begin(), static_cast<long>(rng() % sequences.size()));
      const SequenceId child = next++;
      kv.Fork(it->first, child);
      sequences[child] = it->second;
      salt_of[child] = salt_of[it->first];
    } else {  // finish or preempt
      auto it = std::next(sequences.begin(), static_cast<long>(rng() % sequences.size()));
      kv.Release(it->first);
      sequences.erase(it);
    }
    check();
    if (::testing::Test::HasFatalFailure()) return;
  }
  // (Sliding release cuts the matches whose window would read a released block.)
  EXPECT_GT(hits, window > 0 ? 500 : 1000) << "the workload should exercise the prefix cache";
  EXPECT_GT(kv.stats().evictions, 10) << "the workload should exercise eviction";
  EXPECT_EQ(kv.stats().sliding_released, released);
  if (window > 0) {
    EXPECT_GT(released, 100) << "the workload should exercise sliding release";
  }
  for (const auto& [id, tokens] : sequences) kv.Release(id);
  EXPECT_EQ(kv.free_blocks(), kBlocks);
  EXPECT_EQ(kv.stats().used_blocks, 0);
}

TEST(KvCacheManagerPropertyTest, RandomOperationsKeepEveryInvariant) { RunRandomOperations(0); }

TEST(KvCacheManagerPropertyTest, RandomOperationsNeverReleaseAKeyAWindowReads) {
  RunRandomOperations(6);
}

// --- the event journal (kvcache/kv_event.h) -------------------------------------

TEST(KvEventJournalTest, StoredRunsRemovalsInEvictionOrderAndASnapshot) {
  KvCacheManager kv(4, 2);
  kv.RecordEvents();
  const std::vector<TokenId> a = {10, 11, 12, 13, 14};
  const BlockHash a0 = ChainHash(RootHash(""), std::span(a).first(2));
  const BlockHash a1 = ChainHash(a0, std::span(a).subspan(2, 2));
  ASSERT_TRUE(kv.Admit(1, "", a, {}, 6));
  kv.Commit(1, a, 3);  // block 0 fills
  kv.Commit(1, a, 5);  // block 1 fills: the same run, one event
  std::vector<KvEvent> events = kv.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kStored);
  EXPECT_EQ(events[0].hashes, (std::vector<BlockHash>{a0, a1}));
  EXPECT_FALSE(events[0].parent.has_value());  // a sequence's first block
  EXPECT_EQ(events[0].tokens, (std::vector<TokenId>{10, 11, 12, 13}));
  EXPECT_TRUE(kv.TakeEvents().empty());

  // A later block of the same sequence names its parent.
  const std::vector<TokenId> a_more = {10, 11, 12, 13, 14, 15};
  kv.Commit(1, a_more, 6);
  events = kv.TakeEvents();
  ASSERT_EQ(events.size(), 1u);
  const BlockHash a2 = ChainHash(a1, std::span(a_more).subspan(4, 2));
  EXPECT_EQ(events[0].hashes, (std::vector<BlockHash>{a2}));
  EXPECT_EQ(events[0].parent, a1);
  EXPECT_EQ(events[0].tokens, (std::vector<TokenId>{14, 15}));

  // Released, then taken by another sequence: the cached blocks leave the
  // index least recently used first (the last block of a sequence first:
  // its first blocks are the most shareable), one Removed event.
  kv.Release(1);
  const std::vector<TokenId> b = {20, 21, 22, 23, 24, 25, 26, 27};
  ASSERT_TRUE(kv.Admit(2, "salt", b, {}, 8));
  kv.Commit(2, b, 7);
  events = kv.TakeEvents();
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kRemoved);
  EXPECT_EQ(events[0].hashes, (std::vector<BlockHash>{a2, a1, a0}));
  EXPECT_EQ(events[1].kind, KvEvent::Kind::kStored);
  const BlockHash b0 = ChainHash(RootHash("salt"), std::span(b).first(2));
  const BlockHash b1 = ChainHash(b0, std::span(b).subspan(2, 2));
  const BlockHash b2 = ChainHash(b1, std::span(b).subspan(4, 2));
  EXPECT_EQ(events[1].hashes, (std::vector<BlockHash>{b0, b1, b2}));
  EXPECT_EQ(events[1].tokens, (std::vector<TokenId>{20, 21, 22, 23, 24, 25}));

  // A snapshot: everything cached, after a clear, each block with its
  // parent and after it; it replaces the journal.
  kv.Commit(2, b, 8);  // journaled, then superseded by the snapshot
  const BlockHash b3 = ChainHash(b2, std::span(b).subspan(6, 2));
  events = kv.SnapshotEvents();
  ASSERT_EQ(events.size(), 5u);
  EXPECT_EQ(events[0].kind, KvEvent::Kind::kAllCleared);
  std::vector<std::pair<BlockHash, std::optional<BlockHash>>> listed;
  for (size_t i = 1; i < events.size(); ++i) {
    ASSERT_EQ(events[i].kind, KvEvent::Kind::kStored);
    ASSERT_EQ(events[i].hashes.size(), 1u);
    listed.emplace_back(events[i].hashes[0], events[i].parent);
  }
  // One chain: the snapshot lists it in order whichever block it met first.
  const std::vector<std::pair<BlockHash, std::optional<BlockHash>>> chain = {
      {b0, std::nullopt}, {b1, b0}, {b2, b1}, {b3, b2}};
  EXPECT_EQ(listed, chain);
  EXPECT_EQ(events[1].tokens, (std::vector<TokenId>{20, 21}));
  EXPECT_EQ(events[4].tokens, (std::vector<TokenId>{26, 27}));
  EXPECT_TRUE(kv.TakeEvents().empty());
}

TEST(KvEventJournalTest, NothingIsJournaledUnlessAsked) {
  KvCacheManager kv(4, 2);
  const std::vector<TokenId> a = {10, 11, 12};
  ASSERT_TRUE(kv.Admit(1, "", a, {}, 4));
  kv.Commit(1, a, 3);
  EXPECT_EQ(kv.stats().cached_blocks, 1);
  EXPECT_TRUE(kv.TakeEvents().empty());
}

}  // namespace
}  // namespace tandem::kvcache
