#include "engine/speculative/draft_rounds.h"

#include "engine/sampling/sampler.h"
#include "engine/speculative/verify.h"

namespace tandem::speculative {

absl::Status DraftRounds(model::LlamaModel& model, int layers,
                         std::span<const DraftRequest> requests, const FirstRound* first_round,
                         std::vector<Draft>* drafts) {
  Draft empty;
  empty.source = step::DraftSource::kModel;
  drafts->assign(requests.size(), empty);
  std::vector<TokenId> next(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) next[i] = requests[i].step->tokens.back();
  const size_t vocab = static_cast<size_t>(model.config().vocab);
  std::vector<TokenId> argmax;
  std::vector<float> rows;
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
    // The row of each member in the last pass; sampled members' rows are
    // copied whole, all at once.
    auto row_of = [&](size_t m) { return given ? first_round->rows[members[m]] : m; };
    std::vector<int32_t> sampled_rows;
    for (size_t m = 0; m < members.size(); ++m) {
      if (requests[members[m]].step->sampling.temperature > 0.0f) {
        sampled_rows.push_back(static_cast<int32_t>(row_of(m)));
      }
    }
    if (!sampled_rows.empty()) {
      if (absl::Status st = model.LastLogitsRows(sampled_rows, &rows); !st.ok()) return st;
    }
    size_t next_sampled = 0;
    for (size_t m = 0; m < members.size(); ++m) {
      const size_t i = members[m];
      const step::SequenceStep& s = *requests[i].step;
      Draft& draft = (*drafts)[i];
      const uint64_t index = s.draw_index + static_cast<uint64_t>(round);
      TokenId token;
      if (s.sampling.temperature > 0.0f) {
        const std::span<const float> row =
            std::span<const float>(rows).subspan(next_sampled++ * vocab, vocab);
        std::vector<float> q = sampling::Probabilities(row, s.sampling);
        token = sampling::DrawFrom(
            q, SpeculativeDraw(s.sampling.seed, DrawStream::kDraftSample, index));
        draft.probabilities.push_back(std::move(q));
      } else {
        // Sample() of a greedy request: the argmax (lowest id among equals).
        token = given ? first_round->argmax[row_of(m)] : argmax[m];
      }
      draft.tokens.push_back(token);
      next[i] = token;
    }
  }
}

}  // namespace tandem::speculative
