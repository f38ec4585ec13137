// The scheduling policy and state, single-threaded: admission, continuous
// batching with a token budget, chunked prefill, preemption, finishing.
//
// One rule drives everything: each sequence has tokens known (prompt plus
// generated) and tokens computed (their KV is in its blocks); a step runs
// some of the difference. Decodes are a difference of one, prompts are
// chunked to fit the budget, and a preempted sequence simply starts again
// from zero computed tokens. There is no "phase" flag.
//
// Per step: running sequences that need one token (decodes) are scheduled
// first, then running sequences still computing their prompt, then waiting
// sequences in arrival order while the budget, the running cap and the KV
// pool allow. Admission looks up the prefix cache: cached prompt tokens count
// as computed and are not run again. A running sequence that cannot get a
// block preempts the most recently admitted sequence not yet in this step's
// plan (or itself).
//
// Thread safety: none; owned by the Scheduler thread (or a test).
#ifndef TANDEM_SCHEDULER_SCHEDULER_CORE_H_
#define TANDEM_SCHEDULER_SCHEDULER_CORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/step/step_plan.h"
#include "kvcache/kv_cache_manager.h"
#include "scheduler/request.h"

namespace tandem::scheduler {

struct SchedulerOptions {
  int32_t max_batched_tokens = 512;  // tokens per step, all sequences together
  int32_t max_running = 64;          // sequences in the running batch
  int32_t block_size = 16;           // tokens per KV block
  int32_t kv_blocks = 1024;          // KV blocks in the pool
  int32_t context_length = 2048;     // positions per sequence
  bool prefix_caching = true;        // reuse cached KV blocks of equal prefixes
  std::function<absl::Time()> clock = [] { return absl::Now(); };
};

class SchedulerCore {
 public:
  explicit SchedulerCore(SchedulerOptions options);

  // Checks that a request could ever run: a non-empty prompt that leaves room
  // for one generated token in the context and in the KV pool.
  absl::Status Admissible(const Request& request) const;

  // REQUIRES: Admissible(request).ok() and a fresh sequence id.
  void Add(uint64_t sequence_id, Request request);

  // Ends a waiting or running sequence (unknown ids are ignored: it may have
  // finished already). Frees its blocks and tells its sink.
  void Cancel(uint64_t sequence_id, FinishReason reason, absl::Status why);

  // Ends every sequence.
  void CancelAll(FinishReason reason, const absl::Status& why);

  // Cancels every sequence whose deadline is at or before `now`.
  void ExpireDeadlines(absl::Time now);
  absl::Time NextDeadline() const;

  // The next step's work; empty when there is nothing to run.
  step::StepPlan Schedule();
  // Applies a step's results: computed tokens, sampled tokens, stops.
  void Update(const step::StepPlan& plan, const step::StepResult& result);

  bool HasWork() const { return !waiting_.empty() || !running_.empty(); }
  int32_t waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t running() const { return static_cast<int32_t>(running_.size()); }
  int32_t free_blocks() const { return kv_.free_blocks(); }
  int32_t total_blocks() const { return kv_.total_blocks(); }
  kvcache::KvCacheStats kv_stats() const { return kv_.stats(); }
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Sequence {
    uint64_t id = 0;
    Request request;
    std::vector<TokenId> tokens;  // prompt, then generated tokens
    int32_t computed = 0;         // tokens whose KV is in its blocks
    int32_t generated = 0;
    int32_t cached_prompt_tokens = -1;  // prefix-cache hit at first admission
    Timeline timeline;
  };
  using SequencePtr = std::unique_ptr<Sequence>;

  // Admits a waiting sequence with up to `budget` tokens of work, reusing its
  // cached prefix; returns the tokens to run, or 0 (and no change) when its
  // blocks do not fit.
  int32_t Admit(Sequence& seq, int32_t budget);
  void Preempt(Sequence& seq);
  void Finish(SequencePtr seq, FinishReason reason, absl::Status why);
  step::SequenceStep MakeStep(const Sequence& seq, int32_t count) const;
  Sequence* FindRunning(uint64_t id);

  SchedulerOptions options_;
  kvcache::KvCacheManager kv_;
  std::deque<SequencePtr> waiting_;  // admission order (preempted ones go first)
  std::list<SequencePtr> running_;   // admission order
  int64_t preemptions_ = 0;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SCHEDULER_CORE_H_
