// When the decode lane may start its next step while the prefill lane is
// busy, on one shared compute pool.
//
// The decode lane goes first (its step takes the cores from a running
// prefill step within a small bound), but "first" must not mean "always": a
// few long streams always have a step ready, and back-to-back decode steps
// would starve every prompt. So while the prefill lane is busy, the decode
// lane's steps are paced:
//
//   next start = max(last start + interval,
//                    last end + last duration * share / (1 - share))
//
// `interval` is the inter-token time the decode lane's streams get while
// prompts are being prefilled (its target ITL), and `share` the part of the
// time the prefill lane keeps at least when decode steps grow long (large
// batches). An idle prefill lane holds nothing back: the decode lane then
// runs its steps as soon as they are ready.
//
// Thread safety: none; owned by the scheduler thread (or a test).
#ifndef TANDEM_SCHEDULER_DECODE_PACER_H_
#define TANDEM_SCHEDULER_DECODE_PACER_H_

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tandem::scheduler {

struct DecodePacingOptions {
  absl::Duration interval = absl::Milliseconds(40);  // zero: no pacing
  double prefill_min_share = 0.5;                    // in [0, 1)
};

// InvalidArgument naming the flag when an option is out of range.
absl::Status ValidatePacing(const DecodePacingOptions& options);

class DecodePacer {
 public:
  explicit DecodePacer(DecodePacingOptions options) : options_(options) {}

  // The earliest start of the next decode step while the prefill lane is
  // busy (InfinitePast before the first step).
  absl::Time NextStart() const;
  bool MayStart(absl::Time now, bool prefill_busy) const {
    return !prefill_busy || now >= NextStart();
  }
  void OnStart(absl::Time now) { last_start_ = now; }
  void OnEnd(absl::Time now) { last_end_ = now; }

 private:
  DecodePacingOptions options_;
  absl::Time last_start_ = absl::InfinitePast();
  absl::Time last_end_ = absl::InfinitePast();
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_DECODE_PACER_H_
