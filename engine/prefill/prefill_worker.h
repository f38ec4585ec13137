// The prefill worker: the compute-bound kind. It runs every request's prompt
// (in chunks the scheduler sizes) and the decode steps of colocated requests,
// in mixed batches (docs/architecture.md). It computes on the throughput lane
// of the shared compute: it uses every core the decode worker leaves, and a
// decode step that becomes ready takes them from it between two small tasks
// (engine/kernels/cpu/compute_pool.h); its step results report how long it
// yielded them.
//
// Thread safety: as ModelWorker.
#ifndef TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_
#define TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_

#include <memory>

#include "engine/worker/model_worker.h"

namespace tandem::prefill {

class PrefillWorker final : public worker::ModelWorker {
 public:
  // REQUIRES: `backend` computes on the throughput lane (or alone).
  PrefillWorker(std::unique_ptr<kernels::Backend> backend, std::unique_ptr<model::LlamaModel> model)
      : ModelWorker(std::move(backend), std::move(model)) {}
  std::string_view kind() const override { return "prefill"; }

 protected:
  // Any plan: prompt chunks, decode tokens and drafts, mixed.
  absl::Status CheckPlan(const step::StepPlan& plan) const override;
};

}  // namespace tandem::prefill

#endif  // TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_
