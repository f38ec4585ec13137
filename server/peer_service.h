// The tandem.v1.Peer service (proto/tandem/v1/peer.proto): how a decode
// daemon takes requests over from prefill daemons.
//
// One Decode call per request: the handoff arrives; the scheduler reserves
// blocks for its pages (Scheduler::Import); the pages are read from the
// prefill daemon's KV storage over the KV transport into those blocks (a
// TransferPoller watches the reads); "pages read" goes back; the prefill
// daemon's lease answer either starts the decoding (its tokens stream back on
// the call) or ends it. However the call ends (the prefill daemon cancels or
// dies, the transfer fails, the lease expired, this daemon stops), the
// blocks come back exactly once: the imported request stays untouchable
// while its transfer runs and ends through the scheduler like any other.
#ifndef TANDEM_SERVER_PEER_SERVICE_H_
#define TANDEM_SERVER_PEER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "kvtransfer/transfer_poller.h"
#include "scheduler/scheduler.h"
#include "server/kv_endpoint.h"
#include "server/server_metrics.h"
#include "tandem/v1/peer.grpc.pb.h"

namespace tandem::server {

struct PeerServiceOptions {
  // The model's vocabulary: a handoff's token ids (its prompt, generated
  // tokens and stop tokens) must be below it, or it is refused before it
  // reaches the model (an embedding lookup past the table). 0: unchecked.
  int32_t vocab_size = 0;
  // Testing only (--inject_fault=kv_transfer:error@N): the Nth transfer
  // reads the first half of its pages and then fails. 0: never.
  int64_t fail_transfer = 0;
  // Testing only (--inject_fault=kv_transfer:stall@N:DUR): the Nth
  // transfer reads from a source that stops answering for
  // `stall_duration` (an agent of this daemon's own, on `kv_transport`),
  // so it runs past its lease. 0: never.
  int64_t stall_transfer = 0;
  absl::Duration stall_duration;
  // Testing only (--inject_fault=kv_transfer:overread@N): the Nth transfer
  // also asks for one block of the source that its offer did not name (a
  // reader that oversteps its grant). 0: never.
  int64_t overread_transfer = 0;
  std::string kv_transport = "tcp";
  // This daemon's load (GenerationFrontend::Load), for GetLoad.
  std::function<v1::Load()> load;
};

class PeerService final : public v1::Peer::CallbackService {
 public:
  // Every pointer must outlive the service. `open_calls` counts open Decode
  // calls with the Generation calls (so a drain waits for both); `accepting`
  // turns false when the daemon drains (new handoffs get UNAVAILABLE).
  PeerService(scheduler::Scheduler* scheduler, KvEndpoint* kv, ServerMetrics* metrics,
              std::atomic<int64_t>* open_calls, std::function<bool()> accepting,
              PeerServiceOptions options = {});
  ~PeerService() override = default;

  grpc::ServerBidiReactor<v1::DecodeControl, v1::DecodeEvent>* Decode(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetLoad(grpc::CallbackServerContext* context,
                                    const v1::GetLoadRequest* request, v1::Load* response) override;

 private:
  class Call;
  class Sink;

  // Starts the reads of an imported request's pages into `blocks`.
  void StartTransfer(const std::shared_ptr<Call>& call, const std::vector<int32_t>& blocks);
  // The peer id of the agent with `metadata`, connecting on first use.
  absl::StatusOr<kvtransfer::PeerId> PeerFor(const std::string& metadata);
  // A transfer into `call`'s blocks ended (on the poller's thread);
  // `injected`: why an injected fault makes it a failure (empty: none);
  // `overran`: it was cut off at its lease's end.
  void TransferEnded(const std::shared_ptr<Call>& call, const kvtransfer::TransferStatus& status,
                     uint64_t bytes, absl::Time posted, const std::string& injected, bool overran);
  // Disconnects from `peer` (its reads in flight fail); the next offer from
  // its daemon connects again.
  void ForgetPeer(kvtransfer::PeerId peer);
  // The injected stall's source, connected (see PeerServiceOptions), and the
  // token of its grant over all of its memory.
  struct Stalled {
    kvtransfer::PeerId peer = 0;
    std::string token;
  };
  absl::StatusOr<Stalled> StalledSource(const kernels::KvCacheShape& shape, uint32_t region);

  scheduler::Scheduler* scheduler_;
  KvEndpoint* kv_;
  ServerMetrics* metrics_;
  std::atomic<int64_t>* open_calls_;
  std::function<bool()> accepting_;
  const PeerServiceOptions options_;
  std::atomic<int64_t> transfers_started_{0};

  absl::Mutex peers_mu_;
  absl::flat_hash_map<std::string, kvtransfer::PeerId> peers_ ABSL_GUARDED_BY(peers_mu_);
  // --inject_fault=kv_transfer:stall@N:DUR only. The memory outlives the
  // agent that registered it (members go in reverse order).
  std::vector<char> stalled_memory_ ABSL_GUARDED_BY(peers_mu_);
  std::unique_ptr<kvtransfer::TransferAgent> stalled_agent_ ABSL_GUARDED_BY(peers_mu_);

  // Declared last: stopped first, so no callback sees a dead member.
  kvtransfer::TransferPoller poller_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_PEER_SERVICE_H_
