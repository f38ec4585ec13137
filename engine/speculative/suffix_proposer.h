// Copy-aware drafting for outputs that rewrite their context: code edits,
// repeated tool output, a previous answer quoted back. Where the n-gram
// proposer takes the latest earlier match of the last few tokens, this one
//   - takes the earlier position whose preceding tokens match the sequence's
//     tail longest (up to kMaxMatch tokens), so that in code with repeated
//     structure it copies from the right place rather than the nearest
//     look-alike, and
//   - keeps copying from where its last draft came from while the output
//     follows it (copying proceeds forward), and after a short divergence
//     (a renamed identifier, a changed literal) picks the copy up again just
//     after the place it left, before looking anywhere else.
// Each sequence keeps an index of its tokens (where each token id occurs),
// grown by the tokens it gained since its last step, so a draft costs time
// in the matches it checks, not in the sequence's length.
#ifndef TANDEM_ENGINE_SPECULATIVE_SUFFIX_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_SUFFIX_PROPOSER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/speculative/proposer.h"

namespace tandem::speculative {

// One token stream and the place its drafts copy from.
class SuffixMatcher {
 public:
  // The longest match looked for behind a candidate position.
  static constexpr int32_t kMaxMatch = 64;
  // The most recent occurrences of the last token that are checked.
  static constexpr int32_t kMaxCandidates = 256;
  // How far past the place the last copy left a resumed copy may start.
  static constexpr int32_t kResyncWindow = 32;

  // Appends the stream's next tokens.
  void Append(std::span<const TokenId> tokens);
  std::span<const TokenId> tokens() const { return tokens_; }

  // Up to `limit` tokens that followed the chosen earlier position, which
  // must match at least `min_match` tokens of the tail. Empty when none does.
  std::vector<TokenId> Draft(int32_t limit, int32_t min_match);

 private:
  // Tokens equal going backwards from tokens_[a - 1] and tokens_[b - 1].
  int32_t MatchBefore(int64_t a, int64_t b) const;

  std::vector<TokenId> tokens_;
  // Token id -> the positions it occurs at, in increasing order.
  absl::flat_hash_map<TokenId, std::vector<int32_t>> positions_;
  // The position whose continuation the stream is following: tokens_[source_]
  // is what is expected next. -1 when not copying.
  int64_t source_ = -1;
  // Where the last copy stopped following (for resuming after a divergence);
  // -1 when none.
  int64_t left_at_ = -1;
};

class SuffixProposer final : public DraftProposer {
 public:
  // REQUIRES: min_match >= 1.
  explicit SuffixProposer(int32_t min_match);
  step::Proposer kind() const override { return step::Proposer::kSuffix; }
  // Uses each step's preceding_tokens followed by its tokens; a sequence's
  // matcher is kept between steps and grown by what it gained.
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
  int32_t min_match_;
  uint64_t calls_ = 0;
  absl::flat_hash_map<uint64_t, Tracked> matchers_;
};

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_SUFFIX_PROPOSER_H_
