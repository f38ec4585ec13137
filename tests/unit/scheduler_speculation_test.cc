// SchedulerCore with speculative decoding, against the fake worker (see
// tests/unit/fake_worker.h): it drafts some correct tokens and then a wrong
// one, leaves the rejected tokens in the KV slots, and samples from
// everything readable through the block table. So the output matches plain
// decoding only if rejected positions are never read, never counted as
// computed and never cached.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "scheduler/scheduler_core.h"
#include "tests/unit/fake_worker.h"

namespace tandem::scheduler {
namespace {

constexpr int32_t kBlockSize = 4;
using testing::Record;

// Prompts of stride 7 (see testing::MakeRequest).
Request MakeRequest(int32_t prompt_tokens, int32_t max_tokens, std::shared_ptr<Record> sink,
                    uint64_t seed) {
  return testing::MakeRequest(prompt_tokens, max_tokens, std::move(sink), seed, 7);
}

SchedulerOptions Options(int32_t budget, int32_t blocks, step::Proposer proposer,
                         int32_t max_draft = 5) {
  SchedulerOptions o;
  o.max_batched_tokens = budget;
  o.block_size = kBlockSize;
  o.kv_blocks = blocks;
  o.context_length = 128;
  o.speculation.proposer = proposer;
  o.speculation.max_draft = max_draft;
  o.speculation.adaptive = false;  // always draft: the most rejections
  return o;
}

struct Outcome {
  std::vector<std::shared_ptr<Record>> sinks;
  int steps = 0;
  int64_t drafted_steps = 0;  // steps that planned drafts
  int32_t free_blocks_after = 0;
  int64_t preemptions = 0;
};

// Runs requests (prompt, max_tokens) to completion on one lane; request i
// has seed i + 1.
Outcome RunAll(const SchedulerOptions& options, const std::vector<std::pair<int, int>>& requests) {
  SchedulerCore core(options);
  testing::FakeWorker worker(options.kv_blocks, kBlockSize);
  Outcome run;
  for (size_t i = 0; i < requests.size(); ++i) {
    run.sinks.push_back(std::make_shared<Record>());
    core.Add(i + 1, MakeRequest(requests[i].first, requests[i].second, run.sinks.back(), i + 1));
  }
  while (core.HasWork() && run.steps < 10000) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    EXPECT_LE(
        plan.TokenCount() +
            [&] {
              int64_t drafts = 0;
              for (const auto& s : plan.sequences) drafts += s.draft_limit;
              return drafts;
            }(),
        options.max_batched_tokens)
        << "drafts and tokens exceed the budget";
    bool any_draft = false;
    for (const step::SequenceStep& s : plan.sequences) {
      if (s.draft_limit == 0) continue;
      any_draft = true;
      EXPECT_EQ(s.tokens.size(), 1u) << "only decode steps draft";
      EXPECT_GE(static_cast<int32_t>(s.block_table.size()) * kBlockSize,
                s.first_position + 1 + s.draft_limit)
          << "the block table must hold the drafts";
      EXPECT_EQ(s.proposer, options.speculation.proposer);
      if (s.proposer == step::Proposer::kNgram) {
        EXPECT_EQ(s.preceding_tokens.size(), static_cast<size_t>(s.first_position));
      }
    }
    run.drafted_steps += any_draft ? 1 : 0;
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
    ++run.steps;
  }
  EXPECT_FALSE(core.HasWork());
  run.free_blocks_after = core.free_blocks();
  run.preemptions = core.preemptions();
  return run;
}

TEST(SchedulerSpeculationTest, OutputIsExactlyPlainDecodingsWithFewerSteps) {
  const std::vector<std::pair<int, int>> requests = {{5, 40}, {13, 33}, {2, 60}, {30, 7}};
  const Outcome plain = RunAll(Options(64, 128, step::Proposer::kNone), requests);
  for (step::Proposer proposer : {step::Proposer::kNgram, step::Proposer::kDraftModel}) {
    const Outcome spec = RunAll(Options(64, 128, proposer), requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(spec.sinks[i]->tokens, plain.sinks[i]->tokens) << "request " << i;
      ASSERT_TRUE(spec.sinks[i]->finish.has_value());
      EXPECT_EQ(spec.sinks[i]->finish->reason, FinishReason::kLength);
      const Usage& u = spec.sinks[i]->finish->usage;
      EXPECT_EQ(u.completion_tokens, requests[i].second);
      EXPECT_GT(u.drafted_tokens, 0);
      EXPECT_GT(u.accepted_tokens, 0);
      EXPECT_LT(u.accepted_tokens, u.drafted_tokens);  // the fake rejects some
    }
    EXPECT_GT(spec.drafted_steps, 0);
    EXPECT_LT(spec.steps, plain.steps);
    EXPECT_EQ(spec.free_blocks_after, 128);
    EXPECT_EQ(plain.sinks[0]->finish->usage.drafted_tokens, 0);
  }
}

TEST(SchedulerSpeculationTest, BudgetsChunksAndAFullPoolChangeNothing) {
  const std::vector<std::pair<int, int>> requests = {{9, 30}, {17, 25}, {3, 41}};
  const Outcome plain = RunAll(Options(64, 128, step::Proposer::kNone), requests);
  // A budget of 7 chunks prompts and leaves little room for drafts; 14
  // blocks of 4 cannot hold all three sequences (preemption).
  for (auto [budget, blocks] : {std::pair{7, 128}, std::pair{64, 14}, std::pair{5, 14}}) {
    const Outcome spec = RunAll(Options(budget, blocks, step::Proposer::kNgram, 6), requests);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(spec.sinks[i]->tokens, plain.sinks[i]->tokens)
          << "request " << i << ", budget " << budget << ", blocks " << blocks;
    }
    EXPECT_EQ(spec.free_blocks_after, blocks);
    if (blocks == 14) {
      EXPECT_GT(spec.preemptions, 0);
    }
  }
}

TEST(SchedulerSpeculationTest, DraftsStopAtMaxTokensAndTheContext) {
  // max_tokens 3: at most 2 drafts then the token after them, never a 4th.
  const Outcome short_run = RunAll(Options(64, 128, step::Proposer::kNgram, 8), {{4, 3}});
  EXPECT_EQ(short_run.sinks[0]->tokens.size(), 3u);
  // A prompt of 120 in a context of 128: 8 tokens at most, then length.
  const Outcome plain = RunAll(Options(256, 128, step::Proposer::kNone), {{120, 50}});
  const Outcome spec = RunAll(Options(256, 128, step::Proposer::kNgram, 8), {{120, 50}});
  EXPECT_EQ(plain.sinks[0]->tokens.size(), 8u);
  EXPECT_EQ(spec.sinks[0]->tokens, plain.sinks[0]->tokens);
  EXPECT_EQ(spec.sinks[0]->finish->reason, FinishReason::kLength);
}

TEST(SchedulerSpeculationTest, RejectedTokensNeverReachThePrefixCache) {
  // A speculative request, then a second one whose prompt is the first's
  // prompt and output: its cached prefix must hold the real tokens, so its
  // output equals a cold run's.
  SchedulerOptions options = Options(64, 128, step::Proposer::kNgram);
  SchedulerCore core(options);
  testing::FakeWorker worker(128, kBlockSize);
  auto first = std::make_shared<Record>();
  core.Add(1, MakeRequest(6, 30, first, 3));
  while (core.HasWork()) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  ASSERT_GT(first->finish->usage.drafted_tokens, first->finish->usage.accepted_tokens);
  Request next = MakeRequest(6, 10, std::make_shared<Record>(), 3);  // the same 6 tokens
  next.sampling.seed = 4;
  next.prompt.insert(next.prompt.end(), first->tokens.begin(), first->tokens.end());
  const std::vector<TokenId> prompt = next.prompt;
  auto second = std::static_pointer_cast<Record>(next.sink);
  core.Add(2, std::move(next));
  while (core.HasWork()) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  EXPECT_GE(second->finish->usage.cached_prompt_tokens, 32);

  SchedulerCore cold(Options(64, 128, step::Proposer::kNone));
  testing::FakeWorker cold_worker(128, kBlockSize);
  Request again = MakeRequest(6, 10, std::make_shared<Record>(), 4);
  again.prompt = prompt;
  auto reference = std::static_pointer_cast<Record>(again.sink);
  cold.Add(1, std::move(again));
  while (cold.HasWork()) {
    step::StepPlan plan = cold.Schedule(Lane::kPrefill);
    cold.Update(Lane::kPrefill, plan, cold_worker.Execute(plan));
  }
  EXPECT_EQ(second->tokens, reference->tokens);
}

TEST(SchedulerSpeculationTest, NoDraftsWhilePromptWorkWaitsOrForOptedOutRequests) {
  SchedulerCore core(Options(64, 128, step::Proposer::kNgram));
  testing::FakeWorker worker(128, kBlockSize);
  auto a = std::make_shared<Record>();
  core.Add(1, MakeRequest(4, 20, a, 1));
  step::StepPlan plan = core.Schedule(Lane::kPrefill);  // a's prompt
  core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  core.Add(2, MakeRequest(4, 20, std::make_shared<Record>(), 2));
  plan = core.Schedule(Lane::kPrefill);  // a decodes while b's prompt runs
  ASSERT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(plan.sequences[0].draft_limit, 0) << "a prompt is in this step";
  core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  plan = core.Schedule(Lane::kPrefill);  // both decode: both draft
  ASSERT_EQ(plan.sequences.size(), 2u);
  EXPECT_GT(plan.sequences[0].draft_limit, 0);
  EXPECT_GT(plan.sequences[1].draft_limit, 0);
  core.Update(Lane::kPrefill, plan, worker.Execute(plan));

  Request opted_out = MakeRequest(4, 20, std::make_shared<Record>(), 3);
  opted_out.disable_speculation = true;
  SchedulerCore other(Options(64, 128, step::Proposer::kNgram));
  auto sink = std::static_pointer_cast<Record>(opted_out.sink);
  other.Add(1, std::move(opted_out));
  testing::FakeWorker other_worker(128, kBlockSize);
  while (other.HasWork()) {
    plan = other.Schedule(Lane::kPrefill);
    for (const auto& s : plan.sequences) EXPECT_EQ(s.draft_limit, 0);
    other.Update(Lane::kPrefill, plan, other_worker.Execute(plan));
  }
  EXPECT_EQ(sink->finish->usage.drafted_tokens, 0);
  EXPECT_EQ(sink->tokens.size(), 20u);
}

TEST(SchedulerSpeculationTest, DraftsNeverPreempt) {
  // 6 blocks of 4: two sequences of 8 + 4 tokens nearly fill the pool;
  // drafts get only what is free.
  SchedulerCore core(Options(64, 6, step::Proposer::kNgram, 8));
  testing::FakeWorker worker(6, kBlockSize);
  auto a = std::make_shared<Record>(), b = std::make_shared<Record>();
  core.Add(1, MakeRequest(8, 3, a, 1));
  core.Add(2, MakeRequest(8, 3, b, 2));
  while (core.HasWork()) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  EXPECT_EQ(core.preemptions(), 0);
  EXPECT_EQ(core.free_blocks(), 6);
  EXPECT_EQ(a->tokens.size(), 3u);
  EXPECT_EQ(b->tokens.size(), 3u);
}

TEST(SchedulerSpeculationTest, StopTokensInsideAcceptedDraftsEndTheRequestThere) {
  const Outcome plain = RunAll(Options(64, 128, step::Proposer::kNone), {{5, 40}});
  const std::vector<TokenId>& out = plain.sinks[0]->tokens;
  ASSERT_GE(out.size(), 20u);
  for (int stop_at : {3, 10, 17}) {
    SchedulerCore core(Options(64, 128, step::Proposer::kNgram, 8));
    testing::FakeWorker worker(128, kBlockSize);
    auto sink = std::make_shared<Record>();
    Request r = MakeRequest(5, 40, sink, 1);
    r.stop_token_ids = {out[static_cast<size_t>(stop_at)]};
    core.Add(1, std::move(r));
    while (core.HasWork()) {
      step::StepPlan plan = core.Schedule(Lane::kPrefill);
      core.Update(Lane::kPrefill, plan, worker.Execute(plan));
    }
    // The first occurrence of the stop token ends it, whatever was accepted after.
    size_t first = 0;
    while (out[first] != out[static_cast<size_t>(stop_at)]) ++first;
    EXPECT_EQ(sink->tokens, std::vector<TokenId>(out.begin(), out.begin() + first + 1));
    EXPECT_EQ(sink->finish->reason, FinishReason::kStop);
    EXPECT_EQ(sink->finish->usage.completion_tokens, static_cast<int32_t>(first + 1));
    EXPECT_EQ(core.free_blocks(), 128);
  }
}

}  // namespace
}  // namespace tandem::scheduler

namespace tandem::scheduler {
namespace {

// The text each finished request leaves for suffix drafting across
// requests: its salt, and its prompt then output, exactly once.
TEST(SchedulerSpeculationTest, FinishedRequestsLeaveTheirTextUnderTheirSalt) {
  SchedulerOptions options = Options(64, 128, step::Proposer::kSuffix);
  std::vector<std::pair<std::string, std::vector<TokenId>>> texts;
  options.on_finished_text = [&](std::string_view salt, std::span<const TokenId> tokens) {
    texts.emplace_back(std::string(salt), std::vector<TokenId>(tokens.begin(), tokens.end()));
  };
  SchedulerCore core(options);
  testing::FakeWorker worker(options.kv_blocks, kBlockSize);
  auto salted = std::make_shared<Record>(), cancelled = std::make_shared<Record>(),
       failed = std::make_shared<Record>();
  Request r = MakeRequest(5, 12, salted, 1);
  r.cache_salt = "tenant-a";
  const std::vector<TokenId> salted_prompt = r.prompt;
  core.Add(1, std::move(r));
  core.Add(2, MakeRequest(4, 50, cancelled, 2));
  const std::vector<TokenId> cancelled_prompt = MakeRequest(4, 50, nullptr, 2).prompt;
  bool saw_salted_draft = false;
  for (int step = 0; step < 200 && salted->finishes == 0; ++step) {
    step::StepPlan plan = core.Schedule(Lane::kPrefill);
    for (const step::SequenceStep& s : plan.sequences) {
      if (s.draft_limit == 0) continue;
      EXPECT_EQ(s.cache_salt, s.sequence_id == 1 ? "tenant-a" : "") << "sequence " << s.sequence_id;
      saw_salted_draft |= s.sequence_id == 1;
    }
    core.Update(Lane::kPrefill, plan, worker.Execute(plan));
  }
  ASSERT_EQ(salted->finishes, 1);
  EXPECT_TRUE(saw_salted_draft);
  ASSERT_EQ(texts.size(), 1u);
  std::vector<TokenId> expected = salted_prompt;
  expected.insert(expected.end(), salted->tokens.begin(), salted->tokens.end());
  EXPECT_EQ(texts[0].first, "tenant-a");
  EXPECT_EQ(texts[0].second, expected);

  // A cancelled request's text counts too (what it generated is the
  // model's); one that ended in an error leaves nothing.
  core.Cancel(2, FinishReason::kCancelled, absl::CancelledError("client"));
  ASSERT_EQ(texts.size(), 2u);
  expected = cancelled_prompt;
  expected.insert(expected.end(), cancelled->tokens.begin(), cancelled->tokens.end());
  EXPECT_EQ(texts[1].first, "");
  EXPECT_EQ(texts[1].second, expected);
  core.Add(3, MakeRequest(6, 10, failed, 3));
  step::StepPlan plan = core.Schedule(Lane::kPrefill);
  step::StepResult error;
  error.status = absl::InternalError("the worker failed");
  core.Update(Lane::kPrefill, plan, error);
  ASSERT_EQ(failed->finishes, 1);
  EXPECT_EQ(failed->finish->reason, FinishReason::kError);
  EXPECT_EQ(texts.size(), 2u);
  EXPECT_EQ(core.free_blocks(), 128);
}

// The worker side of a copying proposer, without tokens: verifications go
// in cycles of 12, a copy found at a 12-token match and followed for 4
// verifications, each accepted whole, then 8 fresh one-token matches, each
// rejected at once. Reported as the suffix proposer and the worker would
// (what a copy has agreed with grows by the drafts and the sampled token
// after them: SuffixMatcherTest.ADraftReportsHowLongItsCopyHasAgreed),
// or, with `reports_match` false, saying nothing of the copies (as the
// n-gram proposer), or with `sampled_leaves_copy`, every copy accepted
// whole but left by the sampled token after it.
class CopyingWorker {
 public:
  explicit CopyingWorker(bool reports_match, bool sampled_leaves_copy = false)
      : reports_match_(reports_match), sampled_leaves_copy_(sampled_leaves_copy) {}

  step::StepResult Execute(const step::StepPlan& plan) {
    step::StepResult result;
    for (const step::SequenceStep& s : plan.sequences) {
      step::SequenceResult r;
      r.sequence_id = s.sequence_id;
      if (s.sample && s.draft_limit > 0) {
        const int phase = verifications_++ % 12;
        const bool copy = phase < 4;
        if (phase == 0) agreed_ = 12;
        if (phase >= 1 && phase < 4) continuing_limits.push_back(s.draft_limit);
        r.proposer = s.proposer;
        r.drafted = s.draft_limit;
        r.accepted = copy ? s.draft_limit : 0;
        r.draft_match = reports_match_ ? (copy ? agreed_ : 1) : 0;
        r.draft_copy_goes_on = r.draft_match > 0 && copy && !sampled_leaves_copy_;
        if (copy) agreed_ += s.draft_limit + 1;
      }
      if (s.sample) r.sampled.assign(static_cast<size_t>(r.accepted) + 1, 7);
      result.sequences.push_back(r);
    }
    return result;
  }

  // The draft limits of the verifications that continued a copy accepted
  // whole (the 2nd to 4th of each copy).
  std::vector<int32_t> continuing_limits;

 private:
  bool reports_match_;
  bool sampled_leaves_copy_;
  int verifications_ = 0;
  int32_t agreed_ = 0;
};

// The scheduler learns from the drafts' agreement lengths (CopyAcceptance):
// a copy that goes on drafts long in its next step although the sequence's
// average acceptance is middling; without agreement lengths, or when the
// sampled token left the copy, the same verifications get the average's
// short drafts.
TEST(SchedulerSpeculationTest, AContinuingCopyDraftsByHowLongItHasAgreed) {
  auto continuing_limits = [](bool reports_match, bool sampled_leaves_copy = false) {
    SchedulerOptions o = Options(512, 700, step::Proposer::kSuffix, 16);
    o.speculation.adaptive = true;
    o.step_time_prior = {10.0, 1.0, 0.0, 0.0};
    o.fit_step_time = false;
    o.context_length = 2400;
    SchedulerCore core(o);
    CopyingWorker worker(reports_match, sampled_leaves_copy);
    auto sink = std::make_shared<Record>();
    core.Add(1, MakeRequest(8, 2000, sink, 1));
    for (int steps = 0; core.HasWork() && steps < 5000; ++steps) {
      step::StepPlan plan = core.Schedule(Lane::kPrefill);
      core.Update(Lane::kPrefill, plan, worker.Execute(plan));
    }
    EXPECT_FALSE(core.HasWork());
    EXPECT_EQ(core.free_blocks(), 700);
    std::vector<int32_t> limits = worker.continuing_limits;
    std::sort(limits.begin(), limits.end());
    return limits;
  };
  const std::vector<int32_t> by_agreement = continuing_limits(true);
  const std::vector<int32_t> by_average = continuing_limits(false);
  const std::vector<int32_t> left = continuing_limits(true, true);
  ASSERT_GE(by_agreement.size(), 10u);
  ASSERT_GE(by_average.size(), 10u);
  ASSERT_GE(left.size(), 10u);
  // Medians (measured: 16 of at most 16, against 3 and 3).
  EXPECT_EQ(by_agreement[by_agreement.size() / 2], 16);
  EXPECT_LE(by_average[by_average.size() / 2], 5);
  EXPECT_LE(left[left.size() / 2], 5);
}

}  // namespace
}  // namespace tandem::scheduler
