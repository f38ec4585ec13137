#include "engine/prefill/prefill_worker.h"

namespace tandem::prefill {

absl::Status PrefillWorker::CheckPlan(const step::StepPlan& plan) const { return absl::OkStatus(); }

}  // namespace tandem::prefill
