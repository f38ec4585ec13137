#include "scheduler/decode_pacer.h"

#include <algorithm>

#include "common/strings.h"

namespace tandem::scheduler {

absl::Status ValidatePacing(const DecodePacingOptions& options) {
  if (options.interval < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(StrCat(
        "--decode_step_interval=", absl::FormatDuration(options.interval), ": must be >= 0"));
  }
  if (!(options.prefill_min_share >= 0.0 && options.prefill_min_share < 1.0)) {
    return absl::InvalidArgumentError(
        StrCat("--prefill_min_share=", options.prefill_min_share, ": must be in [0, 1)"));
  }
  return absl::OkStatus();
}

absl::Time DecodePacer::NextStart() const {
  if (last_start_ == absl::InfinitePast()) return absl::InfinitePast();
  absl::Time next = last_start_ + options_.interval;
  if (last_end_ >= last_start_) {
    const double share = options_.prefill_min_share;
    next = std::max(next, last_end_ + (last_end_ - last_start_) * (share / (1.0 - share)));
  }
  return next;
}

}  // namespace tandem::scheduler
