// Executes StepPlans with the model: block copies, drafting for the
// sequences that speculate, one forward pass over the plan's sequences
// (prompt chunks, decode tokens and drafts mixed), then sampling and
// verification. The worker kinds (engine/prefill, engine/decode) build on it:
// each says what plans it takes, and its backend computes on its kind's lane
// of the shared compute (kernels::LanePriority), bracketed step by step.
//
// Thread safety: Execute() is called by one thread at a time.
#ifndef TANDEM_ENGINE_WORKER_MODEL_WORKER_H_
#define TANDEM_ENGINE_WORKER_MODEL_WORKER_H_

#include <memory>
#include <string_view>
#include <vector>

#include "engine/kernels/backend.h"
#include "engine/model/llama_model.h"
#include "engine/speculative/draft_model_proposer.h"
#include "engine/speculative/proposer.h"
#include "engine/speculative/suffix_proposer.h"
#include "engine/step/step_plan.h"

namespace tandem::worker {

class ModelWorker : public step::Worker {
 public:
  // `model` must be bound to `backend`; the worker owns both.
  ModelWorker(std::unique_ptr<kernels::Backend> backend, std::unique_ptr<model::LlamaModel> model);

  // Speculative decoding: the proposers this worker offers. Plans that name
  // a proposer the worker lacks fail with FailedPrecondition.
  // n-gram drafting with match lengths min_n..max_n.
  void EnableNgramProposer(int32_t min_n, int32_t max_n);
  // Suffix drafting (longest match, following the copy it is in), also
  // from earlier requests' text in `cache` when set (shared by workers).
  void EnableSuffixProposer(const speculative::SuffixDraftOptions& options,
                            std::shared_ptr<const speculative::SuffixCache> cache);
  // Layer-skip self-drafting with the model's first `layers` layers.
  void EnableSelfDraftProposer(int layers);
  // Drafting with a separate draft model (same vocabulary, the same KV block
  // ids, its own KV storage; engine/speculative/draft_model_proposer.h),
  // bound to its own `backend`. Replaces a self-draft.
  void EnableDraftModel(std::unique_ptr<kernels::Backend> backend,
                        std::unique_ptr<model::LlamaModel> draft);
  // The separate draft model, or null.
  model::LlamaModel* draft_model();
  // The separate draft model's backend (the draft's own KV storage), or null.
  kernels::Backend* draft_backend();
  // Gives back the resident pages of the KV storage this worker's backend
  // holds, and of a separate draft model's (Backend::ReleaseKvPages).
  // REQUIRES: no block holds anything a request still reads.
  void ReleaseKvPages();

  // Pins the worker's thread to its backend's CPUs.
  void OnThreadStart() override { backend_->BindCallingThread(); }
  // Checks the plan against the kind (CheckPlan), then runs it inside the
  // backend's step bracket (start delay and yielded time in the result).
  step::StepResult Execute(const step::StepPlan& plan) final;

  // "prefill" or "decode", for logs and metrics.
  virtual std::string_view kind() const = 0;
  const model::LlamaModel& model() const { return *model_; }
  model::LlamaModel* mutable_model() { return model_.get(); }
  const kernels::Backend& backend() const { return *backend_; }
  kernels::Backend* mutable_backend() { return backend_.get(); }

 protected:
  // The plans this kind takes: OK, or FailedPrecondition naming the first
  // step it refuses (nothing runs).
  virtual absl::Status CheckPlan(const step::StepPlan& plan) const = 0;

 private:
  step::StepResult Run(const step::StepPlan& plan);
  // Drafts for every sequence whose step asks for speculation.
  absl::Status ProposeDrafts(const step::StepPlan& plan, std::vector<speculative::Draft>* drafts);
  // A separate draft model sees what the target accepted (no-op without one).
  step::StepResult CatchUpSeparateDraft(const step::StepPlan& plan,
                                        const std::vector<speculative::Draft>& drafts,
                                        step::StepResult result);

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<speculative::DraftProposer> ngram_;
  std::unique_ptr<speculative::DraftProposer> suffix_;
  std::unique_ptr<speculative::DraftProposer> draft_model_;
  speculative::DraftModelProposer* separate_draft_ = nullptr;  // draft_model_, when separate
  std::vector<float> logits_;
  // A tokens-only step's sampled tokens and logprobs, one per logits row.
  std::vector<int32_t> sampled_tokens_;
  model::LlamaModel::SampledLogprobs sampled_logprobs_;
  model::LlamaModel::RowShares share_tokens_;  // drafted tokens' shares of the target's rows
  std::vector<float> rejected_logits_;         // the rows where such drafts were rejected
};

}  // namespace tandem::worker

#endif  // TANDEM_ENGINE_WORKER_MODEL_WORKER_H_
