#include "server/cancellation_link.h"

namespace tandem::server {

void CancellationLink::Started(uint64_t sequence_id) {
  absl::MutexLock lock(&mu_);
  sequence_id_ = sequence_id;
  if (cancelled_) scheduler_->Cancel(sequence_id);
}

void CancellationLink::Cancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
  if (sequence_id_.has_value()) scheduler_->Cancel(*sequence_id_);
}

}  // namespace tandem::server
