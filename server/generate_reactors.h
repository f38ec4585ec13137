// The gRPC reactors of the two Generate RPCs. Each owns a ResponseChannel
// through which the scheduler thread delivers messages, and forwards a
// client's cancellation to the scheduler.
//
// gRPC owns a reactor until its OnDone(); the channel outlives it (the
// scheduler may still hold it) and drops whatever arrives after the end.
#ifndef TANDEM_SERVER_GENERATE_REACTORS_H_
#define TANDEM_SERVER_GENERATE_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>

#include "scheduler/scheduler.h"
#include "server/cancellation_link.h"
#include "server/response_stream.h"
#include "server/slow_reader_watchdog.h"
#include "tandem/v1/generate.grpc.pb.h"

namespace tandem::server {

grpc::Status ToGrpc(const absl::Status& s);

// Generate: one write in flight; messages produced meanwhile are coalesced.
// With a watchdog, a write that waits too long on the client cancels the call.
class StreamingGenerate final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  // `watchdog` may be null (no slow-reader timeout).
  StreamingGenerate(grpc::CallbackServerContext* context, scheduler::Scheduler* scheduler,
                    std::atomic<int64_t>* open_calls, SlowReaderWatchdog* watchdog);
  ~StreamingGenerate() override;

  std::shared_ptr<ResponseChannel> channel() const;
  CancellationLink& link() { return link_; }
  // The request reached the scheduler: watch for a slow reader from now on.
  void Started(std::string request_id);
  // Ends a call that never reached the scheduler.
  void Reject(const grpc::Status& status);

  void OnWriteDone(bool ok) override;
  void OnCancel() override { link_.Cancel(); }
  void OnDone() override;

 private:
  class Channel;
  std::atomic<int64_t>* open_calls_;
  SlowReaderWatchdog* watchdog_;
  std::shared_ptr<Channel> channel_;
  CancellationLink link_;
};

// GenerateUnary: messages are merged into the one response.
class UnaryGenerate final : public grpc::ServerUnaryReactor {
 public:
  UnaryGenerate(scheduler::Scheduler* scheduler, v1::GenerateResponse* response,
                std::atomic<int64_t>* open_calls);
  ~UnaryGenerate() override;

  std::shared_ptr<ResponseChannel> channel() const;
  CancellationLink& link() { return link_; }
  void Reject(const grpc::Status& status);

  void OnCancel() override { link_.Cancel(); }
  void OnDone() override;

 private:
  class Channel;
  std::atomic<int64_t>* open_calls_;
  std::shared_ptr<Channel> channel_;
  CancellationLink link_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_GENERATE_REACTORS_H_
