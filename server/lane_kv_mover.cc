#include "server/lane_kv_mover.h"

#include "common/strings.h"
#include "kvtransfer/kv_pages.h"
#include "spdlog/spdlog.h"

namespace tandem::server {

absl::StatusOr<std::unique_ptr<LaneKvMover>> LaneKvMover::Create(const kernels::Backend& prefill,
                                                                 const kernels::Backend& decode,
                                                                 const std::string& transports,
                                                                 ServerMetrics* metrics) {
  std::unique_ptr<LaneKvMover> mover(new LaneKvMover());
  absl::StatusOr<KvEndpoint> owner = StartKvEndpoint(prefill, transports);
  if (!owner.ok()) return owner.status();
  mover->owner_ = *std::move(owner);
  absl::StatusOr<KvEndpoint> reader = StartKvEndpoint(decode, transports);
  if (!reader.ok()) return reader.status();
  mover->reader_ = *std::move(reader);
  absl::StatusOr<kvtransfer::PeerId> peer = mover->reader_.agent->AddPeer(mover->owner_.metadata);
  if (!peer.ok()) return peer.status();
  mover->owner_peer_ = *peer;
  mover->metrics_ = metrics;
  mover->poller_ =
      std::make_unique<kvtransfer::TransferPoller>(mover->reader_.agent.get(), "tandem-kvmove");
  return mover;
}

void LaneKvMover::Move(scheduler::BlockMove move) {
  absl::StatusOr<kvtransfer::KvPageReads> reads = kvtransfer::PlanKvPageReads(
      reader_.shape, reader_.region, move.to, owner_.shape, owner_.region, move.from);
  absl::StatusOr<kvtransfer::TransferId> id = absl::UnknownError("not posted");
  // The owner grants exactly this move's pages, and revokes them before the
  // scheduler hears the move ended (and may give the blocks to another
  // request).
  absl::StatusOr<kvtransfer::ReadGrant> grant = absl::UnknownError("not granted");
  if (!reads.ok()) {
    id = reads.status();
  } else if (grant = owner_.agent->GrantReads(reads->remote, absl::InfiniteFuture()); !grant.ok()) {
    id = grant.status();
  } else {
    id = reader_.agent->PostRead(owner_peer_, reads->local, reads->remote, grant->token, "");
  }
  if (!id.ok()) {
    if (grant.ok()) owner_.agent->RevokeReads(grant->id);
    spdlog::warn("moving KV pages to the decode worker: {}", id.status().ToString());
    metrics_->OnKvTransferFailure("internal", "transfer");
    scheduler_->CompleteMove(move.sequence_id, id.status());
    return;
  }
  const uint64_t bytes = reads->bytes;
  const uint64_t sequence = move.sequence_id;
  poller_->Watch(
      *id, [this, bytes, sequence, granted = grant->id](const kvtransfer::TransferStatus& status) {
        owner_.agent->RevokeReads(granted);
        if (status.state == kvtransfer::TransferState::kDone) {
          metrics_->OnKvTransfer("internal", bytes);
          scheduler_->CompleteMove(sequence, absl::OkStatus());
        } else {
          spdlog::warn("moving KV pages to the decode worker: {}", status.error.ToString());
          metrics_->OnKvTransferFailure("internal", "transfer");
          scheduler_->CompleteMove(sequence, status.error.ok()
                                                 ? absl::UnavailableError("the KV move failed")
                                                 : status.error);
        }
      });
}

}  // namespace tandem::server
