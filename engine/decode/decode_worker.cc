#include "engine/decode/decode_worker.h"

#include "common/strings.h"

namespace tandem::decode {

absl::Status DecodeWorker::CheckPlan(const step::StepPlan& plan) const {
  for (const step::SequenceStep& s : plan.sequences) {
    if (s.tokens.size() != 1 || !s.sample) {
      return absl::FailedPreconditionError(
          StrCat("the decode worker runs decode steps only: sequence ", s.sequence_id, " has ",
                 s.tokens.size(), " tokens", s.sample ? "" : " and does not sample"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::decode
