// The prefill worker: the compute-bound kind. It runs every request's prompt
// (in chunks) and the decode steps of colocated requests, in mixed batches
// (docs/architecture.md). Its own thread and cores come from the scheduler's
// worker thread and its backend's thread pool.
#ifndef TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_
#define TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_

#include "engine/model/model_worker.h"

namespace tandem::prefill {

class PrefillWorker final : public model::ModelWorker {
 public:
  using ModelWorker::ModelWorker;
  std::string_view kind() const override { return "prefill"; }
};

}  // namespace tandem::prefill

#endif  // TANDEM_ENGINE_PREFILL_PREFILL_WORKER_H_
