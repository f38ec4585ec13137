// What every client-facing API shares, without any transport: a request is
// validated, tokenized and submitted here whether it came over gRPC
// (generation_service.h) or HTTP (openai_service.h), so both apply the same
// limits, defaults, drain state and metrics, and count toward the same open
// calls a drain waits for.
#ifndef TANDEM_SERVER_GENERATION_FRONTEND_H_
#define TANDEM_SERVER_GENERATION_FRONTEND_H_

#include <atomic>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "scheduler/scheduler.h"
#include "server/cancellation_link.h"
#include "server/request_builder.h"
#include "server/response_stream.h"
#include "server/server_metrics.h"
#include "server/serving_model.h"
#include "server/slow_reader_watchdog.h"
#include "server/tool_call_parser.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::server {

struct FrontendOptions {
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
  // unified daemons, generation calls get FAILED_PRECONDITION.
  bool accepts_prompts = true;
  // How the model's products round (Load.arithmetic).
  std::string arithmetic;
  // --policy=slo with somewhere to hand requests to: GetModelInfo reports
  // the crossover (ModelInfo.slo_crossover_tokens).
  bool slo_paths = false;
};

class GenerationFrontend {
 public:
  // All pointers must outlive the frontend.
  GenerationFrontend(ServingModel* model, scheduler::Scheduler* scheduler, ServerMetrics* metrics,
                     FrontendOptions options);

  // Validates and submits a generation request whose output goes to
  // `channel`; on success the scheduler holds it and `link` can cancel it.
  // `client_deadline`: the caller's own deadline, if it set one (otherwise
  // the default deadline applies). Errors: FAILED_PRECONDITION (decode
  // daemon), UNAVAILABLE (draining), INVALID_ARGUMENT naming the field,
  // RESOURCE_EXHAUSTED (queue full); each counted as a rejection.
  absl::Status Start(const v1::GenerateRequest& request, std::optional<absl::Time> client_deadline,
                     std::shared_ptr<ResponseChannel> channel, CancellationLink& link,
                     std::string* id_out = nullptr);

  // The token ids the model sees for a text or a conversation.
  absl::StatusOr<v1::TokenizeResponse> Tokenize(const v1::TokenizeRequest& request) const;
  // The model and what the scheduler has learned so far.
  v1::ModelInfo ModelInfo() const;
  v1::Load Load() const;

  // Draining: from now on new generation calls get UNAVAILABLE (so callers
  // retry elsewhere); calls already accepted run on.
  void StopAccepting() { accepting_.store(false); }
  bool accepting() const { return accepting_.load(); }
  // Generation calls whose stream is still open, over every API.
  int64_t open_calls() const { return open_calls_.load(); }
  std::atomic<int64_t>* open_calls_counter() { return &open_calls_; }

  scheduler::Scheduler* scheduler() const { return scheduler_; }
  ServerMetrics* metrics() const { return metrics_; }
  const ServingModel& model() const { return *model_; }
  const FrontendOptions& options() const { return options_; }
  // Null when streams are never cancelled for reading slowly.
  SlowReaderWatchdog* watchdog() const { return watchdog_.get(); }

 private:
  ServingModel* model_;
  scheduler::Scheduler* scheduler_;
  ServerMetrics* metrics_;
  FrontendOptions options_;
  // What the chat template teaches the model: its tool-call format, and
  // whether answers open with <think> reasoning.
  const ToolCallFormat tool_format_;
  const bool template_reasons_;
  std::atomic<bool> accepting_{true};
  std::atomic<int64_t> open_calls_{0};
  // Declared last: destroyed first, so its thread never sees a dead member.
  std::unique_ptr<SlowReaderWatchdog> watchdog_;
};

// Holds one open call for as long as it lives (counted in open_calls()).
class OpenCall {
 public:
  explicit OpenCall(std::atomic<int64_t>* counter) : counter_(counter) { counter_->fetch_add(1); }
  ~OpenCall() { counter_->fetch_sub(1); }
  OpenCall(const OpenCall&) = delete;
  OpenCall& operator=(const OpenCall&) = delete;

 private:
  std::atomic<int64_t>* counter_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GENERATION_FRONTEND_H_
