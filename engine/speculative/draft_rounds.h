// The drafting loop both model proposers share: round r feeds each
// sequence's newest token (the step's last token, then its own drafts) to a
// draft model at the next position and drafts one more token, batched over
// the sequences still drafting. Greedy requests get the draft's argmax (point
// masses); sampling requests get tokens sampled from the draft's
// distribution, which is returned for rejection sampling.
#ifndef TANDEM_ENGINE_SPECULATIVE_DRAFT_ROUNDS_H_
#define TANDEM_ENGINE_SPECULATIVE_DRAFT_ROUNDS_H_

#include <span>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/speculative/proposer.h"

namespace tandem::speculative {

// `layers`: as LlamaModel::Forward (0: all). `first_round`: when not empty,
// the draft's next-token logits after each request's last token, already
// computed (one row of vocab floats per request, in order); round one then
// runs no forward pass. `logits`: scratch.
absl::Status DraftRounds(model::LlamaModel& model, int layers,
                         std::span<const DraftRequest> requests, std::span<const float> first_round,
                         std::vector<Draft>* drafts, std::vector<float>* logits);

}  // namespace tandem::speculative

#endif  // TANDEM_ENGINE_SPECULATIVE_DRAFT_ROUNDS_H_
