#include "server/slow_reader_watchdog.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>

namespace tandem::server {
namespace {

// A stream whose one write started at `write_started` (nullopt: no write in
// flight), cancelled at most once, like the gRPC stream.
class FakeStream final : public WatchedStream {
 public:
  bool CancelIfStalledSince(absl::Time cutoff) override {
    ++looks;
    if (cancelled || !write_started.has_value() || *write_started > cutoff) return false;
    cancelled = true;
    return true;
  }
  std::optional<absl::Time> write_started;
  bool cancelled = false;
  int looks = 0;
};

const absl::Time kT0 = absl::FromUnixSeconds(1000);

TEST(SlowReaderWatchdogTest, CancelsOnlyStreamsWhoseWriteWaitedLongerThanTheTimeout) {
  int cancellations = 0;
  SlowReaderWatchdog watchdog(
      absl::Seconds(5), [&] { ++cancellations; },
      /*start_thread=*/false);
  auto idle = std::make_shared<FakeStream>(), reading = std::make_shared<FakeStream>(),
       stalled = std::make_shared<FakeStream>();
  reading->write_started = kT0 + absl::Seconds(3);
  stalled->write_started = kT0;
  for (auto& s : {idle, reading, stalled}) watchdog.Watch(s);
  EXPECT_EQ(watchdog.watched(), 3);

  EXPECT_EQ(watchdog.Scan(kT0 + absl::Seconds(4)), 0);  // nobody waited 5 s yet
  EXPECT_EQ(watchdog.Scan(kT0 + absl::Seconds(5)), 1);  // the stalled one, on the dot
  EXPECT_TRUE(stalled->cancelled);
  EXPECT_FALSE(reading->cancelled);
  EXPECT_FALSE(idle->cancelled);
  EXPECT_EQ(cancellations, 1);
  // Cancelled once only, whatever the later looks.
  EXPECT_EQ(watchdog.Scan(kT0 + absl::Seconds(60)), 1);  // now `reading` too
  EXPECT_TRUE(reading->cancelled);
  EXPECT_EQ(cancellations, 2);
  EXPECT_FALSE(idle->cancelled);
}

TEST(SlowReaderWatchdogTest, ForgottenAndDestroyedStreamsAreNotLookedAt) {
  SlowReaderWatchdog watchdog(absl::Seconds(1), nullptr, /*start_thread=*/false);
  auto forgotten = std::make_shared<FakeStream>();
  forgotten->write_started = kT0;
  watchdog.Watch(forgotten);
  watchdog.Forget(forgotten.get());
  {
    auto gone = std::make_shared<FakeStream>();
    gone->write_started = kT0;
    watchdog.Watch(gone);
  }  // the channel died without Forget: the watchdog holds no reference
  EXPECT_EQ(watchdog.Scan(kT0 + absl::Hours(1)), 0);
  EXPECT_EQ(forgotten->looks, 0);
}

TEST(SlowReaderWatchdogTest, ItsThreadCancelsAStalledStreamWithinTheTimeout) {
  absl::Notification cancelled;
  SlowReaderWatchdog watchdog(absl::Milliseconds(40), [&] { cancelled.Notify(); });
  auto stalled = std::make_shared<FakeStream>();
  stalled->write_started = absl::Now();
  watchdog.Watch(stalled);
  // Bounded wait on the observable effect (the thread looks every 10 ms).
  EXPECT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

}  // namespace
}  // namespace tandem::server
