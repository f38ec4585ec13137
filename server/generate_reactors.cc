#include "server/generate_reactors.h"

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// --- streaming ----------------------------------------------------------------

class StreamingGenerate::Channel final : public ResponseChannel, public WatchedStream {
 public:
  Channel(StreamingGenerate* reactor, grpc::CallbackServerContext* context)
      : reactor_(reactor), context_(context) {}

  void Send(v1::GenerateResponse response) override {
    absl::MutexLock lock(&mu_);
    if (closing_ || reactor_ == nullptr) return;
    if (write_in_flight_) {
      if (pending_.has_value()) {
        MergeResponse(*pending_, std::move(response));
      } else {
        pending_ = std::move(response);
      }
      return;
    }
    StartWriteLocked(std::move(response));
  }

  void Close(absl::Status status) override { Finish(ToGrpc(status)); }

  void Finish(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (closing_ || reactor_ == nullptr) return;
    closing_ = true;
    close_status_ = status;
    if (!write_in_flight_ && !cancelling_) FinishLocked();
  }

  void OnWriteDone(bool ok) {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    if (!ok) pending_.reset();  // the client is gone; OnCancel follows
    if (pending_.has_value()) {
      v1::GenerateResponse next = *std::move(pending_);
      pending_.reset();
      StartWriteLocked(std::move(next));
    } else if (closing_ && !finished_ && !cancelling_) {
      FinishLocked();
    }
  }

  bool CancelIfStalledSince(absl::Time cutoff) override {
    grpc::CallbackServerContext* context = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (reactor_ == nullptr || finished_ || cancelling_ || !write_in_flight_ ||
          write_started_ > cutoff) {
        return false;
      }
      // Holds Finish() back until TryCancel returns: the call, and with it
      // the context, cannot end (OnDone) before it is finished.
      cancelling_ = true;
      context = context_;
      spdlog::warn("request {}: the client read nothing for {}; cancelling its stream", request_id_,
                   absl::FormatDuration(absl::Now() - write_started_));
    }
    // gRPC may run this call's callbacks (OnWriteDone, OnCancel) on this
    // thread before TryCancel returns: no lock is held across it.
    context->TryCancel();
    absl::MutexLock lock(&mu_);
    cancelling_ = false;
    if (closing_ && !write_in_flight_ && !finished_) FinishLocked();
    return true;
  }

  void set_request_id(std::string id) {
    absl::MutexLock lock(&mu_);
    request_id_ = std::move(id);
  }

  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
    context_ = nullptr;
  }

 private:
  void StartWriteLocked(v1::GenerateResponse response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    in_flight_ = std::move(response);
    write_in_flight_ = true;
    write_started_ = absl::Now();
    reactor_->StartWrite(&in_flight_);
  }
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    finished_ = true;
    reactor_->grpc::ServerWriteReactor<v1::GenerateResponse>::Finish(close_status_);
  }

  absl::Mutex mu_;
  StreamingGenerate* reactor_ ABSL_GUARDED_BY(mu_);
  grpc::CallbackServerContext* context_ ABSL_GUARDED_BY(mu_);
  std::string request_id_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse in_flight_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::GenerateResponse> pending_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time write_started_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelling_ ABSL_GUARDED_BY(mu_) = false;  // in CancelIfStalledSince
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
};

StreamingGenerate::StreamingGenerate(grpc::CallbackServerContext* context,
                                     scheduler::Scheduler* scheduler,
                                     std::atomic<int64_t>* open_calls, SlowReaderWatchdog* watchdog)
    : open_calls_(open_calls),
      watchdog_(watchdog),
      channel_(std::make_shared<Channel>(this, context)),
      link_(scheduler) {
  open_calls_->fetch_add(1);
}

StreamingGenerate::~StreamingGenerate() { open_calls_->fetch_sub(1); }

std::shared_ptr<ResponseChannel> StreamingGenerate::channel() const { return channel_; }

void StreamingGenerate::Started(std::string request_id) {
  channel_->set_request_id(std::move(request_id));
  if (watchdog_ != nullptr) watchdog_->Watch(channel_);
}

void StreamingGenerate::Reject(const grpc::Status& status) { channel_->Finish(status); }

void StreamingGenerate::OnWriteDone(bool ok) { channel_->OnWriteDone(ok); }

void StreamingGenerate::OnDone() {
  if (watchdog_ != nullptr) watchdog_->Forget(channel_.get());
  channel_->Detach();
  delete this;
}

// --- unary ----------------------------------------------------------------------

class UnaryGenerate::Channel final : public ResponseChannel {
 public:
  Channel(UnaryGenerate* reactor, v1::GenerateResponse* response)
      : reactor_(reactor), response_(response) {}

  void Send(v1::GenerateResponse message) override {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finished_) return;
    MergeResponse(*response_, std::move(message));
  }

  void Close(absl::Status status) override { Finish(ToGrpc(status)); }

  void Finish(const grpc::Status& status) {
    absl::MutexLock lock(&mu_);
    if (reactor_ == nullptr || finished_) return;
    finished_ = true;
    reactor_->grpc::ServerUnaryReactor::Finish(status);
  }

  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  UnaryGenerate* reactor_ ABSL_GUARDED_BY(mu_);
  v1::GenerateResponse* response_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

UnaryGenerate::UnaryGenerate(scheduler::Scheduler* scheduler, v1::GenerateResponse* response,
                             std::atomic<int64_t>* open_calls)
    : open_calls_(open_calls),
      channel_(std::make_shared<Channel>(this, response)),
      link_(scheduler) {
  open_calls_->fetch_add(1);
}

UnaryGenerate::~UnaryGenerate() { open_calls_->fetch_sub(1); }

std::shared_ptr<ResponseChannel> UnaryGenerate::channel() const { return channel_; }

void UnaryGenerate::Reject(const grpc::Status& status) { channel_->Finish(status); }

void UnaryGenerate::OnDone() {
  channel_->Detach();
  delete this;
}

}  // namespace tandem::server
