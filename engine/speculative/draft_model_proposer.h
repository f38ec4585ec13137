// A separate draft model (--draft_model): a smaller model with the target's
// vocabulary and its own KV storage, addressed by the target's block ids (the
// sequences' block tables serve both), so it needs no blocks of its own from
// the scheduler and moves between workers with them.
//
// Its KV must hold every token the target has computed, so the worker keeps
// it in step around each step (engine/model/model_worker.cc):
//   1. Shadow(): the draft model runs every sequence's step tokens (prompt
//      chunks and decode tokens alike, so prefix-cached blocks have draft KV
//      too); for sequences that draft with it, that pass's last logits are
//      the first drafting round.
//   2. Propose(): the remaining rounds, feeding its own drafts.
//   3. CatchUp(): after verification, the accepted drafted tokens it has not
//      run yet (the last draft, when every draft was accepted).
// Rejected drafts need no rollback: their KV lies beyond the sequence's
// length, is never read, and is overwritten.
//
// Thread safety: belongs to one worker and runs on its thread.
#ifndef TANDEM_ENGINE_SPECULATIVE_DRAFT_MODEL_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_DRAFT_MODEL_PROPOSER_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/kernels/backend.h"
#include "engine/model/llama_model.h"
#include "engine/speculative/proposer.h"

namespace tandem::speculative {

class DraftModelProposer final : public DraftProposer {
 public:
  // `model` is bound to `backend`; the proposer owns both.
  DraftModelProposer(std::unique_ptr<kernels::Backend> backend,
                     std::unique_ptr<model::LlamaModel> model);
  step::Proposer kind() const override { return step::Proposer::kDraftModel; }

  model::LlamaModel& model() { return *model_; }
  // The backend the draft runs on, which holds the draft's KV storage.
  kernels::Backend& backend() { return *backend_; }

  // Step 1 (also for steps where nobody drafts). Applies the plan's block
  // copies to the draft's KV first.
  absl::Status Shadow(const step::StepPlan& plan);
  // Step 2. REQUIRES: Shadow() of the plan holding the requests' steps.
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;
  // Step 3: `drafts[i]` (any proposer's) and `accepted[i]` for plan.sequences[i].
  absl::Status CatchUp(const step::StepPlan& plan, std::span<const Draft> drafts,
                       std::span<const int32_t> accepted);

 private:
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::LlamaModel> model_;
  // From Shadow(): the first-round logits row of each drafting step, the
  // rows' argmax, and the pass's number (LlamaModel::forward_passes).
  absl::flat_hash_map<const step::SequenceStep*, size_t> first_round_row_;
  std::vector<TokenId> shadow_argmax_;
  int64_t shadow_pass_ = -1;
  std::vector<float> logits_;  // CatchUp()'s (no rows: logits = 0)
};

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_DRAFT_MODEL_PROPOSER_H_
