// The threaded Scheduler: its inbox, the two worker threads and the finish
// hand-off, driven from many client threads at once. Each thread submits,
// cancels at random moments and polls Load() while both lanes run steps on
// one fake worker (one KV store, as the real workers share one pool). Run
// under ThreadSanitizer (scripts/test --sanitize=thread) this is the race
// check of the scheduler's locking; in every build it checks that nothing
// is lost: every request finishes once, uncancelled ones with exactly the
// tokens they get alone, and every block comes back.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_core.h"
#include "tests/unit/fake_worker.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kBlockSize = 4;
constexpr int32_t kBlocks = 512;

// A step::Worker over the shared fake worker (steps of the two lanes run
// concurrently on disjoint blocks, or read shared cached ones).
class LaneWorker final : public step::Worker {
 public:
  explicit LaneWorker(testing::FakeWorker* worker) : worker_(worker) {}
  step::StepResult Execute(const step::StepPlan& plan) override { return worker_->Execute(plan); }

 private:
  testing::FakeWorker* worker_;
};

// Records a request's tokens on the scheduler thread for a client thread.
class ThreadSafeRecord final : public RequestSink {
 public:
  bool OnToken(TokenId token, bool, const step::TokenLogprobs*) override {
    absl::MutexLock lock(&mu_);
    tokens_.push_back(token);
    return false;
  }
  void OnFinish(const FinishInfo& info) override {
    {
      absl::MutexLock lock(&mu_);
      ++finishes_;
      reason_ = info.reason;
    }
    if (!done_.HasBeenNotified()) done_.Notify();
  }
  bool WaitDone(absl::Duration timeout) { return done_.WaitForNotificationWithTimeout(timeout); }
  std::vector<TokenId> tokens() const {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  int finishes() const {
    absl::MutexLock lock(&mu_);
    return finishes_;
  }
  FinishReason reason() const {
    absl::MutexLock lock(&mu_);
    return reason_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<TokenId> tokens_ ABSL_GUARDED_BY(mu_);
  int finishes_ ABSL_GUARDED_BY(mu_) = 0;
  FinishReason reason_ ABSL_GUARDED_BY(mu_) = FinishReason::kStop;
  absl::Notification done_;
};

SchedulerOptions Options() {
  SchedulerOptions o;
  o.max_batched_tokens = 48;
  o.max_running = 16;
  o.block_size = kBlockSize;
  o.kv_blocks = kBlocks;
  o.context_length = 256;
  o.disaggregation.output_threshold = 6;
  return o;
}

std::vector<TokenId> Prompt(int client, int i) {
  std::vector<TokenId> prompt;
  const int length = 3 + (client * 7 + i * 5) % 40;
  for (int t = 0; t < length; ++t) {
    prompt.push_back(static_cast<TokenId>(100 + (client * 31 + i * 17 + t * 3) % 900));
  }
  return prompt;
}

// The tokens a request gets alone, on one thread, from the same fake worker.
std::vector<TokenId> Alone(const std::vector<TokenId>& prompt, int32_t max_tokens) {
  SchedulerOptions o = Options();
  o.disaggregation.output_threshold.reset();
  SchedulerCore core(o);
  testing::FakeWorker worker(kBlocks, kBlockSize);
  auto sink = std::make_shared<testing::Record>();
  Request r;
  r.prompt = prompt;
  r.max_tokens = max_tokens;
  r.sink = sink;
  core.Add(1, std::move(r));
  for (int steps = 0; core.HasWork() && steps < 10000; ++steps) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  return sink->tokens;
}

TEST(SchedulerThreadsTest, ClientsSubmittingAndCancellingConcurrentlyLoseNothing) {
  testing::FakeWorker shared(kBlocks, kBlockSize);
  LaneWorker prefill(&shared), decode(&shared);
  Scheduler scheduler(Options(), /*max_queued=*/1000, &prefill, &decode);

  constexpr int kClients = 6, kPerClient = 40;
  struct Sent {
    std::vector<TokenId> prompt;
    int32_t max_tokens = 0;
    bool cancelled = false;
    std::shared_ptr<ThreadSafeRecord> sink;
  };
  std::vector<std::vector<Sent>> sent(kClients);
  std::atomic<bool> clients_done{false};
  // One thread reads the load all along, as GetLoad and /metrics do.
  std::thread observer([&] {
    while (!clients_done.load()) {
      const SchedulerLoad load = scheduler.Load();
      EXPECT_LE(load.kv.used_blocks, kBlocks);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(static_cast<unsigned>(c) + 7);
      for (int i = 0; i < kPerClient; ++i) {
        Sent s;
        s.prompt = Prompt(c, i);
        s.max_tokens = 1 + static_cast<int32_t>(rng() % 24);
        s.sink = std::make_shared<ThreadSafeRecord>();
        Request r;
        r.prompt = s.prompt;
        r.max_tokens = s.max_tokens;
        r.sink = s.sink;
        absl::StatusOr<uint64_t> id = scheduler.Submit(std::move(r));
        ASSERT_TRUE(id.ok()) << id.status();
        const int dice = static_cast<int>(rng() % 4);
        if (dice == 0) {  // at once: queued, or whatever stage it reached
          scheduler.Cancel(*id);
          s.cancelled = true;
        } else if (dice == 1) {  // once it has produced a token or two
          const absl::Time until = absl::Now() + absl::Seconds(30);
          while (s.sink->tokens().size() < 2 && s.sink->finishes() == 0 && absl::Now() < until) {
            std::this_thread::yield();
          }
          scheduler.Cancel(*id);
          s.cancelled = true;
        }
        sent[static_cast<size_t>(c)].push_back(std::move(s));
      }
    });
  }
  for (std::thread& t : clients) t.join();
  clients_done.store(true);
  observer.join();

  int cancelled_early = 0;
  for (const std::vector<Sent>& per_client : sent) {
    for (const Sent& s : per_client) {
      ASSERT_TRUE(s.sink->WaitDone(absl::Seconds(60))) << "a request never finished";
      EXPECT_EQ(s.sink->finishes(), 1);
      if (s.cancelled) {
        cancelled_early += s.sink->reason() == FinishReason::kCancelled ? 1 : 0;
        continue;
      }
      EXPECT_EQ(s.sink->reason(), FinishReason::kLength);
      EXPECT_EQ(s.sink->tokens(), Alone(s.prompt, s.max_tokens));
    }
  }
  EXPECT_GT(cancelled_early, 0);
  // Everything comes back once the last finish is delivered.
  SchedulerLoad load;
  const absl::Time until = absl::Now() + absl::Seconds(30);
  do {
    load = scheduler.Load();
  } while ((load.kv.used_blocks != 0 || load.has_work) && absl::Now() < until);
  EXPECT_EQ(load.kv.used_blocks, 0);
  EXPECT_EQ(load.waiting, 0);
  EXPECT_EQ(load.running[0] + load.running[1], 0);
  EXPECT_GT(load.handoffs, 0) << "the decode lane never ran";
  scheduler.Stop();
}

}  // namespace
}  // namespace tandem::scheduler
