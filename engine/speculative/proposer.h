// The draft proposer interface of speculative decoding.
//
// A proposer guesses the tokens that follow a decode step's last token; the
// worker then runs the step's token and the guesses through the target model
// in one forward pass and keeps the longest prefix the target agrees with
// (engine/speculative/verify.h). Proposals only change how many tokens a
// step yields, never which: a bad proposer is slow, not wrong.
//
// Thread safety: a proposer belongs to one worker and runs on its thread.
#ifndef TANDEM_ENGINE_SPECULATIVE_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_PROPOSER_H_

#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/step/step_plan.h"

namespace tandem::speculative {

using step::TokenId;

// One sequence to draft for: `step` is its decode step (its last token is the
// one the draft follows; its block table has room for `limit` more tokens).
struct DraftRequest {
  const step::SequenceStep* step = nullptr;
  int32_t limit = 0;
};

struct Draft {
  std::vector<TokenId> tokens;  // at most the request's limit; may be empty
  // For drafts sampled from a distribution (a draft model at temperature >
  // 0): that distribution over the vocabulary at each drafted position.
  // Empty when each drafted token is a certain guess (a point mass).
  std::vector<std::vector<float>> probabilities;
  step::DraftSource source = step::DraftSource::kRequest;
  // A copying proposer's: the tokens the copy agreed with when it drafted
  // (step::SequenceResult::draft_match), 0 otherwise; and the copy's token
  // after the draft, -1 when none.
  int32_t match = 0;
  TokenId copy_next = -1;
};

class DraftProposer {
 public:
  virtual ~DraftProposer() = default;
  virtual step::Proposer kind() const = 0;
  // Fills drafts[i] for requests[i], for all requests at once (a draft model
  // runs them as one batch). An error fails the whole step.
  virtual absl::Status Propose(std::span<const DraftRequest> requests,
                               std::vector<Draft>* drafts) = 0;
};

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_PROPOSER_H_
