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
                                    int64_t other_tokens, const SpeculationOptions& options) {
  std::vector<int32_t> k(candidates.size(), 0);
  if (options.proposer == step::Proposer::kNone || options.max_draft <= 0) return k;
  if (!options.adaptive) {
    for (size_t i = 0; i < candidates.size() && budget > 0; ++i) {
      k[i] = std::min({candidates[i].max_draft, options.max_draft, budget});
      budget -= k[i];
    }
    return k;
  }
  const StepCostModel& c = options.cost;
  const bool draft_model = options.proposer == step::Proposer::kDraftModel;
  // Expected tokens and time of the step as planned so far.
  double yield = static_cast<double>(candidates.size());
  double time = c.fixed + c.per_token * static_cast<double>(other_tokens + candidates.size());
  for (const DraftCandidate& candidate : candidates) {
    time += c.per_context * static_cast<double>(candidate.context);
  }
  std::vector<int32_t> drafting_in_round;  // [r]: sequences drafting a (r+1)-th token
  while (budget > 0) {
    // The best next draft token: the most expected tokens per added time.
    double best_ratio = 0.0, best_gain = 0.0, best_cost = 0.0;
    size_t best = candidates.size();
    for (size_t i = 0; i < candidates.size(); ++i) {
      const int32_t limit = std::min(candidates[i].max_draft, options.max_draft);
      if (k[i] >= limit) continue;
      const double gain = std::pow(candidates[i].acceptance, k[i] + 1);
      const double context = static_cast<double>(candidates[i].context);
      double cost = c.per_token + c.per_context_extra * context;
      if (draft_model) {
        const size_t round = static_cast<size_t>(k[i]);
        cost += c.draft_per_token + c.draft_per_context * context +
                (round >= drafting_in_round.size() ? c.draft_fixed : 0.0);
      }
      const double ratio = gain / cost;
      if (ratio > best_ratio) {
        best_ratio = ratio;
        best_gain = gain;
        best_cost = cost;
        best = i;
      }
    }
    // Take it only if it raises the step's expected tokens per unit time.
    if (best == candidates.size() || (yield + best_gain) * time <= yield * (time + best_cost)) {
      break;
    }
    if (draft_model) {
      const size_t round = static_cast<size_t>(k[best]);
      if (round >= drafting_in_round.size()) drafting_in_round.resize(round + 1, 0);
      ++drafting_in_round[round];
    }
    ++k[best];
    yield += best_gain;
    time += best_cost;
    --budget;
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
