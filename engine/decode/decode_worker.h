// The decode worker: the bandwidth-bound, latency-sensitive kind. It advances
// disaggregated sequences by one token per step, batched, with no prompt work
// in its batches, so a long prompt elsewhere never delays its steps. (Draft
// verification for speculative decoding joins it later.)
#ifndef TANDEM_ENGINE_DECODE_DECODE_WORKER_H_
#define TANDEM_ENGINE_DECODE_DECODE_WORKER_H_

#include "engine/model/model_worker.h"

namespace tandem::decode {

class DecodeWorker final : public model::ModelWorker {
 public:
  using ModelWorker::ModelWorker;
  std::string_view kind() const override { return "decode"; }
};

}  // namespace tandem::decode

#endif  // TANDEM_ENGINE_DECODE_DECODE_WORKER_H_
