#include "engine/speculative/draft_model_proposer.h"

#include <algorithm>

#include "engine/speculative/draft_rounds.h"

namespace tandem::speculative {
namespace {

// The position of a step's last token.
int32_t LastPosition(const step::SequenceStep& s) {
  return s.first_position + static_cast<int32_t>(s.tokens.size()) - 1;
}

}  // namespace

DraftModelProposer::DraftModelProposer(std::unique_ptr<kernels::Backend> backend,
                                       std::unique_ptr<model::LlamaModel> model)
    : backend_(std::move(backend)), model_(std::move(model)) {}

absl::Status DraftModelProposer::Shadow(const step::StepPlan& plan) {
  first_round_row_.clear();
  if (!plan.block_copies.empty()) {
    std::vector<std::pair<int32_t, int32_t>> copies;
    for (const step::BlockCopy& c : plan.block_copies) copies.emplace_back(c.from, c.to);
    if (absl::Status s = model_->CopyBlocks(copies); !s.ok()) return s;
  }
  std::vector<model::SequenceInput> inputs;
  size_t rows = 0;
  for (const step::SequenceStep& s : plan.sequences) {
    const bool drafts = s.sample && s.proposer == step::Proposer::kDraftModel && s.draft_limit > 0;
    model::SequenceInput in;
    in.tokens = s.tokens;
    in.first_position = s.first_position;
    in.block_table = s.block_table;
    in.logits = drafts ? 1 : 0;
    inputs.push_back(in);
    if (drafts) first_round_row_[&s] = rows++;
  }
  if (inputs.empty()) return absl::OkStatus();
  // Greedy picks where the logits are; sampled requests' rows are read by
  // Propose() while this pass is still the model's latest.
  absl::Status s = model_->ForwardGreedy(inputs, &shadow_argmax_);
  shadow_pass_ = model_->forward_passes();
  return s;
}

absl::Status DraftModelProposer::Propose(std::span<const DraftRequest> requests,
                                         std::vector<Draft>* drafts) {
  if (!requests.empty() && model_->forward_passes() != shadow_pass_) {
    return absl::InternalError(
        "draft model: another pass ran between the shadow pass and drafting");
  }
  std::vector<size_t> rows(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto row = first_round_row_.find(requests[i].step);
    if (row == first_round_row_.end()) {
      return absl::InternalError("draft model: a drafting step was not shadowed");
    }
    rows[i] = row->second;
  }
  const FirstRound first_round{shadow_argmax_, rows};
  return DraftRounds(*model_, 0, requests, &first_round, drafts);
}

absl::Status DraftModelProposer::CatchUp(const step::StepPlan& plan, std::span<const Draft> drafts,
                                         std::span<const int32_t> accepted) {
  std::vector<model::SequenceInput> inputs;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const step::SequenceStep& s = plan.sequences[i];
    if (!s.sample || accepted[i] <= 0) continue;
    // Positions last+1 .. last+accepted hold drafts 1..accepted. The shadow
    // pass ran the step's tokens; drafting rounds 2..k ran this model's own
    // drafts 1..k-1, not the k-th; other proposers' drafts it never ran.
    const int32_t last = LastPosition(s);
    const int32_t k = static_cast<int32_t>(drafts[i].tokens.size());
    const int32_t run = s.proposer == step::Proposer::kDraftModel ? std::max(k - 1, 0) : 0;
    const int32_t from = run + 1;  // the first accepted draft (1-based) not yet run
    if (from > accepted[i]) continue;
    model::SequenceInput in;
    in.tokens =
        std::span<const TokenId>(drafts[i].tokens)
            .subspan(static_cast<size_t>(from - 1), static_cast<size_t>(accepted[i] - from + 1));
    in.first_position = last + from;
    in.block_table = s.block_table;
    in.logits = 0;
    inputs.push_back(in);
  }
  if (inputs.empty()) return absl::OkStatus();
  return model_->Forward(inputs, &logits_);
}

}  // namespace tandem::speculative
