// Recent requests' text, for suffix drafting across requests: an agent's
// next turn rewrites the file its last turn wrote, a tool prints what it
// printed before, many users ask the same question. Each finished request's
// prompt and output are kept, within a byte budget (the oldest text goes
// first), in one index per cache salt, so that a request drafts only from
// text of requests with its own salt (one tenant's text never drafts for
// another, as with the prefix cache).
//
// Thread safety: all methods may be called from any thread (one mutex; a
// lookup holds it for the candidates it checks, an insertion for the
// tokens it indexes).
#ifndef TANDEM_ENGINE_SPECULATIVE_SUFFIX_CACHE_H_
#define TANDEM_ENGINE_SPECULATIVE_SUFFIX_CACHE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "engine/step/step_plan.h"

namespace tandem::speculative {

using step::TokenId;

// The longest match looked for behind a candidate position.
inline constexpr int32_t kSuffixMaxMatch = 64;
// The most recent occurrences of the last token that are checked.
inline constexpr int32_t kSuffixMaxCandidates = 256;

// A place to copy from: the continuation starts at `position`, whose
// preceding `length` tokens equal the tail's last ones. position -1: none.
struct SuffixMatch {
  int64_t position = -1;
  int32_t length = 0;
};

// Chooses among places that match the tail equally long, by what they
// would draft first: the continuation the most of them share (what this
// context has most often been followed by), and among those the latest.
// Offered latest first.
class TiedMatches {
 public:
  // A place matching `length` tokens, whose continuation starts with
  // `next`. Shorter matches than the longest so far are ignored; a longer
  // one clears the ties.
  void Offer(int64_t position, int32_t length, TokenId next);
  SuffixMatch Chosen() const;
  int32_t length() const { return length_; }

 private:
  int32_t length_ = -1;
  std::vector<std::pair<int64_t, TokenId>> ties_;  // latest first
};

class SuffixCache {
 public:
  // What the budget counts, estimates of what is allocated: each kept token
  // (its id, and its place in the index with room for the index lists'
  // doubling and their evicted entries awaiting compaction), each distinct
  // token id of a salt's index (a hash slot and a list), and each salt
  // (its index and its name).
  static constexpr int64_t kBytesPerToken = sizeof(TokenId) + 2 * sizeof(int64_t);
  static constexpr int64_t kBytesPerTokenId = 96;
  static constexpr int64_t kBytesPerSalt = 256;

  // REQUIRES: budget_bytes > 0.
  explicit SuffixCache(int64_t budget_bytes);
  SuffixCache(const SuffixCache&) = delete;
  SuffixCache& operator=(const SuffixCache&) = delete;
  ~SuffixCache();

  // Keeps one request's text (prompt, then output) under its salt, evicting
  // the oldest texts (of any salt) until all fit the budget. A text that
  // could not fit alone, or that holds a negative id, is not kept. Matches
  // never span two texts.
  void Add(std::string_view salt, std::span<const TokenId> tokens);

  // Drops every text (the counters since start stay): for benchmarks that
  // compare runs on one cache.
  void Clear();

  struct Stats {
    int64_t budget_bytes = 0;
    int64_t bytes = 0;   // counted as above; <= budget_bytes
    int64_t tokens = 0;  // kept tokens, all salts
    int64_t texts = 0;   // kept texts
    int64_t salts = 0;
    uint64_t evicted_texts = 0;  // since start
    uint64_t refused_texts = 0;  // too large to keep, since start
  };
  Stats stats() const;

  // The earlier position of `salt`'s text whose preceding tokens match the
  // end of `tail` longest (at most kSuffixMaxMatch; over the latest
  // kSuffixMaxCandidates occurrences of tail's last token; among equals the
  // most shared continuation, then the latest: TiedMatches), with at least
  // `min_match` matching and a non-empty
  // continuation. None when the salt has no text or nothing matches.
  // Positions never repeat: a salt emptied and filled again continues from
  // where the cache's positions had got to.
  SuffixMatch Longest(std::string_view salt, std::span<const TokenId> tail,
                      int32_t min_match) const;
  // Up to `limit` tokens of `salt`'s text from `position` on, stopping at
  // the end of the text it is in. Empty when that text was evicted.
  std::vector<TokenId> Continuation(std::string_view salt, int64_t position, int32_t limit) const;
  // Longest() and then Continuation() of what it found, under one lock:
  // the match's length and up to `limit` tokens of its continuation (none
  // when nothing matches).
  struct Copy {
    int32_t length = 0;
    std::vector<TokenId> tokens;
  };
  Copy LongestCopy(std::string_view salt, std::span<const TokenId> tail, int32_t min_match,
                   int32_t limit) const;

 private:
  struct Corpus;
  // Drops the oldest text. REQUIRES: texts are kept; mu_ held.
  void EvictOldest();
  // mu_ held.
  SuffixMatch LongestLocked(std::string_view salt, std::span<const TokenId> tail,
                            int32_t min_match) const;
  std::vector<TokenId> ContinuationLocked(std::string_view salt, int64_t position,
                                          int32_t limit) const;

  const int64_t budget_bytes_;
  mutable std::mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Corpus>> corpora_;
  // Kept texts, oldest first: their salt's corpus and tokens (the
  // separator after each text included).
  std::deque<std::pair<Corpus*, int64_t>> texts_;
  // Where the next new salt's positions start (past every position given).
  int64_t next_base_ = 0;
  int64_t bytes_ = 0;
  int64_t tokens_ = 0;
  uint64_t evicted_texts_ = 0;
  uint64_t refused_texts_ = 0;
};

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_SUFFIX_CACHE_H_
