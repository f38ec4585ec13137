// Cancels generation streams whose client stopped reading.
//
// A stream has at most one write in flight (generate_reactors.h); tokens
// produced meanwhile are merged into one pending message, so a client that
// reads slowly costs one message, not a queue. A client that stops reading
// altogether (its HTTP/2 window stays shut) would still hold a request slot,
// its KV blocks and that growing message until its deadline, perhaps for
// ever. The watchdog looks at every open stream a few times per timeout and
// cancels those whose write has waited for longer than the timeout.
//
// Thread safety: every method may be called from any thread. Cancellation
// runs on the watchdog's own thread, never on the scheduler's.
#ifndef TANDEM_SERVER_SLOW_READER_WATCHDOG_H_
#define TANDEM_SERVER_SLOW_READER_WATCHDOG_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace tandem::server {

// A stream the watchdog can look at.
class WatchedStream {
 public:
  virtual ~WatchedStream() = default;
  // Cancels the call if a write has been waiting since before `cutoff`;
  // returns true if it did. Must not block on the client.
  virtual bool CancelIfStalledSince(absl::Time cutoff) = 0;
};

class SlowReaderWatchdog {
 public:
  // Cancels streams whose write waits longer than `timeout` (> 0), looking
  // every `timeout / 4` (at least 10 ms, at most 1 s). `on_cancel` runs once
  // per cancelled stream (metrics). `start_thread` false: no thread, for
  // tests that call Scan themselves.
  SlowReaderWatchdog(absl::Duration timeout, std::function<void()> on_cancel,
                     bool start_thread = true);
  ~SlowReaderWatchdog();  // stops the thread
  SlowReaderWatchdog(const SlowReaderWatchdog&) = delete;
  SlowReaderWatchdog& operator=(const SlowReaderWatchdog&) = delete;

  // Starts watching `stream` until Forget(stream.get()) or its destruction.
  void Watch(const std::shared_ptr<WatchedStream>& stream);
  void Forget(const WatchedStream* stream);

  // One look at every stream as of `now`; returns how many were cancelled.
  int Scan(absl::Time now);

  absl::Duration timeout() const { return timeout_; }
  int64_t watched() const;

 private:
  void Loop();

  const absl::Duration timeout_;
  const std::function<void()> on_cancel_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<const WatchedStream*, std::weak_ptr<WatchedStream>> streams_
      ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SLOW_READER_WATCHDOG_H_
