// The tandem.v1.Generation gRPC service (callback API).
//
// Generate() validates and tokenizes on the gRPC thread, submits to the
// scheduler and returns a reactor; the scheduler thread then feeds the
// reactor through a ResponseStream. One write is in flight at a time; text
// produced meanwhile is coalesced into the next message.
#ifndef TANDEM_SERVER_GENERATION_SERVICE_H_
#define TANDEM_SERVER_GENERATION_SERVICE_H_

#include <atomic>
#include <memory>

#include "scheduler/scheduler.h"
#include "server/request_builder.h"
#include "server/response_stream.h"
#include "server/server_metrics.h"
#include "server/serving_model.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::server {

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // All pointers must outlive the service.
  GenerationService(ServingModel* model, scheduler::Scheduler* scheduler, ServerMetrics* metrics,
                    RequestDefaults defaults);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;

  // Requests not yet finished (streams still open).
  int64_t open_streams() const { return open_streams_.load(); }

 private:
  ServingModel* model_;
  scheduler::Scheduler* scheduler_;
  ServerMetrics* metrics_;
  RequestDefaults defaults_;
  std::atomic<int64_t> open_streams_{0};
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GENERATION_SERVICE_H_
