#include "scheduler/slo_path.h"

#include <algorithm>
#include <cmath>

namespace tandem::scheduler {
namespace {

// The most of the compute one lane's streams are taken to hold: beyond it a
// forecast would divide by nearly nothing.
constexpr double kMaxShare = 0.95;
// The least rate a forecast credits the prefill lane with gaining on its
// queue, as a share of its rate: a queue that never drains gets a forecast
// far past any budget, not an infinity.
constexpr double kMinDrain = 0.02;

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

double Headroom(double ttft_ms, double ttft_budget_ms, double tpot_ms, double tpot_budget_ms) {
  double least = 1.0 - tpot_ms / tpot_budget_ms;
  if (ttft_budget_ms > 0) least = std::min(least, 1.0 - ttft_ms / ttft_budget_ms);
  return least;
}

}  // namespace

StepShape DecodeShape(int32_t rows, double mean_context) {
  StepShape shape;
  shape.tokens = rows;
  shape.reads = static_cast<double>(rows) * (mean_context + 1.0);
  return shape;
}

StepShape MixedShape(int32_t decode_rows, double mean_context, int64_t prompt_tokens) {
  StepShape shape = DecodeShape(decode_rows, mean_context);
  shape.AddRows(0, prompt_tokens);
  return shape;
}

int32_t ChunkWithin(const StepTimeModel& model, int32_t decode_rows, double mean_context,
                    int32_t min_chunk, int32_t max_chunk, double limit_ms) {
  min_chunk = std::max(1, std::min(min_chunk, max_chunk));
  if (model.PredictMs(MixedShape(decode_rows, mean_context, min_chunk)) > limit_ms) {
    return min_chunk;
  }
  // The predicted time grows with the chunk (coefficients >= 0): bisect.
  int32_t lo = min_chunk, hi = max_chunk;
  while (lo < hi) {
    const int32_t mid = lo + (hi - lo + 1) / 2;
    if (model.PredictMs(MixedShape(decode_rows, mean_context, mid)) <= limit_ms) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

PathChoice ChoosePath(const StepTimeModel& model, const PathLoad& load, const LatencyBudget& slo,
                      int64_t prompt_tokens, int64_t context, double remaining_tokens,
                      const StreamSoFar& so_far) {
  const double pace = kSloMargin * Ms(slo.tpot);
  const int32_t streams = load.colocated_decodes + load.lane_decodes;
  const double ctx = (load.mean_context * streams + static_cast<double>(context)) / (streams + 1.0);
  // The share of the compute `n` decoding streams take: a step of theirs
  // about once per paced interval of the tightest budget among them
  // (`tpot_ms` of the others; `with_this`: this stream among them).
  auto share_at = [&](int32_t n, double tpot_ms, bool with_this) {
    if (n <= 0) return 0.0;
    const double theirs = kSloMargin * tpot_ms;
    const double at = with_this ? std::min(pace, theirs) : theirs;
    return std::min(kMaxShare, model.PredictMs(DecodeShape(n, ctx)) / at);
  };
  // The decode lane's share. A remote lane's budgets are not known here
  // (+infinity): its streams are taken to keep this stream's pace.
  auto lane_share = [&](int32_t n, bool with_this) {
    const bool known = std::isfinite(load.lane_tpot_ms);
    return share_at(n, known ? load.lane_tpot_ms : Ms(slo.tpot), with_this || !known);
  };
  // The share the colocated streams' own steps take of the same compute
  // (on one shared pool only): paced steps are sized to their interval,
  // prompts or not. (The prompts' share above counts full-size steps, so
  // their fixed cost is counted twice here: it errs towards staying.)
  auto colocated_share = [&](int32_t n, bool with_this) {
    return load.shared_compute ? share_at(n, load.colocated_tpot_ms, with_this) : 0.0;
  };
  // The share the arriving prompts need, at full-size steps.
  const double full_rate =
      static_cast<double>(load.max_chunk) / model.PredictMs(MixedShape(0, ctx, load.max_chunk));
  const double prompt_share = load.prompt_arrivals_per_ms / full_rate;
  // The prefill lane's prompt rate (tokens per ms) with `decodes` colocated
  // streams riding along and `share` of the compute taken by the decode lane,
  // less the arrivals (what it gains on its queue).
  auto drain_rate = [&](int32_t decodes, double share) {
    const int32_t chunk =
        decodes > 0 ? ChunkWithin(model, decodes, ctx, load.min_chunk, load.max_chunk, pace)
                    : load.max_chunk;
    const double rate = static_cast<double>(chunk) /
                        model.PredictMs(MixedShape(decodes, ctx, chunk)) * (1.0 - share);
    return std::max(rate - load.prompt_arrivals_per_ms, kMinDrain * rate);
  };
  const double tokens = std::max(1.0, remaining_tokens);
  // The mean over the whole output, from `per_token` ms for the remaining.
  auto whole = [&](double per_token) {
    const double intervals = std::max(0, so_far.tokens - 1) + tokens;
    return (so_far.elapsed_ms + per_token * tokens) / intervals;
  };
  const int64_t prompts = load.prompt_backlog + prompt_tokens;
  const double ttft_budget = prompt_tokens > 0 ? Ms(slo.ttft) : load.queue_ttft_ms;
  const double tpot_budget = Ms(slo.tpot);
  PathChoice choice;

  // Colocated: this stream's tokens ride in the prefill lane's steps: mixed
  // steps (chunks sized to the budget, never below min_chunk) while the
  // prompts waiting now last, then, as prompts keep arriving, mixed steps a
  // prompt_share of the time and decode steps otherwise.
  {
    const int32_t decodes = load.colocated_decodes + 1;
    const double share = lane_share(load.lane_decodes, false);
    PathForecast& f = choice.colocated;
    // Chunks sized so that a step, slowed by the decode lane's share, keeps
    // the pace (as the dispatcher sizes them from the slack it sees).
    const int32_t chunk =
        ChunkWithin(model, decodes, ctx, load.min_chunk, load.max_chunk, pace * (1.0 - share));
    const double mixed = model.PredictMs(MixedShape(decodes, ctx, chunk));
    const double decode = model.PredictMs(DecodeShape(decodes, ctx));
    const double busy = std::min(1.0, prompt_share);
    const double steady = 1.0 / (busy / mixed + (1.0 - busy) / decode);
    const double riding = std::min(tokens, std::ceil(static_cast<double>(prompts) / chunk));
    f.tpot_ms = whole((riding * mixed + (tokens - riding) * steady) / tokens / (1.0 - share));
    if (prompts > 0) f.ttft_ms = static_cast<double>(prompts) / drain_rate(decodes, share);
    f.load = prompt_share + share + colocated_share(decodes, true);
    f.headroom = Headroom(f.ttft_ms, ttft_budget, f.tpot_ms, tpot_budget);
  }
  // Disaggregated: the decode lane's steps gain a row and take their share;
  // the move costs a step sat out, spread over the remaining tokens.
  {
    const double share = lane_share(load.lane_decodes + 1, true);
    PathForecast& f = choice.disaggregated;
    const double step = model.PredictMs(DecodeShape(load.lane_decodes + 1, ctx));
    f.tpot_ms = whole(step * (1.0 + 1.0 / tokens));
    if (prompts > 0) {
      f.ttft_ms = static_cast<double>(prompts) / drain_rate(load.colocated_decodes, share);
    }
    f.load = prompt_share + share + colocated_share(load.colocated_decodes, false);
    f.headroom = Headroom(f.ttft_ms, ttft_budget, f.tpot_ms, tpot_budget);
  }
  // Moving exists to keep a TPOT that colocated steps cannot, and only
  // pays when the machine has the compute for the decode lane's extra
  // passes beside the prompts arriving.
  choice.disaggregate = choice.colocated.tpot_ms > pace && choice.disaggregated.tpot_ms <= pace &&
                        choice.disaggregated.load <= kMaxLoad;
  return choice;
}

std::optional<int32_t> DisaggregationCrossover(const StepTimeModel& model, const PathLoad& load,
                                               const LatencyBudget& slo, int64_t context,
                                               int32_t max_tokens) {
  // Not monotonic in the length (a long output averages prompt stalls out),
  // so scanned at doubling lengths.
  for (int32_t tokens = 1; tokens <= max_tokens; tokens *= 2) {
    if (ChoosePath(model, load, slo, 0, context, tokens).disaggregate) return tokens;
    if (tokens > max_tokens / 2) break;
  }
  return std::nullopt;
}

}  // namespace tandem::scheduler
