// What the front end hands the scheduler, and how results flow back.
#ifndef TANDEM_SCHEDULER_REQUEST_H_
#define TANDEM_SCHEDULER_REQUEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "engine/step/step_plan.h"

namespace tandem::scheduler {

using step::TokenId;

enum class FinishReason {
  kStop,       // a stop token, EOS or stop string
  kLength,     // max_tokens, the context length or the KV capacity reached
  kCancelled,  // the client cancelled, disconnected, or its deadline passed
  kError,      // the worker failed; `error` says why
};

// "stop", "length", "cancelled", "error": for logs and metric labels.
inline std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

// Where a request's decode steps ran.
enum class Path : uint8_t {
  kColocated,      // on the prefill worker, in its mixed batches
  kDisaggregated,  // handed to a decode worker after its prefill
  kRemote,         // decoded by another daemon (on the entering daemon: handed to a decode
                   // daemon; on the decode daemon: taken over from a prefill daemon)
};

// Why the request took its path.
enum class PathReason : uint8_t {
  kDisaggregationOff,   // colocated: disaggregation is off (or no decode worker)
  kBelowThreshold,      // colocated: max_tokens is below the threshold, or it ended first
  kThresholdReached,    // disaggregated: its output reached the threshold
  kExpectedOutputHint,  // disaggregated after prefill: the client's expected_output_tokens
  kWorkloadEstimate,    // disaggregated after prefill: its workload's learned output length
  kMaxTokens,           // disaggregated after prefill: max_tokens (the operator opted in)
  kSloHeadroom,         // either path: the SLO policy predicted more headroom on it
};

// A request's latency budget (its SLOs): time to first token, and the mean
// time per output token after the first (TPOT; what `tandem bench` calls the
// mean inter-token latency). Zero: not set (the daemon's --slo_ttft and
// --slo_tpot apply).
struct LatencyBudget {
  absl::Duration ttft;
  absl::Duration tpot;
};
// The largest budget a request or a flag may give (a bound on how long an
// earliest-deadline-first queue may pass a request over).
inline absl::Duration MaxLatencyBudget() { return absl::Hours(1); }

// Where a request was when it ended. The interesting case is a request that
// did not end by itself (cancelled, deadline, error): which stage it left.
enum class Stage : uint8_t {
  kQueued,   // waiting for admission (never admitted, or preempted and waiting again)
  kPrefill,  // admitted, its prompt (or a recomputation) not yet all computed
  kHandoff,  // handed to the decode worker, before its first step there
  kDecode,   // generating
};

std::string_view PathName(Path path);
// "queued", "prefill", "handoff", "decode": for logs and metric labels.
std::string_view StageName(Stage stage);
// "none", "ngram", "suffix", "draft": for logs and metric labels.
std::string_view ProposerName(step::Proposer proposer);
// "request", "global", "model": for metric labels.
std::string_view DraftSourceName(step::DraftSource source);
std::string_view PathReasonName(PathReason reason);

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;
  // Speculative decoding: tokens drafted for the request and verified, and
  // how many of them the target accepted.
  int32_t drafted_tokens = 0;
  int32_t accepted_tokens = 0;
};

// The request's life, stamped by the scheduler. Unset stamps stay
// absl::InfinitePast() (e.g. no first token for a request cancelled while
// queued).
struct Timeline {
  absl::Time arrival = absl::InfinitePast();
  absl::Time scheduled = absl::InfinitePast();  // first admitted to a batch
  absl::Time first_token = absl::InfinitePast();
  absl::Time handoff_start = absl::InfinitePast();  // handed to the decode worker
  absl::Time handoff_end = absl::InfinitePast();    // its first decode-worker step began
  // Remote decode: from offering the KV pages to a decode daemon until it
  // had read them all (the prefill side's lease released).
  absl::Time kv_transfer_start = absl::InfinitePast();
  absl::Time kv_transfer_end = absl::InfinitePast();
  absl::Time finished = absl::InfinitePast();
};

struct FinishInfo {
  FinishReason reason = FinishReason::kStop;
  absl::Status error;  // for kError, and for kCancelled by deadline
  Usage usage;
  Timeline timeline;
  Path path = Path::kColocated;
  PathReason path_reason = PathReason::kDisaggregationOff;
  Stage stage = Stage::kDecode;  // where it was when it ended
  LatencyBudget slo;             // the budget it was scheduled by
};

// Receives one request's output. Called only on the scheduler thread, in
// order; implementations must not block (they hand data to other threads).
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  // A generated token. `is_stop_token` is true for the EOS or stop token id
  // that ends the request (it counts as generated; front ends usually show
  // no text for it). `logprobs` is set when the request asked for them.
  // Returns true to end the request after this token with FinishReason::kStop
  // (a stop string matched).
  virtual bool OnToken(TokenId token, bool is_stop_token, const step::TokenLogprobs* logprobs) = 0;
  // Called exactly once, after every OnToken.
  virtual void OnFinish(const FinishInfo& info) = 0;
};

struct Request {
  std::string id;  // for logs; the scheduler uses its own sequence ids
  std::vector<TokenId> prompt;
  step::SamplingParams sampling;
  int32_t max_tokens = 1;               // generated tokens, at most
  std::vector<TokenId> stop_token_ids;  // end generation (EOS included unless ignored)
  absl::Time deadline = absl::InfiniteFuture();
  // When the RPC arrived, if the front end knows: the request's timeline
  // (queue time, TTFT, end-to-end) starts here, so it includes tokenization
  // and the hand-off to the scheduler thread. Unset: when the scheduler
  // takes the request in.
  absl::Time received = absl::InfinitePast();
  // Requests share cached KV blocks only with requests of the same salt (one
  // per tenant, say), so a tenant cannot learn another's prompts from timing.
  std::string cache_salt;
  // Larger runs first; equal priorities run in arrival order. Waiting raises
  // a request's effective priority over time (no starvation).
  int32_t priority = 0;
  // A tag for requests of one kind ("chat", "code-edit"): the scheduler
  // learns each tag's output length to decide disaggregation up front.
  std::string workload;
  // The client's guess of the output length; 0 when unknown.
  int32_t expected_output_tokens = 0;
  // Alternatives per token to report with log-probabilities; 0: none.
  int32_t logprobs = 0;
  // Opt out of speculative decoding (the output is the same either way;
  // this trades the speed-up for steadier per-token timing).
  bool disable_speculation = false;
  // Its SLOs; unset fields take the daemon's (SchedulerOptions::slo).
  LatencyBudget slo;
  // Structured output: the grammar the answer's tokens must follow (null:
  // free text). Its stop tokens are among stop_token_ids.
  std::shared_ptr<grammar::GrammarState> grammar;
  std::shared_ptr<RequestSink> sink;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_REQUEST_H_
