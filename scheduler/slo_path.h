// Which path a request's decode steps take under the SLO policy: colocated
// (riding in the prefill lane's steps) or disaggregated (the decode lane, or
// a decode daemon), from forecasts of the step-time model and the load now.
//
// Per path P, for this stream (TPOT: the mean time per token of its whole
// output, what it has produced so far and its remaining tokens on P):
//   colocated      its tokens ride in mixed steps (prompt chunks sized to the
//                  streams' paced budget as the dispatcher sizes them, never
//                  below the least chunk) while the prompts waiting now last;
//                  after that, as prompts keep arriving, in mixed steps the
//                  share of the time the arriving prompts need and in decode
//                  steps otherwise; slowed by the share the decode lane takes.
//   disaggregated  a decode-lane step with this stream added, plus the step
//                  it sits out while moving spread over its remaining tokens.
//   load_P         the share of the compute the arriving prompts need (at
//                  full-size steps) plus the share the decode lane takes on
//                  P (its streams step about once per paced budget, the
//                  tightest of theirs and, moving, this stream's) plus,
//                  on one machine, the share the colocated streams' own
//                  steps take at their paced budget. A stream that moves
//                  costs the streams that stay: the decode lane's steps are
//                  a second pass over the weights beside theirs, so a move
//                  that would break their pace does not pay (with one fixed
//                  cost per step, two lanes of streams at one tight budget
//                  serve fewer tokens than one lane of all of them).
// It moves to the decode lane when colocated steps would not keep its paced
// TPOT (kSloMargin of the budget), the decode lane would, and the machine has
// the compute for it: load_disaggregated <= kMaxLoad. Otherwise it stays
// (and a stream on the decode lane goes back, within one KV pool). So a loose
// TPOT stays colocated (no extra pass over the weights per token), a tight
// one moves while the machine can afford the passes, and when the prompts
// need the compute the streams give it back rather than starve them.
//
// TTFT forecasts (the prompts waiting over the rate the prefill lane gains on
// them on P) and the headroom against the budgets are reported for each path
// (GetModelInfo, logs); the decision rests on the TPOT forecasts and the
// load, which are what a per-request choice can change.
//
// Thread safety: pure functions.
#ifndef TANDEM_SCHEDULER_SLO_PATH_H_
#define TANDEM_SCHEDULER_SLO_PATH_H_

#include <cstdint>
#include <limits>
#include <optional>

#include "scheduler/request.h"
#include "scheduler/step_time_model.h"

namespace tandem::scheduler {

// The share of a stream's TPOT budget the scheduler plans to use (the rest
// absorbs prediction error and start-up jitter).
inline constexpr double kSloMargin = 0.9;
// The most of the compute the arriving prompts, the decode lane and (on one
// shared compute pool) the colocated streams' steps may need together for a
// move to the decode lane.
inline constexpr double kMaxLoad = 0.9;

// The load a path decision sees (SchedulerCore::PathLoadNow; a decision
// leaves the stream it weighs out, SchedulerCore::PathLoadWithout).
struct PathLoad {
  int32_t colocated_decodes = 0;  // streams decoding on the prefill lane (this one not counted)
  int32_t lane_decodes = 0;       // streams on the decode lane (remote: the peer's)
  int64_t prompt_backlog = 0;     // prompt tokens not yet computed (other requests)
  double mean_context = 0;        // tokens, of the decoding streams
  int32_t max_chunk = 512;        // --max_batched_tokens
  int32_t min_chunk = 16;         // the least prompt chunk a step takes (no starvation)
  // The tightest TTFT budget of the requests waiting for their first token
  // (ms; 0: none wait).
  double queue_ttft_ms = 0;
  // Prompt tokens arriving per ms, over the last arrivals, less the prefixes
  // already cached when they arrived (SchedulerCore::PromptArrivalsPerMs).
  double prompt_arrivals_per_ms = 0;
  // The tightest TPOT budget of the colocated streams and of the decode
  // lane's (ms; +infinity: no other stream there, or a remote decode
  // daemon's, whose budgets this daemon does not see): the pace their steps
  // keep. The stream whose path is weighed is left out of both.
  double colocated_tpot_ms = std::numeric_limits<double>::infinity();
  double lane_tpot_ms = std::numeric_limits<double>::infinity();
  // The decode lane computes on the prefill lane's compute pool (not threads
  // of its own, nor a remote decode daemon): the colocated streams' steps
  // count in its load.
  bool shared_compute = true;
};

struct PathForecast {
  double ttft_ms = 0;   // the prompts waiting now, until their first tokens
  double tpot_ms = 0;   // this stream's mean over its whole output
  double load = 0;      // the share of the compute prompts and the two lanes' streams need
  double headroom = 0;  // min(1 - ttft / budget, 1 - tpot / budget)
};

struct PathChoice {
  PathForecast colocated;
  PathForecast disaggregated;
  bool disaggregate = false;
};

// What a stream has produced so far: `tokens` since its first (the first
// included), over `elapsed_ms` from the first to the last. Its TPOT is the
// mean over its whole output, so time it has banked counts.
struct StreamSoFar {
  int32_t tokens = 0;
  double elapsed_ms = 0;
};

// `prompt_tokens`: this request's prompt still to compute (0 once decoding);
// `context`: its length; `remaining_tokens`: the output it is expected to
// produce from now (at least 1).
PathChoice ChoosePath(const StepTimeModel& model, const PathLoad& load, const LatencyBudget& slo,
                      int64_t prompt_tokens, int64_t context, double remaining_tokens,
                      const StreamSoFar& so_far = {});

// The least output length, of 1, 2, 4, ... up to `max_tokens`, at which
// ChoosePath disaggregates a new stream of `context` tokens at this load
// (nullopt: none does): what GetModelInfo reports. (Not a threshold: a
// long output averages prompt stalls out, so it may colocate again.)
std::optional<int32_t> DisaggregationCrossover(const StepTimeModel& model, const PathLoad& load,
                                               const LatencyBudget& slo, int64_t context,
                                               int32_t max_tokens = 1 << 16);

// The decode step and the mixed step shapes the forecasts use.
StepShape DecodeShape(int32_t rows, double mean_context);
StepShape MixedShape(int32_t decode_rows, double mean_context, int64_t prompt_tokens);

// The largest prompt chunk in [min_chunk, max_chunk] whose mixed step with
// `decode_rows` decodes is predicted within `limit_ms` (min_chunk when none
// is).
int32_t ChunkWithin(const StepTimeModel& model, int32_t decode_rows, double mean_context,
                    int32_t min_chunk, int32_t max_chunk, double limit_ms);

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SLO_PATH_H_
