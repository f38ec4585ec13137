#include "server/remote_decoder.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <climits>
#include <optional>

#include "absl/time/clock.h"
#include "common/strings.h"
#include "common/thread_name.h"
#include "kvtransfer/kv_pages.h"
#include "server/peer_list.h"
#include "server/response_stream.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

scheduler::FinishReason FinishReasonFromProto(v1::FinishReason reason) {
  return reason == v1::FINISH_REASON_STOP ? scheduler::FinishReason::kStop
                                          : scheduler::FinishReason::kLength;
}

}  // namespace

// One handoff's Decode call. The scheduler's lease answer may come after the
// call broke: a hold keeps the call from ending until the answer has been
// written or is known not to be needed.
class RemoteDecoder::Call final
    : public grpc::ClientBidiReactor<v1::DecodeControl, v1::DecodeEvent> {
 public:
  Call(RemoteDecoder* owner, std::shared_ptr<Peer> peer, uint64_t sequence_id)
      : owner_(owner), peer_(std::move(peer)), sequence_id_(sequence_id) {}

  void Start(std::shared_ptr<Call> self, v1::HandoffRequest handoff, absl::Time deadline) {
    self_ = std::move(self);
    if (!owner_->options_.api_key.empty()) {
      context_.AddMetadata("authorization", "Bearer " + owner_->options_.api_key);
    }
    if (deadline != absl::InfiniteFuture()) context_.set_deadline(absl::ToChronoTime(deadline));
    *first_.mutable_handoff() = std::move(handoff);
    peer_->peer->async()->Decode(&context_, this);
    AddHold();
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = true;
    }
    StartWrite(&first_);
    StartRead(&event_);
    StartCall();
  }

  // The request ended here: stop the peer. Counted as outcome "aborted"
  // when its pages had not moved yet (cancelled, a deadline, the lease ran
  // out).
  void Abort() {
    bool count = false;
    {
      absl::MutexLock lock(&mu_);
      count = !aborted_ && !committed_;
      aborted_ = true;
    }
    if (count) owner_->metrics_->OnRemoteHandoff(peer_->address, "aborted");
    context_.TryCancel();
  }

  // Ends the call at once (the daemon is stopping).
  void ForceEnd() {
    Abort();
    ReleaseHoldOnce();
  }

  void OnWriteDone(bool ok) override {
    bool write_lease = false, release = false;
    {
      absl::MutexLock lock(&mu_);
      write_in_flight_ = false;
      if (lease_write_started_) {
        release = true;  // the lease answer is out (or the call broke)
      } else if (lease_answered_ && ok) {
        write_lease = lease_write_started_ = write_in_flight_ = true;
      } else if (lease_answered_) {
        release = true;
      }
    }
    if (write_lease) StartWrite(&lease_);
    if (release) ReleaseHoldOnce();
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      bool release = false;
      {
        absl::MutexLock lock(&mu_);
        broken_ = true;
        // No lease answer will be needed, or it was already written.
        release = !asked_commit_ || (lease_answered_ && !write_in_flight_);
      }
      if (release) ReleaseHoldOnce();
      return;
    }
    if (event_.has_pages_read()) {
      const uint64_t bytes = event_.pages_read().bytes();
      {
        absl::MutexLock lock(&mu_);
        asked_commit_ = true;
      }
      std::shared_ptr<Call> self = self_;
      owner_->scheduler_->CommitLease(
          sequence_id_, [self, bytes](bool committed) { self->Answer(committed, bytes); });
    } else if (event_.has_tokens()) {
      const v1::GeneratedTokens& t = event_.tokens();
      std::vector<scheduler::TokenId> tokens(t.token_ids().begin(), t.token_ids().end());
      std::vector<step::TokenLogprobs> logprobs;
      for (const v1::TokenLogprobs& lp : t.logprobs()) logprobs.push_back(LogprobsFromProto(lp));
      owner_->scheduler_->RemoteTokens(sequence_id_, std::move(tokens), std::move(logprobs));
    } else if (event_.has_finished()) {
      {
        absl::MutexLock lock(&mu_);
        finished_ = true;
      }
      const v1::DecodeFinished& f = event_.finished();
      owner_->scheduler_->RemoteFinished(sequence_id_, FinishReasonFromProto(f.finish_reason()),
                                         f.drafted_tokens(), f.accepted_tokens());
    }
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    bool report = false;
    {
      absl::MutexLock lock(&mu_);
      report = !finished_ && !aborted_;
    }
    if (report) {
      // The peer died, refused or failed: the request goes on here.
      spdlog::warn("request handed to {} continues here: {} ({})", peer_->address,
                   status.error_message(), static_cast<int>(status.error_code()));
      owner_->metrics_->OnRemoteHandoff(peer_->address, "failed");
      owner_->scheduler_->RemoteFailed(sequence_id_);
    }
    owner_->CallEnded(sequence_id_);
    self_.reset();  // may destroy this
  }

 private:
  // The scheduler's answer to "pages read", on the scheduler thread.
  void Answer(bool committed, uint64_t bytes) {
    if (committed) {
      owner_->metrics_->OnRemoteHandoff(peer_->address, "committed");
      owner_->metrics_->OnKvTransfer("out", bytes);
    } else {
      owner_->metrics_->OnRemoteHandoff(peer_->address, "lease_expired");
      owner_->metrics_->OnKvTransferFailure("out", "lease");
    }
    bool write = false, release = false;
    {
      absl::MutexLock lock(&mu_);
      committed_ = committed;
      lease_.mutable_lease()->set_committed(committed);
      lease_answered_ = true;
      if (broken_) {
        release = true;
      } else if (!write_in_flight_) {
        write = lease_write_started_ = write_in_flight_ = true;
      }
    }
    if (write) StartWrite(&lease_);
    if (release) ReleaseHoldOnce();
  }

  void ReleaseHoldOnce() {
    {
      absl::MutexLock lock(&mu_);
      if (hold_released_) return;
      hold_released_ = true;
    }
    RemoveHold();
  }

  RemoteDecoder* owner_;
  std::shared_ptr<Peer> peer_;
  const uint64_t sequence_id_;
  std::shared_ptr<Call> self_;  // until OnDone
  grpc::ClientContext context_;
  v1::DecodeControl first_;
  v1::DecodeEvent event_;  // the read buffer

  absl::Mutex mu_;
  v1::DecodeControl lease_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool asked_commit_ ABSL_GUARDED_BY(mu_) = false;
  bool lease_answered_ ABSL_GUARDED_BY(mu_) = false;
  bool lease_write_started_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
};

RemoteDecoder::RemoteDecoder(RemoteDecoderOptions options, scheduler::Scheduler* scheduler,
                             const KvEndpoint* kv, ServerMetrics* metrics)
    : options_(std::move(options)), scheduler_(scheduler), kv_(kv), metrics_(metrics) {
  // The first round before serving, so the first requests find their peers.
  std::promise<void> first_round;
  std::future<void> ready = first_round.get_future();
  poller_ = std::thread([this, first = std::move(first_round)]() mutable {
    NameThisThread("tandem-peers");
    PollLoop(&first);
  });
  ready.wait();
}

RemoteDecoder::~RemoteDecoder() {
  std::vector<std::shared_ptr<Call>> calls;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    for (auto& [id, call] : calls_) calls.push_back(call);
  }
  for (auto& call : calls) call->ForceEnd();
  calls.clear();
  {
    // ForceEnd guarantees each call's OnDone, which removes it.
    absl::MutexLock lock(&mu_);
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_.empty(); };
    mu_.Await(absl::Condition(&ended));
  }
  poller_.join();
}

int RemoteDecoder::ready_peers() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(
      std::count_if(peers_.begin(), peers_.end(), [](const auto& p) { return p->ready; }));
}

void RemoteDecoder::Offer(scheduler::HandoffOffer offer) {
  std::shared_ptr<Peer> chosen;
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      // Fewest requests (as last reported, plus those sent since), then the
      // emptiest KV cache; ties rotate.
      const size_t n = peers_.size();
      for (size_t i = 0; i < n; ++i) {
        const std::shared_ptr<Peer>& p = peers_[(round_robin_ + i) % n];
        if (!p->ready) continue;
        auto score = [](const Peer& q) {
          return std::pair(
              q.load.waiting() + q.load.running_prefill() + q.load.running_decode() + q.sent,
              q.load.kv_usage());
        };
        if (chosen == nullptr || score(*p) < score(*chosen)) chosen = p;
      }
      ++round_robin_;
      if (chosen != nullptr) ++chosen->sent;
    }
  }
  bool stall = false;
  {
    absl::MutexLock lock(&mu_);
    stall = chosen != nullptr && ++offers_ == options_.stall_offer;
  }
  if (stall) {
    spdlog::warn("request {}: injected fault: this daemon's KV transport stops answering for {}",
                 offer.request.id, absl::FormatDuration(options_.stall_duration));
    kv_->agent->StopAnsweringForTesting(options_.stall_duration);
  }
  if (chosen == nullptr) {
    metrics_->OnRemoteHandoff("none", "no_peer");
    scheduler_->RemoteFailed(offer.sequence_id);
    return;
  }
  v1::HandoffRequest h;
  const scheduler::Request& r = offer.request;
  h.set_request_id(r.id);
  for (scheduler::TokenId t : offer.tokens) h.add_token_ids(static_cast<uint32_t>(t));
  h.set_prompt_tokens(static_cast<int32_t>(r.prompt.size()));
  h.set_temperature(r.sampling.temperature);
  h.set_top_k(r.sampling.top_k);
  h.set_top_p(r.sampling.top_p);
  h.set_seed(r.sampling.seed);
  h.set_max_tokens(r.max_tokens);
  for (scheduler::TokenId t : r.stop_token_ids) h.add_stop_token_ids(static_cast<uint32_t>(t));
  h.set_logprobs(r.logprobs);
  h.set_disable_speculation(r.disable_speculation);
  h.set_cache_salt(r.cache_salt);
  h.set_priority(r.priority);
  h.set_path_reason(PathReasonToProto(offer.reason));
  h.mutable_latency_budget()->set_ttft_ms(absl::ToDoubleMilliseconds(r.slo.ttft));
  h.mutable_latency_budget()->set_tpot_ms(absl::ToDoubleMilliseconds(r.slo.tpot));
  v1::KvSource* kv = h.mutable_kv();
  kv->set_agent_metadata(kv_->metadata);
  kv->set_region(kv_->region);
  kv->set_layers(kv_->shape.layers);
  kv->set_block_size(kv_->shape.block_size);
  kv->set_kv_heads(kv_->shape.kv_heads);
  kv->set_head_dim(kv_->shape.head_dim);
  kv->set_total_blocks(kv_->shape.blocks);
  kv->set_arithmetic(kv_->arithmetic);
  for (int32_t b : offer.block_table) kv->add_block_ids(b);
  kv->set_lease_ms(absl::ToInt64Milliseconds(offer.lease_deadline - absl::Now()));
  // The peer may read these blocks' pages, and nothing else, until the
  // lease ends (LeaseEnded revokes it sooner).
  absl::StatusOr<kvtransfer::KvPageReads> pages = kvtransfer::PlanKvPageReads(
      kv_->shape, kv_->region, offer.block_table, kv_->shape, kv_->region, offer.block_table);
  absl::StatusOr<kvtransfer::ReadGrant> grant =
      pages.ok() ? kv_->agent->GrantReads(pages->remote, offer.lease_deadline) : pages.status();
  if (!grant.ok()) {
    spdlog::error("request {} stays here: cannot grant its KV pages: {}", r.id,
                  grant.status().ToString());
    metrics_->OnRemoteHandoff(chosen->address, "failed");
    scheduler_->RemoteFailed(offer.sequence_id);
    return;
  }
  kv->set_read_grant(grant->token);

  auto call = std::make_shared<Call>(this, chosen, offer.sequence_id);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      // The destructor is ending every call: this one never starts.
      kv_->agent->RevokeReads(grant->id);
      scheduler_->RemoteFailed(offer.sequence_id);
      return;
    }
    calls_[offer.sequence_id] = call;
    grants_[offer.sequence_id] = grant->id;
  }
  call->Start(call, std::move(h), r.deadline);
}

void RemoteDecoder::LeaseEnded(uint64_t sequence_id) { RevokeGrant(sequence_id); }

void RemoteDecoder::RevokeGrant(uint64_t sequence_id) {
  std::optional<kvtransfer::GrantId> grant;
  {
    absl::MutexLock lock(&mu_);
    auto it = grants_.find(sequence_id);
    if (it == grants_.end()) return;
    grant = it->second;
    grants_.erase(it);
  }
  kv_->agent->RevokeReads(*grant);
}

void RemoteDecoder::Abort(uint64_t sequence_id) {
  std::shared_ptr<Call> call;
  {
    absl::MutexLock lock(&mu_);
    auto it = calls_.find(sequence_id);
    if (it == calls_.end()) return;
    call = it->second;
  }
  call->Abort();
}

void RemoteDecoder::CallEnded(uint64_t sequence_id) {
  {
    absl::MutexLock lock(&mu_);
    calls_.erase(sequence_id);
  }
  // The peer is gone or done: it reads nothing more (the scheduler's
  // LeaseEnded may come later, or came already).
  RevokeGrant(sequence_id);
}

std::shared_ptr<grpc::ChannelCredentials> RemoteDecoder::ChannelCredentials(
    const std::string& host, grpc::ChannelArguments& args) const {
  if (options_.tls_ca.empty()) return grpc::InsecureChannelCredentials();
  // The peer's certificate must name the host of its --decode_peers entry,
  // not the address that resolved (a pod's IP is in no certificate).
  args.SetSslTargetNameOverride(host);
  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = options_.tls_ca;
  tls.pem_private_key = options_.tls_key;
  tls.pem_cert_chain = options_.tls_cert;
  return grpc::SslCredentials(tls);
}

std::vector<RemoteDecoder::Resolved> RemoteDecoder::Resolve() const {
  std::vector<Resolved> addresses;
  for (const std::string& entry : options_.peers) {
    std::string host, port;
    if (!SplitHostPort(entry, &host, &port)) continue;
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (const int err = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); err != 0) {
      spdlog::warn("--decode_peers: cannot resolve '{}': {}", entry, gai_strerror(err));
      continue;
    }
    for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
      char ip[NI_MAXHOST];
      if (getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof(ip), nullptr, 0, NI_NUMERICHOST) != 0) {
        continue;
      }
      const std::string address =
          a->ai_family == AF_INET6 ? StrCat("[", ip, "]:", port) : StrCat(ip, ":", port);
      if (std::none_of(addresses.begin(), addresses.end(),
                       [&](const Resolved& r) { return r.address == address; })) {
        addresses.push_back({address, host});
      }
    }
    freeaddrinfo(found);
  }
  return addresses;
}

void RemoteDecoder::PollLoop(std::promise<void>* first_round) {
  absl::Time next_resolve = absl::InfinitePast();
  for (;;) {
    const absl::Time now = absl::Now();
    if (now >= next_resolve) {
      next_resolve = now + options_.resolve_interval;
      std::vector<Resolved> addresses = Resolve();
      absl::MutexLock lock(&mu_);
      if (!addresses.empty() || peers_.empty()) {
        std::vector<std::shared_ptr<Peer>> next;
        for (const Resolved& resolved : addresses) {
          const std::string& address = resolved.address;
          auto same = [&](const auto& p) { return p->address == address; };
          if (auto it = std::find_if(peers_.begin(), peers_.end(), same); it != peers_.end()) {
            next.push_back(*it);
            continue;
          }
          auto peer = std::make_shared<Peer>();
          peer->address = address;
          grpc::ChannelArguments args;
          args.SetMaxReceiveMessageSize(options_.max_message_bytes);
          args.SetMaxSendMessageSize(options_.max_message_bytes);
          // A peer cut off without a reset (a partition) is found within
          // seconds: its calls then fail and their requests go on here. The
          // daemon's server accepts pings this often (grpc_server.cc).
          args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 15000);
          args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
          args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
          args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
          peer->channel =
              grpc::CreateCustomChannel(address, ChannelCredentials(resolved.host, args), args);
          peer->peer = v1::Peer::NewStub(peer->channel);
          next.push_back(std::move(peer));
        }
        peers_ = std::move(next);
      }
    }
    std::vector<std::shared_ptr<Peer>> peers;
    {
      absl::MutexLock lock(&mu_);
      peers = peers_;
    }
    for (const std::shared_ptr<Peer>& peer : peers) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      if (!options_.api_key.empty()) {
        context.AddMetadata("authorization", "Bearer " + options_.api_key);
      }
      v1::Load load;
      const grpc::Status status = peer->peer->GetLoad(&context, v1::GetLoadRequest(), &load);
      absl::MutexLock lock(&mu_);
      // A peer whose products round otherwise would refuse every handoff
      // (peer_service.cc): it is never chosen, and the log says why.
      const bool same_arithmetic = load.arithmetic() == kv_->arithmetic;
      const bool ready = status.ok() && load.accepting() && same_arithmetic;
      // Logged when its kind changes (a peer starts with none, so its first
      // state is logged too); a varying error text is not a new state.
      std::string kind = "ready", detail;
      if (!status.ok()) {
        kind = "not ready";
        detail = StrCat(" (", status.error_message(), ")");
      } else if (!same_arithmetic) {
        kind = StrCat("not used: its products round as '", load.arithmetic(), "'");
        detail = StrCat(
            load.arithmetic().empty() ? " (it predates reporting it: upgrade both pools)" : "",
            ", this daemon's as '", kv_->arithmetic, "': ", kSameArithmeticAdvice);
      } else if (!ready) {
        kind = "not ready (not accepting work)";
      }
      if (kind != peer->state) {
        if (status.ok() && !same_arithmetic) {
          spdlog::error("decode peer {}: {}{}", peer->address, kind, detail);
        } else {
          spdlog::info("decode peer {}: {}{}", peer->address, kind, detail);
        }
        peer->state = std::move(kind);
      }
      peer->ready = ready;
      peer->load = load;
      peer->sent = 0;
    }
    // The SLO policy weighs a handoff against the peer with the most room:
    // the fewest decoding streams, and the most slack (none reported: a
    // peer with nothing decoding, no limit).
    std::optional<int32_t> decoding;
    std::optional<double> slack;
    bool unpressed = false;
    {
      absl::MutexLock lock(&mu_);
      for (const std::shared_ptr<Peer>& peer : peers) {
        if (!peer->ready) continue;
        decoding = std::min(decoding.value_or(INT32_MAX), peer->load.running_decode());
        if (!peer->load.has_slo_slack_ms()) {
          unpressed = true;
        } else {
          slack = std::max(slack.value_or(-1e300), peer->load.slo_slack_ms());
        }
      }
    }
    if (decoding.has_value()) {
      scheduler_->SetPeerLoad(*decoding, unpressed ? std::nullopt : slack);
    }
    if (first_round != nullptr) {
      first_round->set_value();
      first_round = nullptr;
    }
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), options_.load_interval)) return;
  }
}

}  // namespace tandem::server
