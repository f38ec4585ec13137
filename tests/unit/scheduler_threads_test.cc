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
#include <set>
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

// KV events (SchedulerOptions::on_kv_events) come from the scheduler thread
// after the rounds that change the prefix index; a batch the receiver
// dropped is followed by the whole index, so a receiver that applies what
// it got ends with the scheduler's cached blocks.
TEST(SchedulerThreadsTest, ADroppedKvEventBatchIsFollowedByTheWholeIndex) {
  testing::FakeWorker shared(kBlocks, kBlockSize);
  LaneWorker prefill(&shared);
  absl::Mutex mu;
  std::vector<std::vector<kvcache::KvEvent>> calls;
  SchedulerOptions o = Options();
  o.disaggregation.output_threshold.reset();
  o.on_kv_events = [&](std::vector<kvcache::KvEvent> events) {
    absl::MutexLock lock(&mu);
    calls.push_back(std::move(events));
    return calls.size() != 1;  // the first batch is lost
  };
  Scheduler scheduler(o, /*max_queued=*/10, &prefill);
  auto run = [&](std::vector<TokenId> prompt) {
    Request r;
    r.prompt = std::move(prompt);
    r.max_tokens = 1;
    auto sink = std::make_shared<ThreadSafeRecord>();
    r.sink = sink;
    ASSERT_TRUE(scheduler.Submit(std::move(r)).ok());
    ASSERT_TRUE(sink->WaitDone(absl::Seconds(30)));
  };
  // 9 tokens: two full blocks each.
  run({11, 12, 13, 14, 15, 16, 17, 18, 19});
  run({21, 22, 23, 24, 25, 26, 27, 28, 29});

  // What a receiver holds, from every batch after the lost one, once the
  // scheduler has published its last round (bounded wait).
  std::set<std::vector<TokenId>> held;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    held.clear();
    bool snapshot_first = false;
    {
      absl::MutexLock lock(&mu);
      for (size_t c = 1; c < calls.size(); ++c) {
        if (c == 1) snapshot_first = calls[c].front().kind == kvcache::KvEvent::Kind::kAllCleared;
        for (const kvcache::KvEvent& e : calls[c]) {
          if (e.kind == kvcache::KvEvent::Kind::kAllCleared) held.clear();
          for (size_t b = 0; e.kind == kvcache::KvEvent::Kind::kStored && b < e.hashes.size();
               ++b) {
            held.insert(
                std::vector<TokenId>(e.tokens.begin() + 4 * b, e.tokens.begin() + 4 * b + 4));
          }
        }
      }
      if (calls.size() >= 2) {
        EXPECT_TRUE(snapshot_first) << "no snapshot after the lost batch";
      }
    }
    if (held.size() == 4 || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_EQ(held, (std::set<std::vector<TokenId>>{
                      {11, 12, 13, 14}, {15, 16, 17, 18}, {21, 22, 23, 24}, {25, 26, 27, 28}}));
  EXPECT_EQ(scheduler.Load().kv.cached_blocks, 4);
}

}  // namespace
}  // namespace tandem::scheduler
