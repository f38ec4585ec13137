// The scheduling policy and state, single-threaded: admission by priority,
// continuous batching with a token budget, chunked prefill, preemption, the
// hand-off of long outputs from the prefill worker to a decode worker, and
// finishing.
//
// One rule drives everything: each sequence has tokens known (prompt plus
// generated) and tokens computed (their KV is in its blocks); a step runs
// some of the difference. Decodes are a difference of one, prompts are
// chunked to fit the budget, and a preempted sequence simply starts again
// from zero computed tokens (mostly from the prefix cache). There is no
// "phase" flag.
//
// Workers are lanes. The prefill lane runs every prompt and the decode steps
// of colocated requests (mixed batches); the decode lane, when there is one,
// runs the decode steps of disaggregated requests only. With disaggregation
// off, both lanes serve colocated requests, so no worker idles while work
// waits. A handoff moves a sequence (its block table) from one lane's running
// set to the other's; the one KV pool is shared.
//
// Per lane and step: its running decodes first, then its running prompts
// (chunked; while requests wait, a prompt takes at most half the budget so
// that a short request behind a long prompt starts in the next step), then
// waiting requests it may admit, by effective priority (priority plus one per
// `priority_aging` waited) then arrival, while the budget, the running cap and
// the KV pool allow. Admission looks up the prefix
// cache. A sequence that cannot get a block preempts the lane's lowest-
// priority, most recently admitted sequence not in this step (or itself).
//
// Speculative decoding: a lane's decode steps may also verify drafted tokens
// (PlanDrafts, scheduler/speculation_policy.h) when the lane has no prompt
// work in the step, so drafts never delay a prompt. Their KV slots are
// reserved only from blocks that are free (speculation never preempts), and
// only accepted drafts count as computed or enter the prefix cache.
//
// Each lane has at most one step in flight. Sequences in flight are not
// touched: a cancellation or deadline that hits one takes effect when its
// step's results arrive. Every way a sequence ends goes through Finish(),
// which releases its blocks exactly once.
//
// Remote decode (several daemons). On a prefill daemon (`remote_decode`), a
// request due for the decode lane goes to another daemon instead: it leaves
// the running lists for the remote set, and an offer (its tokens and block
// table) is queued for TakeOffers(). Its blocks stay held under a lease
// until the decode daemon has read them (CommitLease) or the lease's deadline
// passes (ExpireDeadlines); a commit after expiry is refused, so nobody
// decodes from pages that may have been reused. The decode daemon's tokens
// come back through OnRemoteTokens and its end through FinishRemote. If it
// fails (it died, it refused, the transfer broke), ResumeLocally continues
// the request here: from its blocks if the lease still holds them, else
// from its tokens (the prefix cache keeps most of their KV). A remote
// request that ends here (cancelled, deadline, a stop string) is queued for
// TakeRemoteAborts() so the decode daemon stops too.
// On a decode daemon, Import() takes such a request in with blocks reserved
// for its pages; it is in flight (untouchable, its blocks being written by
// the transfer) until CompleteImport().
//
// Thread safety: none; owned by the Scheduler thread (or a test).
#ifndef TANDEM_SCHEDULER_SCHEDULER_CORE_H_
#define TANDEM_SCHEDULER_SCHEDULER_CORE_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/step/step_plan.h"
#include "kvcache/kv_cache_manager.h"
#include "scheduler/disaggregation_policy.h"
#include "scheduler/request.h"
#include "scheduler/slo_path.h"
#include "scheduler/speculation_policy.h"
#include "scheduler/step_time_model.h"

namespace tandem::scheduler {

enum class Lane : uint8_t { kPrefill = 0, kDecode = 1 };
inline constexpr int kLanes = 2;
std::string_view LaneName(Lane lane);

struct SchedulerOptions {
  int32_t max_batched_tokens = 512;  // tokens per step of one lane
  int32_t max_running = 64;          // sequences running, all lanes together
  int32_t block_size = 16;           // tokens per KV block
  int32_t kv_blocks = 1024;          // KV blocks in the pool
  int32_t context_length = 2048;     // positions per sequence
  bool prefix_caching = true;        // reuse cached KV blocks of equal prefixes
  bool decode_lane = false;          // a decode worker exists
  DisaggregationOptions disaggregation;
  absl::Duration priority_aging = absl::Seconds(10);  // +1 effective priority per this long waited
  // Prompt tokens that may wait (submitted, not yet running) at once; a
  // request that would pass it is refused unless nothing waits. 0: no limit.
  int64_t max_queued_tokens = 0;
  SpeculationOptions speculation;
  // Where the step-time model starts (scheduler/step_time_model.h; the
  // daemon measures it at start-up, Scheduler::CalibrateStepTime may restart
  // it) and the backend's row curve, which it keeps. The draft policy prices
  // steps with these as they are (draft_time_model_).
  StepTimeCoefficients step_time_prior;
  RowCurve row_curve;
  // false: the model keeps step_time_prior (tests that need a known model).
  bool fit_step_time = true;
  // > 0: the decode lane's worker keeps its KV in storage of its own, a pool
  // of this many blocks, so a handoff moves the sequence's pages there (a
  // BlockMove, TakeMoves) instead of its block table (one daemon whose two
  // workers share no memory: a GPU and the CPU, two GPUs). 0: one pool.
  int32_t decode_kv_blocks = 0;
  // Hand requests due for decoding to other daemons (TakeOffers) instead of
  // a local decode lane.
  bool remote_decode = false;
  // The decode lane's steps compute on the prefill lane's compute (one
  // pool): a move to it costs the colocated streams (slo_path.h, load_P).
  // false: it has threads of its own (--decode_reserved_threads), or
  // (remote_decode) another daemon.
  bool lanes_share_compute = true;
  // How long a prefill daemon holds an offered request's blocks for the
  // decode daemon to read them.
  absl::Duration kv_lease = absl::Seconds(30);
  // The SLO policy (--policy=slo; scheduler/step_dispatcher.h): waiting
  // prompts in order of their TTFT deadlines, and the path of each request
  // chosen by forecast (scheduler/slo_path.h) instead of by
  // disaggregation.output_threshold.
  bool slo_policy = false;
  // The budget of requests that bring none (--slo_ttft, --slo_tpot).
  LatencyBudget slo = {absl::Seconds(1), absl::Milliseconds(100)};
  // The least prompt chunk a prefill step takes while prompts wait, however
  // little slack the colocated streams have: prompts cannot starve.
  int32_t min_prompt_chunk = 32;
  // The longest a stream on time waits for its next token, in paced TPOT
  // budgets (kSloMargin * tpot): the lead a stream builds while the machine
  // is idle is spent on prompts later, but never as one stall longer than
  // this (the inter-token tail stays bounded).
  double slo_max_gap = 2.0;
  // When set, called with each finished request's cache salt and tokens
  // (prompt, then output) unless it ended in an error: the text suffix
  // drafting copies from across requests (speculative::SuffixCache::Add).
  // Called on the scheduler's thread, with its state locked: must be quick.
  std::function<void(std::string_view salt, std::span<const TokenId> tokens)> on_finished_text;
  // KV events (server/kv_event_publisher.h): when set, called on the
  // scheduler thread after each round that changed the prefix index (of the
  // prefill lane's storage: where prompts find their prefixes), with its
  // events in order. It answers false when the receiver dropped a batch:
  // the next call (at the index's next change) then carries the whole index
  // instead (AllCleared, then every cached block). Must be quick.
  std::function<bool(std::vector<kvcache::KvEvent>)> on_kv_events;
  // Sliding-window layers (Gemma 2 and 3): when sliding_window > 0 and
  // release_sliding_pages is set, blocks a whole window behind the sequence
  // that holds them alone are passed to it with the lane whose storage
  // holds them, once each, so the backend gives those layers' pages back
  // (kvcache::KvCacheManager::EnableSlidingRelease). Called on the scheduler
  // thread, possibly while a step runs: must be quick.
  int32_t sliding_window = 0;
  std::function<void(Lane, std::span<const int32_t>)> release_sliding_pages;
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

// A request offered to a decode daemon: everything it needs to go on.
struct HandoffOffer {
  uint64_t sequence_id = 0;
  Request request;              // without its sink
  std::vector<TokenId> tokens;  // prompt and generated; all but the last have KV
  int32_t generated = 0;
  PathReason reason = PathReason::kThresholdReached;
  std::vector<int32_t> block_table;  // holds the KV of tokens[0, tokens.size() - 1)
  absl::Time lease_deadline;
};

// Pages to copy from the prefill lane's KV storage to the decode lane's
// (separate storages, SchedulerOptions::decode_kv_blocks): block from[i]
// into block to[i]; then CompleteMove.
struct BlockMove {
  uint64_t sequence_id = 0;
  std::vector<int32_t> from;
  std::vector<int32_t> to;
};

// A request taken over from a prefill daemon (Import).
struct ImportedRequest {
  Request request;              // prompt, sampling, limits, sink
  std::vector<TokenId> tokens;  // prompt and generated; all but the last have KV (sent)
  int32_t generated = 0;        // tokens of `tokens` already generated (and streamed)
  PathReason reason = PathReason::kThresholdReached;
};

class SchedulerCore {
 public:
  explicit SchedulerCore(SchedulerOptions options);

  // Checks that a request could ever run: a non-empty prompt that leaves room
  // for one generated token in the context and in the KV pool.
  absl::Status Admissible(const Request& request) const;

  // REQUIRES: Admissible(request).ok() and a fresh sequence id.
  void Add(uint64_t sequence_id, Request request);

  // Ends a sequence wherever it is (unknown ids are ignored: it may have
  // finished already); one in flight ends when its step's results arrive.
  void Cancel(uint64_t sequence_id, FinishReason reason, absl::Status why);
  // Ends every sequence (those in flight when their steps return).
  void CancelAll(FinishReason reason, const absl::Status& why);

  // Cancels every sequence whose deadline is at or before `now`.
  void ExpireDeadlines(absl::Time now);
  absl::Time NextDeadline() const;

  // The lane's next step, of at most `token_budget` tokens (0:
  // max_batched_tokens); empty when it has nothing to run. The plan's
  // sequences are in flight until Update(lane, ...).
  step::StepPlan Schedule(Lane lane, int32_t token_budget = 0);

  // --- the SLO policy's view (scheduler/step_dispatcher.h) ---
  // The least TPOT slack of the lane's decoding sequences that are not in
  // flight, in ms (+infinity when there are none). A stream's next token is
  // due by the earlier of
  //   first token + kSloMargin * tpot * (tokens generated)   (its mean), and
  //   last token + kSloMargin * tpot * slo_max_gap           (no long stalls),
  // so a stream behind its mean catches up, and one ahead of it spends its
  // lead on prompts, but not as one long stall. `relaxed`: the deadline its
  // whole budget allows, first token + tpot * (tokens generated), without
  // the margin and the stall bound (when prompts are pressed for their
  // TTFT, streams give them what they have to spare).
  // `in_flight_too`: also the sequences whose step runs (for load reports).
  double LeastSlackMs(Lane lane, absl::Time now, bool relaxed = false,
                      bool in_flight_too = false) const;
  // The tightest TPOT budget of the lane's decoding sequences, in ms
  // (+infinity when none).
  double LeastTpotMs(Lane lane) const;
  // The lane's decoding sequences that are not in flight, as a decode step.
  StepShape DecodeStepShape(Lane lane) const;
  // The load path decisions see (scheduler/slo_path.h).
  PathLoad PathLoadNow() const { return PathLoadWithout(nullptr); }
  // Prompt tokens arriving per ms: those of the recent arrivals after the
  // first of them, over the time from it to `now` (0 until a few arrived),
  // less each one's prefix cached when it arrived (no compute).
  double PromptArrivalsPerMs(absl::Time now) const;
  // Prompt tokens admitted but not yet computed.
  int64_t running_prompt_tokens() const;
  // The prompts most pressed for their first token: the earliest TTFT
  // deadline after `now` of a request without one (ms from `now`), and the
  // prompt tokens still to compute of the requests due by then, those past
  // their deadline included (they go first: earliest deadline first).
  // Prompts already past their deadline cannot be saved, so they do not hide
  // the ones behind them that can. nullopt: none waits with a deadline ahead.
  struct PromptPressure {
    double deadline_ms = 0;
    int64_t tokens = 0;
  };
  std::optional<PromptPressure> EarliestPrompt(absl::Time now) const;
  // What every SLO decision predicts step times with; the Scheduler feeds it
  // the steps that ran (StepDispatcher::OnEnd).
  const StepTimeModel& time_model() const { return time_model_; }
  StepTimeModel& mutable_time_model() { return time_model_; }
  // Remote decode under the SLO policy: the decode daemons' load (GetLoad):
  // their decoding streams, and the least slack one reported (ms; nullopt:
  // none streams). A handoff that the peer's slack could not absorb stays here.
  void SetPeerLoad(int32_t decoding, std::optional<double> least_slack_ms);
  // Applies a lane's step results: computed tokens, sampled tokens, stops,
  // handoffs, and cancellations that waited for the step.
  void Update(Lane lane, const step::StepPlan& plan, const step::StepResult& result);

  // --- remote decode, the prefill daemon's side (see the file comment) ---
  // Requests handed off since the last call, to send to decode daemons.
  std::vector<HandoffOffer> TakeOffers();
  // Remote requests that ended here since the last call, to abort there.
  std::vector<uint64_t> TakeRemoteAborts();
  // Called with a remote request's id whenever its lease ends (committed,
  // expired, resumed here, or the request ended), before its blocks can go
  // to anything else (RemoteDecodeLink::LeaseEnded).
  void SetLeaseEndHook(std::function<void(uint64_t)> hook) { on_lease_end_ = std::move(hook); }
  // Whether the remote request still holds its blocks under its offer's
  // lease (false once it was read, expired, resumed here or ended).
  bool LeaseHeld(uint64_t sequence_id) const;
  // The decode daemon has read the request's pages: releases them and
  // returns true, unless the lease already expired (or the request ended).
  bool CommitLease(uint64_t sequence_id);
  // Tokens the decode daemon generated, in order, with their log-probabilities
  // when the request asked for them (empty otherwise).
  void OnRemoteTokens(uint64_t sequence_id, std::span<const TokenId> tokens,
                      std::span<const step::TokenLogprobs> logprobs);
  // The decode daemon finished the request by itself (kStop or kLength).
  void FinishRemote(uint64_t sequence_id, FinishReason reason, int32_t drafted, int32_t accepted);
  // The decode daemon failed the request: it continues here.
  void ResumeLocally(uint64_t sequence_id);

  // --- remote decode, the decode daemon's side ---
  // Registers the request with blocks for its tokens' KV and returns its
  // block table (where the transfer writes); RESOURCE_EXHAUSTED when the
  // pool is short, INVALID_ARGUMENT when it could not run here.
  absl::StatusOr<std::vector<int32_t>> Import(uint64_t sequence_id, ImportedRequest imported);
  // The transfer into an imported request's blocks ended: decoding starts
  // when it succeeded, else the request ends with `status` (kError). A
  // cancellation that arrived meanwhile takes effect now.
  void CompleteImport(uint64_t sequence_id, const absl::Status& status);
  // --- separate KV storages for the two lanes (decode_kv_blocks) ---
  // Page copies handoffs need since the last call, to run in order.
  std::vector<BlockMove> TakeMoves();
  // A move ended: the sequence decodes on the decode lane from the copied
  // pages, or, when it failed, goes on from its prefill-lane pages (it stays
  // there). A cancellation that came meanwhile takes effect now.
  void CompleteMove(uint64_t sequence_id, const absl::Status& status);

  // Shutting down: ends every import still waiting for its pages and every
  // sequence whose pages are moving now (with `why`, as cancelled) instead of
  // when their transfers end; nothing will use their blocks again.
  void AbandonTransfers(const absl::Status& why);

  bool has_decode_lane() const { return options_.decode_lane; }
  int32_t max_batched_tokens() const { return options_.max_batched_tokens; }
  int32_t min_prompt_chunk() const {
    return std::min(options_.min_prompt_chunk, options_.max_batched_tokens);
  }
  bool HasWork() const;
  int32_t waiting() const { return static_cast<int32_t>(waiting_.size()); }
  // Tokens of the waiting sequences (prompts, and what preempted ones had).
  int64_t waiting_tokens() const;
  int32_t running(Lane lane) const {
    return static_cast<int32_t>(running_[static_cast<size_t>(lane)].size());
  }
  // The KV pools together (one, or the prefill and decode lanes' own).
  int32_t free_blocks() const {
    return kv_.free_blocks() + (decode_kv_ ? decode_kv_->free_blocks() : 0);
  }
  int32_t total_blocks() const {
    return kv_.total_blocks() + (decode_kv_ ? decode_kv_->total_blocks() : 0);
  }
  kvcache::KvCacheStats kv_stats() const;
  // The prefix index's events since the last call (options.on_kv_events),
  // or with `snapshot` the whole index instead.
  std::vector<kvcache::KvEvent> TakeKvEvents(bool snapshot) {
    return snapshot ? kv_.SnapshotEvents() : kv_.TakeEvents();
  }
  int32_t remote() const { return static_cast<int32_t>(remote_.size()); }
  int64_t preemptions() const { return preemptions_; }
  int64_t handoffs() const { return handoffs_; }
  int64_t lease_expirations() const { return lease_expirations_; }

 private:
  struct Sequence {
    uint64_t id = 0;
    Request request;
    std::vector<TokenId> tokens;  // prompt, then generated tokens
    int32_t computed = 0;         // tokens whose KV is in its blocks
    int32_t generated = 0;
    int32_t cached_prompt_tokens = -1;  // prefix-cache hit at first admission
    Lane lane = Lane::kPrefill;
    bool queued = true;  // in waiting_: not yet admitted, or preempted
    bool in_flight = false;
    std::optional<std::pair<FinishReason, absl::Status>> pending_cancel;
    AdmissionDecision decision;
    bool handed_off = false;
    bool ever_handed_off = false;  // decoded on the decode lane at some point (the SLO
                                   // policy may move it back)
    Timeline timeline;
    step::Proposer proposer = step::Proposer::kNone;  // its speculation (kNone: off)
    AcceptanceEstimate acceptance;
    // Its copying proposer's copy, as its last verification on copy_lane
    // left it: the tokens the copy will have agreed with when that lane's
    // proposer drafts next (0: none known: no copy, a rejection or the
    // copy left by the sampled token, or a step without drafts since), and
    // where it copies from. Its drafts there are then priced by
    // copy_acceptance_.
    int32_t copy_agreed = 0;
    step::DraftSource copy_source = step::DraftSource::kRequest;
    Lane copy_lane = Lane::kPrefill;
    int32_t drafted = 0;  // drafted tokens verified, over its life
    int32_t accepted = 0;
    // Remote decode: in remote_ (handed to a decode daemon); its blocks held
    // under a lease until lease_deadline; it came back after a failure (it
    // stays here from then on); decoded by a peer or taken from one.
    bool remote = false;
    bool lease_held = false;
    absl::Time lease_deadline = absl::InfiniteFuture();
    bool remote_failed = false;
    bool remote_path = false;
    // Separate storages: a failed page move keeps it on the prefill lane.
    bool move_failed = false;
    // The SLO policy: when its last token came, and the generated length at
    // which its path is weighed again (it doubles each time).
    absl::Time last_token = absl::InfinitePast();
    int32_t next_path_check = 1;
  };
  using SequencePtr = std::unique_ptr<Sequence>;
  using RunningList = std::list<SequencePtr>;

  RunningList& running_of(Lane lane) { return running_[static_cast<size_t>(lane)]; }
  bool Admits(Lane lane) const;
  int64_t EffectivePriority(const Sequence& seq, absl::Time now) const;
  // Admits a waiting sequence with up to `budget` tokens of work, reusing its
  // cached prefix; returns the tokens to run, or 0 (and no change) when its
  // blocks do not fit.
  int32_t Admit(Sequence& seq, int32_t budget);
  // The running sequence of `lane` to preempt for `needy`: not planned, not
  // in flight, lowest effective priority, then most recently admitted.
  RunningList::iterator PickVictim(Lane lane, const Sequence& needy,
                                   const absl::flat_hash_set<uint64_t>& planned, absl::Time now);
  void Preempt(RunningList& list, RunningList::iterator it);
  void MaybeHandOff(Sequence& seq);
  // PathLoadNow, with `deciding` (the stream whose path is weighed) left out
  // of the lanes' tightest budgets (colocated_tpot_ms, lane_tpot_ms).
  PathLoad PathLoadWithout(const Sequence* deciding) const;
  // The SLO policy: at a decoding sequence's first token and each time its
  // length doubles, whether it is better on the decode lane (or a decode
  // daemon) than colocated; nullopt between those points.
  std::optional<bool> SloPrefersDecodeLane(Sequence& seq);
  // The SLO policy: a stream on the decode lane that colocated steps would
  // now serve within its budget (the prompts grew, the lane's share starves
  // them) goes back to the prefill lane; one pool only.
  void MaybeReturn(Sequence& seq);
  // The daemon's budget for the fields a request left unset.
  void FillBudget(Request& request) const;
  // Its next token's deadline against its TPOT budget (see LeastSlackMs).
  absl::Time TokenDeadline(const Sequence& seq, bool relaxed = false) const;
  static bool Decoding(const Sequence& seq) {
    return !seq.queued && seq.computed == static_cast<int32_t>(seq.tokens.size()) - 1;
  }
  // Moves a running prefill-lane sequence to remote_ and queues its offer.
  void OfferRemote(RunningList::iterator it);
  Sequence* FindRemote(uint64_t id);
  // Every list a sequence can be in.
  std::array<std::list<SequencePtr>*, 6> AllLists() {
    return {&waiting_, &running_[0], &running_[1], &remote_, &importing_, &moving_};
  }
  std::array<const std::list<SequencePtr>*, 6> AllLists() const {
    return {&waiting_, &running_[0], &running_[1], &remote_, &importing_, &moving_};
  }
  // The pool a lane's sequences keep their KV in.
  kvcache::KvCacheManager& Kv(Lane lane) {
    return lane == Lane::kDecode && decode_kv_ ? *decode_kv_ : kv_;
  }
  const kvcache::KvCacheManager& Kv(Lane lane) const {
    return lane == Lane::kDecode && decode_kv_ ? *decode_kv_ : kv_;
  }
  // Drops the sequence's blocks in every pool (exactly once per pool).
  // Clears `seq`'s lease, after the hook (SetLeaseEndHook) has run.
  void EndLease(Sequence& seq) {
    if (!seq.lease_held) return;
    if (on_lease_end_) on_lease_end_(seq.id);
    seq.lease_held = false;
  }
  void ReleaseBlocks(uint64_t id) {
    kv_.Release(id);
    if (decode_kv_) decode_kv_->Release(id);
  }
  // Separate storages: reserves the decode lane's blocks for a running
  // prefill-lane sequence and queues the page move; false (no change) when
  // the decode pool is short.
  bool StartMove(RunningList::iterator it);
  // Gives the decode steps of `lane`'s plan their drafts (speculative
  // decoding), within `budget` tokens; returns the tokens used.
  int32_t PlanDrafts(Lane lane, step::StepPlan& plan, int32_t budget);
  void Finish(SequencePtr seq, FinishReason reason, absl::Status why);
  static Stage StageOf(const Sequence& seq);
  step::SequenceStep MakeStep(const Sequence& seq, int32_t count) const;
  // Finds a waiting or running sequence.
  Sequence* Find(uint64_t id);
  // Finds a sequence running in `lane`, or null.
  Sequence* FindRunning(Lane lane, uint64_t id);
  // Removes and returns a sequence that is not in flight.
  SequencePtr Take(uint64_t id);

  SchedulerOptions options_;
  kvcache::KvCacheManager kv_;                        // the prefill lane's (or the only) pool
  std::optional<kvcache::KvCacheManager> decode_kv_;  // decode_kv_blocks > 0
  DisaggregationPolicy policy_;
  std::list<SequencePtr> waiting_;  // arrival order; admission picks by priority
  std::array<RunningList, kLanes> running_;
  std::list<SequencePtr> remote_;     // decoding on other daemons (remote_decode)
  std::list<SequencePtr> importing_;  // imported, their pages still arriving (in flight)
  std::list<SequencePtr> moving_;     // pages being copied to the decode lane (in flight)
  std::vector<BlockMove> moves_;
  std::vector<HandoffOffer> offers_;
  std::vector<uint64_t> remote_aborts_;
  StepTimeModel time_model_;
  // The draft policy's (PlanDrafts): the same formula and row curve, kept at
  // the start-up measurement. Its choices depend only on ratios of step
  // times, which a uniform change of the machine's speed (what the fit
  // tracks) leaves as they are, while the fit's split between the fixed and
  // per-row terms, identified from differences of a few percent between
  // steps of 1 and 2 rows under step-time noise of 15-30% on a shared
  // machine, swung from 0 to 2.5 ms a row within one run (measured with
  // tandem-spec-bench): at 0, drafts look free.
  StepTimeModel draft_time_model_;
  // Acceptance by copy source and agreement length, from every sequence's
  // verifications (PlanDrafts prices continuing copies by it).
  CopyAcceptance copy_acceptance_;
  // The last arrivals (when, prompt tokens not cached then), for the
  // prompt arrival rate.
  std::deque<std::pair<absl::Time, int64_t>> recent_arrivals_;
  int32_t peer_decoding_ = 0;
  std::optional<double> peer_slack_ms_;
  int64_t preemptions_ = 0;
  int64_t handoffs_ = 0;
  int64_t lease_expirations_ = 0;
  std::function<void(uint64_t)> on_lease_end_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SCHEDULER_CORE_H_
