// Moves KV pages between the two workers of one daemon whose backends keep
// their KV in storage of their own (--decode_kv_cache_bytes: what a GPU
// prefill worker beside a CPU decode worker, or two GPUs, need), through the
// same KV-transfer seam as between daemons: two agents in this process, the
// prefill backend's storage registered in one and the decode backend's in
// the other, the decode side reading. The scheduler hands it a BlockMove per
// handoff and hears back through Scheduler::CompleteMove.
#ifndef TANDEM_SERVER_LANE_KV_MOVER_H_
#define TANDEM_SERVER_LANE_KV_MOVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"
#include "kvtransfer/transfer_poller.h"
#include "scheduler/scheduler.h"
#include "server/kv_endpoint.h"
#include "server/server_metrics.h"

namespace tandem::server {

class LaneKvMover final : public scheduler::BlockMover {
 public:
  // Starts both agents on `transports` and connects them. The backends and
  // `metrics` must outlive the mover.
  static absl::StatusOr<std::unique_ptr<LaneKvMover>> Create(const kernels::Backend& prefill,
                                                             const kernels::Backend& decode,
                                                             const std::string& transports,
                                                             ServerMetrics* metrics);

  // REQUIRES: before the first Move; `scheduler` outlives the mover.
  void SetScheduler(scheduler::Scheduler* scheduler) { scheduler_ = scheduler; }
  void Move(scheduler::BlockMove move) override;

 private:
  LaneKvMover() = default;

  KvEndpoint owner_;   // the prefill worker's storage
  KvEndpoint reader_;  // the decode worker's
  kvtransfer::PeerId owner_peer_ = 0;
  ServerMetrics* metrics_ = nullptr;
  scheduler::Scheduler* scheduler_ = nullptr;
  std::unique_ptr<kvtransfer::TransferPoller> poller_;  // last: stopped first
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_LANE_KV_MOVER_H_
