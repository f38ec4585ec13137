// Forwards a client's cancellation to the scheduler, whether it comes before
// or after the request reached the scheduler. Shared by every front end
// (gRPC reactors, the HTTP API, the peer service); no transport header here.
#ifndef TANDEM_SERVER_CANCELLATION_LINK_H_
#define TANDEM_SERVER_CANCELLATION_LINK_H_

#include <cstdint>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/scheduler.h"

namespace tandem::server {

class CancellationLink {
 public:
  explicit CancellationLink(scheduler::Scheduler* scheduler) : scheduler_(scheduler) {}
  // The request reached the scheduler as `sequence_id`; a cancellation that
  // came first is forwarded now.
  void Started(uint64_t sequence_id);
  void Cancel();

 private:
  scheduler::Scheduler* scheduler_;
  absl::Mutex mu_;
  std::optional<uint64_t> sequence_id_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_CANCELLATION_LINK_H_
