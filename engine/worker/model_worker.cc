#include "engine/worker/model_worker.h"

#include <algorithm>

#include "common/strings.h"
#include "engine/grammar/token_grammar.h"
#include "engine/sampling/sampler.h"
#include "engine/speculative/ngram_proposer.h"
#include "engine/speculative/self_draft_proposer.h"
#include "engine/speculative/suffix_proposer.h"
#include "engine/speculative/verify.h"

namespace tandem::worker {

ModelWorker::ModelWorker(std::unique_ptr<kernels::Backend> backend,
                         std::unique_ptr<model::LlamaModel> model)
    : backend_(std::move(backend)), model_(std::move(model)) {}

void ModelWorker::EnableNgramProposer(int32_t min_n, int32_t max_n) {
  ngram_ = std::make_unique<speculative::NgramProposer>(min_n, max_n);
}

void ModelWorker::EnableSuffixProposer(const speculative::SuffixDraftOptions& options,
                                       std::shared_ptr<const speculative::SuffixCache> cache) {
  suffix_ = std::make_unique<speculative::SuffixProposer>(options, std::move(cache));
}

void ModelWorker::EnableSelfDraftProposer(int layers) {
  draft_model_ = std::make_unique<speculative::SelfDraftProposer>(model_.get(), layers);
  separate_draft_ = nullptr;
}

void ModelWorker::EnableDraftModel(std::unique_ptr<kernels::Backend> backend,
                                   std::unique_ptr<model::LlamaModel> draft) {
  auto proposer =
      std::make_unique<speculative::DraftModelProposer>(std::move(backend), std::move(draft));
  separate_draft_ = proposer.get();
  draft_model_ = std::move(proposer);
}

model::LlamaModel* ModelWorker::draft_model() {
  return separate_draft_ != nullptr ? &separate_draft_->model() : nullptr;
}

kernels::Backend* ModelWorker::draft_backend() {
  return separate_draft_ != nullptr ? &separate_draft_->backend() : nullptr;
}

void ModelWorker::ReleaseKvPages() {
  backend_->ReleaseKvPages();
  if (kernels::Backend* draft = draft_backend()) draft->ReleaseKvPages();
}

absl::Status ModelWorker::ProposeDrafts(const step::StepPlan& plan,
                                        std::vector<speculative::Draft>* drafts) {
  drafts->assign(plan.sequences.size(), speculative::Draft{});
  struct Offered {
    step::Proposer kind;
    speculative::DraftProposer* proposer;
    const char* name;
  };
  for (const auto& [kind, proposer, name] :
       {Offered{step::Proposer::kNgram, ngram_.get(), "n-gram"},
        Offered{step::Proposer::kSuffix, suffix_.get(), "suffix"},
        Offered{step::Proposer::kDraftModel, draft_model_.get(), "draft-model"}}) {
    std::vector<speculative::DraftRequest> requests;
    std::vector<size_t> members;
    for (size_t i = 0; i < plan.sequences.size(); ++i) {
      const step::SequenceStep& s = plan.sequences[i];
      if (s.proposer != kind || s.draft_limit <= 0 || !s.sample) continue;
      requests.push_back({&s, s.draft_limit});
      members.push_back(i);
    }
    if (requests.empty()) continue;
    if (proposer == nullptr) {
      return absl::FailedPreconditionError(
          StrCat("the plan asks for ", name, " speculation, which this worker does not offer"));
    }
    std::vector<speculative::Draft> proposed;
    if (absl::Status s = proposer->Propose(requests, &proposed); !s.ok()) return s;
    for (size_t m = 0; m < members.size(); ++m) {
      (*drafts)[members[m]] = std::move(proposed[m]);
    }
  }
  return absl::OkStatus();
}

step::StepResult ModelWorker::Execute(const step::StepPlan& plan) {
  if (absl::Status s = CheckPlan(plan); !s.ok()) return {s, {}, {}, {}};
  const absl::Duration start_delay = backend_->BeginStep();
  step::StepResult result = Run(plan);
  result.yielded = backend_->EndStep();
  result.start_delay = start_delay;
  return result;
}

step::StepResult ModelWorker::Run(const step::StepPlan& plan) {
  step::StepResult result;
  if (!plan.block_copies.empty()) {
    std::vector<std::pair<int32_t, int32_t>> copies;
    for (const step::BlockCopy& c : plan.block_copies) copies.emplace_back(c.from, c.to);
    result.status = model_->CopyBlocks(copies);
    if (!result.status.ok()) return result;
  }
  // A separate draft model sees every token the target computes.
  if (separate_draft_ != nullptr) {
    result.status = separate_draft_->Shadow(plan);
    if (!result.status.ok()) return result;
  }
  std::vector<speculative::Draft> drafts;
  result.status = ProposeDrafts(plan, &drafts);
  if (!result.status.ok()) return result;

  // Each sequence runs its tokens followed by its draft, with logits for the
  // last token and every drafted one.
  std::vector<std::vector<int32_t>> extended(plan.sequences.size());
  std::vector<model::SequenceInput> inputs;
  inputs.reserve(plan.sequences.size());
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const step::SequenceStep& s = plan.sequences[i];
    const std::vector<int32_t>& draft = drafts[i].tokens;
    model::SequenceInput in;
    in.tokens = s.tokens;
    if (!draft.empty()) {
      extended[i] = s.tokens;
      extended[i].insert(extended[i].end(), draft.begin(), draft.end());
      in.tokens = extended[i];
    }
    in.first_position = s.first_position;
    in.block_table = s.block_table;
    in.logits = s.sample ? 1 + static_cast<int32_t>(draft.size()) : 0;
    inputs.push_back(in);
  }
  // A step needs only each row's token (and its logprobs, when asked),
  // drawn where the logits are (Backend::SampleRows, exactly the sampler's
  // draw), so a GPU copies token ids, not rows of the vocabulary. Row i of a
  // sequence is drawn as its generated token draw_index + i, and drafts are
  // verified against those samples (speculative::VerifySampled). Drafts
  // sampled from a distribution also need, at each drafted token, its share
  // of the target's distribution (Backend::SampleRowsWithShares), and the
  // logits of the row where a draft is rejected, one a sequence, fetched
  // for the whole step at once (speculative::VerifyFromShares). A step
  // where a sequence with such drafts asks for logprobs copies every row
  // and verifies every sequence on the host (speculative::Verify): those
  // drafts' emitted tokens are not the rows' samples.
  // Structured output masks rows on the host: a step with a grammar takes
  // the host path below (the tokens are the same either way).
  bool tokens_only = std::none_of(plan.sequences.begin(), plan.sequences.end(),
                                  [](const step::SequenceStep& s) { return s.grammar != nullptr; });
  bool any_shares = false;
  std::vector<kernels::RowDraw> draws;
  share_tokens_.tokens.clear();
  sampled_logprobs_.top = 0;
  for (size_t i = 0; i < plan.sequences.size() && tokens_only; ++i) {
    const step::SequenceStep& s = plan.sequences[i];
    if (!s.sample) continue;
    const bool from_shares = speculative::NeedsTargetDistribution(drafts[i], s.sampling);
    if (from_shares && s.logprobs > 0) {
      tokens_only = false;
      break;
    }
    any_shares = any_shares || from_shares;
    sampled_logprobs_.top =
        std::max(sampled_logprobs_.top,
                 std::min({s.logprobs, model_->config().vocab, kernels::Backend::kMaxLogprobs}));
    const std::vector<int32_t>& draft = drafts[i].tokens;
    for (size_t row = 0; row <= draft.size(); ++row) {
      draws.push_back(sampling::RowDrawOf(
          s.sampling, sampling::UniformDraw(s.sampling.seed, s.draw_index + row)));
      share_tokens_.tokens.push_back(from_shares && row < draft.size() ? draft[row] : -1);
    }
  }
  if (tokens_only) {
    const bool any_logprobs =
        std::any_of(plan.sequences.begin(), plan.sequences.end(),
                    [](const step::SequenceStep& s) { return s.sample && s.logprobs > 0; });
    result.status = model_->ForwardSample(inputs, draws, &sampled_tokens_,
                                          any_logprobs ? &sampled_logprobs_ : nullptr,
                                          any_shares ? &share_tokens_ : nullptr);
    if (!result.status.ok()) return result;
    const auto top = static_cast<size_t>(sampled_logprobs_.top);
    // Drafts verified from shares: where each stops, and the rows of the
    // rejected ones, copied at once.
    const size_t vocab = static_cast<size_t>(model_->config().vocab);
    std::vector<int32_t> rejected_rows;
    std::vector<int64_t> rejected_at(plan.sequences.size(), -1);  // index in rejected_rows
    for (size_t i = 0, row = 0; i < plan.sequences.size(); ++i) {
      const step::SequenceStep& s = plan.sequences[i];
      if (!s.sample) continue;
      const size_t k = drafts[i].tokens.size();
      if (speculative::NeedsTargetDistribution(drafts[i], s.sampling)) {
        const size_t accepted = speculative::AcceptedFromShares(
            std::span<const kernels::NucleusShare>(share_tokens_.share.data() + row, k), drafts[i],
            s.sampling, s.draw_index);
        if (accepted < k) {
          rejected_at[i] = static_cast<int64_t>(rejected_rows.size());
          rejected_rows.push_back(static_cast<int32_t>(row + accepted));
        }
      }
      row += k + 1;
    }
    if (!rejected_rows.empty()) {
      result.status = model_->LastLogitsRows(rejected_rows, &rejected_logits_);
      if (!result.status.ok()) return result;
    }
    size_t row = 0;
    for (size_t i = 0; i < plan.sequences.size(); ++i) {
      const step::SequenceStep& s = plan.sequences[i];
      step::SequenceResult r;
      r.sequence_id = s.sequence_id;
      if (s.sample) {
        const speculative::Draft& draft = drafts[i];
        const size_t rows = draft.tokens.size() + 1;
        speculative::Verification v;
        if (speculative::NeedsTargetDistribution(draft, s.sampling)) {
          const std::span<const float> rejected =
              rejected_at[i] < 0 ? std::span<const float>()
                                 : std::span<const float>(rejected_logits_)
                                       .subspan(static_cast<size_t>(rejected_at[i]) * vocab, vocab);
          v = speculative::VerifyFromShares(
              std::span<const kernels::NucleusShare>(share_tokens_.share.data() + row, rows - 1),
              sampled_tokens_[row + rows - 1], rejected, draft, s.sampling, s.draw_index);
        } else {
          v = speculative::VerifySampled(
              std::span<const int32_t>(sampled_tokens_.data() + row, rows), draft);
        }
        for (size_t t = 0; t < v.tokens.size() && s.logprobs > 0; ++t) {
          step::TokenLogprobs l;
          l.token = v.tokens[t];
          l.logprob = sampled_logprobs_.token[row + t];
          for (size_t j = 0; j < std::min(static_cast<size_t>(s.logprobs), top); ++j) {
            l.top.emplace_back(sampled_logprobs_.top_ids[(row + t) * top + j],
                               sampled_logprobs_.top_logprobs[(row + t) * top + j]);
          }
          r.logprobs.push_back(std::move(l));
        }
        r.sampled = std::move(v.tokens);
        r.proposer = s.draft_limit > 0 ? s.proposer : step::Proposer::kNone;
        r.draft_source = draft.source;
        r.draft_match = draft.match;
        r.drafted = static_cast<int32_t>(draft.tokens.size());
        r.accepted = v.accepted;
        r.draft_copy_goes_on = r.draft_match > 0 && r.drafted > 0 && r.accepted == r.drafted &&
                               draft.copy_next >= 0 && r.sampled.back() == draft.copy_next;
        row += rows;
      }
      result.sequences.push_back(std::move(r));
    }
    return CatchUpSeparateDraft(plan, drafts, std::move(result));
  }

  result.status = model_->Forward(inputs, &logits_);
  if (!result.status.ok()) return result;

  const size_t vocab = static_cast<size_t>(model_->config().vocab);
  size_t row = 0;
  result.sequences.reserve(plan.sequences.size());
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const step::SequenceStep& s = plan.sequences[i];
    step::SequenceResult r;
    r.sequence_id = s.sequence_id;
    if (s.sample) {
      const speculative::Draft& draft = drafts[i];
      const size_t rows = draft.tokens.size() + 1;
      const std::span<float> logits(logits_.data() + row * vocab, rows * vocab);
      // Log-probabilities stay the model's, before the grammar's mask.
      std::vector<float> unmasked;
      if (s.grammar != nullptr) {
        if (s.logprobs > 0) unmasked.assign(logits.begin(), logits.end());
        grammar::MaskDraftRows(*s.grammar, draft.tokens, logits, vocab);
      }
      const std::span<const float> model_logits =
          unmasked.empty() ? std::span<const float>(logits) : std::span<const float>(unmasked);
      speculative::Verification v =
          speculative::Verify(logits, static_cast<int32_t>(vocab), draft, s.sampling, s.draw_index);
      if (s.logprobs > 0) {
        for (size_t t = 0; t < v.tokens.size(); ++t) {
          r.logprobs.push_back(
              sampling::Logprobs(model_logits.subspan(t * vocab, vocab), v.tokens[t], s.logprobs));
        }
      }
      r.sampled = std::move(v.tokens);
      r.proposer = s.draft_limit > 0 ? s.proposer : step::Proposer::kNone;
      r.draft_source = draft.source;
      r.draft_match = draft.match;
      r.drafted = static_cast<int32_t>(draft.tokens.size());
      r.accepted = v.accepted;
      r.draft_copy_goes_on = r.draft_match > 0 && r.drafted > 0 && r.accepted == r.drafted &&
                             draft.copy_next >= 0 && r.sampled.back() == draft.copy_next;
      row += rows;
    }
    result.sequences.push_back(std::move(r));
  }
  return CatchUpSeparateDraft(plan, drafts, std::move(result));
}

step::StepResult ModelWorker::CatchUpSeparateDraft(const step::StepPlan& plan,
                                                   const std::vector<speculative::Draft>& drafts,
                                                   step::StepResult result) {
  if (separate_draft_ != nullptr) {
    std::vector<int32_t> accepted;
    for (const step::SequenceResult& r : result.sequences) accepted.push_back(r.accepted);
    result.status = separate_draft_->CatchUp(plan, drafts, accepted);
    if (!result.status.ok()) result.sequences.clear();
  }
  return result;
}

}  // namespace tandem::worker
