#include "scheduler/scheduler_core.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "common/check.h"
#include "common/strings.h"

namespace tandem::scheduler {

SchedulerCore::SchedulerCore(SchedulerOptions options)
    : options_(std::move(options)),
      kv_(options_.kv_blocks, options_.block_size, options_.prefix_caching) {}

absl::Status SchedulerCore::Admissible(const Request& request) const {
  const int32_t prompt = static_cast<int32_t>(request.prompt.size());
  if (prompt == 0) return absl::InvalidArgumentError("the prompt is empty");
  if (prompt >= options_.context_length) {
    return absl::InvalidArgumentError(StrCat("the prompt has ", prompt,
                                             " tokens; the context holds ", options_.context_length,
                                             " including at least one generated token"));
  }
  if (kv_.BlocksFor(prompt + 1) > kv_.total_blocks()) {
    return absl::InvalidArgumentError(StrCat("the prompt needs ", kv_.BlocksFor(prompt + 1),
                                             " KV blocks; the cache has ", kv_.total_blocks()));
  }
  if (request.max_tokens < 1) return absl::InvalidArgumentError("max_tokens must be at least 1");
  return absl::OkStatus();
}

void SchedulerCore::Add(uint64_t sequence_id, Request request) {
  auto seq = std::make_unique<Sequence>();
  seq->id = sequence_id;
  seq->tokens = request.prompt;
  seq->request = std::move(request);
  seq->timeline.arrival = options_.clock();
  waiting_.push_back(std::move(seq));
}

int32_t SchedulerCore::Admit(Sequence& seq, int32_t budget) {
  const kvcache::PrefixMatch match = kv_.FindPrefix(seq.tokens, seq.request.cache_salt);
  const int32_t count = std::min(static_cast<int32_t>(seq.tokens.size()) - match.tokens, budget);
  if (!kv_.Admit(seq.id, seq.request.cache_salt, seq.tokens, match, match.tokens + count)) {
    return 0;
  }
  seq.computed = match.tokens;
  if (seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = match.tokens;
  return count;
}

void SchedulerCore::Preempt(Sequence& seq) {
  kv_.Release(seq.id);
  seq.computed = 0;  // recomputed later, mostly from the prefix cache
  ++preemptions_;
}

SchedulerCore::Sequence* SchedulerCore::FindRunning(uint64_t id) {
  for (SequencePtr& s : running_) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

step::SequenceStep SchedulerCore::MakeStep(const Sequence& seq, int32_t count) const {
  step::SequenceStep step;
  step.sequence_id = seq.id;
  step.tokens.assign(seq.tokens.begin() + seq.computed, seq.tokens.begin() + seq.computed + count);
  step.first_position = seq.computed;
  step.block_table = kv_.BlockTable(seq.id);
  step.sample = seq.computed + count == static_cast<int32_t>(seq.tokens.size());
  step.sampling = seq.request.sampling;
  step.draw_index = static_cast<uint64_t>(seq.generated);
  return step;
}

step::StepPlan SchedulerCore::Schedule() {
  step::StepPlan plan;
  int32_t budget = options_.max_batched_tokens;
  absl::flat_hash_set<uint64_t> planned;

  // Running sequences: decodes first (pass 0), then unfinished prompts.
  for (int pass = 0; pass < 2; ++pass) {
    for (auto it = running_.begin(); it != running_.end() && budget > 0;) {
      Sequence& seq = **it;
      const int32_t needed = static_cast<int32_t>(seq.tokens.size()) - seq.computed;
      if (planned.contains(seq.id) || (needed == 1) != (pass == 0)) {
        ++it;
        continue;
      }
      const int32_t count = std::min(needed, budget);
      bool fits = kv_.Reserve(seq.id, seq.computed + count);
      // Make room by preempting the newest sequence not in this step.
      while (!fits) {
        auto victim = running_.end();
        for (auto v = running_.begin(); v != running_.end(); ++v) {
          if (v != it && !planned.contains((*v)->id)) victim = v;
        }
        if (victim == running_.end()) break;
        Preempt(**victim);
        waiting_.push_front(std::move(*victim));
        running_.erase(victim);
        fits = kv_.Reserve(seq.id, seq.computed + count);
      }
      if (!fits) {
        if (kv_.pool().used_blocks() == static_cast<int32_t>(kv_.BlockTable(seq.id).size())) {
          // Alone in the pool and still short: it can never grow.
          SequencePtr owned = std::move(*it);
          it = running_.erase(it);
          Finish(std::move(owned), FinishReason::kLength,
                 absl::ResourceExhaustedError("the KV cache cannot hold a longer sequence"));
          continue;
        }
        Preempt(seq);
        waiting_.push_front(std::move(*it));
        it = running_.erase(it);
        continue;
      }
      plan.sequences.push_back(MakeStep(seq, count));
      planned.insert(seq.id);
      budget -= count;
      ++it;
    }
  }

  // Waiting sequences, in order, while they fit.
  while (budget > 0 && !waiting_.empty() &&
         static_cast<int32_t>(running_.size()) < options_.max_running) {
    Sequence& seq = *waiting_.front();
    if (planned.contains(seq.id)) break;  // preempted during this step
    const int32_t count = Admit(seq, budget);
    if (count == 0) break;
    if (seq.timeline.scheduled == absl::InfinitePast()) seq.timeline.scheduled = options_.clock();
    plan.sequences.push_back(MakeStep(seq, count));
    planned.insert(seq.id);
    budget -= count;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  for (const kvcache::BlockCopy& c : kv_.TakeCopies()) plan.block_copies.push_back({c.from, c.to});
  return plan;
}

void SchedulerCore::Update(const step::StepPlan& plan, const step::StepResult& result) {
  if (!result.status.ok()) {
    for (const step::SequenceStep& s : plan.sequences) {
      Cancel(s.sequence_id, FinishReason::kError, result.status);
    }
    return;
  }
  TANDEM_CHECK(result.sequences.size() == plan.sequences.size(),
               "a step result must answer every sequence of its plan");
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const step::SequenceStep& s = plan.sequences[i];
    Sequence* seq = FindRunning(s.sequence_id);
    TANDEM_CHECK(seq != nullptr, "a planned sequence left the running set mid-step");
    seq->computed += static_cast<int32_t>(s.tokens.size());
    kv_.Commit(seq->id, seq->tokens, seq->computed);
    if (!s.sample) continue;
    TANDEM_CHECK(result.sequences[i].sampled.has_value(), "a sampling step returned no token");
    const TokenId token = *result.sequences[i].sampled;
    seq->tokens.push_back(token);
    ++seq->generated;
    if (seq->timeline.first_token == absl::InfinitePast()) {
      seq->timeline.first_token = options_.clock();
    }
    const auto& stops = seq->request.stop_token_ids;
    const bool is_stop_token = std::find(stops.begin(), stops.end(), token) != stops.end();
    const bool sink_stop = seq->request.sink->OnToken(token, is_stop_token);
    std::optional<FinishReason> reason;
    if (is_stop_token || sink_stop) {
      reason = FinishReason::kStop;
    } else if (seq->generated >= seq->request.max_tokens ||
               static_cast<int32_t>(seq->tokens.size()) >= options_.context_length) {
      reason = FinishReason::kLength;
    }
    if (reason.has_value()) Cancel(seq->id, *reason, absl::OkStatus());
  }
}

void SchedulerCore::Cancel(uint64_t sequence_id, FinishReason reason, absl::Status why) {
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
    if ((*it)->id == sequence_id) {
      SequencePtr seq = std::move(*it);
      waiting_.erase(it);
      Finish(std::move(seq), reason, std::move(why));
      return;
    }
  }
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->id == sequence_id) {
      SequencePtr seq = std::move(*it);
      running_.erase(it);
      Finish(std::move(seq), reason, std::move(why));
      return;
    }
  }
}

void SchedulerCore::CancelAll(FinishReason reason, const absl::Status& why) {
  std::vector<uint64_t> ids;
  for (const SequencePtr& s : waiting_) ids.push_back(s->id);
  for (const SequencePtr& s : running_) ids.push_back(s->id);
  for (uint64_t id : ids) Cancel(id, reason, why);
}

void SchedulerCore::ExpireDeadlines(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const SequencePtr& s : waiting_) {
    if (s->request.deadline <= now) expired.push_back(s->id);
  }
  for (const SequencePtr& s : running_) {
    if (s->request.deadline <= now) expired.push_back(s->id);
  }
  for (uint64_t id : expired) {
    Cancel(id, FinishReason::kCancelled, absl::DeadlineExceededError("the deadline passed"));
  }
}

absl::Time SchedulerCore::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const SequencePtr& s : waiting_) next = std::min(next, s->request.deadline);
  for (const SequencePtr& s : running_) next = std::min(next, s->request.deadline);
  return next;
}

void SchedulerCore::Finish(SequencePtr seq, FinishReason reason, absl::Status why) {
  kv_.Release(seq->id);
  seq->timeline.finished = options_.clock();
  FinishInfo info;
  info.reason = reason;
  info.error = std::move(why);
  info.usage.prompt_tokens = static_cast<int32_t>(seq->request.prompt.size());
  info.usage.completion_tokens = seq->generated;
  info.usage.cached_prompt_tokens = std::max(0, seq->cached_prompt_tokens);
  info.timeline = seq->timeline;
  seq->request.sink->OnFinish(info);
}

}  // namespace tandem::scheduler
