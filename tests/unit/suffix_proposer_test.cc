// The suffix proposer (engine/speculative/suffix_proposer.h) on crafted token
// streams: longest match over latest, resuming a copy past a divergence,
// following its source, draft bounds, per-sequence matchers.
#include "engine/speculative/suffix_proposer.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/speculative/ngram_proposer.h"

namespace tandem::speculative {
namespace {

using Tokens = std::vector<TokenId>;

SuffixMatcher MatcherOf(const Tokens& tokens) {
  SuffixMatcher matcher;
  matcher.Append(tokens);
  return matcher;
}

// The tokens of a draft from the matcher's own stream (no cache, no length
// factor).
Tokens Drafted(SuffixMatcher& matcher, int32_t limit, int32_t min_match) {
  SuffixDraftOptions options;
  options.min_match = min_match;
  SuffixDraft draft = matcher.Draft(limit, options);
  EXPECT_EQ(draft.source, step::DraftSource::kRequest);
  return draft.tokens;
}
Tokens Drafted(SuffixMatcher&& matcher, int32_t limit, int32_t min_match) {
  return Drafted(matcher, limit, min_match);
}

TEST(SuffixMatcherTest, TheLongestMatchBeatsTheLatest) {
  // "1 2 3 4 5" is followed by 10 at the start; the later "3 4 5" by 20.
  // The tail "1 2 3 4 5" matches five tokens at the start, three later.
  const Tokens tokens = {1, 2, 3, 4, 5, 10, 9, 3, 4, 5, 20, 1, 2, 3, 4, 5};
  SuffixMatcher matcher = MatcherOf(tokens);
  EXPECT_EQ(Drafted(matcher, 3, 1), (Tokens{10, 9, 3}));
  // The n-gram proposer (n <= 3) takes the latest "3 4 5".
  EXPECT_EQ(NgramDraft(tokens, 1, 3, 3), (Tokens{20, 1, 2}));
}

TEST(SuffixMatcherTest, AmongEqualMatchesTheLatestWins) {
  SuffixMatcher matcher = MatcherOf({7, 1, 30, 8, 1, 40, 9, 1});
  EXPECT_EQ(Drafted(matcher, 2, 1), (Tokens{40, 9}));
}

// Frequency before recency: "5 1" was followed by 30 twice and by 40 once
// (the latest); among equal matches the continuation most of them share
// wins, from its latest place.
TEST(SuffixMatcherTest, AmongEqualMatchesTheMostSharedContinuationWins) {
  SuffixMatcher matcher = MatcherOf({5, 1, 30, 7, 5, 1, 30, 8, 5, 1, 40, 9, 5, 1});
  EXPECT_EQ(Drafted(matcher, 2, 1), (Tokens{30, 8}));
  // A longer match still beats any count: "6 5 1" once, followed by 50.
  SuffixMatcher longer = MatcherOf({5, 1, 30, 5, 1, 30, 6, 5, 1, 50, 6, 5, 1});
  EXPECT_EQ(Drafted(longer, 1, 1), (Tokens{50}));
}

// The source: 1 2 [50] 3 4 5 6, and later 60 3 4 5 9 (where "60 3" and
// "60 3 4 5" match the output's tail better once it replaced 50 with 60).
const Tokens kSource = {1, 2, 50, 3, 4, 5, 6, 60, 3, 4, 5, 9, 0};

TEST(SuffixMatcherTest, ACopyResumesJustPastWhereItDiverged) {
  SuffixMatcher matcher = MatcherOf(kSource);
  matcher.Append(Tokens{1, 2});
  EXPECT_EQ(Drafted(matcher, 2, 1), (Tokens{50, 3}));  // copying the start
  matcher.Append(Tokens{60, 3});                       // the output renames 50 to 60
  // A fresh search would take "60 3" at 7..8 (two tokens against one); the
  // copy goes on where it left instead.
  EXPECT_EQ(Drafted(matcher, 3, 1), (Tokens{4, 5, 6}));
  matcher.Append(Tokens{4, 5});
  // Still following its source, though "60 3 4 5" now matches four tokens
  // at 7..10 against three.
  EXPECT_EQ(Drafted(matcher, 2, 1), (Tokens{6, 60}));
}

// The scheduler prices a draft by how long its copy has agreed with the
// stream (scheduler::CopyAcceptance): the match it started from, then each
// token followed since; a resumed copy starts again from its new match.
// With the draft comes the copy's next token: a stream that takes the draft
// and that token has its copy agree with match + drafted + 1 tokens.
TEST(SuffixMatcherTest, ADraftReportsHowLongItsCopyHasAgreed) {
  SuffixDraftOptions options;
  SuffixMatcher matcher = MatcherOf(kSource);
  matcher.Append(Tokens{1, 2});
  SuffixDraft draft = matcher.Draft(2, options);
  EXPECT_EQ(draft.tokens, (Tokens{50, 3}));
  EXPECT_EQ(draft.match, 2);  // "1 2"
  EXPECT_EQ(draft.next, 4);
  {
    SuffixMatcher followed = matcher;
    followed.Append(Tokens{50, 3, 4});
    const SuffixDraft after = followed.Draft(1, options);
    EXPECT_EQ(after.match, 2 + 2 + 1);
    EXPECT_EQ(after.tokens, (Tokens{5}));
  }
  // A copy that reaches the stream's end goes on into its own draft.
  const SuffixDraft periodic = MatcherOf({7, 8, 7, 8}).Draft(5, options);
  EXPECT_EQ(periodic.tokens, (Tokens{7, 8}));
  EXPECT_EQ(periodic.next, 7);
  matcher.Append(Tokens{60, 3});
  draft = matcher.Draft(3, options);
  EXPECT_EQ(draft.tokens, (Tokens{4, 5, 6}));
  EXPECT_EQ(draft.match, 1);  // resumed at "3"
  matcher.Append(Tokens{4, 5});
  draft = matcher.Draft(2, options);
  EXPECT_EQ(draft.match, 3);  // "3", then 4 and 5 followed
}

TEST(SuffixMatcherTest, WithoutAnEarlierCopyADivergedTailSearchesAfresh) {
  SuffixMatcher matcher = MatcherOf(kSource);
  matcher.Append(Tokens{60, 3});
  EXPECT_EQ(Drafted(matcher, 2, 1), (Tokens{4, 5}));
  EXPECT_EQ(Drafted(matcher, 5, 1), (Tokens{4, 5, 9, 0, 60}));
}

TEST(SuffixMatcherTest, DraftsAreBoundedByTheLimitTheStreamAndTheShortestMatch) {
  SuffixMatcher matcher = MatcherOf({4, 4, 4});
  EXPECT_EQ(Drafted(matcher, 5, 1), (Tokens{4}));  // the stream's end bounds it
  EXPECT_TRUE(Drafted(matcher, 0, 1).empty());
  EXPECT_TRUE(Drafted(MatcherOf({1, 2, 3, 4}), 5, 1).empty());  // nothing repeats
  EXPECT_TRUE(Drafted(MatcherOf({5}), 3, 1).empty());
  // "8 2" matches two tokens: enough for min_match 2, not for 3.
  EXPECT_EQ(Drafted(MatcherOf({8, 2, 6, 7, 8, 2}), 2, 2), (Tokens{6, 7}));
  EXPECT_TRUE(Drafted(MatcherOf({8, 2, 6, 7, 8, 2}), 2, 3).empty());
  // The longest match counted is kMaxMatch: a long repeat still drafts.
  Tokens periodic;
  for (int i = 0; i < 300; ++i) periodic.push_back(i % 100);
  EXPECT_EQ(Drafted(MatcherOf(periodic), 64, 1).size(), 64u);
}

step::SequenceStep Step(uint64_t id, const Tokens& all) {
  step::SequenceStep s;
  s.sequence_id = id;
  s.preceding_tokens.assign(all.begin(), all.end() - 1);
  s.tokens = {all.back()};
  return s;
}

TEST(SuffixProposerTest, EachSequenceDraftsFromItsOwnTokensAcrossSteps) {
  SuffixProposer proposer(SuffixDraftOptions{});
  Tokens a = kSource, b = {7, 8, 9, 7, 8};
  a.insert(a.end(), {1, 2});
  std::vector<Draft> drafts;
  step::SequenceStep sa = Step(1, a), sb = Step(2, b);
  ASSERT_TRUE(proposer.Propose(std::vector<DraftRequest>{{&sa, 2}, {&sb, 4}}, &drafts).ok());
  ASSERT_EQ(drafts.size(), 2u);
  EXPECT_EQ(drafts[0].tokens, (Tokens{50, 3}));
  EXPECT_EQ(drafts[1].tokens, (Tokens{9, 7, 8}));
  EXPECT_EQ(drafts[0].match, 2);  // with each draft, how long its copy has agreed
  EXPECT_EQ(drafts[1].match, 2);
  EXPECT_TRUE(drafts[0].probabilities.empty());
  // The next step of sequence 1 grows its matcher: the divergence and the
  // resumed copy are seen (as in ACopyResumesJustPastWhereItDiverged).
  a.insert(a.end(), {60, 3});
  sa = Step(1, a);
  ASSERT_TRUE(proposer.Propose(std::vector<DraftRequest>{{&sa, 3}}, &drafts).ok());
  EXPECT_EQ(drafts[0].tokens, (Tokens{4, 5, 6}));
  EXPECT_EQ(drafts[0].match, 1);
  EXPECT_EQ(proposer.tracked(), 2u);
  // A sequence whose tokens are not what its matcher holds starts over.
  sa = Step(1, {5, 6, 5});
  ASSERT_TRUE(proposer.Propose(std::vector<DraftRequest>{{&sa, 3}}, &drafts).ok());
  EXPECT_EQ(drafts[0].tokens, (Tokens{6, 5}));
}

TEST(SuffixProposerTest, SequencesThatStopAskingAreDropped) {
  SuffixProposer proposer(SuffixDraftOptions{});
  std::vector<Draft> drafts;
  step::SequenceStep gone = Step(1, {1, 2, 1}), staying = Step(2, {3, 4, 3});
  ASSERT_TRUE(proposer.Propose(std::vector<DraftRequest>{{&gone, 1}, {&staying, 1}}, &drafts).ok());
  for (uint64_t call = 0; call < SuffixProposer::kIdleCalls + 64; ++call) {
    ASSERT_TRUE(proposer.Propose(std::vector<DraftRequest>{{&staying, 1}}, &drafts).ok());
  }
  EXPECT_EQ(proposer.tracked(), 1u);
  EXPECT_EQ(drafts[0].tokens, (Tokens{4}));
}

}  // namespace
}  // namespace tandem::speculative
