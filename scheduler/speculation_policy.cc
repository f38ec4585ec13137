#include "scheduler/speculation_policy.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <utility>

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
  const StepTimeCoefficients c = time.coefficients();
  // The order drafts are handed out in: by expected tokens per ms of what a
  // row of that sequence adds (its arithmetic, its shared reads, its draft
  // round), largest first. A sequence's next draft always yields less than
  // its last, so its drafts come in order.
  auto score = [&](size_t i) {
    const double context = static_cast<double>(candidates[i].context + k[i]);
    double row_ms = c.per_token + c.per_kilo_shared_read * (context + 1.0) / 1000.0;
    if (draft_model) row_ms += d.per_token + d.per_context * context;
    return std::pow(candidates[i].acceptance, k[i] + 1) / std::max(row_ms, 1e-9);
  };
  auto room = [&](size_t i) { return k[i] < std::min(candidates[i].max_draft, options.max_draft); };
  std::priority_queue<std::pair<double, size_t>> next;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (room(i)) next.emplace(score(i), i);
  }
  // Then each total D of drafts is priced as a whole step; the D with the
  // most expected tokens per ms wins (0: none).
  StepShape shape = step;
  double yield = static_cast<double>(candidates.size());
  double draft_ms = 0;  // the draft model's rounds
  int32_t rounds = 0;
  double ms = time.PredictMs(shape);
  double best_yield = yield, best_ms = ms;
  size_t best_total = 0;
  std::vector<size_t> order;  // the sequence that gets each draft
  while (static_cast<int32_t>(order.size()) < budget && !next.empty()) {
    const size_t i = next.top().second;
    next.pop();
    const DraftCandidate& candidate = candidates[i];
    yield += std::pow(candidate.acceptance, k[i] + 1);
    // Draft k[i] + 1 sits at position context + k[i], after the decode row
    // at context - 1.
    shape.AddFollowingRows(static_cast<int64_t>(candidate.context) + k[i], 1);
    ++k[i];
    if (draft_model) {
      draft_ms += d.per_token + d.per_context * static_cast<double>(candidate.context);
      if (k[i] > rounds) {
        rounds = k[i];
        draft_ms += d.fixed;
      }
    }
    order.push_back(i);
    if (room(i)) next.emplace(score(i), i);
    const double previous_ms = ms;
    ms = time.PredictMs(shape) + draft_ms;
    if (yield * best_ms > best_yield * ms) {
      best_yield = yield;
      best_ms = ms;
      best_total = order.size();
    }
    // Past the widest row count the curve measured, each row costs the
    // same and each draft yields no more than the last: once a draft adds
    // less than the step's rate, none after it can raise the rate again.
    if (shape.tokens > time.row_curve().widest() && order.size() > best_total &&
        std::pow(candidate.acceptance, k[i]) * ms <= yield * (ms - previous_ms)) {
      break;
    }
  }
  std::fill(k.begin(), k.end(), 0);
  for (size_t n = 0; n < best_total; ++n) ++k[order[n]];
  budget -= static_cast<int32_t>(best_total);
  for (size_t i = 0; i < candidates.size() && budget > 0; ++i) {
    if (candidates[i].probe && k[i] == 0 && candidates[i].max_draft > 0) {
      k[i] = 1;
      --budget;
    }
  }
  return k;
}

}  // namespace tandem::scheduler
