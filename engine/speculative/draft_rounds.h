// The drafting loop both model proposers share: round r feeds each
// sequence's newest token (the step's last token, then its own drafts) to a
// draft model at the next position and drafts one more token, batched over
// the sequences still drafting. Greedy requests get the draft's argmax (point
// masses), picked where the logits are (LlamaModel::ForwardGreedy: a GPU
// copies token ids); sampling requests get tokens sampled from the draft's
// distribution, which is returned for rejection sampling, so only their
// rows are copied whole (LlamaModel::LastLogitsRows).
#ifndef TANDEM_ENGINE_SPECULATIVE_DRAFT_ROUNDS_H_
#define TANDEM_ENGINE_SPECULATIVE_DRAFT_ROUNDS_H_

#include <span>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/speculative/proposer.h"

namespace tandem::speculative {

// Round one already computed by the draft model's last forward pass (a
// ForwardGreedy(), which must be the model's latest pass): requests[i]'s row
// in it is rows[i], whose argmax is argmax[rows[i]].
struct FirstRound {
  std::span<const TokenId> argmax;
  std::span<const size_t> rows;
};

// `layers`: as LlamaModel::Forward (0: all). `first_round`: null, or round
// one as above (then it runs no forward pass).
absl::Status DraftRounds(model::LlamaModel& model, int layers,
                         std::span<const DraftRequest> requests, const FirstRound* first_round,
                         std::vector<Draft>* drafts);

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_DRAFT_ROUNDS_H_
