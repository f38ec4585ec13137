// How a prefill daemon (--role=prefill) hands requests to decode daemons
// (--decode_peers) and relays their tokens: the scheduler's RemoteDecodeLink.
//
// Peers: each --decode_peers entry is host:port (a decode daemon's Peer
// service: its --peer_listen, or its --listen without one); a name that
// resolves to several addresses (a Kubernetes headless Service) is several
// peers. With TLS (--peer_tls_*) each peer must present a certificate the
// CA signed for the entry's host name (whatever address it resolved to),
// and this daemon presents its own. Names are resolved again every few
// seconds, and every peer's Peer.GetLoad is polled
// (--peer_load_interval): a handoff goes to the accepting peer with the
// fewest requests (waiting plus running, plus those sent to it since its
// last report), then the emptiest KV cache. With no peer available the
// request continues here.
//
// One Decode call (proto/tandem/v1/peer.proto) per handoff: it offers the
// request's pages; when the peer has read them the scheduler releases them
// (CommitLease) unless the lease ran out first, and answers; the peer's
// tokens go to the scheduler, which forwards them to the client's stream. A
// call that ends without the request's end (the peer died, refused, or its
// transfer failed) makes the scheduler continue the request here.
#ifndef TANDEM_SERVER_REMOTE_DECODER_H_
#define TANDEM_SERVER_REMOTE_DECODER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "scheduler/scheduler.h"
#include "server/kv_endpoint.h"
#include "server/server_metrics.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "tandem/v1/peer.grpc.pb.h"

namespace tandem::server {

struct RemoteDecoderOptions {
  std::vector<std::string> peers;  // host:port each (--decode_peers)
  absl::Duration load_interval = absl::Milliseconds(200);
  absl::Duration resolve_interval = absl::Seconds(5);
  std::string api_key;  // sent to peers as a bearer token when set
  int max_message_bytes = 64 << 20;
  // Mutual TLS (--peer_tls_cert, --peer_tls_key, --peer_tls_ca), PEM
  // contents; all empty: plaintext.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  // Testing only (--inject_fault=kv_transfer:stall@N:DUR on a prefill
  // daemon): from the Nth offer on, this daemon's KV transport answers no
  // read for `stall_duration`, so the peer's read runs past its lease. 0:
  // never.
  int64_t stall_offer = 0;
  absl::Duration stall_duration;
};

class RemoteDecoder final : public scheduler::RemoteDecodeLink {
 public:
  // Every pointer must outlive this object.
  RemoteDecoder(RemoteDecoderOptions options, scheduler::Scheduler* scheduler, const KvEndpoint* kv,
                ServerMetrics* metrics);
  // Cancels the calls still open and waits for them to end.
  ~RemoteDecoder() override;

  void Offer(scheduler::HandoffOffer offer) override;
  void Abort(uint64_t sequence_id) override;
  // Revokes the offer's read grant: its pages may go to another request.
  void LeaseEnded(uint64_t sequence_id) override;

  // Peers whose last GetLoad answered and accepted work.
  int ready_peers() const;

 private:
  class Call;
  struct Peer {
    std::string address;  // as resolved: ip:port
    std::string state;    // the kind last logged ("ready", "not ready", ...)
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Peer::Stub> peer;
    bool ready = false;
    v1::Load load;
    int32_t sent = 0;  // handoffs since its last load report
  };

  // Resolves peers and polls their load until stopping; `first_round` is
  // set after the first round.
  void PollLoop(std::promise<void>* first_round);
  // Resolves every --decode_peers entry into addresses, each with the
  // entry's host name (what its certificate must name).
  struct Resolved {
    std::string address;
    std::string host;
  };
  std::vector<Resolved> Resolve() const;
  // Plaintext, or mutual TLS verifying the peer as `host` (sets `args`).
  std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(const std::string& host,
                                                               grpc::ChannelArguments& args) const;
  void CallEnded(uint64_t sequence_id);
  void RevokeGrant(uint64_t sequence_id);

  const RemoteDecoderOptions options_;
  scheduler::Scheduler* scheduler_;
  const KvEndpoint* kv_;
  ServerMetrics* metrics_;

  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  uint64_t round_robin_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t offers_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Call>> calls_ ABSL_GUARDED_BY(mu_);
  // Each offer's read grant (kv_->agent), by sequence, until its lease ends.
  absl::flat_hash_map<uint64_t, kvtransfer::GrantId> grants_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_REMOTE_DECODER_H_
