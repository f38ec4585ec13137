// SchedulerCore against a fake worker that keeps a token "KV cache" in the
// scheduler's block ids: it writes each step's tokens into the slots its block
// table names and samples a token that hashes every earlier token read back
// through the table. So any mistake in block tables, positions, chunking or
// recompute after preemption changes the generated tokens.
#include "scheduler/scheduler_core.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "tests/unit/fake_worker.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kBlockSize = 4;

using testing::Record;

// The scheduler's fake worker, with this file's block size.
class FakeWorker : public testing::FakeWorker {
 public:
  explicit FakeWorker(int32_t blocks) : testing::FakeWorker(blocks, kBlockSize) {}
};

Request MakeRequest(int32_t prompt_tokens, int32_t max_tokens, std::shared_ptr<Record> sink,
                    uint64_t seed = 1) {
  Request r;
  for (int32_t i = 0; i < prompt_tokens; ++i) r.prompt.push_back(1000 + i * 3 % 97);
  r.max_tokens = max_tokens;
  r.sampling.seed = seed;
  r.sink = std::move(sink);
  return r;
}

SchedulerOptions Options(int32_t budget, int32_t blocks, int32_t max_running = 64) {
  SchedulerOptions o;
  o.max_batched_tokens = budget;
  o.max_running = max_running;
  o.block_size = kBlockSize;
  o.kv_blocks = blocks;
  o.context_length = 256;
  return o;
}

// Runs steps until idle, checking per-step invariants; returns step count.
int RunToCompletion(SchedulerCore& core, FakeWorker& worker, int32_t budget,
                    int max_steps = 10000) {
  int steps = 0;
  while (core.HasWork() && steps < max_steps) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    EXPECT_LE(plan.TokenCount(), budget) << "the token budget was exceeded";
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
    ++steps;
  }
  EXPECT_FALSE(core.HasWork()) << "did not finish in " << max_steps << " steps";
  return steps;
}

// The tokens a request generates when it runs alone with a roomy cache.
std::vector<TokenId> Alone(int32_t prompt, int32_t max_tokens, uint64_t seed) {
  SchedulerCore core(Options(64, 256));
  FakeWorker worker(256);
  auto sink = std::make_shared<Record>();
  core.Add(1, MakeRequest(prompt, max_tokens, sink, seed));
  RunToCompletion(core, worker, 64);
  return sink->tokens;
}

TEST(SchedulerCoreTest, ChunksAPromptToTheBudgetThenDecodes) {
  SchedulerCore core(Options(16, 64));
  FakeWorker worker(64);
  auto sink = std::make_shared<Record>();
  core.Add(1, MakeRequest(40, 5, sink));
  std::vector<int64_t> step_tokens;
  while (core.HasWork()) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    step_tokens.push_back(plan.TokenCount());
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  // 16 + 16 + 8 prompt tokens (the last chunk samples token 1), then 4 decodes.
  EXPECT_EQ(step_tokens, (std::vector<int64_t>{16, 16, 8, 1, 1, 1, 1}));
  ASSERT_TRUE(sink->finish.has_value());
  EXPECT_EQ(sink->finish->reason, FinishReason::kLength);
  EXPECT_EQ(sink->finish->usage.prompt_tokens, 40);
  EXPECT_EQ(sink->finish->usage.completion_tokens, 5);
  EXPECT_EQ(sink->tokens, Alone(40, 5, 1));
  EXPECT_EQ(core.free_blocks(), 64);
}

// Sliding-window layers: the blocks a window behind go to
// release_sliding_pages, which here loses their tokens. Requests whose
// prompts are prefixes of each other's, in two waves (the second matching
// the first's cached blocks), in a roomy cache and in one small enough to
// preempt, generate what they generate without any release: nothing a
// window reads, in a step or through a prefix match, was given back.
TEST(SchedulerCoreTest, SlidingReleaseNeverGivesBackAKeyAWindowReads) {
  constexpr int32_t kWindow = 6;
  const std::vector<std::pair<int32_t, int32_t>> waves[] = {{{30, 20}, {12, 25}},
                                                            {{30, 20}, {21, 10}, {17, 12}}};
  auto run = [&](bool release, int32_t blocks, int64_t* released) {
    SchedulerOptions o = Options(16, blocks);
    FakeWorker worker(blocks);
    worker.SetWindow(kWindow);
    *released = 0;
    if (release) {
      o.sliding_window = kWindow;
      o.release_sliding_pages = [&](Lane lane, std::span<const int32_t> b) {
        EXPECT_EQ(lane, Lane::kPrefill);
        worker.Clobber(b);
        *released += static_cast<int64_t>(b.size());
      };
    }
    SchedulerCore core(o);
    std::vector<std::vector<TokenId>> outputs;
    uint64_t id = 1;
    for (const auto& wave : waves) {
      std::vector<std::shared_ptr<Record>> sinks;
      for (const auto& [prompt, max_tokens] : wave) {
        sinks.push_back(std::make_shared<Record>());
        core.Add(id, MakeRequest(prompt, max_tokens, sinks.back(), id));
        ++id;
      }
      RunToCompletion(core, worker, 16);
      for (const auto& sink : sinks) outputs.push_back(sink->tokens);
    }
    EXPECT_EQ(core.kv_stats().sliding_released, *released);
    EXPECT_EQ(core.free_blocks(), blocks);
    return outputs;
  };
  int64_t released = 0;
  const auto reference = run(false, 256, &released);
  for (int32_t blocks : {256, 16}) {
    EXPECT_EQ(run(true, blocks, &released), reference) << blocks << " blocks";
    EXPECT_GT(released, 20) << blocks << " blocks";
  }
}

TEST(SchedulerCoreTest, OutputDoesNotDependOnTheBudget) {
  const std::vector<TokenId> reference = Alone(37, 12, 5);
  for (int32_t budget : {1, 3, 8, 37, 100}) {
    SchedulerCore core(Options(budget, 64));
    FakeWorker worker(64);
    auto sink = std::make_shared<Record>();
    core.Add(1, MakeRequest(37, 12, sink, 5));
    RunToCompletion(core, worker, budget);
    EXPECT_EQ(sink->tokens, reference) << "budget " << budget;
  }
}

TEST(SchedulerCoreTest, DecodesAreScheduledBeforeANewLongPrompt) {
  SchedulerCore core(Options(8, 128));
  FakeWorker worker(128);
  std::vector<std::shared_ptr<Record>> sinks;
  for (uint64_t id = 1; id <= 3; ++id) {
    sinks.push_back(std::make_shared<Record>());
    core.Add(id, MakeRequest(2, 30, sinks.back(), id));
  }
  // Let the three short requests reach decoding.
  for (int i = 0; i < 2; ++i) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  auto long_prompt = std::make_shared<Record>();
  core.Add(9, MakeRequest(100, 2, long_prompt, 9));
  for (int step = 0; step < 10; ++step) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    ASSERT_GE(plan.sequences.size(), 3u);
    // The three decodes come first, one token each; the prompt gets the rest.
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(plan.sequences[static_cast<size_t>(i)].tokens.size(), 1u);
      EXPECT_LE(plan.sequences[static_cast<size_t>(i)].sequence_id, 3u);
    }
    EXPECT_EQ(plan.sequences.back().sequence_id, 9u);
    EXPECT_EQ(plan.TokenCount(), 8);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
}

TEST(SchedulerCoreTest, StopTokenAndSinkStopFinishWithStop) {
  const std::vector<TokenId> tokens = Alone(5, 10, 3);
  SchedulerCore core(Options(16, 64));
  FakeWorker worker(64);
  auto by_token = std::make_shared<Record>();
  Request r = MakeRequest(5, 10, by_token, 3);
  r.stop_token_ids = {tokens[3]};
  core.Add(1, std::move(r));
  auto by_sink = std::make_shared<Record>();
  by_sink->stop_after = 2;
  core.Add(2, MakeRequest(5, 10, by_sink, 3));
  RunToCompletion(core, worker, 16);
  EXPECT_EQ(by_token->finish->reason, FinishReason::kStop);
  EXPECT_EQ(by_token->tokens.size(), 4u);  // the stop token itself is reported
  EXPECT_EQ(by_sink->finish->reason, FinishReason::kStop);
  EXPECT_EQ(by_sink->tokens.size(), 2u);
  EXPECT_EQ(core.free_blocks(), 64);
}

TEST(SchedulerCoreTest, PreemptionUnderAFullPoolIsInvisibleInTheOutput) {
  // 12 blocks of 4 tokens: two requests of 10 + 30 tokens cannot both fit.
  const std::vector<TokenId> a = Alone(10, 30, 1), b = Alone(10, 30, 2);
  SchedulerCore core(Options(32, 12));
  FakeWorker worker(12);
  auto sa = std::make_shared<Record>(), sb = std::make_shared<Record>();
  core.Add(1, MakeRequest(10, 30, sa, 1));
  core.Add(2, MakeRequest(10, 30, sb, 2));
  RunToCompletion(core, worker, 32);
  EXPECT_GT(core.preemptions(), 0);
  EXPECT_EQ(sa->tokens, a);
  EXPECT_EQ(sb->tokens, b);
  EXPECT_EQ(sa->finish->reason, FinishReason::kLength);
  EXPECT_EQ(sb->finish->reason, FinishReason::kLength);
  EXPECT_EQ(core.free_blocks(), 12);
}

TEST(SchedulerCoreTest, ASequenceTooLongForThePoolEndsWithLength) {
  SchedulerCore core(Options(16, 3));  // 12 token slots in all
  FakeWorker worker(3);
  auto sink = std::make_shared<Record>();
  core.Add(1, MakeRequest(6, 50, sink));
  RunToCompletion(core, worker, 16);
  EXPECT_EQ(sink->finish->reason, FinishReason::kLength);
  EXPECT_EQ(sink->tokens.size(), 7u);  // positions 0..11 hold 6 prompt + 6 generated; 7th sampled
  EXPECT_EQ(core.free_blocks(), 3);
}

TEST(SchedulerCoreTest, RunningCapLimitsTheBatch) {
  SchedulerCore core(Options(64, 64, /*max_running=*/2));
  FakeWorker worker(64);
  std::vector<std::shared_ptr<Record>> sinks;
  for (uint64_t id = 1; id <= 5; ++id) {
    sinks.push_back(std::make_shared<Record>());
    core.Add(id, MakeRequest(3, 4, sinks.back(), id));
  }
  while (core.HasWork()) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    EXPECT_LE(plan.sequences.size(), 2u);
    EXPECT_LE(core.running(Lane::kPrefill), 2);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  for (uint64_t id = 1; id <= 5; ++id) EXPECT_EQ(sinks[id - 1]->tokens, Alone(3, 4, id));
}

TEST(SchedulerCoreTest, CancelInEveryStateFreesEverything) {
  SchedulerCore core(Options(8, 64, /*max_running=*/1));
  FakeWorker worker(64);
  auto running = std::make_shared<Record>(), waiting = std::make_shared<Record>(),
       mid_prompt = std::make_shared<Record>();
  core.Add(1, MakeRequest(3, 100, running));
  core.Add(2, MakeRequest(3, 100, waiting));
  for (int i = 0; i < 3; ++i) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  EXPECT_EQ(core.running(Lane::kPrefill), 1);
  EXPECT_EQ(core.waiting(), 1);
  core.Cancel(2, FinishReason::kCancelled, absl::CancelledError("client left"));
  core.Cancel(1, FinishReason::kCancelled, absl::CancelledError("client left"));
  EXPECT_EQ(waiting->finish->reason, FinishReason::kCancelled);
  EXPECT_EQ(waiting->tokens.size(), 0u);
  EXPECT_EQ(waiting->finish->stage, Stage::kQueued);
  EXPECT_EQ(running->finish->reason, FinishReason::kCancelled);
  EXPECT_EQ(running->finish->stage, Stage::kDecode);
  EXPECT_EQ(running->finish->usage.completion_tokens, static_cast<int32_t>(running->tokens.size()));
  // A prompt cancelled between two of its chunks.
  core.Add(3, MakeRequest(30, 5, mid_prompt));
  step::StepPlan plan = core.Schedule(Lane::kPrefill);
  core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  core.Cancel(3, FinishReason::kCancelled, absl::CancelledError("client left"));
  EXPECT_EQ(mid_prompt->finish->reason, FinishReason::kCancelled);
  EXPECT_EQ(mid_prompt->finish->stage, Stage::kPrefill);
  core.Cancel(3, FinishReason::kCancelled, absl::OkStatus());  // unknown by now: ignored
  EXPECT_FALSE(core.HasWork());
  EXPECT_EQ(core.free_blocks(), 64);
}

TEST(SchedulerCoreTest, ExpiredDeadlinesCancelWithDeadlineExceeded) {
  absl::Time now = absl::FromUnixSeconds(1000);
  SchedulerOptions options = Options(8, 64);
  options.clock = [&now] { return now; };
  SchedulerCore core(options);
  FakeWorker worker(64);
  auto sink = std::make_shared<Record>();
  Request r = MakeRequest(3, 100, sink);
  r.deadline = now + absl::Seconds(5);
  core.Add(1, std::move(r));
  EXPECT_EQ(core.NextDeadline(), now + absl::Seconds(5));
  step::StepPlan plan = core.Schedule(Lane::kPrefill);
  core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  core.ExpireDeadlines(now + absl::Seconds(4));
  EXPECT_FALSE(sink->finish.has_value());
  now += absl::Seconds(6);
  core.ExpireDeadlines(now);
  ASSERT_TRUE(sink->finish.has_value());
  EXPECT_EQ(sink->finish->reason, FinishReason::kCancelled);
  EXPECT_EQ(sink->finish->error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(sink->finish->timeline.finished, now);
  EXPECT_EQ(core.free_blocks(), 64);
}

TEST(SchedulerCoreTest, TheTimelineStartsWhenTheRpcArrivedIfTheFrontEndSaysSo) {
  absl::Time now = absl::FromUnixSeconds(2000);
  SchedulerOptions options = Options(8, 64);
  options.clock = [&now] { return now; };
  SchedulerCore core(options);
  FakeWorker worker(64);
  auto told = std::make_shared<Record>();
  auto untold = std::make_shared<Record>();
  Request r = MakeRequest(3, 1, told);
  r.received = now - absl::Milliseconds(7);  // tokenized and queued for 7 ms
  core.Add(1, std::move(r));
  core.Add(2, MakeRequest(3, 1, untold));
  while (core.HasWork()) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  ASSERT_TRUE(told->finish.has_value() && untold->finish.has_value());
  EXPECT_EQ(told->finish->timeline.arrival, now - absl::Milliseconds(7));
  EXPECT_EQ(untold->finish->timeline.arrival, now);
}

TEST(SchedulerCoreTest, AWorkerErrorEndsThePlannedSequencesWithError) {
  SchedulerCore core(Options(8, 64));
  auto sink = std::make_shared<Record>();
  core.Add(1, MakeRequest(3, 10, sink));
  step::StepPlan plan = core.Schedule(Lane::kPrefill);
  step::StepResult failed;
  failed.status = absl::InternalError("device lost");
  core.Update(Lane::kPrefill, plan, failed);
  ASSERT_TRUE(sink->finish.has_value());
  EXPECT_EQ(sink->finish->reason, FinishReason::kError);
  EXPECT_EQ(sink->finish->error.message(), "device lost");
  EXPECT_EQ(core.free_blocks(), 64);
}

TEST(SchedulerCoreTest, AdmissibleRejectsWhatCanNeverRun) {
  SchedulerCore core(Options(8, 4));  // 16 token slots, context 256
  auto sink = std::make_shared<Record>();
  EXPECT_FALSE(core.Admissible(MakeRequest(0, 5, sink)).ok());
  EXPECT_FALSE(core.Admissible(MakeRequest(16, 5, sink)).ok());  // needs 5 blocks with one more
  EXPECT_TRUE(core.Admissible(MakeRequest(15, 5, sink)).ok());
  SchedulerCore small_context(Options(8, 1000));
  EXPECT_FALSE(small_context.Admissible(MakeRequest(256, 1, sink)).ok());
  EXPECT_FALSE(core.Admissible(MakeRequest(3, 0, sink)).ok());
}

TEST(SchedulerCoreTest, ARepeatedPromptRunsOnlyItsUncachedTokensAndGivesTheSameOutput) {
  SchedulerCore core(Options(64, 64));
  FakeWorker worker(64);
  auto first = std::make_shared<Record>();
  core.Add(1, MakeRequest(37, 6, first, 9));
  RunToCompletion(core, worker, 64);
  EXPECT_EQ(first->finish->usage.cached_prompt_tokens, 0);

  auto second = std::make_shared<Record>();
  core.Add(2, MakeRequest(37, 6, second, 9));
  step::StepPlan plan = core.Schedule(Lane::kPrefill);
  ASSERT_EQ(plan.sequences.size(), 1u);
  // 37 tokens: 9 full blocks of 4 are cached, leaving token 36 to compute.
  EXPECT_EQ(plan.sequences[0].first_position, 36);
  EXPECT_EQ(plan.sequences[0].tokens.size(), 1u);
  EXPECT_TRUE(plan.sequences[0].sample);
  core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  RunToCompletion(core, worker, 64);
  EXPECT_EQ(second->finish->usage.cached_prompt_tokens, 36);
  EXPECT_EQ(second->tokens, first->tokens);
  EXPECT_EQ(core.kv_stats().prefix_hit_tokens, 36);
  EXPECT_EQ(core.kv_stats().prefix_queried_tokens, 74);
  EXPECT_EQ(core.free_blocks(), 64);
}

// The prompt arrival rate (the SLO policy's path forecasts: the share of
// the compute arriving prompts need) counts the tokens arrivals will
// compute: a prefix cached when a request arrives costs nothing.
TEST(SchedulerCoreTest, ThePromptArrivalRateLeavesOutCachedPrefixes) {
  absl::Time now = absl::UnixEpoch();
  SchedulerOptions options = Options(64, 64);
  options.clock = [&now] { return now; };
  options.slo_policy = true;  // the policy that reads the rate
  SchedulerCore core(options);
  FakeWorker worker(64);
  core.Add(1, MakeRequest(37, 6, std::make_shared<Record>(), 9));
  RunToCompletion(core, worker, 64);
  // The same prompt four times, 10 ms apart: 36 of its 37 tokens cached.
  for (uint64_t id = 2; id <= 5; ++id) {
    now += absl::Milliseconds(10);
    core.Add(id, MakeRequest(37, 6, std::make_shared<Record>(), 9));
  }
  // The tokens after the first arrival (4 x 1) over the 40 ms since it.
  EXPECT_DOUBLE_EQ(core.PromptArrivalsPerMs(now), 4.0 / 40.0);
  EXPECT_DOUBLE_EQ(core.PathLoadNow().prompt_arrivals_per_ms, 4.0 / 40.0);
}

TEST(SchedulerCoreTest, TheNextChatTurnHitsThePreviousAnswer) {
  SchedulerCore core(Options(64, 64));
  FakeWorker worker(64);
  auto turn1 = std::make_shared<Record>();
  core.Add(1, MakeRequest(10, 12, turn1, 4));
  RunToCompletion(core, worker, 64);
  // Turn 2: the conversation so far (prompt, answer) and a new message.
  Request next = MakeRequest(10, 3, std::make_shared<Record>(), 4);
  next.prompt.insert(next.prompt.end(), turn1->tokens.begin(), turn1->tokens.end());
  for (int i = 0; i < 5; ++i) next.prompt.push_back(777 + i);
  auto turn2 = std::static_pointer_cast<Record>(next.sink);
  core.Add(2, std::move(next));
  RunToCompletion(core, worker, 64);
  // 21 tokens were computed in turn 1 (the last generated token never is):
  // 5 full blocks, including ones filled while decoding.
  EXPECT_EQ(turn2->finish->usage.cached_prompt_tokens, 20);
}

TEST(SchedulerCoreTest, CacheSaltsAndTheSwitchKeepRequestsApart) {
  for (bool caching : {true, false}) {
    SchedulerOptions options = Options(64, 64);
    options.prefix_caching = caching;
    SchedulerCore core(options);
    FakeWorker worker(64);
    auto a = std::make_shared<Record>(), b = std::make_shared<Record>(),
         c = std::make_shared<Record>();
    Request ra = MakeRequest(30, 2, a, 1);
    ra.cache_salt = "tenant-a";
    core.Add(1, std::move(ra));
    RunToCompletion(core, worker, 64);
    Request rb = MakeRequest(30, 2, b, 1);
    rb.cache_salt = "tenant-b";
    core.Add(2, std::move(rb));
    Request rc = MakeRequest(30, 2, c, 1);
    rc.cache_salt = "tenant-a";
    core.Add(3, std::move(rc));
    RunToCompletion(core, worker, 64);
    EXPECT_EQ(b->finish->usage.cached_prompt_tokens, 0);
    EXPECT_EQ(c->finish->usage.cached_prompt_tokens, caching ? 28 : 0);
    EXPECT_EQ(b->tokens, a->tokens);
    EXPECT_EQ(c->tokens, a->tokens);
  }
}

}  // namespace
}  // namespace tandem::scheduler
