// How many tokens each decoding sequence drafts in a step.
//
// Verifying k drafted tokens costs the target a forward pass over k more
// tokens; it pays when the expected accepted tokens outweigh that cost. A
// draft of k tokens yields on average 1 + r(1) + ... + r(k) tokens, where
// r(j) is the chance that its first j tokens are all accepted: a^j for a
// sequence's per-position acceptance rate a, or, while a copying proposer's
// copy goes on, the product of the chances that a copy of each agreement
// length continues (CopyAcceptance), so a long copy drafts long at once.
// The step's time is the step-time model's prediction for the whole step
// (scheduler/step_time_model.h, as measured at start-up: the scheduler
// passes its frozen copy, SchedulerCore::draft_time_model_), including the
// backend's row curve, plus the draft model's rounds, measured at start-up.
// Drafts are handed out one at a time, each to the sequence whose next
// draft adds the most expected tokens per ms of its own row; every total D
// of drafts so far is priced as a whole step, and the D with the most
// expected tokens per ms wins. Pricing totals, not single tokens, lets the
// drafts of several sequences together cross a jump of the row curve (where
// a tile of rows of the CPU's kernels ends) that no one sequence's drafts
// pay for. So speculation shrinks as the batch grows (the fixed cost,
// reading the weights, is already shared) and stops where the step becomes
// compute-bound; drafts stay within the rows the kernels verify cheaply
// unless acceptance pays for the next jump; sequences whose drafts keep
// failing stop drafting, and start again when their estimate recovers.
#ifndef TANDEM_SCHEDULER_SPECULATION_POLICY_H_
#define TANDEM_SCHEDULER_SPECULATION_POLICY_H_

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/step/step_plan.h"
#include "scheduler/step_time_model.h"

namespace tandem::scheduler {

// What a draft model's rounds add to a step, in ms: each round (the r-th
// drafted token of every sequence drafting that many) costs fixed +
// per_token * sequences + per_context * their contexts. Measured at
// start-up (server/serving_model.cc).
struct DraftModelCost {
  double fixed = 0.0;
  double per_token = 0.0;
  double per_context = 0.0;
};

struct SpeculationOptions {
  step::Proposer proposer = step::Proposer::kNone;  // the default for requests
  int32_t max_draft = 8;                            // drafted tokens per sequence and step
  // false: always draft max_draft tokens (for tests and measurements).
  bool adaptive = true;
  DraftModelCost draft_cost;  // with Proposer::kDraftModel
};

// A sequence's per-position acceptance rate, estimated from its recent
// verifications (a geometric model: each drafted token is accepted with the
// same probability, until the first rejection), with older evidence decaying.
// A sequence that stopped drafting gathers no evidence, so each step it
// spends without drafts moves the estimate slowly back to the prior, and
// after kProbeAfter such steps it is due a probe: one drafted token whatever
// the cost model says (at long contexts, where a verified row costs most of
// a step, even the prior's acceptance does not pay for a token, and the
// sequence would never draft again). So copied stretches of an output are
// found again, at the cost of one row every kProbeAfter steps when there
// are none.
class AcceptanceEstimate {
 public:
  // `prior`: the rate assumed before any evidence (worth two observations).
  explicit AcceptanceEstimate(double prior = 0.5);
  // A step that planned drafts: its verification (drafted > 0), or none
  // because the proposer found nothing to draft (drafted 0: no evidence,
  // but the probe clock restarts, so a sequence the proposer has nothing
  // for is not probed step after step).
  void Record(int32_t drafted, int32_t accepted);
  // A decode step without drafts.
  void Idle();
  double rate() const;
  // Whether the sequence has gone kProbeAfter decode steps without drafts.
  bool probe_due() const { return idle_steps_ >= kProbeAfter; }
  static constexpr int32_t kProbeAfter = 32;

 private:
  double prior_;
  double accepted_;
  double rejected_;
  int32_t idle_steps_ = 0;  // decode steps since the last verification
};

// Acceptance by where a copy comes from and how long it has agreed, for
// copying proposers (suffix), learned across the scheduler's sequences. A copy
// that has followed the sequence for 40 tokens is far likelier to go on
// than one found a token ago, whatever the sequence's average says: an
// output rewriting a file copies long stretches between short, failing
// matches. So each drafted token is evidence for the agreement length it
// was drafted at (the copy's match plus the drafts before it): continued
// when accepted, ended at the first rejection. Buckets of agreement
// lengths double in width (1, 2-3, 4-7, ..., 256 and more), per source
// (the sequence's own tokens, or earlier requests' text); a bucket's older
// evidence fades as new evidence arrives in it, and where a bucket has
// little, the sequence's own rate decides.
class CopyAcceptance {
 public:
  // A verification of `drafted` tokens copied from `source`, whose copy
  // had agreed with `match` tokens when it drafted, of which the first
  // `accepted` were accepted. match 0 (a proposer that does not copy)
  // records nothing.
  void Record(step::DraftSource source, int32_t match, int32_t drafted, int32_t accepted);
  // The chance that a copy from `source` having agreed with `agreed`
  // tokens gives one more the target accepts; `prior` (the sequence's own
  // rate) stands in for missing evidence, with the weight of two tokens.
  double Continues(step::DraftSource source, int32_t agreed, double prior) const;
  // reach[j]: the chance that all of the first j + 1 tokens of a draft
  // copied from `source`, its copy having agreed with `agreed` tokens, are
  // accepted; `length` entries.
  std::vector<double> Reach(step::DraftSource source, int32_t agreed, double prior,
                            int32_t length) const;

  static constexpr int kBuckets = 9;  // agreement 1, 2-3, 4-7, ..., 256+
  static int Bucket(int32_t agreed);

 private:
  struct Counts {
    double continued = 0.0;
    double ended = 0.0;
  };
  static int SourceIndex(step::DraftSource source);
  std::array<std::array<Counts, kBuckets>, 2> counts_{};  // request, global
};

struct DraftCandidate {
  double acceptance = 0.0;  // AcceptanceEstimate::rate()
  int32_t max_draft = 0;    // the most this sequence may draft (context, max_tokens, KV)
  int32_t context = 0;      // tokens its attention reads (its length)
  bool probe = false;       // AcceptanceEstimate::probe_due(): draft one token whatever it costs
  // When not empty: reach[j] is the chance that its first j + 1 drafted
  // tokens are all accepted (CopyAcceptance::Reach, for a sequence whose
  // copy is known to go on); otherwise acceptance^(j + 1). Non-increasing.
  std::vector<double> reach{};
  // The chance that its first `n` drafted tokens are all accepted (1 at 0).
  double Reach(int32_t n) const;
};

// Draft lengths for the decode sequences of one step (same order), using at
// most `budget` drafted tokens in all. `step`: the step as planned without
// drafts (its prompt chunks add to its time, not to its yield); `time`
// predicts it. A candidate due a probe drafts at least one token while the
// budget lasts.
std::vector<int32_t> AllocateDrafts(std::span<const DraftCandidate> candidates, int32_t budget,
                                    const StepShape& step, const StepTimeModel& time,
                                    const SpeculationOptions& options);

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_SPECULATION_POLICY_H_
