// The tandem.v1.Generation gRPC service (callback API).
//
// API keys are checked before any of this runs, in gRPC's transport
// (grpc_auth.h). Generate and GenerateUnary validate and tokenize on the gRPC
// thread, submit to the scheduler and return a reactor that the scheduler
// thread then feeds (generate_reactors.h). Tokenize, GetModelInfo and GetLoad
// answer at once.
#ifndef TANDEM_SERVER_GENERATION_SERVICE_H_
#define TANDEM_SERVER_GENERATION_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/scheduler.h"
#include "server/request_builder.h"
#include "server/response_stream.h"
#include "server/server_metrics.h"
#include "server/serving_model.h"
#include "server/slow_reader_watchdog.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::server {

struct ServiceOptions {
  RequestDefaults defaults;
  // What GetModelInfo answers.
  v1::ModelInfo model_info;
  // Longest prompt accepted (0: the context length minus one).
  int32_t max_prompt_tokens = 0;
  // Deadline of requests whose client set none (zero: none).
  absl::Duration default_deadline = absl::ZeroDuration();
  // A stream whose write waits this long on its client is cancelled (zero:
  // never; server/slow_reader_watchdog.h).
  absl::Duration slow_reader_timeout = absl::ZeroDuration();
  // False on a decode daemon (--role=decode): prompts belong to prefill or
  // unified daemons, Generate calls get FAILED_PRECONDITION.
  bool accepts_prompts = true;
  // --policy=slo with somewhere to hand requests to: GetModelInfo reports
  // the crossover (ModelInfo.slo_crossover_tokens).
  bool slo_paths = false;
};

class GenerationService final : public v1::Generation::CallbackService {
 public:
  // All pointers must outlive the service.
  GenerationService(ServingModel* model, scheduler::Scheduler* scheduler, ServerMetrics* metrics,
                    ServiceOptions options);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* GenerateUnary(grpc::CallbackServerContext* context,
                                          const v1::GenerateRequest* request,
                                          v1::GenerateResponse* response) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request,
                                         v1::ModelInfo* response) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request, v1::Load* response) override;

  // Draining: from now on new generation calls get UNAVAILABLE (so callers
  // retry elsewhere); calls already accepted run on.
  void StopAccepting() { accepting_.store(false); }
  bool accepting() const { return accepting_.load(); }
  // Generation calls whose stream is still open.
  int64_t open_calls() const { return open_calls_.load(); }
  // The counter of open calls, for other services whose calls a drain waits
  // for too (the Peer service's).
  std::atomic<int64_t>* open_calls_counter() { return &open_calls_; }

 private:
  // Authorizes, validates and submits a generation request whose output goes
  // to `channel`; on success the scheduler holds it.
  absl::Status Start(grpc::CallbackServerContext& context, const v1::GenerateRequest& request,
                     std::shared_ptr<ResponseChannel> channel, class CancellationLink& link,
                     std::string* id_out = nullptr);

  ServingModel* model_;
  scheduler::Scheduler* scheduler_;
  ServerMetrics* metrics_;
  ServiceOptions options_;
  std::atomic<bool> accepting_{true};
  std::atomic<int64_t> open_calls_{0};
  // Declared last: destroyed first, so its thread never sees a dead member.
  std::unique_ptr<SlowReaderWatchdog> watchdog_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GENERATION_SERVICE_H_
