#include "server/slow_reader_watchdog.h"

#include <algorithm>
#include <vector>

#include "absl/time/clock.h"
#include "common/check.h"
#include "common/thread_name.h"

namespace tandem::server {

SlowReaderWatchdog::SlowReaderWatchdog(absl::Duration timeout, std::function<void()> on_cancel,
                                       bool start_thread)
    : timeout_(timeout), on_cancel_(std::move(on_cancel)) {
  TANDEM_CHECK(timeout > absl::ZeroDuration(), "the slow-reader timeout must be positive");
  if (start_thread) {
    thread_ = std::thread([this] {
      NameThisThread("tandem-watchdog");
      Loop();
    });
  }
}

SlowReaderWatchdog::~SlowReaderWatchdog() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void SlowReaderWatchdog::Watch(const std::shared_ptr<WatchedStream>& stream) {
  absl::MutexLock lock(&mu_);
  streams_[stream.get()] = stream;
}

void SlowReaderWatchdog::Forget(const WatchedStream* stream) {
  absl::MutexLock lock(&mu_);
  streams_.erase(stream);
}

int64_t SlowReaderWatchdog::watched() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(streams_.size());
}

int SlowReaderWatchdog::Scan(absl::Time now) {
  std::vector<std::shared_ptr<WatchedStream>> streams;
  {
    absl::MutexLock lock(&mu_);
    streams.reserve(streams_.size());
    for (const auto& [key, weak] : streams_) {
      if (std::shared_ptr<WatchedStream> stream = weak.lock()) streams.push_back(std::move(stream));
    }
  }
  // Cancelling may run gRPC callbacks on this thread (which Forget() streams),
  // so no lock of ours is held here.
  int cancelled = 0;
  for (const std::shared_ptr<WatchedStream>& stream : streams) {
    if (stream->CancelIfStalledSince(now - timeout_)) {
      ++cancelled;
      if (on_cancel_) on_cancel_();
    }
  }
  return cancelled;
}

void SlowReaderWatchdog::Loop() {
  const absl::Duration period = std::clamp(timeout_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  while (!stop_.WaitForNotificationWithTimeout(period)) Scan(absl::Now());
}

}  // namespace tandem::server
