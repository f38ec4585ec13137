#include "engine/speculative/draft_rounds.h"

#include "engine/sampling/sampler.h"
#include "engine/speculative/verify.h"

namespace tandem::speculative {

absl::Status DraftRounds(model::LlamaModel& model, int layers,
                         std::span<const DraftRequest> requests, std::span<const float> first_round,
                         std::vector<Draft>* drafts, std::vector<float>* logits) {
  drafts->assign(requests.size(), Draft{});
  const size_t vocab = static_cast<size_t>(model.config().vocab);
  std::vector<TokenId> next(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) next[i] = requests[i].step->tokens.back();
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
    const bool given = round == 0 && !first_round.empty();
    if (!given) {
      if (absl::Status st = model.Forward(inputs, logits, layers); !st.ok()) return st;
    }
    for (size_t m = 0; m < members.size(); ++m) {
      const size_t i = members[m];
      const step::SequenceStep& s = *requests[i].step;
      const std::span<const float> row =
          given ? first_round.subspan(i * vocab, vocab)
                : std::span<const float>(logits->data() + m * vocab, vocab);
      Draft& draft = (*drafts)[i];
      const uint64_t index = s.draw_index + static_cast<uint64_t>(round);
      TokenId token;
      if (s.sampling.temperature > 0.0f) {
        std::vector<float> q = sampling::Probabilities(row, s.sampling);
        token = sampling::DrawFrom(
            q, SpeculativeDraw(s.sampling.seed, DrawStream::kDraftSample, index));
        draft.probabilities.push_back(std::move(q));
      } else {
        token = sampling::Sample(row, s.sampling, index);
      }
      draft.tokens.push_back(token);
      next[i] = token;
    }
  }
}

}  // namespace tandem::speculative
