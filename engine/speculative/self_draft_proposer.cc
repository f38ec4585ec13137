#include "engine/speculative/self_draft_proposer.h"

#include "common/check.h"
#include "engine/speculative/draft_rounds.h"

namespace tandem::speculative {

SelfDraftProposer::SelfDraftProposer(model::LlamaModel* model, int layers)
    : model_(model), layers_(layers) {
  TANDEM_CHECK(layers >= 1 && layers < model->config().layers,
               "a self-draft runs fewer layers than the model has");
}

absl::Status SelfDraftProposer::Propose(std::span<const DraftRequest> requests,
                                        std::vector<Draft>* drafts) {
  return DraftRounds(*model_, layers_, requests, nullptr, drafts);
}

}  // namespace tandem::speculative
