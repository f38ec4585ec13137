#include "engine/speculative/draft_rounds.h"

#include "engine/sampling/sampler.h"
#include "engine/speculative/verify.h"

namespace tandem::speculative {

absl::Status DraftRounds(model::LlamaModel& model, int layers,
                         std::span<const DraftRequest> requests, const FirstRound* first_round,
                         std::vector<Draft>* drafts) {
  drafts->assign(requests.size(), Draft{});
  std::vector<TokenId> next(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) next[i] = requests[i].step->tokens.back();
  std::vector<TokenId> argmax;
  std::vector<float> row;
  for (int32_t round = 0;; ++round) {
    std::vector<model::SequenceInput> inputs;
    std::vector<size_t> members;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (round >= requests[i].limit) continue;
      const step::SequenceStep& s = *requests[i].step;
      model::SequenceInput in;
      in.tokens = std::span<const TokenId>(&next[i], 1);
      in.first_position = s.first_position + static_cast<int32_t>(s.tokens.size()) - 1 + round;
      in.block_table = s.block_table;
      in.logits = 1;
      inputs.push_back(in);
      members.push_back(i);
    }
    if (inputs.empty()) return absl::OkStatus();
    const bool given = round == 0 && first_round != nullptr;
    if (!given) {
      if (absl::Status st = model.ForwardGreedy(inputs, &argmax, layers); !st.ok()) return st;
    }
    for (size_t m = 0; m < members.size(); ++m) {
      const size_t i = members[m];
      const step::SequenceStep& s = *requests[i].step;
      const size_t at = given ? first_round->rows[i] : m;  // the row in the last pass
      Draft& draft = (*drafts)[i];
      const uint64_t index = s.draw_index + static_cast<uint64_t>(round);
      TokenId token;
      if (s.sampling.temperature > 0.0f) {
        if (absl::Status st = model.LastLogitsRow(static_cast<int64_t>(at), &row); !st.ok()) {
          return st;
        }
        std::vector<float> q = sampling::Probabilities(row, s.sampling);
        token = sampling::DrawFrom(
            q, SpeculativeDraw(s.sampling.seed, DrawStream::kDraftSample, index));
        draft.probabilities.push_back(std::move(q));
      } else {
        // Sample() of a greedy request: the argmax (lowest id among equals).
        token = given ? first_round->argmax[at] : argmax[m];
      }
      draft.tokens.push_back(token);
      next[i] = token;
    }
  }
}

}  // namespace tandem::speculative
