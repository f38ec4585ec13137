// Copy-aware drafting for outputs that rewrite their context: code edits,
// repeated tool output, a previous answer quoted back. Where the n-gram
// proposer takes the latest earlier match of the last few tokens, this one
//   - takes the earlier position whose preceding tokens match the sequence's
//     tail longest (up to kMaxMatch tokens), so that in code with repeated
//     structure it copies from the right place rather than the nearest
//     look-alike, in the sequence's own tokens or, when it matches longer
//     there, in earlier requests' text of the same cache salt
//     (speculative::SuffixCache), and
//   - keeps copying from where its last draft came from while the output
//     follows it (copying proceeds forward), and after a short divergence
//     (a renamed identifier, a changed literal) picks the copy up again just
//     after the place it left, before looking anywhere else, and
//   - drafts as far as the evidence reaches: at most `length_factor` times
//     the tokens the copy agrees with so far (its match plus the tokens
//     followed since), so a one-token coincidence drafts little and a long
//     copy drafts long.
// Each sequence keeps an index of its tokens (where each token id occurs),
// grown by the tokens it gained since its last step, so a draft costs time
// in the matches it checks, not in the sequence's length.
#ifndef TANDEM_ENGINE_SPECULATIVE_SUFFIX_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_SUFFIX_PROPOSER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/speculative/proposer.h"
#include "engine/speculative/suffix_cache.h"

namespace tandem::speculative {

struct SuffixDraftOptions {
  int32_t min_match = 1;  // the shortest match a copy may start from
  // Drafts at most this times the tokens the copy agrees with (rounded
  // down, at least 1); 0: only the limit bounds them.
  double length_factor = 0.0;
  // Earlier requests' text, or null; drafts copy from `salt`'s only.
  const SuffixCache* cache = nullptr;
  std::string_view salt;
};

struct SuffixDraft {
  std::vector<TokenId> tokens;
  step::DraftSource source = step::DraftSource::kRequest;
  // The tokens the copy agreed with the stream when it drafted: its match,
  // then each token followed since.
  int32_t match = 0;
  // The copy's token after the draft, which the stream must take next for
  // the copy to go on; -1 when the copy ends with the draft or the token
  // after it (a cache copy used up).
  TokenId next = -1;
};

// One token stream and the place its drafts copy from.
class SuffixMatcher {
 public:
  static constexpr int32_t kMaxMatch = kSuffixMaxMatch;
  static constexpr int32_t kMaxCandidates = kSuffixMaxCandidates;
  // How far past the place the last copy left a resumed copy may start.
  static constexpr int32_t kResyncWindow = 32;
  // Tokens taken from the cache when a copy starts there (a longer copy
  // looks the cache up again where this one ends).
  static constexpr int32_t kCacheCopy = 256;

  // Appends the stream's next tokens.
  void Append(std::span<const TokenId> tokens);
  std::span<const TokenId> tokens() const { return tokens_; }

  // Up to `limit` tokens that followed the chosen earlier position, which
  // must match at least `options.min_match` tokens of the tail. Empty when
  // none does.
  SuffixDraft Draft(int32_t limit, const SuffixDraftOptions& options);

 private:
  enum class Where : uint8_t { kNone, kOwn, kCache };
  // Tokens equal going backwards from tokens_[a - 1] and tokens_[b - 1].
  int32_t MatchBefore(int64_t a, int64_t b) const;
  // Tokens equal going backwards from cache_copy_[start - 1] and the tail.
  int32_t CopyMatchBefore(int64_t start) const;
  // Starts following `where` at `source` with `agreed` tokens matched;
  // returns true.
  bool StartCopy(Where where, int64_t source, int32_t agreed);
  // Picks a copy up again near left_at_; false when none fits.
  bool Resume(int32_t min_match);
  // The longest match in the stream or the cache; false when none.
  bool Search(const SuffixDraftOptions& options);

  std::vector<TokenId> tokens_;
  // Token id -> the positions it occurs at, in increasing order.
  absl::flat_hash_map<TokenId, std::vector<int32_t>> positions_;
  // What the stream is following: tokens_[source_] (kOwn) or
  // cache_copy_[source_] (kCache) is what is expected next.
  Where copying_ = Where::kNone;
  int64_t source_ = -1;
  std::vector<TokenId> cache_copy_;  // kCache: the continuation taken from the cache
  // The tokens the copy agrees with: its match, then each token followed.
  int32_t agreed_ = 0;
  // Where the last copy stopped following (for resuming after a
  // divergence): in what, and at which position; -1 when none.
  Where left_in_ = Where::kNone;
  int64_t left_at_ = -1;
};

class SuffixProposer final : public DraftProposer {
 public:
  // REQUIRES: options.min_match >= 1 and options.length_factor >= 0.
  // `cache`, when set, is searched too (options.cache and salt are set per
  // request).
  explicit SuffixProposer(SuffixDraftOptions options,
                          std::shared_ptr<const SuffixCache> cache = nullptr);
  step::Proposer kind() const override { return step::Proposer::kSuffix; }
  // Uses each step's preceding_tokens followed by its tokens, and its
  // cache_salt; a sequence's matcher is kept between steps and grown by
  // what it gained.
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;

  // Sequences with a matcher (for tests: ones unused for kIdleCalls calls
  // are dropped).
  size_t tracked() const { return matchers_.size(); }
  static constexpr uint64_t kIdleCalls = 512;

 private:
  struct Tracked {
    SuffixMatcher matcher;
    uint64_t last_call = 0;
  };
  SuffixDraftOptions options_;
  std::shared_ptr<const SuffixCache> cache_;
  uint64_t calls_ = 0;
  absl::flat_hash_map<uint64_t, Tracked> matchers_;
};

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_SUFFIX_PROPOSER_H_
