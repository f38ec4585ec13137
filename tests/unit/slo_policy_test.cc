// The SLO policy in the shared-compute simulation
// (tests/unit/shared_compute_simulation.h): the dispatcher and the core as
// the daemon runs them, on a simulated clock, with a step-time model that
// starts from the wrong costs and learns the simulated ones.
//
// Checked: across synthetic load shapes the SLO policy's goodput (requests
// meeting both their TTFT and their mean-TPOT budget) is at least that of
// both fixed policies (colocated: one worker; always disaggregated: the
// fixed pacing), and a negative control whose path choice ignores the
// slack (every stream moved to the decode lane, the same dispatcher) falls
// short of it; a request with
// a tight TPOT is moved to the decode lane and one with a loose TPOT stays
// colocated under the same load; every request gets exactly its solo tokens
// whatever the policy and path.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tests/unit/shared_compute_simulation.h"

namespace tandem::scheduler {
namespace {

using testing::MakeRequest;
using testing::SharedComputeSimulation;
using testing::TimedRecord;

absl::Duration Ms(double ms) { return absl::Microseconds(static_cast<int64_t>(ms * 1000)); }

// Requests of one kind: `count` of them, one every `every_ms` from `start_ms`.
struct RequestClass {
  int32_t prompt = 0;
  int32_t output = 0;
  int count = 0;
  double start_ms = 0;
  double every_ms = 0;
  double ttft_ms = 0;
  double tpot_ms = 0;
};

struct LoadShape {
  std::string name;
  std::vector<RequestClass> classes;
};

enum class Policy { kColocated, kDisaggregated, kSlo, kSloIgnoringSlack };

SchedulerOptions Base() {
  SchedulerOptions o;
  o.max_batched_tokens = 64;
  o.context_length = 2048;
  o.min_prompt_chunk = 16;
  return o;
}

struct Outcome {
  int good = 0;
  int total = 0;
  std::vector<std::vector<TokenId>> tokens;  // per request, in AddAt order
  std::vector<Path> paths;
};

Outcome Simulate(const LoadShape& shape, Policy policy) {
  SchedulerOptions o = Base();
  DispatchOptions d;
  switch (policy) {
    case Policy::kColocated:  // one worker: the daemon with --disagg_output_threshold=off
      d = {DispatchPolicy::kPaced, {absl::ZeroDuration(), 0.0}, true};
      break;
    case Policy::kDisaggregated:  // threshold 0 with the fixed pacing
      o.decode_lane = true;
      o.disaggregation.output_threshold = 0;
      d = {DispatchPolicy::kPaced, {Ms(5), 0.5}, true};
      break;
    case Policy::kSlo:
      o.decode_lane = true;
      o.slo_policy = true;
      d = {DispatchPolicy::kSlo, {}, true, Ms(testing::kTaskMs)};
      break;
    case Policy::kSloIgnoringSlack:  // the SLO dispatcher, every stream moved regardless
      o.decode_lane = true;
      o.disaggregation.output_threshold = 0;
      d = {DispatchPolicy::kSlo, {}, true, Ms(testing::kTaskMs)};
      break;
  }
  SharedComputeSimulation sim(o, d, 4096);
  // As the daemon does at start-up: a lone decode step and a prompt chunk,
  // measured (here: the simulated costs), then learned as steps run.
  sim.core().mutable_time_model().Calibrate(1.1, 7.4, 64);
  struct Sent {
    std::shared_ptr<TimedRecord> record;
    double at;
    const RequestClass* c;
  };
  std::vector<Sent> sent;
  uint64_t id = 1;
  for (const RequestClass& c : shape.classes) {
    for (int i = 0; i < c.count; ++i) {
      auto record = std::make_shared<TimedRecord>(sim.clock());
      Request r = MakeRequest(c.prompt, c.output, record, id);
      r.slo = {Ms(c.ttft_ms), Ms(c.tpot_ms)};
      // Each class is one workload: the scheduler learns its output length
      // from the requests that finish (until then it guesses).
      r.workload = "class-" + std::to_string(c.prompt) + "-" + std::to_string(c.output);
      const double at = c.start_ms + i * c.every_ms;
      sim.AddAt(at, id++, std::move(r));
      sent.push_back({record, at, &c});
    }
  }
  sim.RunToCompletion();
  Outcome out;
  for (const Sent& s : sent) {
    const TimedRecord& r = *s.record;
    ++out.total;
    out.tokens.push_back(r.tokens);
    out.paths.push_back(r.finish.has_value() ? r.finish->path : Path::kColocated);
    if (r.times.empty()) continue;
    const double ttft = r.times.front() - s.at;
    const double tpot =
        r.times.size() > 1 ? (r.times.back() - r.times.front()) / (r.times.size() - 1) : 0.0;
    if (ttft <= s.c->ttft_ms && tpot <= s.c->tpot_ms) ++out.good;
  }
  return out;
}

std::vector<LoadShape> Shapes() {
  return {
      // Chat with a loose TPOT: prompts matter, streams can wait.
      {"loose-chat", {{120, 40, 24, 0, 14, 40, 12}}},
      // Long streams with a tight TPOT beside long prompts.
      {"tight-streams", {{16, 300, 2, 0, 2, 50, 2.0}, {400, 4, 6, 20, 90, 300, 50}}},
      // Both kinds at once, each with its own budget.
      {"mixed",
       {{16, 200, 2, 0, 3, 50, 2.5}, {120, 30, 12, 10, 70, 80, 15}, {400, 4, 3, 30, 250, 300, 50}}},
      // A short-output chat with a moderate TPOT under steady load.
      {"short-chat", {{60, 12, 40, 0, 9, 30, 8}}},
      // Short answers with a TPOT that full-size prompt steps break, beside
      // long documents: prompt steps sized to the streams' slack keep it.
      {"chats-beside-documents", {{32, 40, 20, 0, 15, 40, 4.0}, {600, 4, 3, 5, 150, 400, 50}}},
  };
}

TEST(SloPolicyTest, GoodputAtLeastBothFixedPoliciesOnEveryShape) {
  int control_short = 0;
  for (const LoadShape& shape : Shapes()) {
    SCOPED_TRACE(shape.name);
    const Outcome colocated = Simulate(shape, Policy::kColocated);
    const Outcome disaggregated = Simulate(shape, Policy::kDisaggregated);
    const Outcome slo = Simulate(shape, Policy::kSlo);
    const Outcome control = Simulate(shape, Policy::kSloIgnoringSlack);
    const int best = std::max(colocated.good, disaggregated.good);
    std::cout << shape.name << ": goodput colocated " << colocated.good << ", disaggregated "
              << disaggregated.good << ", slo " << slo.good << ", ignoring slack " << control.good
              << " of " << slo.total << "\n";
    EXPECT_GE(slo.good, best);
    control_short += control.good < best ? 1 : 0;
    // The same tokens whatever the policy and path.
    EXPECT_EQ(slo.tokens, colocated.tokens);
    EXPECT_EQ(disaggregated.tokens, colocated.tokens);
    EXPECT_EQ(control.tokens, colocated.tokens);
  }
  // The negative control: ignoring the slack loses on some shape.
  EXPECT_GT(control_short, 0);
}

TEST(SloPolicyTest, TightTpotGoesToTheDecodeLaneLooseStaysColocated) {
  // Two long streams arriving together behind the same prompts: one with a
  // TPOT only a decode-lane step can keep, one with plenty.
  const LoadShape shape{
      "budgets",
      {{16, 120, 1, 0, 0, 100, 2.5}, {16, 120, 1, 0.5, 0, 100, 50}, {400, 4, 6, 5, 30, 400, 50}}};
  const Outcome slo = Simulate(shape, Policy::kSlo);
  ASSERT_EQ(slo.paths.size(), 8u);
  EXPECT_EQ(slo.paths[0], Path::kDisaggregated);
  EXPECT_EQ(slo.paths[1], Path::kColocated);
  EXPECT_EQ(slo.tokens, Simulate(shape, Policy::kColocated).tokens);
}

TEST(SloPolicyTest, ATightStreamAmongLooseOnesStillMoves) {
  // Six long streams with a loose TPOT (50 ms) decode colocated when a
  // stream with a tight one (2.5 ms) comes, and a long prompt right after
  // it: colocated, its steps would carry that prompt's chunks (3.3 ms).
  // The loose streams' steps need little of the compute at their pace
  // (1.6 ms a paced 45), so it moves. Were its own budget taken for
  // theirs, their steps (1.6 ms a paced 2.25) and a decode lane's beside
  // them would be past the machine, and it would stay.
  const LoadShape shape{"tight-among-loose",
                        {{16, 1500, 6, 0, 100, 100, 50},
                         {16, 120, 1, 700, 0, 100, 2.5},
                         {1000, 4, 1, 705, 0, 2000, 50}}};
  const Outcome slo = Simulate(shape, Policy::kSlo);
  ASSERT_EQ(slo.paths.size(), 8u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(slo.paths[i], Path::kColocated) << i;
  EXPECT_EQ(slo.paths[6], Path::kDisaggregated);
  EXPECT_EQ(slo.tokens, Simulate(shape, Policy::kColocated).tokens);
}

// An overloaded machine: the SLO policy on 64-token steps (chunks of at
// least 16) and 24 colocated streams of `output` tokens from 0 ms whose
// decode step alone (1 + 0.1 * 24 = 3.4 ms) is past their 2 ms TPOT budget.
struct OverloadedMachine {
  static SchedulerOptions Options() {
    SchedulerOptions o = Base();
    o.slo_policy = true;
    return o;
  }

  explicit OverloadedMachine(int32_t output)
      : sim(Options(), {DispatchPolicy::kSlo, {}, true, Ms(testing::kTaskMs)}, 4096) {
    sim.core().mutable_time_model().Calibrate(1.1, 7.4, 64);
    for (uint64_t id = 1; id <= 24; ++id) {
      streams.push_back(std::make_shared<TimedRecord>(sim.clock()));
      Request r = MakeRequest(4, output, streams.back(), id);
      r.slo = {Ms(1000), Ms(2)};
      sim.AddAt(0, id, std::move(r));
    }
  }

  // A prompt of `tokens` (2 output tokens) arriving at `at_ms`; its record.
  std::shared_ptr<TimedRecord> AddPrompt(double at_ms, int32_t tokens, double ttft_ms) {
    auto record = std::make_shared<TimedRecord>(sim.clock());
    Request r = MakeRequest(tokens, 2, record, next_id);
    r.slo = {Ms(ttft_ms), Ms(50)};
    sim.AddAt(at_ms, next_id++, std::move(r));
    return record;
  }

  // The streams' longest gap between tokens, of those before `until_ms`.
  double LongestStreamGap(double until_ms = 1e300) const {
    double longest = 0;
    for (const auto& s : streams) {
      for (size_t i = 1; i < s->times.size() && s->times[i] < until_ms; ++i) {
        longest = std::max(longest, s->times[i] - s->times[i - 1]);
      }
    }
    return longest;
  }

  SharedComputeSimulation sim;
  std::vector<std::shared_ptr<TimedRecord>> streams;
  uint64_t next_id = 100;
};

double Ttft(const TimedRecord& record, double at_ms) {
  return record.times.empty() ? 1e9 : record.times[0] - at_ms;
}

// The overloaded machine with streams of 120 tokens and prompts arriving at
// 100 ms, each {tokens, TTFT ms}, in order. Returns the streams' longest
// gap between tokens and each prompt's TTFT (ms).
struct OverloadOutcome {
  double longest_stream_gap = 0;
  std::vector<double> prompt_ttft;
};

OverloadOutcome RunOverloaded(const std::vector<std::pair<int32_t, double>>& prompts) {
  OverloadedMachine machine(120);
  std::vector<std::shared_ptr<TimedRecord>> late;
  for (const auto& [tokens, ttft_ms] : prompts)
    late.push_back(machine.AddPrompt(100, tokens, ttft_ms));
  machine.sim.RunToCompletion();
  OverloadOutcome out;
  out.longest_stream_gap = machine.LongestStreamGap();
  for (const auto& r : late) out.prompt_ttft.push_back(Ttft(*r, 100));
  return out;
}

// A step of the 24 decodes and the least chunk; a full one is 64 tokens,
// 7.4 ms. 192 prompt tokens take 5 full steps (40 prompt tokens each: 37
// ms) or 12 least ones (60 ms).
constexpr double kLeastChunkStepMs = 1.0 + 0.1 * (24 + 16);

TEST(SloPolicyTest, OverloadedStreamsStallOnlyForTheLeastChunkOfAPromptThatMissesAnyway) {
  // A 20 ms TTFT: missed at full size (37 ms) and at the least chunk (60),
  // while the streams miss their TPOT whatever the chunk: each step carries
  // the least chunk, so the streams' longest stall is the shortest it can be.
  const OverloadOutcome o = RunOverloaded({{192, 20}});
  EXPECT_LE(o.longest_stream_gap, kLeastChunkStepMs + 1e-6);
  EXPECT_GT(o.prompt_ttft[0], 20.0);
}

TEST(SloPolicyTest, OverloadedStreamsStillGiveFullStepsToAPromptThatNeedsThem) {
  // A 50 ms TTFT: made at full size (37 ms), missed at the least chunk.
  const OverloadOutcome o = RunOverloaded({{192, 50}});
  EXPECT_LE(o.prompt_ttft[0], 50.0);
  EXPECT_GT(o.longest_stream_gap, kLeastChunkStepMs + 1e-6);
}

TEST(SloPolicyTest, APromptPastItsDeadlineDoesNotHideOneThatCanBeSaved) {
  // 120 tokens already out of time (1 ms) ahead of 72 with 50 ms: the 192
  // tokens before the second one's first token make its deadline only in
  // full steps from the start (after the first prompt's 8 least chunks,
  // 40 ms, 72 tokens do not fit in the 10 ms left).
  const OverloadOutcome o = RunOverloaded({{120, 1}, {72, 50}});
  EXPECT_GT(o.prompt_ttft[0], 1.0);
  EXPECT_LE(o.prompt_ttft[1], 50.0);
}

// Open-loop overload: the overloaded machine with streams of 400 tokens
// while prompts of `prompt` tokens (200 ms TTFT) arrive one every
// `every_ms` from 20 ms to 1 s, whatever the daemon's pace. Returns each
// prompt's TTFT (ms) in arrival order and the streams' longest gap between
// tokens while the prompts arrive.
struct OpenLoopOutcome {
  std::vector<double> ttft;
  double longest_stream_gap = 0;
};

OpenLoopOutcome RunOpenLoop(int32_t prompt, double every_ms) {
  OverloadedMachine machine(400);
  std::vector<std::pair<std::shared_ptr<TimedRecord>, double>> prompts;
  for (double at = 20; at < 1000; at += every_ms) {
    prompts.emplace_back(machine.AddPrompt(at, prompt, 200), at);
  }
  machine.sim.RunToCompletion();
  OpenLoopOutcome out;
  for (const auto& [record, at] : prompts) out.ttft.push_back(Ttft(*record, at));
  out.longest_stream_gap = machine.LongestStreamGap(1000);
  return out;
}

TEST(SloPolicyTest, ArrivalsTheLeastChunkKeepsUpWithLeaveTheStreamsTheLeastChunk) {
  // 40 tokens every 16 ms (2.5 a ms): a step of the 24 decodes and the
  // least chunk takes 16 in 5 ms (3.2 a ms), so least-chunk steps keep up,
  // every prompt makes its TTFT, and no step is full-size (7.4 ms): the
  // overloaded streams stall only for the least chunk.
  const OpenLoopOutcome o = RunOpenLoop(40, 16);
  const double longest = *std::max_element(o.ttft.begin(), o.ttft.end());
  std::cout << "2.5 tokens a ms: longest TTFT " << longest << " ms, streams' longest gap "
            << o.longest_stream_gap << " ms\n";
  EXPECT_LE(longest, 200.0);
  EXPECT_LT(o.longest_stream_gap, 1.0 + 0.1 * 64 - 1e-6);
}

// Many streams at one tight budget, in a closed loop: `clients` clients each
// send `rounds` requests of `prompt` tokens and `output` outputs, the next
// when the last one ends, on a machine whose steps cost `fixed` ms + `per`
// ms a token (a pass over the weights, then each row), all with the TPOT
// budget `tpot_ms` and a TTFT budget no policy misses.
struct ClosedLoop {
  int clients = 32;
  int rounds = 2;
  int32_t prompt = 64;
  int32_t output = 128;
  double fixed = 1.0;
  double per = 0.1;
  double tpot_ms = 0;
  // A step of every stream's decode: the least time per token the machine
  // can give all of them at once.
  double AllStreamsStepMs() const { return fixed + per * clients; }
};

struct ClosedLoopOutcome {
  double tokens_per_ms = 0;  // every output token over the time to the last
  int met_tpot = 0;          // requests whose mean TPOT kept the budget
  int total = 0;
  int moved = 0;        // requests that decoded on the decode lane
  double p99_gap = 0;   // inter-token gaps of every request, in ms
  double max_ttft = 0;  // ms
};

ClosedLoopOutcome RunClosedLoop(const ClosedLoop& load, Policy policy) {
  SchedulerOptions o = Base();
  DispatchOptions d{DispatchPolicy::kPaced, {absl::ZeroDuration(), 0.0}, true};
  if (policy == Policy::kSlo) {
    o.decode_lane = true;
    o.slo_policy = true;
    d = {DispatchPolicy::kSlo, {}, true, Ms(testing::kTaskMs)};
  }
  auto cost = [&load](const step::StepPlan& plan) {
    return load.fixed + load.per * static_cast<double>(plan.TokenCount());
  };
  SharedComputeSimulation sim(o, d, 8192, cost);
  sim.core().mutable_time_model().Calibrate(load.fixed + load.per, load.fixed + load.per * 64, 64);
  // A client's request; when it ends, the client sends its next one.
  struct Client : TimedRecord {
    using TimedRecord::TimedRecord;
    void OnFinish(const FinishInfo& info) override {
      TimedRecord::OnFinish(info);
      if (next) next();
    }
    std::function<void()> next;
    double sent_at = 0;
  };
  std::vector<std::shared_ptr<Client>> sent;
  uint64_t id = 1;
  std::function<void(int, double)> send = [&](int round, double at) {
    auto record = std::make_shared<Client>(sim.clock());
    record->sent_at = at;
    Request r = MakeRequest(load.prompt, load.output, record, id);
    r.slo = {absl::Hours(1), Ms(load.tpot_ms)};
    r.workload = "closed-loop";
    if (round + 1 < load.rounds) {
      record->next = [&send, round, clock = sim.clock()] { send(round + 1, *clock); };
    }
    sent.push_back(record);
    sim.AddAt(at, id++, std::move(r));
  };
  for (int c = 0; c < load.clients; ++c) send(0, 0.0);
  sim.RunToCompletion();

  ClosedLoopOutcome out;
  std::vector<double> gaps;
  int tokens = 0;
  double end = 0;
  for (const auto& r : sent) {
    ++out.total;
    if (r->times.size() < 2) continue;
    tokens += static_cast<int>(r->times.size());
    end = std::max(end, r->times.back());
    out.max_ttft = std::max(out.max_ttft, r->times.front() - r->sent_at);
    for (size_t i = 1; i < r->times.size(); ++i) gaps.push_back(r->times[i] - r->times[i - 1]);
    const double tpot = (r->times.back() - r->times.front()) / (r->times.size() - 1);
    out.met_tpot += tpot <= load.tpot_ms ? 1 : 0;
    out.moved += r->finish.has_value() && r->finish->path == Path::kDisaggregated ? 1 : 0;
  }
  EXPECT_GT(end, 0.0);
  EXPECT_FALSE(gaps.empty());
  if (gaps.empty()) return out;
  out.tokens_per_ms = tokens / end;
  std::sort(gaps.begin(), gaps.end());
  out.p99_gap = gaps[gaps.size() * 99 / 100];
  return out;
}

// The load under colocated serving and under the SLO policy, each printed.
struct ClosedLoopPair {
  ClosedLoopOutcome colocated;
  ClosedLoopOutcome slo;
};

ClosedLoopPair RunBothPolicies(const ClosedLoop& load) {
  ClosedLoopPair both{RunClosedLoop(load, Policy::kColocated), RunClosedLoop(load, Policy::kSlo)};
  for (const auto& [label, o] : {std::pair{"colocated", &both.colocated}, {"slo", &both.slo}}) {
    std::cout << label << ": " << o->tokens_per_ms << " tokens a ms, TPOT met " << o->met_tpot
              << " of " << o->total << ", moved " << o->moved << ", inter-token p99 " << o->p99_gap
              << " ms, longest TTFT " << o->max_ttft << " ms\n";
  }
  return both;
}

TEST(SloPolicyTest, StreamsAtOneTightBudgetStayInOneLane) {
  // A step's pass over the weights (4 ms) costs as much as 40 rows: the 32
  // streams' step takes 7.2 ms against a paced 7.8 ms (0.9 of 8.64). Every
  // stream keeps its budget colocated. Moving some to the decode lane
  // would add a second pass (4 ms) beside the others' steps: neither lane
  // keeps the pace then, and the tokens a ms fall with every step that
  // does not carry all the streams.
  ClosedLoop load;
  load.fixed = 4.0;
  load.tpot_ms = 1.2 * load.AllStreamsStepMs();
  const auto [colocated, slo] = RunBothPolicies(load);
  EXPECT_EQ(colocated.met_tpot, colocated.total);
  EXPECT_EQ(slo.met_tpot, slo.total);
  EXPECT_EQ(slo.moved, 0);
  EXPECT_LE(slo.p99_gap, colocated.p99_gap);
  // The paced steps carry smaller prompt chunks (more passes a prompt).
  EXPECT_GE(slo.tokens_per_ms, 0.85 * colocated.tokens_per_ms);
}

TEST(SloPolicyTest, ABudgetNoPolicyCanKeepCostsNoThroughputAndNoTail) {
  // 32 streams at a TPOT budget of 0.8 of their own step's time: none can
  // keep it for long, whatever the policy. Stepping some of them apart (a
  // second pass over the weights a token) would keep a few within budget
  // for a while and cost every other stream its pace and the machine its
  // throughput; the SLO policy serves them all in the steps that carry them
  // all, as colocated serving does.
  ClosedLoop load;
  load.per = 0.4;
  load.tpot_ms = 0.8 * load.AllStreamsStepMs();
  const auto [colocated, slo] = RunBothPolicies(load);
  EXPECT_GE(slo.tokens_per_ms, 0.95 * colocated.tokens_per_ms);
  EXPECT_LE(slo.p99_gap, 1.05 * colocated.p99_gap);
}

}  // namespace
}  // namespace tandem::scheduler
