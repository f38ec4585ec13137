#include "scheduler/scheduler_core.h"

#include <algorithm>
#include <limits>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "common/check.h"
#include "common/strings.h"
#include "engine/grammar/token_grammar.h"

namespace tandem::scheduler {

std::string_view LaneName(Lane lane) { return lane == Lane::kPrefill ? "prefill" : "decode"; }

namespace {

// Arrivals the prompt arrival rate is measured over.
constexpr size_t kArrivalWindow = 32;

DisaggregationOptions PolicyOptions(const SchedulerOptions& options) {
  DisaggregationOptions d = options.disaggregation;
  d.slo = options.slo_policy;
  return d;
}

}  // namespace

SchedulerCore::SchedulerCore(SchedulerOptions options)
    : options_(std::move(options)),
      kv_(options_.kv_blocks, options_.block_size, options_.prefix_caching),
      policy_(PolicyOptions(options_), options_.decode_lane || options_.remote_decode),
      time_model_(options_.step_time_prior),
      draft_time_model_(options_.step_time_prior) {
  time_model_.SetRowCurve(options_.row_curve);
  if (!options_.fit_step_time) time_model_.Freeze();
  draft_time_model_.SetRowCurve(options_.row_curve);
  draft_time_model_.Freeze();
  if (options_.decode_kv_blocks > 0) {
    decode_kv_.emplace(options_.decode_kv_blocks, options_.block_size, options_.prefix_caching);
  }
  if (options_.on_kv_events) kv_.RecordEvents();
  if (options_.sliding_window > 0 && options_.release_sliding_pages) {
    for (Lane lane : {Lane::kPrefill, Lane::kDecode}) {
      if (lane == Lane::kDecode && !decode_kv_) continue;
      Kv(lane).EnableSlidingRelease(
          options_.sliding_window,
          [release = options_.release_sliding_pages,
           lane](std::span<const kvcache::BlockId> blocks) { release(lane, blocks); });
    }
  }
}

kvcache::KvCacheStats SchedulerCore::kv_stats() const {
  kvcache::KvCacheStats stats = kv_.stats();
  if (decode_kv_) {
    const kvcache::KvCacheStats d = decode_kv_->stats();
    stats.total_blocks += d.total_blocks;
    stats.used_blocks += d.used_blocks;
    stats.cached_blocks += d.cached_blocks;
    stats.evictions += d.evictions;
    stats.sliding_released += d.sliding_released;
  }
  return stats;
}

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
  FillBudget(seq->request);
  if (options_.slo_policy) {
    // Weighed when it decodes (SloPrefersDecodeLane), with the load of then.
    seq->decision.may_hand_off_later = policy_.enabled();
    seq->decision.reason =
        policy_.enabled() ? PathReason::kSloHeadroom : PathReason::kDisaggregationOff;
  } else {
    seq->decision = policy_.Admit(seq->request);
  }
  if (!seq->request.disable_speculation) seq->proposer = options_.speculation.proposer;
  const absl::Time now = options_.clock();
  seq->timeline.arrival =
      seq->request.received == absl::InfinitePast() ? now : std::min(seq->request.received, now);
  // The tokens it will compute: a cached prefix costs no compute (looked up
  // now, reserved at admission). Only the SLO policy reads the rate.
  const int32_t cached =
      options_.slo_policy ? kv_.FindPrefix(seq->tokens, seq->request.cache_salt).tokens : 0;
  recent_arrivals_.emplace_back(now, static_cast<int64_t>(seq->tokens.size()) - cached);
  if (recent_arrivals_.size() > kArrivalWindow) recent_arrivals_.pop_front();
  waiting_.push_back(std::move(seq));
}

int64_t SchedulerCore::waiting_tokens() const {
  int64_t tokens = 0;
  for (const SequencePtr& seq : waiting_) tokens += static_cast<int64_t>(seq->tokens.size());
  return tokens;
}

bool SchedulerCore::HasWork() const {
  return !waiting_.empty() || !running_[0].empty() || !running_[1].empty();
}

bool SchedulerCore::Admits(Lane lane) const {
  // With disaggregation on, the decode worker keeps to handed-off requests;
  // otherwise it serves colocated requests like the prefill worker.
  // (With a pool of its own the decode lane takes only handed-off requests.)
  return lane == Lane::kPrefill || (options_.decode_lane && !policy_.enabled() && !decode_kv_);
}

int64_t SchedulerCore::EffectivePriority(const Sequence& seq, absl::Time now) const {
  int64_t aged = 0;
  if (options_.priority_aging > absl::ZeroDuration() && now > seq.timeline.arrival) {
    aged = static_cast<int64_t>(
        absl::FDivDuration(now - seq.timeline.arrival, options_.priority_aging));
  }
  return int64_t{seq.request.priority} + aged;
}

int32_t SchedulerCore::Admit(Sequence& seq, int32_t budget) {
  const kvcache::PrefixMatch match = kv_.FindPrefix(seq.tokens, seq.request.cache_salt);
  const int32_t count = std::min(static_cast<int32_t>(seq.tokens.size()) - match.tokens, budget);
  if (!kv_.Admit(seq.id, seq.request.cache_salt, seq.tokens, match, match.tokens + count)) {
    return 0;
  }
  seq.computed = match.tokens;
  seq.queued = false;
  if (seq.cached_prompt_tokens < 0) seq.cached_prompt_tokens = match.tokens;
  return count;
}

SchedulerCore::RunningList::iterator SchedulerCore::PickVictim(
    Lane lane, const Sequence& needy, const absl::flat_hash_set<uint64_t>& planned,
    absl::Time now) {
  RunningList& list = running_of(lane);
  auto best = list.end();
  for (auto it = list.begin(); it != list.end(); ++it) {
    const Sequence& s = **it;
    if (&s == &needy || s.in_flight || planned.contains(s.id)) continue;
    if (best == list.end()) {
      best = it;
      continue;
    }
    const Sequence& b = **best;
    const int64_t ps = EffectivePriority(s, now), pb = EffectivePriority(b, now);
    if (ps < pb || (ps == pb && s.timeline.scheduled > b.timeline.scheduled) ||
        (ps == pb && s.timeline.scheduled == b.timeline.scheduled && s.id > b.id)) {
      best = it;
    }
  }
  return best;
}

void SchedulerCore::Preempt(RunningList& list, RunningList::iterator it) {
  Sequence& seq = **it;
  ReleaseBlocks(seq.id);
  seq.computed = 0;  // recomputed later, mostly from the prefix cache
  seq.queued = true;
  seq.lane = Lane::kPrefill;
  ++preemptions_;
  waiting_.push_back(std::move(*it));
  list.erase(it);
}

SchedulerCore::Sequence* SchedulerCore::Find(uint64_t id) {
  for (std::list<SequencePtr>* list : AllLists()) {
    for (SequencePtr& s : *list) {
      if (s->id == id) return s.get();
    }
  }
  return nullptr;
}

SchedulerCore::Sequence* SchedulerCore::FindRunning(Lane lane, uint64_t id) {
  for (SequencePtr& s : running_of(lane)) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

SchedulerCore::SequencePtr SchedulerCore::Take(uint64_t id) {
  for (std::list<SequencePtr>* list : AllLists()) {
    for (auto it = list->begin(); it != list->end(); ++it) {
      if ((*it)->id != id) continue;
      TANDEM_CHECK(!(*it)->in_flight, "taking a sequence whose step is running");
      SequencePtr seq = std::move(*it);
      list->erase(it);
      return seq;
    }
  }
  return nullptr;
}

step::SequenceStep SchedulerCore::MakeStep(const Sequence& seq, int32_t count) const {
  step::SequenceStep step;
  step.sequence_id = seq.id;
  step.tokens.assign(seq.tokens.begin() + seq.computed, seq.tokens.begin() + seq.computed + count);
  step.first_position = seq.computed;
  step.block_table = Kv(seq.lane).BlockTable(seq.id);
  step.sample = seq.computed + count == static_cast<int32_t>(seq.tokens.size());
  step.sampling = seq.request.sampling;
  step.draw_index = static_cast<uint64_t>(seq.generated);
  step.logprobs = step.sample ? seq.request.logprobs : 0;
  step.grammar = step.sample ? seq.request.grammar.get() : nullptr;
  return step;
}

step::StepPlan SchedulerCore::Schedule(Lane lane, int32_t token_budget) {
  step::StepPlan plan;
  if (lane == Lane::kDecode && !options_.decode_lane) return plan;
  const absl::Time now = options_.clock();
  const int32_t step_budget = token_budget > 0 ? std::min(token_budget, options_.max_batched_tokens)
                                               : options_.max_batched_tokens;
  int32_t budget = step_budget;
  absl::flat_hash_set<uint64_t> planned;
  absl::flat_hash_set<uint64_t> preempted;
  RunningList& list = running_of(lane);
  if (options_.slo_policy) {
    // Prompts already running get their chunks in TTFT-deadline order too
    // (a short chat admitted behind a long document goes first).
    list.sort([](const SequencePtr& a, const SequencePtr& b) {
      return a->timeline.arrival + a->request.slo.ttft < b->timeline.arrival + b->request.slo.ttft;
    });
  }
  // Prompt work this lane could run now: drafts would take its budget.
  bool prompt_work = Admits(lane) && !waiting_.empty();
  for (const SequencePtr& s : list) {
    prompt_work |= !s->in_flight && static_cast<int32_t>(s->tokens.size()) - s->computed > 1;
  }

  // Running sequences: decodes first (pass 0), then unfinished prompts.
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1 && !prompt_work && budget > 0) budget -= PlanDrafts(lane, plan, budget);
    for (auto it = list.begin(); it != list.end() && budget > 0;) {
      Sequence& seq = **it;
      const int32_t needed = static_cast<int32_t>(seq.tokens.size()) - seq.computed;
      if (seq.in_flight || planned.contains(seq.id) || (needed == 1) != (pass == 0)) {
        ++it;
        continue;
      }
      int32_t count = std::min(needed, budget);
      if (pass == 1 && !waiting_.empty() && Admits(lane)) {
        // A long prompt takes at most half a step while requests wait, so a
        // short request arriving behind it is admitted in the next step
        // instead of after the whole prompt.
        count = std::min(count, std::max(options_.block_size, step_budget / 2));
      }
      kvcache::KvCacheManager& kv = Kv(lane);
      bool fits = kv.Reserve(seq.id, seq.computed + count);
      while (!fits) {
        auto victim = PickVictim(lane, seq, planned, now);
        if (victim == list.end()) break;
        preempted.insert((*victim)->id);
        Preempt(list, victim);
        fits = kv.Reserve(seq.id, seq.computed + count);
      }
      if (!fits) {
        auto next = std::next(it);
        if (kv.pool().used_blocks() == static_cast<int32_t>(kv.BlockTable(seq.id).size())) {
          // Alone in the pool and still short: it can never grow.
          SequencePtr owned = std::move(*it);
          list.erase(it);
          Finish(std::move(owned), FinishReason::kLength,
                 absl::ResourceExhaustedError("the KV cache cannot hold a longer sequence"));
        } else {
          preempted.insert(seq.id);
          Preempt(list, it);
        }
        it = next;
        continue;
      }
      if (lane == Lane::kDecode && seq.timeline.handoff_end == absl::InfinitePast()) {
        seq.timeline.handoff_end = now;
      }
      plan.sequences.push_back(MakeStep(seq, count));
      planned.insert(seq.id);
      budget -= count;
      ++it;
    }
  }

  // Waiting sequences, by effective priority then arrival, while they fit.
  if (Admits(lane)) {
    while (budget > 0 && !waiting_.empty() &&
           running(Lane::kPrefill) + running(Lane::kDecode) < options_.max_running) {
      // Within a priority: arrival order, or under the SLO policy the
      // earliest TTFT deadline (arrival + its TTFT budget). Budgets are
      // bounded (MaxLatencyBudget()), so a request is passed only by those
      // that arrive before its own deadline: it cannot starve.
      auto order = [&](const Sequence& seq) {
        return options_.slo_policy ? seq.timeline.arrival + seq.request.slo.ttft
                                   : seq.timeline.arrival;
      };
      auto best = waiting_.begin();
      for (auto it = std::next(waiting_.begin()); it != waiting_.end(); ++it) {
        const int64_t p = EffectivePriority(**it, now), q = EffectivePriority(**best, now);
        if (p > q || (p == q && order(**it) < order(**best))) best = it;
      }
      Sequence& seq = **best;
      if (preempted.contains(seq.id)) break;  // no thrashing within one step
      const int32_t count = Admit(seq, budget);
      if (count == 0) break;
      if (seq.timeline.scheduled == absl::InfinitePast()) seq.timeline.scheduled = now;
      seq.lane = lane;
      plan.sequences.push_back(MakeStep(seq, count));
      planned.insert(seq.id);
      budget -= count;
      list.push_back(std::move(*best));
      waiting_.erase(best);
    }
  }
  for (SequencePtr& s : list) s->in_flight = planned.contains(s->id);
  for (const kvcache::BlockCopy& c : Kv(lane).TakeCopies()) {
    plan.block_copies.push_back({c.from, c.to});
  }
  return plan;
}

int32_t SchedulerCore::PlanDrafts(Lane lane, step::StepPlan& plan, int32_t budget) {
  if (options_.speculation.proposer == step::Proposer::kNone) return 0;
  std::vector<size_t> steps;
  std::vector<Sequence*> seqs;
  std::vector<DraftCandidate> candidates;
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const step::SequenceStep& step = plan.sequences[i];
    if (!step.sample || step.tokens.size() != 1) continue;
    Sequence* seq = FindRunning(lane, step.sequence_id);
    if (seq == nullptr || seq->proposer == step::Proposer::kNone) continue;
    // The drafts and the token after them must fit max_tokens and the
    // context (the forward pass writes positions up to computed + k).
    const int32_t length = static_cast<int32_t>(seq->tokens.size());
    const int32_t cap =
        std::min(seq->request.max_tokens - seq->generated - 1, options_.context_length - length);
    if (cap <= 0) continue;
    steps.push_back(i);
    seqs.push_back(seq);
    DraftCandidate candidate{seq->acceptance.rate(), cap, length, seq->acceptance.probe_due()};
    // Each lane's worker has its own proposer: on another lane the copy is
    // found afresh.
    if (seq->copy_agreed > 0 && seq->copy_lane == lane) {
      candidate.reach =
          copy_acceptance_.Reach(seq->copy_source, seq->copy_agreed, candidate.acceptance,
                                 std::min(cap, options_.speculation.max_draft));
    }
    candidates.push_back(std::move(candidate));
  }
  if (candidates.empty()) return 0;
  const std::vector<int32_t> k = AllocateDrafts(candidates, budget, StepShape::Of(plan),
                                                draft_time_model_, options_.speculation);
  int32_t used = 0;
  for (size_t c = 0; c < candidates.size(); ++c) {
    if (k[c] <= 0) {
      seqs[c]->acceptance.Idle();
      continue;
    }
    Sequence& seq = *seqs[c];
    step::SequenceStep& step = plan.sequences[steps[c]];
    // Room for the drafts from free blocks only; otherwise what the table
    // already holds beyond the decode token.
    int32_t limit = k[c];
    kvcache::KvCacheManager& kv = Kv(lane);
    if (!kv.Reserve(seq.id, seq.computed + 1 + limit)) {
      const int32_t held = static_cast<int32_t>(kv.BlockTable(seq.id).size()) * options_.block_size;
      limit = std::min(limit, held - seq.computed - 1);
    }
    if (limit <= 0) continue;
    step.proposer = seq.proposer;
    step.draft_limit = limit;
    step.block_table = kv.BlockTable(seq.id);
    if (seq.proposer == step::Proposer::kNgram || seq.proposer == step::Proposer::kSuffix) {
      step.preceding_tokens.assign(seq.tokens.begin(), seq.tokens.begin() + seq.computed);
    }
    if (seq.proposer == step::Proposer::kSuffix) step.cache_salt = seq.request.cache_salt;
    used += limit;
  }
  return used;
}

void SchedulerCore::MaybeHandOff(Sequence& seq) {
  if (seq.lane != Lane::kPrefill || !policy_.enabled() || seq.remote_failed) return;
  const bool decoding = seq.computed == static_cast<int32_t>(seq.tokens.size()) - 1;
  if (!decoding) return;
  const bool now_due = seq.handed_off || seq.decision.hand_off_after_prefill ||
                       (seq.decision.may_hand_off_later &&
                        (options_.slo_policy ? SloPrefersDecodeLane(seq).value_or(false)
                                             : policy_.ReachedThreshold(seq.generated)));
  if (!now_due || seq.move_failed) return;
  // The peer protocol does not carry a grammar: structured output decodes
  // on this daemon.
  if (options_.remote_decode && seq.request.grammar != nullptr) return;
  if (decode_kv_ && !options_.remote_decode) {
    // Its pages must move first; a full decode pool keeps it here for now
    // (tried again after its next step).
    RunningList& from = running_of(Lane::kPrefill);
    auto it = std::find_if(from.begin(), from.end(),
                           [&](const SequencePtr& s) { return s.get() == &seq; });
    if (it == from.end() || !StartMove(it)) return;
    return;
  }
  if (!seq.handed_off) {
    seq.handed_off = true;
    if (seq.decision.may_hand_off_later && !options_.slo_policy) {
      seq.decision.reason = PathReason::kThresholdReached;
    }
    seq.timeline.handoff_start = options_.clock();
    ++handoffs_;
  }
  RunningList& from = running_of(Lane::kPrefill);
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (it->get() != &seq) continue;
    if (options_.remote_decode) {
      OfferRemote(it);
      return;
    }
    seq.lane = Lane::kDecode;
    running_of(Lane::kDecode).push_back(std::move(*it));
    from.erase(it);
    return;
  }
}

void SchedulerCore::Update(Lane lane, const step::StepPlan& plan, const step::StepResult& result) {
  TANDEM_CHECK(result.status.ok() ? result.sequences.size() == plan.sequences.size() : true,
               "a step result must answer every sequence of its plan");
  for (size_t i = 0; i < plan.sequences.size(); ++i) {
    const step::SequenceStep& s = plan.sequences[i];
    Sequence* seq = FindRunning(lane, s.sequence_id);
    TANDEM_CHECK(seq != nullptr && seq->in_flight, "a planned sequence left its lane mid-step");
    seq->in_flight = false;
    if (!result.status.ok()) {
      Finish(Take(seq->id), FinishReason::kError, result.status);
      continue;
    }
    const step::SequenceResult& r = result.sequences[i];
    const int32_t accepted = s.sample ? r.accepted : 0;
    TANDEM_CHECK(
        !s.sample || (r.drafted <= s.draft_limit && accepted >= 0 && accepted <= r.drafted &&
                      static_cast<int32_t>(r.sampled.size()) == accepted + 1),
        "a sampling step returns its accepted drafts and one more token");
    // Accepted drafts are known tokens whose KV this step computed.
    seq->tokens.insert(seq->tokens.end(), r.sampled.begin(), r.sampled.begin() + accepted);
    seq->computed += static_cast<int32_t>(s.tokens.size()) + accepted;
    Kv(lane).Commit(seq->id, seq->tokens, seq->computed);
    if (s.draft_limit > 0) {
      seq->acceptance.Record(r.drafted, accepted);
      copy_acceptance_.Record(r.draft_source, r.draft_match, r.drafted, accepted);
      // A copy that goes on has agreed with its match, the drafts and the
      // sampled token after them when this lane's proposer drafts next.
      seq->copy_agreed = r.draft_copy_goes_on ? r.draft_match + accepted + 1 : 0;
      seq->copy_source = r.draft_source;
      seq->copy_lane = lane;
    } else if (s.sample) {
      // Decoded without drafts: the proposer sees these tokens only when it
      // drafts next, so whether the copy still goes on is unknown.
      seq->copy_agreed = 0;
    }
    if (r.drafted > 0) {
      seq->drafted += r.drafted;
      seq->accepted += accepted;
    }
    if (seq->pending_cancel.has_value()) {
      auto [reason, why] = *seq->pending_cancel;
      Finish(Take(seq->id), reason, std::move(why));
      continue;
    }
    if (!s.sample) continue;
    seq->tokens.push_back(r.sampled.back());
    seq->last_token = options_.clock();
    // Hand the tokens to the sink in order, until one ends the request.
    const int32_t length_before =
        static_cast<int32_t>(seq->tokens.size() - r.sampled.size());  // before this step's tokens
    std::optional<FinishReason> ended;
    for (size_t t = 0; t < r.sampled.size() && !ended.has_value(); ++t) {
      const TokenId token = r.sampled[t];
      ++seq->generated;
      // The worker sampled within the grammar, so it accepts every token.
      if (seq->request.grammar != nullptr) seq->request.grammar->Accept(token);
      if (seq->timeline.first_token == absl::InfinitePast()) {
        seq->timeline.first_token = options_.clock();
      }
      const auto& stops = seq->request.stop_token_ids;
      const bool is_stop_token = std::find(stops.begin(), stops.end(), token) != stops.end();
      const step::TokenLogprobs* logprobs = t < r.logprobs.size() ? &r.logprobs[t] : nullptr;
      const bool sink_stop = seq->request.sink->OnToken(token, is_stop_token, logprobs);
      if (is_stop_token || sink_stop) {
        ended = FinishReason::kStop;
      } else if (seq->generated >= seq->request.max_tokens ||
                 length_before + static_cast<int32_t>(t) + 1 >= options_.context_length) {
        ended = FinishReason::kLength;
      }
    }
    if (ended.has_value()) {
      Finish(Take(seq->id), *ended, absl::OkStatus());
    } else {
      MaybeHandOff(*seq);
      MaybeReturn(*seq);
    }
  }
}

void SchedulerCore::Cancel(uint64_t sequence_id, FinishReason reason, absl::Status why) {
  Sequence* seq = Find(sequence_id);
  if (seq == nullptr) return;
  if (seq->in_flight) {
    if (!seq->pending_cancel.has_value()) seq->pending_cancel.emplace(reason, std::move(why));
    return;
  }
  Finish(Take(sequence_id), reason, std::move(why));
}

void SchedulerCore::CancelAll(FinishReason reason, const absl::Status& why) {
  std::vector<uint64_t> ids;
  for (const std::list<SequencePtr>* list : AllLists()) {
    for (const SequencePtr& s : *list) ids.push_back(s->id);
  }
  for (uint64_t id : ids) Cancel(id, reason, why);
}

void SchedulerCore::ExpireDeadlines(absl::Time now) {
  std::vector<uint64_t> expired;
  for (const std::list<SequencePtr>* list : AllLists()) {
    for (const SequencePtr& s : *list) {
      if (s->request.deadline <= now && !s->pending_cancel.has_value()) expired.push_back(s->id);
    }
  }
  // Leases: the decode daemon had its time to read the pages. The request
  // goes on here at once (a stalled or cut-off peer costs no more than the
  // lease), the peer is told to stop, and a late commit is refused, so its
  // copy is never used.
  std::vector<uint64_t> lapsed;
  for (SequencePtr& s : remote_) {
    if (s->lease_held && s->lease_deadline <= now) lapsed.push_back(s->id);
  }
  for (uint64_t id : lapsed) {
    ++lease_expirations_;
    remote_aborts_.push_back(id);
    // Its blocks are intact here (the peer only read them): it goes on from
    // them, and the blocks are never given to the peer.
    ResumeLocally(id);
  }
  for (uint64_t id : expired) {
    Cancel(id, FinishReason::kCancelled, absl::DeadlineExceededError("the deadline passed"));
  }
}

absl::Time SchedulerCore::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const std::list<SequencePtr>* list : AllLists()) {
    for (const SequencePtr& s : *list) next = std::min(next, s->request.deadline);
  }
  for (const SequencePtr& s : remote_) {
    if (s->lease_held) next = std::min(next, s->lease_deadline);
  }
  return next;
}

Stage SchedulerCore::StageOf(const Sequence& seq) {
  if (seq.queued) return Stage::kQueued;
  // Every token but the last has its KV once the prompt is done: the last
  // one is the input of the next decode step.
  if (seq.computed < static_cast<int32_t>(seq.tokens.size()) - 1) return Stage::kPrefill;
  if (seq.lane == Lane::kDecode && seq.timeline.handoff_end == absl::InfinitePast()) {
    return Stage::kHandoff;
  }
  return Stage::kDecode;
}

// --- separate KV storages for the two lanes --------------------------------

bool SchedulerCore::StartMove(RunningList::iterator it) {
  Sequence& seq = **it;
  const int32_t length = static_cast<int32_t>(seq.tokens.size());
  // Room for its KV and the next token, in plain new blocks.
  if (!decode_kv_->Admit(seq.id, seq.request.cache_salt, {}, kvcache::PrefixMatch{}, length)) {
    return false;
  }
  const absl::Time now = options_.clock();
  if (!seq.handed_off) {
    seq.handed_off = true;
    if (seq.decision.may_hand_off_later && !options_.slo_policy) {
      seq.decision.reason = PathReason::kThresholdReached;
    }
    seq.timeline.handoff_start = now;
    ++handoffs_;
  }
  seq.timeline.kv_transfer_start = now;
  BlockMove move;
  move.sequence_id = seq.id;
  const int32_t blocks = kv_.BlocksFor(seq.computed);
  const std::vector<kvcache::BlockId>& from = kv_.BlockTable(seq.id);
  const std::vector<kvcache::BlockId>& to = decode_kv_->BlockTable(seq.id);
  move.from.assign(from.begin(), from.begin() + blocks);
  move.to.assign(to.begin(), to.begin() + blocks);
  moves_.push_back(std::move(move));
  seq.lane = Lane::kDecode;
  seq.in_flight = true;  // until CompleteMove: the copy reads and writes its pages
  moving_.push_back(std::move(*it));
  running_of(Lane::kPrefill).erase(it);
  return true;
}

std::vector<BlockMove> SchedulerCore::TakeMoves() {
  std::vector<BlockMove> out;
  out.swap(moves_);
  return out;
}

void SchedulerCore::CompleteMove(uint64_t sequence_id, const absl::Status& status) {
  auto it = std::find_if(moving_.begin(), moving_.end(),
                         [&](const SequencePtr& s) { return s->id == sequence_id; });
  if (it == moving_.end()) return;
  SequencePtr seq = std::move(*it);
  moving_.erase(it);
  Sequence* moved = seq.get();
  moved->in_flight = false;
  moved->timeline.kv_transfer_end = options_.clock();
  if (status.ok()) {
    kv_.Release(moved->id);  // the prefill lane's copy (stays in its prefix cache)
    decode_kv_->Commit(moved->id, moved->tokens, moved->computed);
    running_of(Lane::kDecode).push_back(std::move(seq));
  } else {
    // Its prefill-lane pages are intact: it goes on there, colocated.
    decode_kv_->Release(moved->id);
    moved->lane = Lane::kPrefill;
    moved->move_failed = true;
    moved->handed_off = false;
    running_of(Lane::kPrefill).push_back(std::move(seq));
  }
  if (moved->pending_cancel.has_value()) {
    auto [reason, why] = *moved->pending_cancel;
    Finish(Take(sequence_id), reason, std::move(why));
  }
}

// --- remote decode ----------------------------------------------------------

void SchedulerCore::OfferRemote(RunningList::iterator it) {
  Sequence& seq = **it;
  const absl::Time now = options_.clock();
  seq.lane = Lane::kDecode;
  seq.remote = true;
  seq.lease_held = true;
  seq.lease_deadline = now + options_.kv_lease;
  seq.timeline.kv_transfer_start = now;
  HandoffOffer offer;
  offer.sequence_id = seq.id;
  offer.request = seq.request;
  offer.request.sink = nullptr;
  offer.tokens = seq.tokens;
  offer.generated = seq.generated;
  offer.reason = seq.decision.reason;
  const std::vector<kvcache::BlockId>& table = kv_.BlockTable(seq.id);
  // Only the blocks that hold computed tokens travel.
  offer.block_table.assign(table.begin(), table.begin() + kv_.BlocksFor(seq.computed));
  offer.lease_deadline = seq.lease_deadline;
  offers_.push_back(std::move(offer));
  remote_.push_back(std::move(*it));
  running_of(Lane::kPrefill).erase(it);
}

std::vector<HandoffOffer> SchedulerCore::TakeOffers() {
  std::vector<HandoffOffer> out;
  out.swap(offers_);
  return out;
}

std::vector<uint64_t> SchedulerCore::TakeRemoteAborts() {
  std::vector<uint64_t> out;
  out.swap(remote_aborts_);
  return out;
}

SchedulerCore::Sequence* SchedulerCore::FindRemote(uint64_t id) {
  for (SequencePtr& s : remote_) {
    if (s->id == id) return s.get();
  }
  return nullptr;
}

bool SchedulerCore::LeaseHeld(uint64_t sequence_id) const {
  for (const SequencePtr& s : remote_) {
    if (s->id == sequence_id) return s->lease_held;
  }
  return false;
}

bool SchedulerCore::CommitLease(uint64_t sequence_id) {
  Sequence* seq = FindRemote(sequence_id);
  if (seq == nullptr || !seq->lease_held) return false;
  const absl::Time now = options_.clock();
  EndLease(*seq);
  kv_.Release(seq->id);  // its blocks stay in the prefix cache
  if (now >= seq->lease_deadline) {
    // Expired, though ExpireDeadlines has not run since: refused all the same.
    ++lease_expirations_;
    return false;
  }
  seq->remote_path = true;
  seq->timeline.kv_transfer_end = now;
  seq->timeline.handoff_end = now;
  return true;
}

void SchedulerCore::OnRemoteTokens(uint64_t sequence_id, std::span<const TokenId> tokens,
                                   std::span<const step::TokenLogprobs> logprobs) {
  Sequence* seq = FindRemote(sequence_id);
  if (seq == nullptr) return;  // it ended here; the abort is on its way
  for (size_t t = 0; t < tokens.size(); ++t) {
    const TokenId token = tokens[t];
    seq->tokens.push_back(token);
    ++seq->generated;
    if (seq->timeline.first_token == absl::InfinitePast()) {
      seq->timeline.first_token = options_.clock();
    }
    seq->last_token = options_.clock();
    const auto& stops = seq->request.stop_token_ids;
    const bool is_stop_token = std::find(stops.begin(), stops.end(), token) != stops.end();
    const step::TokenLogprobs* lp = t < logprobs.size() ? &logprobs[t] : nullptr;
    if (seq->request.sink->OnToken(token, is_stop_token, lp) && !is_stop_token) {
      // A stop string matched here: the decode daemon cannot know.
      Finish(Take(sequence_id), FinishReason::kStop, absl::OkStatus());
      return;
    }
  }
}

void SchedulerCore::FinishRemote(uint64_t sequence_id, FinishReason reason, int32_t drafted,
                                 int32_t accepted) {
  Sequence* seq = FindRemote(sequence_id);
  if (seq == nullptr) return;
  seq->drafted += drafted;
  seq->accepted += accepted;
  seq->remote = false;  // nothing to abort there
  Finish(Take(sequence_id), reason, absl::OkStatus());
}

void SchedulerCore::ResumeLocally(uint64_t sequence_id) {
  Sequence* found = FindRemote(sequence_id);
  if (found == nullptr) return;
  // The peer may have sent the request's last token and failed before
  // saying it finished: it ends here as it would have there.
  const auto& stops = found->request.stop_token_ids;
  const bool stopped = found->generated > 0 &&
                       std::find(stops.begin(), stops.end(), found->tokens.back()) != stops.end();
  if (stopped || found->generated >= found->request.max_tokens ||
      static_cast<int32_t>(found->tokens.size()) >= options_.context_length) {
    found->remote = false;  // nothing to abort there
    Finish(Take(sequence_id), stopped ? FinishReason::kStop : FinishReason::kLength,
           absl::OkStatus());
    return;
  }
  SequencePtr seq = Take(sequence_id);
  seq->remote = false;
  seq->remote_failed = true;
  seq->lane = Lane::kPrefill;
  const absl::Time now = options_.clock();
  if (seq->timeline.handoff_end == absl::InfinitePast()) seq->timeline.handoff_end = now;
  if (seq->lease_held) {
    // Its blocks still hold every computed token: it goes on as it was
    // (tokens the decode daemon sent meanwhile are computed as a chunk).
    EndLease(*seq);
    running_of(Lane::kPrefill).push_back(std::move(seq));
    return;
  }
  // Its blocks went back to the pool (into the prefix cache): from its tokens.
  seq->computed = 0;
  seq->queued = true;
  waiting_.push_back(std::move(seq));
}

absl::StatusOr<std::vector<int32_t>> SchedulerCore::Import(uint64_t sequence_id,
                                                           ImportedRequest imported) {
  const int32_t length = static_cast<int32_t>(imported.tokens.size());
  const int32_t prompt = static_cast<int32_t>(imported.request.prompt.size());
  if (length < 2 || prompt < 1 || imported.generated < 0 || prompt + imported.generated != length) {
    return absl::InvalidArgumentError(StrCat("tokens: ", length, " tokens are not a ", prompt,
                                             "-token prompt and ", imported.generated,
                                             " generated tokens"));
  }
  if (length >= options_.context_length) {
    return absl::InvalidArgumentError(StrCat("tokens: ", length, " tokens leave no room in a ",
                                             options_.context_length, "-token context"));
  }
  if (imported.generated >= imported.request.max_tokens) {
    return absl::InvalidArgumentError("max_tokens: the request has generated them all");
  }
  // Every running decode must fit in one step (max_running is at most the
  // step's tokens): a full batch refuses, and the request goes on where it is.
  const int64_t batch = int64_t{running(Lane::kPrefill)} + running(Lane::kDecode) +
                        static_cast<int64_t>(importing_.size());
  if (batch >= options_.max_running) {
    return absl::ResourceExhaustedError(StrCat("the running batch is full (", batch,
                                               " of --max_running=", options_.max_running, ")"));
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = sequence_id;
  seq->tokens = std::move(imported.tokens);
  seq->request = std::move(imported.request);
  seq->generated = imported.generated;
  seq->computed = length - 1;
  FillBudget(seq->request);
  seq->cached_prompt_tokens = 0;
  if (!seq->request.disable_speculation) seq->proposer = options_.speculation.proposer;
  // Pages are written by the transfer: plain new blocks (no prefix match),
  // with room for the next token.
  // (An empty prompt span: no prefix lookup to count in the statistics.)
  if (!kv_.Admit(seq->id, seq->request.cache_salt, {}, kvcache::PrefixMatch{}, length)) {
    return absl::ResourceExhaustedError(StrCat("the KV cache has ", kv_.free_blocks(),
                                               " free blocks; the request needs ",
                                               kv_.BlocksFor(length)));
  }
  const absl::Time now = options_.clock();
  seq->timeline.arrival = now;
  seq->timeline.scheduled = now;
  seq->timeline.handoff_start = now;
  seq->timeline.kv_transfer_start = now;
  seq->last_token = now;  // its next token is due a TPOT budget from here
  seq->queued = false;
  seq->in_flight = true;  // until CompleteImport: the transfer writes its blocks
  seq->handed_off = true;
  seq->remote_path = true;
  seq->decision.reason = imported.reason;
  // The decode lane when there is one, else the one worker.
  seq->lane = options_.decode_lane ? Lane::kDecode : Lane::kPrefill;
  const std::vector<kvcache::BlockId>& table = kv_.BlockTable(seq->id);
  std::vector<int32_t> blocks(table.begin(), table.begin() + kv_.BlocksFor(seq->computed));
  importing_.push_back(std::move(seq));
  return blocks;
}

void SchedulerCore::AbandonTransfers(const absl::Status& why) {
  std::vector<uint64_t> ids;
  for (const SequencePtr& s : importing_) ids.push_back(s->id);
  for (const SequencePtr& s : moving_) ids.push_back(s->id);
  for (uint64_t id : ids) {
    Find(id)->in_flight = false;
    Finish(Take(id), FinishReason::kCancelled, why);
  }
}

void SchedulerCore::CompleteImport(uint64_t sequence_id, const absl::Status& status) {
  auto it = std::find_if(importing_.begin(), importing_.end(),
                         [&](const SequencePtr& s) { return s->id == sequence_id; });
  if (it == importing_.end()) return;  // completed already
  SequencePtr owned = std::move(*it);
  importing_.erase(it);
  Sequence* seq = owned.get();
  seq->in_flight = false;
  running_of(seq->lane).push_back(std::move(owned));
  // A cancellation (or deadline) that came during the transfer wins over
  // the transfer's own outcome.
  if (seq->pending_cancel.has_value()) {
    auto [reason, why] = *seq->pending_cancel;
    Finish(Take(sequence_id), reason, std::move(why));
    return;
  }
  if (!status.ok()) {
    Finish(Take(sequence_id), FinishReason::kError, status);
    return;
  }
  kv_.Commit(seq->id, seq->tokens, seq->computed);
  seq->timeline.kv_transfer_end = options_.clock();
  seq->timeline.handoff_end = seq->timeline.kv_transfer_end;
}

void SchedulerCore::Finish(SequencePtr seq, FinishReason reason, absl::Status why) {
  TANDEM_CHECK(seq != nullptr, "finishing an unknown sequence");
  EndLease(*seq);
  ReleaseBlocks(seq->id);
  seq->timeline.finished = options_.clock();
  if (reason == FinishReason::kStop || reason == FinishReason::kLength) {
    policy_.Record(seq->request, seq->generated);
  }
  if (options_.on_finished_text && reason != FinishReason::kError) {
    options_.on_finished_text(seq->request.cache_salt, seq->tokens);
  }
  FinishInfo info;
  info.reason = reason;
  info.error = std::move(why);
  info.usage.prompt_tokens = static_cast<int32_t>(seq->request.prompt.size());
  info.usage.completion_tokens = seq->generated;
  info.usage.cached_prompt_tokens = std::max(0, seq->cached_prompt_tokens);
  info.usage.drafted_tokens = seq->drafted;
  info.usage.accepted_tokens = seq->accepted;
  info.timeline = seq->timeline;
  // (A request that came back from a failed remote handoff before any
  // pages moved was decoded here, colocated.)
  info.path = seq->remote_path ? Path::kRemote
              : (seq->handed_off || seq->ever_handed_off) && !seq->remote_failed
                  ? Path::kDisaggregated
                  : Path::kColocated;
  // The decode daemon stops too (it may not know yet: a stop string, a
  // cancellation or a deadline here).
  if (seq->remote) remote_aborts_.push_back(seq->id);
  info.path_reason = seq->decision.reason;
  info.stage = StageOf(*seq);
  info.slo = seq->request.slo;
  seq->request.sink->OnFinish(info);
}

// --- the SLO policy ---

void SchedulerCore::FillBudget(Request& request) const {
  if (request.slo.ttft <= absl::ZeroDuration()) request.slo.ttft = options_.slo.ttft;
  if (request.slo.tpot <= absl::ZeroDuration()) request.slo.tpot = options_.slo.tpot;
}

absl::Time SchedulerCore::TokenDeadline(const Sequence& seq, bool relaxed) const {
  if (relaxed) {
    if (seq.timeline.first_token != absl::InfinitePast() && seq.generated > 0) {
      return seq.timeline.first_token + seq.request.slo.tpot * seq.generated;
    }
    return seq.last_token == absl::InfinitePast() ? absl::InfinitePast()
                                                  : seq.last_token + seq.request.slo.tpot;
  }
  const absl::Duration paced = seq.request.slo.tpot * kSloMargin;
  absl::Time deadline = seq.last_token == absl::InfinitePast()
                            ? absl::InfinitePast()
                            : seq.last_token + paced * options_.slo_max_gap;
  if (seq.timeline.first_token != absl::InfinitePast() && seq.generated > 0) {
    deadline = std::min(deadline, seq.timeline.first_token + paced * seq.generated);
  }
  return deadline;
}

double SchedulerCore::LeastTpotMs(Lane lane) const {
  double least = std::numeric_limits<double>::infinity();
  for (const SequencePtr& s : running_[static_cast<size_t>(lane)]) {
    if (s->in_flight || !Decoding(*s)) continue;
    least = std::min(least, absl::ToDoubleMilliseconds(s->request.slo.tpot));
  }
  return least;
}

double SchedulerCore::LeastSlackMs(Lane lane, absl::Time now, bool relaxed,
                                   bool in_flight_too) const {
  absl::Time least = absl::InfiniteFuture();
  for (const SequencePtr& s : running_[static_cast<size_t>(lane)]) {
    if ((s->in_flight && !in_flight_too) || !Decoding(*s)) continue;
    least = std::min(least, TokenDeadline(*s, relaxed));
  }
  if (least == absl::InfiniteFuture()) return std::numeric_limits<double>::infinity();
  if (least == absl::InfinitePast()) return 0.0;
  return absl::ToDoubleMilliseconds(least - now);
}

StepShape SchedulerCore::DecodeStepShape(Lane lane) const {
  StepShape shape;
  for (const SequencePtr& s : running_[static_cast<size_t>(lane)]) {
    if (!s->in_flight && Decoding(*s)) shape.AddRows(s->computed, 1);
  }
  return shape;
}

int64_t SchedulerCore::running_prompt_tokens() const {
  int64_t tokens = 0;
  for (const RunningList& list : running_) {
    for (const SequencePtr& s : list) {
      if (!Decoding(*s)) tokens += static_cast<int64_t>(s->tokens.size()) - s->computed;
    }
  }
  return tokens;
}

PathLoad SchedulerCore::PathLoadWithout(const Sequence* deciding) const {
  PathLoad load;
  double context = 0;
  for (int lane = 0; lane < kLanes; ++lane) {
    for (const SequencePtr& s : running_[static_cast<size_t>(lane)]) {
      if (!Decoding(*s)) continue;
      (lane == 0 ? load.colocated_decodes : load.lane_decodes) += 1;
      context += static_cast<double>(s->tokens.size());
      if (s.get() != deciding) {
        double& tightest = lane == 0 ? load.colocated_tpot_ms : load.lane_tpot_ms;
        tightest = std::min(tightest, absl::ToDoubleMilliseconds(s->request.slo.tpot));
      }
    }
  }
  const int32_t decoding = load.colocated_decodes + load.lane_decodes;
  load.mean_context = decoding > 0 ? context / decoding : 0.0;
  if (options_.remote_decode) load.lane_decodes = std::max(peer_decoding_, remote());
  load.prompt_backlog = waiting_tokens() + running_prompt_tokens();
  auto tightest = [&](const Sequence& s) {
    const double budget = absl::ToDoubleMilliseconds(s.request.slo.ttft);
    load.queue_ttft_ms = load.queue_ttft_ms > 0 ? std::min(load.queue_ttft_ms, budget) : budget;
  };
  for (const SequencePtr& s : waiting_) {
    if (s->generated == 0) tightest(*s);
  }
  for (const RunningList& list : running_) {
    for (const SequencePtr& s : list) {
      if (s->generated == 0) tightest(*s);
    }
  }
  load.prompt_arrivals_per_ms = PromptArrivalsPerMs(options_.clock());
  load.max_chunk = options_.max_batched_tokens;
  load.min_chunk = std::min(options_.min_prompt_chunk, options_.max_batched_tokens);
  load.shared_compute = options_.lanes_share_compute && !options_.remote_decode;
  return load;
}

double SchedulerCore::PromptArrivalsPerMs(absl::Time now) const {
  if (recent_arrivals_.size() < kArrivalWindow / 8) return 0.0;
  // The tokens after the first arrival, over the time since it.
  int64_t tokens = 0;
  for (size_t i = 1; i < recent_arrivals_.size(); ++i) tokens += recent_arrivals_[i].second;
  const double span = absl::ToDoubleMilliseconds(now - recent_arrivals_.front().first);
  return span > 0 ? static_cast<double>(tokens) / span : 0.0;
}

std::optional<SchedulerCore::PromptPressure> SchedulerCore::EarliestPrompt(absl::Time now) const {
  std::optional<absl::Time> earliest;
  auto visit = [&](const Sequence& s) {
    if (s.generated > 0) return;
    const absl::Time due = s.timeline.arrival + s.request.slo.ttft;
    if (due > now && (!earliest || due < *earliest)) earliest = due;
  };
  for (const SequencePtr& s : waiting_) visit(*s);
  for (const RunningList& list : running_) {
    for (const SequencePtr& s : list) visit(*s);
  }
  if (!earliest) return std::nullopt;
  PromptPressure pressure;
  pressure.deadline_ms = absl::ToDoubleMilliseconds(*earliest - now);
  auto count = [&](const Sequence& s) {
    if (s.generated == 0 && s.timeline.arrival + s.request.slo.ttft <= *earliest) {
      pressure.tokens += static_cast<int64_t>(s.tokens.size()) - s.computed;
    }
  };
  for (const SequencePtr& s : waiting_) count(*s);
  for (const RunningList& list : running_) {
    for (const SequencePtr& s : list) count(*s);
  }
  return pressure;
}

void SchedulerCore::SetPeerLoad(int32_t decoding, std::optional<double> least_slack_ms) {
  peer_decoding_ = std::max(0, decoding);
  peer_slack_ms_ = least_slack_ms;
}

std::optional<bool> SchedulerCore::SloPrefersDecodeLane(Sequence& seq) {
  if (seq.generated < seq.next_path_check) return std::nullopt;
  // Checked at 1, 2, 4, 8 tokens, then every quarter of its length (at
  // least 8 tokens apart): early enough to move a stream that is missing
  // its budget, often enough to give compute back when prompts need it.
  seq.next_path_check = seq.generated < 8 ? std::max(2, seq.generated * 2)
                                          : seq.generated + std::max(8, seq.generated / 4);
  // The output still to come: the client's hint, its workload's learned
  // length, or, knowing nothing, as much as it has produced so far (a
  // stream that has run long tends to run on).
  int32_t expected = seq.request.expected_output_tokens;
  if (expected <= 0) expected = policy_.EstimateOutput(seq.request.workload).value_or(0);
  int32_t remaining = expected > seq.generated ? expected - seq.generated : seq.generated;
  remaining = std::min(remaining, seq.request.max_tokens - seq.generated);
  if (remaining <= 1) return std::nullopt;
  PathLoad load = PathLoadWithout(&seq);
  // The load without this stream: the forecasts add it to either path.
  int32_t& here = seq.lane == Lane::kPrefill ? load.colocated_decodes : load.lane_decodes;
  here = std::max(0, here - 1);
  const int64_t context = static_cast<int64_t>(seq.tokens.size());
  if (seq.lane == Lane::kPrefill && options_.remote_decode && peer_slack_ms_.has_value()) {
    // The peers' streams have less slack than a step with one more would
    // take: a handoff now would break their budgets, or this one's.
    const double step =
        time_model_.PredictMs(DecodeShape(load.lane_decodes + 1, static_cast<double>(context)));
    if (*peer_slack_ms_ < step) return false;
  }
  StreamSoFar so_far;
  if (seq.timeline.first_token != absl::InfinitePast() && seq.last_token != absl::InfinitePast()) {
    so_far.tokens = seq.generated;
    so_far.elapsed_ms = absl::ToDoubleMilliseconds(seq.last_token - seq.timeline.first_token);
  }
  return ChoosePath(time_model_, load, seq.request.slo, 0, context, remaining, so_far).disaggregate;
}

void SchedulerCore::MaybeReturn(Sequence& seq) {
  // Only within one KV pool, on this daemon, for a stream the policy moved.
  if (!options_.slo_policy || seq.lane != Lane::kDecode || decode_kv_ || seq.remote_path ||
      !Decoding(seq)) {
    return;
  }
  if (SloPrefersDecodeLane(seq).value_or(true)) return;
  RunningList& from = running_of(Lane::kDecode);
  for (auto it = from.begin(); it != from.end(); ++it) {
    if (it->get() != &seq) continue;
    seq.lane = Lane::kPrefill;
    seq.handed_off = false;  // free to move again at a later check
    seq.ever_handed_off = true;
    running_of(Lane::kPrefill).push_back(std::move(*it));
    from.erase(it);
    return;
  }
}

}  // namespace tandem::scheduler
