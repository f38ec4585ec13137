// Prompt-lookup (n-gram) drafting: the continuation that followed the latest
// earlier occurrence of the sequence's last n tokens, for the longest n in
// [min_n, max_n] that occurs. No model: it costs microseconds and pays off
// when the output repeats the input (a file being edited, code being
// explained, a document being quoted).
#ifndef TANDEM_ENGINE_SPECULATIVE_NGRAM_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_NGRAM_PROPOSER_H_

#include "engine/speculative/proposer.h"

namespace tandem::speculative {

// The draft for `tokens` (a whole sequence): up to `limit` tokens that
// followed the latest earlier match of its last n tokens, trying n from
// max_n down to min_n. Empty when nothing matches.
std::vector<TokenId> NgramDraft(std::span<const TokenId> tokens, int32_t min_n, int32_t max_n,
                                int32_t limit);

class NgramProposer final : public DraftProposer {
 public:
  // REQUIRES: 1 <= min_n <= max_n.
  NgramProposer(int32_t min_n, int32_t max_n);
  step::Proposer kind() const override { return step::Proposer::kNgram; }
  // Uses each step's preceding_tokens followed by its tokens.
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;

 private:
  int32_t min_n_;
  int32_t max_n_;
  std::vector<TokenId> scratch_;
};

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_NGRAM_PROPOSER_H_
