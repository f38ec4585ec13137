// What the SLO policy's decisions cost the scheduler thread (Google
// Benchmark):
//   build/bin/tandem-slo-bench [--benchmark_filter=...]
//
// A SchedulerCore with N streams decoding (half on each lane) and 8 prompts
// waiting. One "dispatch" is what the policy adds to a pass of the
// scheduler's loop: the prompt step's budget (slack, decode shape, the most
// pressed prompt, the chunk search), the decode lane's hold (slack, its
// tightest budget, the prompts' pressure), the published load (the path
// load, both lanes' slack) and one path forecast (a stream's checkpoint;
// pessimistic: most passes have none). Compare with a step: a decode step of
// 32 streams takes ~15 ms on 2 cores, so the share is ns / 15e6.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "scheduler/scheduler_core.h"
#include "scheduler/step_dispatcher.h"

namespace tandem::scheduler {
namespace {

class NullSink final : public RequestSink {
 public:
  bool OnToken(TokenId, bool, const step::TokenLogprobs*) override { return false; }
  void OnFinish(const FinishInfo&) override {}
};

// Runs `lane`'s next step as a worker would: every sampling row gets a token.
void RunStep(SchedulerCore& core, Lane lane, int32_t budget) {
  const step::StepPlan plan = core.Schedule(lane, budget);
  step::StepResult result;
  for (const step::SequenceStep& s : plan.sequences) {
    step::SequenceResult r;
    if (s.sample) r.sampled = {7};
    result.sequences.push_back(r);
  }
  core.Update(lane, plan, result);
}

void BM_PolicyPerDispatch(benchmark::State& state) {
  const auto streams = static_cast<int32_t>(state.range(0));
  SchedulerOptions o;
  o.decode_lane = true;
  o.slo_policy = true;
  o.kv_blocks = 8192;
  o.max_running = 256;
  o.max_batched_tokens = 4096;
  SchedulerCore core(o);
  StepDispatcher dispatcher({DispatchPolicy::kSlo, {}, true}, &core);
  auto request = [](int32_t prompt, int32_t salt) {
    Request r;
    for (int32_t i = 0; i < prompt; ++i) r.prompt.push_back((i * 7919 + salt) % 40000);
    r.max_tokens = 100000;
    r.sink = std::make_shared<NullSink>();
    return r;
  };
  uint64_t id = 1;
  for (int32_t i = 0; i < streams; ++i) core.Add(id++, request(200, i));
  // Prefill them and let them decode a while (the policy may move some).
  for (int step = 0; step < 40; ++step) {
    RunStep(core, Lane::kPrefill, 0);
    RunStep(core, Lane::kDecode, 0);
  }
  for (int32_t i = 0; i < 8; ++i) core.Add(id++, request(1000, 1000 + i));
  const absl::Time now = absl::Now();
  const StepShape lane_shape = core.DecodeStepShape(Lane::kDecode);
  for (auto _ : state) {
    benchmark::DoNotOptimize(dispatcher.PromptStepBudget(now));
    benchmark::DoNotOptimize(core.LeastSlackMs(Lane::kDecode, now));
    benchmark::DoNotOptimize(core.time_model().PredictMs(core.DecodeStepShape(Lane::kDecode)));
    benchmark::DoNotOptimize(core.LeastTpotMs(Lane::kDecode));
    benchmark::DoNotOptimize(core.EarliestPrompt(now));
    const PathLoad load = core.PathLoadNow();
    benchmark::DoNotOptimize(core.LeastSlackMs(Lane::kPrefill, now, false, true));
    benchmark::DoNotOptimize(
        ChoosePath(core.time_model(), load, o.slo, 0, 400, 200, StreamSoFar{100, 900}));
  }
  state.counters["decode_lane_streams"] = static_cast<double>(lane_shape.tokens);
}
BENCHMARK(BM_PolicyPerDispatch)->Arg(8)->Arg(32)->Arg(64)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace tandem::scheduler

BENCHMARK_MAIN();
