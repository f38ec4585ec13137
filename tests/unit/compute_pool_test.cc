// The shared compute pool: every index runs once on either lane, both lanes
// run concurrently, and a latency step owns the pool: once BeginStep()
// returns no throughput index runs until EndStep(), while the latency lane's
// loops still use the helpers. Each wait in these tests has a deadline.
#include "engine/kernels/cpu/compute_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/time/clock.h"

namespace tandem::kernels::cpu {
namespace {

// Spins until `done()` or a 30-second deadline; returns done().
template <typename Done>
bool SpinUntil(Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (!done() && absl::Now() < deadline) std::this_thread::yield();
  return done();
}

class ComputePoolTest : public ::testing::TestWithParam<int> {};

TEST_P(ComputePoolTest, EveryIndexRunsOnceOnEitherLane) {
  ComputePool pool(GetParam());
  for (LanePriority priority : {LanePriority::kThroughput, LanePriority::kLatency}) {
    for (int64_t n : {1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.lane(priority).ParallelFor(n, [&](int64_t i, int thread) {
        EXPECT_GE(thread, 0);
        EXPECT_LT(thread, pool.size());
        hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
    }
  }
}

TEST_P(ComputePoolTest, BothLanesRunConcurrentlyWithoutLosingAnIndex) {
  ComputePool pool(GetParam());
  constexpr int kLoops = 300;
  std::atomic<int64_t> sums[2] = {0, 0};
  auto drive = [&](LanePriority priority, int which) {
    for (int loop = 0; loop < kLoops; ++loop) {
      if (priority == LanePriority::kLatency) pool.lane(priority).BeginStep();
      pool.lane(priority).ParallelFor(64, [&](int64_t i, int) { sums[which].fetch_add(i + 1); });
      pool.lane(priority).EndStep();
    }
  };
  std::thread latency(drive, LanePriority::kLatency, 0);
  drive(LanePriority::kThroughput, 1);
  latency.join();
  EXPECT_EQ(sums[0].load(), int64_t{kLoops} * 64 * 65 / 2);
  EXPECT_EQ(sums[1].load(), int64_t{kLoops} * 64 * 65 / 2);
}

// A throughput loop is running (its second half cannot finish before a
// latency step has begun, so it is mid-loop by construction).
// From BeginStep's return to EndStep no throughput index starts or ends;
// the latency loop runs meanwhile (with the helpers, when there are any);
// afterwards the throughput loop completes.
TEST_P(ComputePoolTest, ALatencyStepOwnsThePoolUntilItEnds) {
  ComputePool pool(GetParam());
  constexpr int64_t kThroughputIndices = 400;
  std::atomic<bool> released{false};  // a latency step has begun (or ended)
  std::atomic<bool> latency_holds{false};
  std::atomic<int64_t> started{0};
  std::atomic<int64_t> finished{0};
  std::atomic<int64_t> started_while_held{0};
  std::thread throughput([&] {
    pool.lane(LanePriority::kThroughput).BeginStep();
    pool.lane(LanePriority::kThroughput).ParallelFor(kThroughputIndices, [&](int64_t i, int) {
      started.fetch_add(1);
      if (latency_holds.load()) started_while_held.fetch_add(1);
      if (i >= kThroughputIndices / 2) {
        SpinUntil([&] {
          if (pool.latency_step_active()) released.store(true);
          return released.load();
        });
      }
      finished.fetch_add(1);
    });
    pool.lane(LanePriority::kThroughput).EndStep();
  });
  ASSERT_TRUE(SpinUntil([&] { return started.load() > 0; }));

  ComputeLane& latency = pool.lane(LanePriority::kLatency);
  latency.BeginStep();
  latency_holds.store(true);
  const int64_t started_at_begin = started.load();
  const int64_t finished_at_begin = finished.load();
  std::mutex mu;
  std::set<int> threads;
  std::atomic<int64_t> latency_done{0};
  latency.ParallelFor(1000, [&](int64_t, int thread) {
    {
      std::lock_guard<std::mutex> lock(mu);
      threads.insert(thread);
    }
    latency_done.fetch_add(1);
    // With helpers, hold the first indices until another thread has joined:
    // helpers must serve the latency lane while a throughput loop waits.
    if (pool.size() > 1) {
      SpinUntil([&] {
        std::lock_guard<std::mutex> lock(mu);
        return threads.size() > 1;
      });
    }
  });
  EXPECT_EQ(started.load(), started_at_begin) << "a throughput index started in a latency step";
  EXPECT_EQ(finished.load(), finished_at_begin) << "a throughput index ran in a latency step";
  EXPECT_EQ(latency_done.load(), 1000);
  if (pool.size() > 1) {
    EXPECT_GT(threads.size(), 1u) << "no helper served the latency lane";
  }
  latency_holds.store(false);
  latency.EndStep();
  released.store(true);  // for indices that start only now

  throughput.join();
  EXPECT_EQ(finished.load(), kThroughputIndices);
  EXPECT_EQ(started_while_held.load(), 0);
  EXPECT_LT(finished_at_begin, kThroughputIndices) << "the test did not preempt a running loop";
}

// The throughput lane's step reports how long latency steps held the pool.
TEST_P(ComputePoolTest, TheThroughputStepReportsTheTimeItYielded) {
  ComputePool pool(GetParam());
  ComputeLane& throughput = pool.lane(LanePriority::kThroughput);
  ComputeLane& latency = pool.lane(LanePriority::kLatency);
  throughput.BeginStep();
  const absl::Time before = absl::Now();
  latency.BeginStep();
  // A latency step of at least 5 ms by its own clock (no sleep).
  const absl::Time begun = absl::Now();
  while (absl::Now() - begun < absl::Milliseconds(5)) latency.ParallelFor(8, [](int64_t, int) {});
  latency.EndStep();
  const absl::Duration held = absl::Now() - before;
  const absl::Duration yielded = throughput.EndStep();
  EXPECT_GE(yielded, absl::Milliseconds(5));
  EXPECT_LE(yielded, held);
  // No latency step since: the next throughput step yielded nothing.
  throughput.BeginStep();
  throughput.ParallelFor(16, [](int64_t, int) {});
  EXPECT_EQ(throughput.EndStep(), absl::ZeroDuration());
}

INSTANTIATE_TEST_SUITE_P(Threads, ComputePoolTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "threads" + std::to_string(info.param); });

}  // namespace
}  // namespace tandem::kernels::cpu
