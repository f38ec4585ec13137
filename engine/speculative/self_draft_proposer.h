// Layer-skip self-speculation: the target model's first N layers plus its
// output norm and head draft the tokens. It needs no second model file, and
// its KV is the target's own (the first N layers of the full model compute
// exactly the same keys and values), so it needs no blocks of its own and no
// rollback: the verification pass rewrites every drafted position.
//
// Drafting k tokens costs k forward passes of N layers and the head over the
// drafting sequences (batched); the scheduler's speculation policy weighs
// that cost against the acceptance it sees.
#ifndef TANDEM_ENGINE_SPECULATIVE_SELF_DRAFT_PROPOSER_H_
#define TANDEM_ENGINE_SPECULATIVE_SELF_DRAFT_PROPOSER_H_

#include "engine/model/llama_model.h"
#include "engine/speculative/proposer.h"

namespace tandem::speculative {

class SelfDraftProposer final : public DraftProposer {
 public:
  // REQUIRES: 1 <= layers < model->config().layers; `model` outlives this.
  SelfDraftProposer(model::LlamaModel* model, int layers);
  step::Proposer kind() const override { return step::Proposer::kDraftModel; }
  // Greedy requests get the draft's argmax (point masses); sampling requests
  // get tokens sampled from the draft's distribution, which is returned.
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;

 private:
  model::LlamaModel* model_;
  int layers_;
};

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_SELF_DRAFT_PROPOSER_H_
