// The decode worker: the bandwidth-bound, latency-sensitive kind. It advances
// disaggregated sequences by one token per step (plus verified drafts with
// speculative decoding), batched, with no prompt work in its batches, so a
// long prompt never rides in its steps. It computes on the latency lane of
// the shared compute: each step first takes the cores from a running prefill
// step (within one small task; the wait is reported as the step's start
// delay), and gives them back when it ends. The scheduler paces its steps
// while prompts are being prefilled (scheduler/decode_pacer.h).
//
// Thread safety: as ModelWorker.
#ifndef TANDEM_ENGINE_DECODE_DECODE_WORKER_H_
#define TANDEM_ENGINE_DECODE_DECODE_WORKER_H_

#include <memory>

#include "engine/worker/model_worker.h"

namespace tandem::decode {

class DecodeWorker final : public worker::ModelWorker {
 public:
  // REQUIRES: `backend` computes on the latency lane (or alone).
  DecodeWorker(std::unique_ptr<kernels::Backend> backend, std::unique_ptr<model::LlamaModel> model)
      : ModelWorker(std::move(backend), std::move(model)) {}
  std::string_view kind() const override { return "decode"; }

 protected:
  // Decode steps only: every sequence runs one token and samples (its
  // drafts come from the worker's proposers). A prompt chunk is refused:
  // prompts belong to the prefill worker.
  absl::Status CheckPlan(const step::StepPlan& plan) const override;
};

}  // namespace tandem::decode

#endif  // TANDEM_ENGINE_DECODE_DECODE_WORKER_H_
