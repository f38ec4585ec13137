#include "scheduler/speculation_policy.h"

#include <algorithm>
#include <cmath>

namespace tandem::scheduler {
namespace {

// Evidence older than a few verifications fades: acceptance changes as the
// output moves between copied and new text.
constexpr double kDecay = 0.8;
constexpr double kPriorWeight = 2.0;
// Per idle step, the share of the evidence kept (the rest becomes prior).
constexpr double kIdleRecovery = 0.95;

}  // namespace

AcceptanceEstimate::AcceptanceEstimate(double prior)
    : prior_(prior), accepted_(prior * kPriorWeight), rejected_((1.0 - prior) * kPriorWeight) {}

void AcceptanceEstimate::Record(int32_t drafted, int32_t accepted) {
  idle_steps_ = 0;
  if (drafted <= 0) return;
  accepted_ = accepted_ * kDecay + accepted;
  rejected_ = rejected_ * kDecay + (accepted < drafted ? 1.0 : 0.0);
}

void AcceptanceEstimate::Idle() {
  ++idle_steps_;
  accepted_ = accepted_ * kIdleRecovery + prior_ * kPriorWeight * (1.0 - kIdleRecovery);
  rejected_ = rejected_ * kIdleRecovery + (1.0 - prior_) * kPriorWeight * (1.0 - kIdleRecovery);
}

double AcceptanceEstimate::rate() const { return accepted_ / (accepted_ + rejected_); }

std::vector<int32_t> AllocateDrafts(std::span<const DraftCandidate> candidates, int32_t budget,
                                    const StepShape& step, const StepTimeModel& time,
                                    const SpeculationOptions& options) {
  std::vector<int32_t> k(candidates.size(), 0);
  if (options.proposer == step::Proposer::kNone || options.max_draft <= 0) return k;
  if (!options.adaptive) {
    for (size_t i = 0; i < candidates.size() && budget > 0; ++i) {
      k[i] = std::min({candidates[i].max_draft, options.max_draft, budget});
      budget -= k[i];
    }
    return k;
  }
  const DraftModelCost& d = options.draft_cost;
  const bool draft_model = options.proposer == step::Proposer::kDraftModel;
  std::vector<int32_t> drafting_in_round;  // [r]: sequences drafting an (r+1)-th token
  // What drafting `more` tokens after its k[i] adds to the draft model's rounds.
  auto draft_ms = [&](size_t i, int32_t more) {
    if (!draft_model) return 0.0;
    double ms = 0;
    for (int32_t r = k[i]; r < k[i] + more; ++r) {
      ms += d.per_token + d.per_context * static_cast<double>(candidates[i].context);
      if (static_cast<size_t>(r) >= drafting_in_round.size() ||
          drafting_in_round[static_cast<size_t>(r)] == 0) {
        ms += d.fixed;
      }
    }
    return ms;
  };
  // The step as planned so far: its shape, expected tokens, the time the
  // model predicts for it, and that plus the draft model's rounds.
  StepShape shape = step;
  double yield = static_cast<double>(candidates.size());
  double step_ms = time.PredictMs(shape);
  double ms = step_ms;
  while (budget > 0) {
    // The best next choice: the most expected tokens per added time.
    double best_ratio = 0.0, best_gain = 0.0, best_ms = 0.0;
    size_t best = candidates.size();
    int32_t best_more = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      const DraftCandidate& c = candidates[i];
      const int32_t room = std::min({c.max_draft, options.max_draft, k[i] + budget}) - k[i];
      double gain = 0.0;
      double p = std::pow(c.acceptance, k[i]);
      for (int32_t more = 1; more <= std::min(room, kDraftLookahead); ++more) {
        p *= c.acceptance;
        gain += p;
        StepShape trial = shape;
        // Drafts k[i] + 1 .. k[i] + more sit after the decode row at
        // position context - 1.
        trial.AddFollowingRows(static_cast<int64_t>(c.context) + k[i], more);
        const double added = std::max(time.PredictMs(trial) - step_ms + draft_ms(i, more), 1e-9);
        if (gain / added > best_ratio) {
          best_ratio = gain / added;
          best_gain = gain;
          best_ms = added;
          best = i;
          best_more = more;
        }
      }
    }
    // Take it only if it raises the step's expected tokens per unit time.
    if (best == candidates.size() || (yield + best_gain) * ms <= yield * (ms + best_ms)) break;
    if (draft_model) {
      const size_t last = static_cast<size_t>(k[best] + best_more);
      if (last > drafting_in_round.size()) drafting_in_round.resize(last, 0);
      for (int32_t r = k[best]; r < k[best] + best_more; ++r) {
        ++drafting_in_round[static_cast<size_t>(r)];
      }
    }
    shape.AddFollowingRows(static_cast<int64_t>(candidates[best].context) + k[best], best_more);
    step_ms = time.PredictMs(shape);
    k[best] += best_more;
    yield += best_gain;
    ms += best_ms;
    budget -= best_more;
  }
  for (size_t i = 0; i < candidates.size() && budget > 0; ++i) {
    if (candidates[i].probe && k[i] == 0 && candidates[i].max_draft > 0) {
      k[i] = 1;
      --budget;
    }
  }
  return k;
}

}  // namespace tandem::scheduler
