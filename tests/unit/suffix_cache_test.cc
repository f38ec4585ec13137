// The suffix cache (engine/speculative/suffix_cache.h): longest matches over
// several requests' texts that never span two of them, tenant separation by
// salt, eviction oldest first within the byte budget, and the suffix
// matcher and proposer drafting from it.
#include "engine/speculative/suffix_cache.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/speculative/suffix_proposer.h"

namespace tandem::speculative {
namespace {

using Tokens = std::vector<TokenId>;

constexpr int64_t kSalt = SuffixCache::kBytesPerSalt;
constexpr int64_t kToken = SuffixCache::kBytesPerToken;
constexpr int64_t kId = SuffixCache::kBytesPerTokenId;

TEST(SuffixCacheTest, FindsTheLongestMatchAcrossTextsButNeverSpansTwo) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{1, 2, 3, 4, 5});  // positions 0..4, then the end of the text
  cache.Add("", Tokens{9, 3, 4, 5, 6});  // positions 6..10
  // "2 3 4 5": the first text's "5" ends its text (nothing to copy); the
  // second's matches "3 4 5" and goes on with 6.
  const SuffixMatch match = cache.Longest("", Tokens{2, 3, 4, 5}, 1);
  EXPECT_EQ(match.position, 10);
  EXPECT_EQ(match.length, 3);
  EXPECT_EQ(cache.Continuation("", match.position, 5), (Tokens{6})) << "stops at the text's end";
  EXPECT_EQ(cache.Longest("", Tokens{2, 3, 4, 5}, 4).position, -1) << "shorter than min_match";

  // "7 8" then "8 1": the tail "7 8" matches "7 8" only by spanning both.
  cache.Add("", Tokens{7, 8});
  cache.Add("", Tokens{8, 1});
  EXPECT_EQ(cache.Longest("", Tokens{7, 8}, 1).length, 1);
  EXPECT_EQ(cache.Longest("", Tokens{7, 8}, 2).position, -1);
  EXPECT_EQ(cache.Longest("", Tokens{42}, 1).position, -1) << "a token it never saw";
}

TEST(SuffixCacheTest, AmongEqualMatchesTheLatestTextWins) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{1, 2, 30});
  cache.Add("", Tokens{1, 2, 40});
  const SuffixMatch match = cache.Longest("", Tokens{1, 2}, 1);
  EXPECT_EQ(cache.Continuation("", match.position, 1), (Tokens{40}));
}

TEST(SuffixCacheTest, AmongEqualMatchesTheMostSharedContinuationWins) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{1, 2, 30});
  cache.Add("", Tokens{1, 2, 30});
  cache.Add("", Tokens{1, 2, 40});
  const SuffixMatch match = cache.Longest("", Tokens{1, 2}, 1);
  EXPECT_EQ(match.length, 2);
  EXPECT_EQ(cache.Continuation("", match.position, 1), (Tokens{30}));
}

TEST(SuffixCacheTest, ARequestNeverDraftsFromAnotherSaltsText) {
  SuffixCache cache(1 << 20);
  cache.Add("tenant-a", Tokens{1, 2, 3, 4});
  const SuffixMatch mine = cache.Longest("tenant-a", Tokens{1, 2}, 1);
  EXPECT_EQ(cache.Continuation("tenant-a", mine.position, 2), (Tokens{3, 4}));
  EXPECT_EQ(cache.Longest("tenant-b", Tokens{1, 2}, 1).position, -1);
  EXPECT_EQ(cache.Longest("", Tokens{1, 2}, 1).position, -1) << "unsalted is a salt of its own";
  EXPECT_TRUE(cache.Continuation("tenant-b", mine.position, 2).empty());
}

TEST(SuffixCacheTest, EvictsTheOldestTextsFirstAcrossSaltsWithinItsBudget) {
  // Four distinct tokens a text: each costs 5 kept tokens (the end too) and
  // 4 ids; a salt adds its own cost.
  const int64_t text = 5 * kToken + 4 * kId;
  const int64_t budget = kSalt + 2 * text + kSalt / 2;  // two texts of one salt, not three
  SuffixCache cache(budget);
  cache.Add("", Tokens{1, 2, 3, 4});
  cache.Add("", Tokens{5, 6, 7, 8});
  EXPECT_EQ(cache.stats().bytes, kSalt + 2 * text);
  EXPECT_EQ(cache.stats().evicted_texts, 0u);
  cache.Add("", Tokens{9, 10, 11, 12});  // the first text goes
  SuffixCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.texts, 2);
  EXPECT_EQ(stats.tokens, 8);
  EXPECT_EQ(stats.evicted_texts, 1u);
  EXPECT_EQ(stats.bytes, kSalt + 2 * text);
  EXPECT_EQ(cache.Longest("", Tokens{2}, 1).position, -1) << "evicted";
  EXPECT_NE(cache.Longest("", Tokens{6}, 1).position, -1);
  EXPECT_NE(cache.Longest("", Tokens{10}, 1).position, -1);

  // Another salt's text makes room by evicting the oldest texts, whatever
  // their salt; the emptied salt's cost goes with its last text.
  cache.Add("other", Tokens{13, 14, 15, 16});
  stats = cache.stats();
  EXPECT_EQ(stats.evicted_texts, 3u);
  EXPECT_EQ(stats.texts, 1);
  EXPECT_EQ(stats.salts, 1);
  EXPECT_EQ(stats.bytes, kSalt + static_cast<int64_t>(sizeof("other") - 1) + text);
  EXPECT_LE(stats.bytes, budget);
  EXPECT_EQ(cache.Longest("", Tokens{10}, 1).position, -1);
  EXPECT_NE(cache.Longest("other", Tokens{14}, 1).position, -1);
}

TEST(SuffixCacheTest, CountsARepeatedTokenIdOnce) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{1, 1, 1});
  EXPECT_EQ(cache.stats().bytes, kSalt + 4 * kToken + kId);
}

TEST(SuffixCacheTest, ATextLargerThanTheBudgetAloneIsNotKept) {
  SuffixCache cache(kSalt + 3 * kToken + 2 * kId);  // "1 2" just fits
  cache.Add("", Tokens{1, 2});
  ASSERT_EQ(cache.stats().texts, 1);
  cache.Add("", Tokens(40, 3));
  const SuffixCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.refused_texts, 1u);
  EXPECT_EQ(stats.texts, 1) << "and nothing was evicted for it";
  EXPECT_EQ(stats.evicted_texts, 0u);
}

TEST(SuffixCacheTest, ManyEvictionsKeepMatchesRight) {
  // Each text is "7 i": after many evictions (and the index lists of 7
  // compacted), "7" still continues with the latest text's i. Ten texts
  // cost their tokens and eleven ids (7 is shared); an eleventh does not fit.
  const int64_t ten = kSalt + 10 * 3 * kToken + 11 * kId;
  SuffixCache cache(ten + 3 * kToken + kId - 1);
  for (TokenId i = 100; i < 400; ++i) cache.Add("", Tokens{7, i});
  const SuffixCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.texts, 10);
  EXPECT_EQ(stats.evicted_texts, 290u);
  // Only the latest 10 texts' ids are counted: 7 and 390..399.
  EXPECT_EQ(stats.bytes, ten);
  const SuffixMatch match = cache.Longest("", Tokens{7}, 1);
  EXPECT_EQ(cache.Continuation("", match.position, 3), (Tokens{399}));
  EXPECT_EQ(cache.Longest("", Tokens{5, 390}, 1).position, -1) << "390 ends its text";
  EXPECT_EQ(cache.Longest("", Tokens{389}, 1).position, -1) << "evicted";
}

TEST(SuffixCacheTest, ATextWithANegativeIdIsNotKept) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{1, -1, 2});
  EXPECT_EQ(cache.stats().refused_texts, 1u);
  EXPECT_EQ(cache.stats().texts, 0);
  EXPECT_EQ(cache.Longest("", Tokens{1}, 1).position, -1);
}

TEST(SuffixCacheTest, PositionsAreNeverReusedAfterASaltEmpties) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{1, 2, 3});
  const int64_t old = cache.Longest("", Tokens{1}, 1).position;
  cache.Clear();
  cache.Add("", Tokens{7, 8, 9});
  EXPECT_TRUE(cache.Continuation("", old, 2).empty()) << "the old text is gone, not replaced";
  const SuffixMatch now = cache.Longest("", Tokens{7}, 1);
  EXPECT_GT(now.position, old);
  EXPECT_EQ(cache.Continuation("", now.position, 2), (Tokens{8, 9}));
  const SuffixCache::Copy copy = cache.LongestCopy("", Tokens{5, 7}, 1, 1);
  EXPECT_EQ(copy.length, 1);
  EXPECT_EQ(copy.tokens, (Tokens{8}));
  EXPECT_TRUE(cache.LongestCopy("", Tokens{5, 7}, 2, 1).tokens.empty());
}

TEST(SuffixCacheTest, ClearDropsEveryTextAndKeepsWorking) {
  SuffixCache cache(1 << 20);
  cache.Add("a", Tokens{1, 2, 3});
  cache.Add("b", Tokens{1, 2, 3});
  cache.Clear();
  EXPECT_EQ(cache.stats().bytes, 0);
  EXPECT_EQ(cache.stats().texts, 0);
  EXPECT_EQ(cache.Longest("a", Tokens{1}, 1).position, -1);
  cache.Add("a", Tokens{1, 4});
  EXPECT_EQ(cache.Continuation("a", cache.Longest("a", Tokens{1}, 1).position, 1), (Tokens{4}));
  EXPECT_EQ(cache.stats().bytes, kSalt + 1 + 3 * kToken + 2 * kId);
}

// --- the matcher and the proposer with a cache ---

SuffixDraftOptions WithCache(const SuffixCache& cache, std::string_view salt) {
  SuffixDraftOptions options;
  options.cache = &cache;
  options.salt = salt;
  return options;
}

TEST(SuffixMatcherCacheTest, CopiesAnEarlierRequestsTextWhenItMatchesLonger) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{10, 11, 12, 13, 14, 15, 16, 17});
  SuffixMatcher matcher;
  matcher.Append(Tokens{1, 11, 12, 13});
  SuffixDraft draft = matcher.Draft(3, WithCache(cache, ""));
  EXPECT_EQ(draft.tokens, (Tokens{14, 15, 16}));
  EXPECT_EQ(draft.source, step::DraftSource::kGlobal);
  // Taking 17 after it would use the copy up: no next token to go on with.
  EXPECT_EQ(draft.next, -1);
  {
    SuffixMatcher shorter;
    shorter.Append(Tokens{1, 11, 12, 13});
    EXPECT_EQ(shorter.Draft(2, WithCache(cache, "")).next, 16);
  }
  // Following the copy: the next draft goes on where it is, to the end of
  // that text, where the copy ends (no next token).
  matcher.Append(Tokens{14, 15});
  draft = matcher.Draft(5, WithCache(cache, ""));
  EXPECT_EQ(draft.tokens, (Tokens{16, 17}));
  EXPECT_EQ(draft.source, step::DraftSource::kGlobal);
  EXPECT_EQ(draft.match, 5);  // "11 12 13", then 14 and 15
  EXPECT_EQ(draft.next, -1);
  // The same stream with another salt finds nothing to copy.
  SuffixMatcher other;
  other.Append(Tokens{1, 11, 12, 13});
  EXPECT_TRUE(other.Draft(3, WithCache(cache, "someone-else")).tokens.empty());
}

TEST(SuffixMatcherCacheTest, OnATieTheRequestsOwnTokensWin) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{5, 6, 99});
  SuffixMatcher matcher;
  matcher.Append(Tokens{5, 6, 42, 5, 6});  // "5 6" matches two tokens in both
  SuffixDraft draft = matcher.Draft(1, WithCache(cache, ""));
  EXPECT_EQ(draft.tokens, (Tokens{42}));
  EXPECT_EQ(draft.source, step::DraftSource::kRequest);
  // One more matching token in the cache's text wins there.
  SuffixCache longer(1 << 20);
  longer.Add("", Tokens{4, 5, 6, 99});
  SuffixMatcher again;
  again.Append(Tokens{5, 6, 42, 4, 5, 6});
  draft = again.Draft(1, WithCache(longer, ""));
  EXPECT_EQ(draft.tokens, (Tokens{99}));
  EXPECT_EQ(draft.source, step::DraftSource::kGlobal);
}

TEST(SuffixMatcherCacheTest, ACacheCopyResumesPastADivergence) {
  SuffixCache cache(1 << 20);
  cache.Add("", Tokens{20, 21, 22, 23, 24, 25, 26, 27});
  SuffixMatcher matcher;
  matcher.Append(Tokens{20, 21});
  EXPECT_EQ(matcher.Draft(2, WithCache(cache, "")).tokens, (Tokens{22, 23}));
  // A later text where "24" goes on otherwise: a fresh search for "50 24"
  // matches one token in both texts and takes the latest (99).
  cache.Add("", Tokens{24, 99});
  matcher.Append(Tokens{22, 50, 24});  // 23 replaced by 50
  // Resumed after "24" in the copy instead.
  const SuffixDraft draft = matcher.Draft(3, WithCache(cache, ""));
  EXPECT_EQ(draft.tokens, (Tokens{25, 26, 27}));
  EXPECT_EQ(draft.source, step::DraftSource::kGlobal);
}

TEST(SuffixMatcherCacheTest, DraftLengthGrowsWithWhatTheCopyAgreesWith) {
  SuffixDraftOptions options;
  options.length_factor = 1.0;
  SuffixMatcher matcher;
  matcher.Append(Tokens{7, 1, 2, 3, 4, 5, 6, 7});
  // "7" matches one token: a draft of one.
  EXPECT_EQ(matcher.Draft(8, options).tokens, (Tokens{1}));
  matcher.Append(Tokens{1});  // agreed: 2
  EXPECT_EQ(matcher.Draft(8, options).tokens, (Tokens{2, 3}));
  matcher.Append(Tokens{2, 3});  // agreed: 4
  EXPECT_EQ(matcher.Draft(8, options).tokens, (Tokens{4, 5, 6, 7}));
  options.length_factor = 0.5;  // half of 4
  EXPECT_EQ(matcher.Draft(8, options).tokens, (Tokens{4, 5}));
  options.length_factor = 0;  // only the limit
  EXPECT_EQ(matcher.Draft(8, options).tokens.size(), 7u) << "4 5 6 7 1 2 3: the stream's end";
}

TEST(SuffixProposerCacheTest, DraftsFromEarlierRequestsOfItsOwnSaltOnly) {
  auto cache = std::make_shared<SuffixCache>(1 << 20);
  cache->Add("tenant-a", Tokens{3, 1, 4, 1, 5, 9, 2, 6});
  SuffixProposer proposer(SuffixDraftOptions{}, cache);
  step::SequenceStep a, b;
  a.sequence_id = 1;
  a.preceding_tokens = {8, 3, 1};
  a.tokens = {4};
  a.cache_salt = "tenant-a";
  b = a;
  b.sequence_id = 2;
  b.cache_salt = "tenant-b";
  std::vector<Draft> drafts;
  ASSERT_TRUE(proposer.Propose(std::vector<DraftRequest>{{&a, 4}, {&b, 4}}, &drafts).ok());
  ASSERT_EQ(drafts.size(), 2u);
  EXPECT_EQ(drafts[0].tokens, (Tokens{1, 5, 9, 2}));
  EXPECT_EQ(drafts[0].source, step::DraftSource::kGlobal);
  EXPECT_TRUE(drafts[1].tokens.empty());
}

}  // namespace
}  // namespace tandem::speculative
