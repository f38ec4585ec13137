#include "scheduler/speculation_policy.h"

#include <algorithm>
#include <bit>
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
// CopyAcceptance: per drafted token observed in a bucket, the share of the
// bucket's older evidence kept (it remembers roughly the last 50 tokens).
constexpr double kCopyDecay = 0.98;

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

int CopyAcceptance::Bucket(int32_t agreed) {
  if (agreed <= 1) return 0;
  return std::min(kBuckets - 1,
                  static_cast<int>(std::bit_width(static_cast<uint32_t>(agreed))) - 1);
}

int CopyAcceptance::SourceIndex(step::DraftSource source) {
  return source == step::DraftSource::kGlobal ? 1 : 0;
}

void CopyAcceptance::Record(step::DraftSource source, int32_t match, int32_t drafted,
                            int32_t accepted) {
  if (match <= 0 || source == step::DraftSource::kModel) return;
  auto& buckets = counts_[static_cast<size_t>(SourceIndex(source))];
  // Token j was drafted with match + j tokens agreed; the first rejection
  // ends the copy's evidence (what a rejected token's successors would have
  // been is unknown).
  for (int32_t j = 0; j < drafted && j <= accepted; ++j) {
    Counts& c = buckets[static_cast<size_t>(Bucket(match + j))];
    c.continued *= kCopyDecay;
    c.ended *= kCopyDecay;
    (j < accepted ? c.continued : c.ended) += 1.0;
  }
}

double CopyAcceptance::Continues(step::DraftSource source, int32_t agreed, double prior) const {
  const Counts& c = counts_[static_cast<size_t>(SourceIndex(source))]
                           [static_cast<size_t>(Bucket(std::max(agreed, 1)))];
  return (c.continued + prior * kPriorWeight) / (c.continued + c.ended + kPriorWeight);
}

std::vector<double> CopyAcceptance::Reach(step::DraftSource source, int32_t agreed, double prior,
                                          int32_t length) const {
  std::vector<double> reach(static_cast<size_t>(std::max(length, 0)));
  double all = 1.0;
  for (size_t j = 0; j < reach.size(); ++j) {
    all *= Continues(source, agreed + static_cast<int32_t>(j), prior);
    reach[j] = all;
  }
  return reach;
}

double DraftCandidate::Reach(int32_t n) const {
  if (n <= 0) return 1.0;
  if (reach.empty()) return std::pow(acceptance, n);
  const auto known = static_cast<int32_t>(reach.size());
  if (n <= known) return reach[static_cast<size_t>(n - 1)];
  return reach.back() * std::pow(acceptance, n - known);
}

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
    return candidates[i].Reach(k[i] + 1) / std::max(row_ms, 1e-9);
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
    yield += candidate.Reach(k[i] + 1);
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
        candidate.Reach(k[i]) * ms <= yield * (ms - previous_ms)) {
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
