// The prefill worker: it executes StepPlans with the model: one forward pass over the
// plan's sequences (prompt chunks and decode tokens mixed), then sampling.
//
// It is the compute-bound worker kind: it runs prompt chunks and the
// decode steps of colocated requests in mixed batches (docs/architecture.md).
//
// Thread safety: Execute() is called by one thread at a time.
#ifndef TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_
#define TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_

#include <memory>
#include <vector>

#include "engine/kernels/backend.h"
#include "engine/model/llama_model.h"
#include "engine/step/step_plan.h"

namespace tandem::prefill {

class PrefillWorker : public step::Worker {
 public:
  // `model` must be bound to `backend`; the worker owns both.
  PrefillWorker(std::unique_ptr<kernels::Backend> backend,
                std::unique_ptr<model::LlamaModel> model);

  step::StepResult Execute(const step::StepPlan& plan) override;

  const model::LlamaModel& model() const { return *model_; }

 private:
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::LlamaModel> model_;
  std::vector<float> logits_;
};

}  // namespace tandem::prefill

#endif  // TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_
