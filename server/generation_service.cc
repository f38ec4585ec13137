#include "server/generation_service.h"

#include <optional>
#include <random>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

uint64_t RandomU64() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return rng();
}

std::string NewRequestId() {
  static const char* kDigits = "0123456789abcdef";
  uint64_t bits = RandomU64();
  std::string id = "req-";
  for (int i = 0; i < 16; ++i, bits >>= 4) id.push_back(kDigits[bits & 15]);
  return id;
}

// Folds `next` into `acc`: text and tokens append, final fields override.
void Merge(v1::GenerateResponse& acc, v1::GenerateResponse&& next) {
  acc.mutable_text()->append(next.text());
  acc.mutable_token_ids()->MergeFrom(next.token_ids());
  if (next.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    acc.set_finish_reason(next.finish_reason());
    *acc.mutable_usage() = next.usage();
    *acc.mutable_timeline() = next.timeline();
    acc.set_path(next.path());
    acc.set_path_reason(next.path_reason());
  }
}

// One Generate call. gRPC owns the reactor until OnDone(); the scheduler
// reaches it through the Channel, which outlives it.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  class Channel final : public ResponseChannel {
   public:
    explicit Channel(GenerateReactor* reactor) : reactor_(reactor) {}

    void Send(v1::GenerateResponse response) override {
      absl::MutexLock lock(&mu_);
      if (closing_ || reactor_ == nullptr) return;
      if (write_in_flight_) {
        if (pending_.has_value()) {
          Merge(*pending_, std::move(response));
        } else {
          pending_ = std::move(response);
        }
        return;
      }
      StartWriteLocked(std::move(response));
    }

    void Close(absl::Status status) override {
      absl::MutexLock lock(&mu_);
      if (closing_ || reactor_ == nullptr) return;
      closing_ = true;
      close_status_ = ToGrpc(status);
      if (!write_in_flight_) FinishLocked();
    }

    void OnWriteDone(bool ok) {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (!ok) pending_.reset();  // the client is gone; OnCancel follows
      if (pending_.has_value()) {
        v1::GenerateResponse next = *std::move(pending_);
        pending_.reset();
        StartWriteLocked(std::move(next));
      } else if (closing_ && !finished_) {
        FinishLocked();
      }
    }

    // Closes a stream that never reached the scheduler.
    void Reject(const grpc::Status& status) {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      close_status_ = status;
      FinishLocked();
    }

    void Detach() {
      absl::MutexLock lock(&mu_);
      reactor_ = nullptr;
    }

   private:
    void StartWriteLocked(v1::GenerateResponse response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      in_flight_ = std::move(response);
      write_in_flight_ = true;
      reactor_->StartWrite(&in_flight_);
    }
    void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      finished_ = true;
      reactor_->Finish(close_status_);
    }

    absl::Mutex mu_;
    GenerateReactor* reactor_ ABSL_GUARDED_BY(mu_);
    v1::GenerateResponse in_flight_ ABSL_GUARDED_BY(mu_);
    std::optional<v1::GenerateResponse> pending_ ABSL_GUARDED_BY(mu_);
    bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
    bool closing_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
    grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
  };

  GenerateReactor(scheduler::Scheduler* scheduler, std::atomic<int64_t>* open_streams)
      : scheduler_(scheduler),
        open_streams_(open_streams),
        channel_(std::make_shared<Channel>(this)) {
    open_streams_->fetch_add(1);
  }

  std::shared_ptr<Channel> channel() const { return channel_; }

  // Records the scheduler's id; cancels at once if the client already left.
  void Started(uint64_t sequence_id) {
    absl::MutexLock lock(&mu_);
    sequence_id_ = sequence_id;
    if (cancelled_) scheduler_->Cancel(sequence_id);
  }

  void OnWriteDone(bool ok) override { channel_->OnWriteDone(ok); }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (sequence_id_.has_value()) scheduler_->Cancel(*sequence_id_);
  }

  void OnDone() override {
    channel_->Detach();
    open_streams_->fetch_sub(1);
    delete this;
  }

 private:
  scheduler::Scheduler* scheduler_;
  std::atomic<int64_t>* open_streams_;
  std::shared_ptr<Channel> channel_;
  absl::Mutex mu_;
  std::optional<uint64_t> sequence_id_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

GenerationService::GenerationService(ServingModel* model, scheduler::Scheduler* scheduler,
                                     ServerMetrics* metrics, RequestDefaults defaults)
    : model_(model), scheduler_(scheduler), metrics_(metrics), defaults_(defaults) {}

grpc::ServerWriteReactor<v1::GenerateResponse>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateReactor(scheduler_, &open_streams_);
  const std::string request_id =
      request->request_id().empty() ? NewRequestId() : request->request_id();
  ModelLimits limits{&model_->tokenizer(), &model_->chat_template(), model_->context_length()};
  absl::StatusOr<BuiltRequest> built = BuildRequest(*request, limits, defaults_, RandomU64());
  if (!built.ok()) {
    spdlog::info("request {} rejected: {}", request_id, built.status().ToString());
    metrics_->OnRejected();
    reactor->channel()->Reject(ToGrpc(built.status()));
    return reactor;
  }
  scheduler::Request& r = built->request;
  r.id = request_id;
  r.deadline = absl::FromChrono(context->deadline());
  const int32_t prompt_tokens = static_cast<int32_t>(r.prompt.size());
  ServerMetrics* metrics = metrics_;
  r.sink = std::make_shared<ResponseStream>(
      request_id, model_->tokenizer(), std::move(built->stop_strings), reactor->channel(),
      [metrics, prompt_tokens](const std::string& id, const scheduler::FinishInfo& info) {
        metrics->OnFinish(info);
        const v1::Timeline t = TimelineToProto(info.timeline);
        spdlog::info(
            "request {} finished: reason={} path={} path_reason={} prompt_tokens={} "
            "cached_prompt_tokens={} completion_tokens={} queued_ms={:.1f} prefill_ms={:.1f} "
            "first_token_ms={:.1f} handoff_ms={:.1f} decode_ms={:.1f} total_ms={:.1f}{}",
            id, scheduler::FinishReasonName(info.reason), scheduler::PathName(info.path),
            scheduler::PathReasonName(info.path_reason), prompt_tokens,
            info.usage.cached_prompt_tokens, info.usage.completion_tokens, t.queued_ms(),
            t.prefill_ms(), t.first_token_ms(), t.handoff_ms(), t.decode_ms(), t.total_ms(),
            info.error.ok() ? "" : " error=" + info.error.ToString());
      });
  absl::StatusOr<uint64_t> id = scheduler_->Submit(std::move(r));
  if (!id.ok()) {
    spdlog::info("request {} rejected: {}", request_id, id.status().ToString());
    metrics_->OnRejected();
    reactor->channel()->Reject(ToGrpc(id.status()));
    return reactor;
  }
  reactor->Started(*id);
  return reactor;
}

}  // namespace tandem::server
