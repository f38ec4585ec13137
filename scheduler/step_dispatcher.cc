#include "scheduler/step_dispatcher.h"

#include <algorithm>
#include <cmath>

#include "scheduler/slo_path.h"

namespace tandem::scheduler {

StepDispatcher::StepDispatcher(DispatchOptions options, SchedulerCore* core)
    : options_(options), core_(core), pacer_(options.pacing) {}

bool StepDispatcher::PromptsPressed(absl::Time now, double decode_share) const {
  const std::optional<SchedulerCore::PromptPressure> p = core_->EarliestPrompt(now);
  if (!p.has_value() || p->deadline_ms <= 0 || decode_share <= 0) return false;
  const int32_t chunk = core_->max_batched_tokens();
  const double full_ms = std::ceil(static_cast<double>(p->tokens) / chunk) *
                         core_->time_model().PredictMs(MixedShape(0, 0, chunk));
  // Pressed: they make their deadline with all the compute, not with the
  // share the decode lane takes.
  return full_ms <= p->deadline_ms &&
         full_ms / (1.0 - std::min(decode_share, 0.95)) > p->deadline_ms;
}

bool StepDispatcher::DecodeDue(absl::Time now) {
  const double strict = core_->LeastSlackMs(Lane::kDecode, now);
  if (std::isinf(strict)) return true;  // nothing decoding: imports, nothing to pace
  const double step = core_->time_model().PredictMs(core_->DecodeStepShape(Lane::kDecode));
  const double share = step / (kSloMargin * core_->LeastTpotMs(Lane::kDecode));
  const double slack =
      PromptsPressed(now, share) ? core_->LeastSlackMs(Lane::kDecode, now, true) : strict;
  const double lead = 1.25 * step + absl::ToDoubleMilliseconds(options_.start_latency);
  if (slack <= lead) return true;
  wake_ = now + absl::Microseconds(static_cast<int64_t>((slack - lead) * 1000.0));
  return false;
}

int32_t StepDispatcher::PromptStepBudget(absl::Time now) const {
  const double slack = core_->LeastSlackMs(Lane::kPrefill, now);
  const int32_t max_tokens = core_->max_batched_tokens();
  if (std::isinf(slack)) return max_tokens;
  const StepShape decodes = core_->DecodeStepShape(Lane::kPrefill);
  const auto rows = static_cast<int32_t>(decodes.tokens);
  if (rows >= max_tokens) return max_tokens;
  const double mean_context = rows > 0 ? decodes.reads / rows - 1.0 : 0.0;
  const StepTimeModel& model = core_->time_model();
  const double limit = slack - absl::ToDoubleMilliseconds(options_.start_latency);
  int32_t chunk =
      ChunkWithin(model, rows, mean_context, core_->min_prompt_chunk(), max_tokens - rows, limit);
  // When not even a step with the least chunk fits within the streams'
  // least slack (an overloaded machine: many streams of a large model),
  // ChunkWithin answers the least chunk: each larger one would only
  // lengthen every stream's stall (the inter-token tail), for prompts that
  // the rule below serves when their TTFT needs it.
  // The prompts due first (of those that can still make their TTFT) would
  // miss it at this size but make it at full size: they are the more
  // pressed, and get full steps. Prompts that miss it either way are lost
  // to goodput already, so the streams' stalls are not stretched for them.
  if (const std::optional<SchedulerCore::PromptPressure> p = core_->EarliestPrompt(now);
      p.has_value() && p->deadline_ms > 0 && chunk < max_tokens - rows) {
    auto finish_ms = [&](int32_t c) {
      const double steps = std::ceil(static_cast<double>(p->tokens) / c);
      return steps * model.PredictMs(MixedShape(rows, mean_context, c));
    };
    if (finish_ms(chunk) > p->deadline_ms && finish_ms(max_tokens - rows) <= p->deadline_ms) {
      chunk = max_tokens - rows;
    }
  }
  return rows + chunk;
}

step::StepPlan StepDispatcher::Next(Lane lane, absl::Time now, bool prefill_busy) {
  if (lane == Lane::kPrefill) {
    return core_->Schedule(Lane::kPrefill,
                           options_.policy == DispatchPolicy::kSlo ? PromptStepBudget(now) : 0);
  }
  wake_ = absl::InfiniteFuture();
  if (prefill_busy && options_.shared_compute) {
    if (options_.policy == DispatchPolicy::kPaced) {
      if (!pacer_.MayStart(now, true)) {
        if (core_->running(Lane::kDecode) > 0) wake_ = pacer_.NextStart();
        return {};
      }
    } else if (!DecodeDue(now)) {
      return {};
    }
  }
  step::StepPlan plan = core_->Schedule(Lane::kDecode);
  if (!plan.sequences.empty()) pacer_.OnStart(now);
  return plan;
}

void StepDispatcher::OnEnd(Lane lane, const step::StepPlan& plan, const step::StepResult& result,
                           absl::Time now, absl::Duration compute) {
  if (lane == Lane::kDecode) pacer_.OnEnd(now);
  if (!result.status.ok() || compute <= absl::ZeroDuration()) return;
  core_->mutable_time_model().Observe(StepShape::Of(plan, &result),
                                      absl::ToDoubleMilliseconds(compute));
}

}  // namespace tandem::scheduler
