#include "server/peer_service.h"

#include <algorithm>
#include <deque>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "common/strings.h"
#include "kvtransfer/kv_pages.h"
#include "kvtransfer/ucx_agent.h"
#include "server/generate_reactors.h"
#include "server/logging.h"
#include "server/request_builder.h"
#include "server/response_stream.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

// What a handoff must agree on with this daemon's KV storage and products.
absl::Status CheckSource(const v1::KvSource& kv, const KvEndpoint& endpoint, int32_t tokens) {
  const kernels::KvCacheShape& mine = endpoint.shape;
  if (kv.arithmetic() != endpoint.arithmetic) {
    return absl::FailedPreconditionError(
        StrCat("kv.arithmetic: the prefill daemon's products round as '", kv.arithmetic(),
               "' and this daemon's as '", endpoint.arithmetic,
               "': decoding its pages here would give tokens neither daemon gives alone; ",
               kSameArithmeticAdvice));
  }
  if (kv.layers() != mine.layers || kv.block_size() != mine.block_size ||
      kv.kv_heads() != mine.kv_heads || kv.head_dim() != mine.head_dim) {
    return absl::FailedPreconditionError(
        StrCat("kv: the prefill daemon's KV pages (", kv.layers(), " layers, ", kv.block_size(),
               "-token blocks, ", kv.kv_heads(), " KV heads of ", kv.head_dim(),
               ") differ from this "
               "daemon's (",
               mine.layers, ", ", mine.block_size, ", ", mine.kv_heads, ", ", mine.head_dim,
               "): serve the same model with the same --block_size"));
  }
  const int32_t blocks = (tokens - 1 + mine.block_size - 1) / mine.block_size;
  if (kv.block_ids_size() != blocks) {
    return absl::InvalidArgumentError(StrCat("kv.block_ids: ", kv.block_ids_size(), " blocks for ",
                                             tokens - 1, " tokens of KV; expected ", blocks));
  }
  return absl::OkStatus();
}

}  // namespace

// One Decode call. gRPC owns it until OnDone; the sink, the poller and the
// scheduler's callbacks hold it by shared_ptr, so it lives until the last of
// them lets go, and its stream operations do nothing once the call is done.
class PeerService::Call final : public grpc::ServerBidiReactor<v1::DecodeControl, v1::DecodeEvent> {
 public:
  enum class Phase { kAwaitHandoff, kTransferring, kAwaitLease, kDecoding, kEnded };

  Call(PeerService* service, grpc::CallbackServerContext* context)
      : service_(service), context_(context), link_(service->scheduler_) {
    service_->open_calls_->fetch_add(1);
  }
  ~Call() override = default;

  void Begin(std::shared_ptr<Call> self) {
    self_ = std::move(self);
    StartRead(&control_);
  }

  // --- the stream, from any thread ---
  // Queues an event; tokens merge into a queued tokens event.
  void Send(v1::DecodeEvent event) {
    absl::MutexLock lock(&mu_);
    if (done_ || closing_) return;
    if (event.has_tokens() && !queue_.empty() && queue_.back().has_tokens()) {
      v1::GeneratedTokens* into = queue_.back().mutable_tokens();
      into->mutable_token_ids()->MergeFrom(event.tokens().token_ids());
      into->mutable_logprobs()->MergeFrom(event.tokens().logprobs());
      return;
    }
    queue_.push_back(std::move(event));
    if (!write_in_flight_) WriteNextLocked();
  }
  // Ends the call with `status` after the queued events.
  void Close(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    if (done_ || closing_) return;
    closing_ = true;
    close_status_ = ToGrpc(status);
    if (!write_in_flight_) WriteNextLocked();
  }

  // --- the request's progress ---
  const v1::HandoffRequest& handoff() const { return handoff_; }
  kvtransfer::PeerId peer() const { return peer_; }
  absl::Time lease_end() const { return lease_end_; }
  // The transfer ended: go on to the lease answer (true), or the call was
  // cancelled meanwhile (false: the import is completed as cancelled here).
  bool TransferDone() {
    absl::MutexLock lock(&mu_);
    if (cancelled_) {
      phase_ = Phase::kEnded;
      service_->scheduler_->CompleteImport(sequence_id_, absl::CancelledError("cancelled"));
      return false;
    }
    phase_ = Phase::kAwaitLease;
    return true;
  }
  void TransferFailed(const absl::Status& status) {
    absl::MutexLock lock(&mu_);
    phase_ = Phase::kEnded;
    service_->scheduler_->CompleteImport(sequence_id_, status);
  }

  // --- gRPC's reactions ---
  void OnReadDone(bool ok) override {
    if (!ok) {  // the prefill daemon went away (it never half-closes)
      OnGone();
      return;
    }
    Phase phase;
    {
      absl::MutexLock lock(&mu_);
      phase = phase_;
    }
    if (phase == Phase::kAwaitHandoff && control_.has_handoff()) {
      handoff_ = control_.handoff();
      // The pages are held for lease_ms from when the offer was sent; a
      // transfer still running then is cut off (StartTransfer).
      // (No lease, or one already over: nothing may be read under it, and a
      // read is cut off at once.)
      lease_end_ = absl::Now() + absl::Milliseconds(std::max<int64_t>(0, handoff_.kv().lease_ms()));
      StartRead(&control_);  // the lease answer
      if (absl::Status s = TakeOver(); !s.ok()) {
        {
          absl::MutexLock lock(&mu_);
          phase_ = Phase::kEnded;
        }
        if (!absl::IsCancelled(s)) service_->metrics_->OnKvTransferFailure("in", "refused");
        Close(s);
      }
      return;
    }
    if (phase == Phase::kAwaitLease && control_.has_lease()) {
      absl::MutexLock lock(&mu_);
      phase_ = control_.lease().committed() ? Phase::kDecoding : Phase::kEnded;
      if (!control_.lease().committed()) service_->metrics_->OnKvTransferFailure("in", "lease");
      service_->scheduler_->CompleteImport(
          sequence_id_, control_.lease().committed()
                            ? absl::OkStatus()
                            : absl::AbortedError("the prefill daemon's lease on the KV pages "
                                                 "expired before they were read"));
      return;
    }
    // A peer that breaks the protocol: the request ends as if it had gone.
    OnGone();
    Close(absl::InvalidArgumentError(
        "unexpected message: a Decode call sends one handoff, then one lease answer"));
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    write_in_flight_ = false;
    if (!ok) queue_.clear();  // the prefill daemon is gone; OnCancel follows
    WriteNextLocked();
  }

  void OnCancel() override { OnGone(); }

  void OnDone() override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    service_->open_calls_->fetch_sub(1);
    self_.reset();  // may destroy this
  }

 private:
  // Validates the handoff and hands the request to the scheduler.
  absl::Status TakeOver();

  // The prefill daemon cancelled or vanished: the request ends here too.
  // Where a request exists, its end (through the scheduler and the sink)
  // finishes the call; before the handoff arrived, nothing else would.
  void OnGone() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    link_.Cancel();
    if (phase_ == Phase::kAwaitLease) {
      // No answer will come: release the pages read for nothing.
      phase_ = Phase::kEnded;
      service_->scheduler_->CompleteImport(sequence_id_, absl::CancelledError("cancelled"));
    } else if (phase_ == Phase::kAwaitHandoff) {
      phase_ = Phase::kEnded;
      if (!closing_) {
        closing_ = true;
        close_status_ = grpc::Status::CANCELLED;
        WriteNextLocked();
      }
    }
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (done_ || write_in_flight_) return;
    if (!queue_.empty()) {
      in_flight_ = std::move(queue_.front());
      queue_.pop_front();
      write_in_flight_ = true;
      StartWrite(&in_flight_);
    } else if (closing_ && !finished_) {
      finished_ = true;
      Finish(close_status_);
    }
  }

  PeerService* service_;
  grpc::CallbackServerContext* context_;
  CancellationLink link_;
  std::shared_ptr<Call> self_;   // gRPC's reference, dropped in OnDone
  v1::DecodeControl control_;    // the read buffer (one read at a time)
  v1::HandoffRequest handoff_;   // set once, before the scheduler sees the request
  kvtransfer::PeerId peer_ = 0;  // ditto
  absl::Time lease_end_ = absl::InfiniteFuture();  // ditto

  absl::Mutex mu_;
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kAwaitHandoff;
  uint64_t sequence_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::DecodeEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::DecodeEvent in_flight_ ABSL_GUARDED_BY(mu_);
  bool write_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_ ABSL_GUARDED_BY(mu_);
};

// The imported request's output: its tokens and its end, onto the call.
class PeerService::Sink final : public scheduler::RequestSink {
 public:
  Sink(std::shared_ptr<Call> call, ServerMetrics* metrics)
      : call_(std::move(call)), metrics_(metrics) {}

  bool OnToken(scheduler::TokenId token, bool, const step::TokenLogprobs* logprobs) override {
    v1::DecodeEvent event;
    v1::GeneratedTokens* tokens = event.mutable_tokens();
    tokens->add_token_ids(static_cast<uint32_t>(token));
    if (logprobs != nullptr) LogprobsToProto(*logprobs, tokens->add_logprobs());
    call_->Send(std::move(event));
    return false;  // stop strings are the entering daemon's business
  }

  void OnFinish(const scheduler::FinishInfo& info) override {
    // Counted here too (path "remote"): the per-phase histograms of what
    // this daemon decoded. The entering daemon counts the request as well.
    metrics_->OnFinish(info, {}, /*from_client=*/false);
    spdlog::info("{}",
                 RequestFinishedLine(call_->handoff().request_id(),
                                     static_cast<int32_t>(call_->handoff().prompt_tokens()), info));
    if (info.reason == scheduler::FinishReason::kStop ||
        info.reason == scheduler::FinishReason::kLength) {
      v1::DecodeEvent event;
      v1::DecodeFinished* finished = event.mutable_finished();
      finished->set_finish_reason(info.reason == scheduler::FinishReason::kStop
                                      ? v1::FINISH_REASON_STOP
                                      : v1::FINISH_REASON_LENGTH);
      finished->set_drafted_tokens(info.usage.drafted_tokens);
      finished->set_accepted_tokens(info.usage.accepted_tokens);
      call_->Send(std::move(event));
      call_->Close(absl::OkStatus());
    } else if (info.reason == scheduler::FinishReason::kCancelled) {
      // Shutting down, or the prefill daemon's own cancellation.
      call_->Close(info.error.ok() || absl::IsCancelled(info.error)
                       ? absl::CancelledError("cancelled")
                       : info.error);
    } else {
      call_->Close(info.error.ok() ? absl::InternalError("the decode step failed") : info.error);
    }
    call_.reset();
  }

 private:
  std::shared_ptr<Call> call_;
  ServerMetrics* metrics_;
};

absl::Status PeerService::Call::TakeOver() {
  if (!service_->accepting_()) {
    return absl::UnavailableError("the decode daemon is draining; retry on another");
  }
  const v1::HandoffRequest& h = handoff_;
  const int32_t length = h.token_ids_size();
  if (h.prompt_tokens() < 1 || h.prompt_tokens() >= length) {
    return absl::InvalidArgumentError(StrCat("prompt_tokens: ", h.prompt_tokens(), " of ", length,
                                             " tokens (a handoff carries the prompt and at "
                                             "least one generated token)"));
  }
  if (const int32_t vocab = service_->options_.vocab_size; vocab > 0) {
    for (const auto& [ids, field] : {std::pair(&h.token_ids(), "token_ids"),
                                     std::pair(&h.stop_token_ids(), "stop_token_ids")}) {
      if (absl::Status s = CheckTokenIds(*ids, field, vocab).status(); !s.ok()) return s;
    }
  }
  step::SamplingParams sampling;
  sampling.temperature = h.temperature();
  sampling.top_k = h.top_k();
  sampling.top_p = h.top_p();
  sampling.seed = h.seed();
  if (absl::Status s = ValidateSampling(sampling, h.logprobs(), ""); !s.ok()) return s;
  if (absl::Status s = CheckSource(h.kv(), *service_->kv_, length); !s.ok()) return s;
  absl::StatusOr<kvtransfer::PeerId> peer = service_->PeerFor(h.kv().agent_metadata());
  if (!peer.ok()) return peer.status();
  peer_ = *peer;

  scheduler::ImportedRequest imported;
  scheduler::Request& r = imported.request;
  r.id = h.request_id();
  r.prompt.assign(h.token_ids().begin(), h.token_ids().begin() + h.prompt_tokens());
  r.sampling = sampling;
  r.max_tokens = h.max_tokens();
  r.stop_token_ids.assign(h.stop_token_ids().begin(), h.stop_token_ids().end());
  r.deadline = absl::FromChrono(context_->deadline());
  r.cache_salt = h.cache_salt();
  r.priority = h.priority();
  r.logprobs = h.logprobs();
  r.disable_speculation = h.disable_speculation();
  absl::StatusOr<scheduler::LatencyBudget> slo =
      LatencyBudgetFromProto(h.latency_budget(), "latency_budget");
  if (!slo.ok()) return slo.status();
  r.slo = *slo;
  r.sink = std::make_shared<Sink>(self_, service_->metrics_);
  imported.tokens.assign(h.token_ids().begin(), h.token_ids().end());
  imported.generated = length - h.prompt_tokens();
  imported.reason = PathReasonFromProto(h.path_reason());

  std::shared_ptr<Call> self = self_;
  PeerService* service = service_;
  // Held across Import: the transfer (started from the scheduler thread)
  // may end before Import returns, and must find the id and phase set.
  absl::MutexLock lock(&mu_);
  if (cancelled_) return absl::CancelledError("the prefill daemon went away");
  absl::StatusOr<uint64_t> id = service_->scheduler_->Import(
      std::move(imported), [self, service](absl::StatusOr<std::vector<int32_t>> blocks) {
        if (!blocks.ok()) {
          {
            absl::MutexLock lock(&self->mu_);
            self->phase_ = Phase::kEnded;
          }
          service->metrics_->OnKvTransferFailure("in", "refused");
          self->Close(blocks.status());
          return;
        }
        service->StartTransfer(self, *blocks);
      });
  if (!id.ok()) return id.status();
  sequence_id_ = *id;
  phase_ = Phase::kTransferring;
  link_.Started(*id);
  return absl::OkStatus();
}

PeerService::PeerService(scheduler::Scheduler* scheduler, KvEndpoint* kv, ServerMetrics* metrics,
                         std::atomic<int64_t>* open_calls, std::function<bool()> accepting,
                         PeerServiceOptions options)
    : scheduler_(scheduler),
      kv_(kv),
      metrics_(metrics),
      open_calls_(open_calls),
      accepting_(std::move(accepting)),
      options_(options),
      poller_(kv->agent.get(), "tandem-kvread") {}

grpc::ServerUnaryReactor* PeerService::GetLoad(grpc::CallbackServerContext* context,
                                               const v1::GetLoadRequest*, v1::Load* response) {
  if (options_.load) *response = options_.load();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerBidiReactor<v1::DecodeControl, v1::DecodeEvent>* PeerService::Decode(
    grpc::CallbackServerContext* context) {
  auto call = std::make_shared<Call>(this, context);
  Call* raw = call.get();
  raw->Begin(std::move(call));
  return raw;
}

absl::StatusOr<kvtransfer::PeerId> PeerService::PeerFor(const std::string& metadata) {
  absl::MutexLock lock(&peers_mu_);
  if (auto it = peers_.find(metadata); it != peers_.end()) return it->second;
  absl::StatusOr<kvtransfer::PeerId> peer = kv_->agent->AddPeer(metadata);
  if (!peer.ok()) {
    return absl::UnavailableError(
        StrCat("kv.agent_metadata: cannot reach the prefill daemon's KV transport: ",
               peer.status().message()));
  }
  peers_.emplace(metadata, *peer);
  return *peer;
}

void PeerService::StartTransfer(const std::shared_ptr<Call>& call,
                                const std::vector<int32_t>& blocks) {
  const v1::KvSource& source = call->handoff().kv();
  kernels::KvCacheShape remote_shape = kv_->shape;
  remote_shape.blocks = source.total_blocks();
  const std::vector<int32_t> remote_blocks(source.block_ids().begin(), source.block_ids().end());
  absl::StatusOr<kvtransfer::KvPageReads> reads = kvtransfer::PlanKvPageReads(
      kv_->shape, kv_->region, blocks, remote_shape, source.region(), remote_blocks);
  const int64_t n = transfers_started_.fetch_add(1) + 1;
  const bool fail = options_.fail_transfer > 0 && n == options_.fail_transfer;
  // An injected fault: the transfer's end counts as a failure whatever UCX
  // says (half the pages, or the stand-in source's zeros).
  std::string injected =
      fail ? std::string("injected fault: the KV transfer failed half way") : std::string();
  kvtransfer::PeerId from = call->peer();
  std::string token = source.read_grant();
  if (options_.stall_transfer > 0 && n == options_.stall_transfer && reads.ok()) {
    absl::StatusOr<Stalled> stalled = StalledSource(remote_shape, source.region());
    if (stalled.ok()) {
      from = stalled->peer;
      token = stalled->token;
      injected = "injected fault: the KV transfer read a stalled stand-in source";
      spdlog::warn("request {}: injected fault: the KV transfer's source stops answering for {}",
                   call->handoff().request_id(), absl::FormatDuration(options_.stall_duration));
    } else {
      spdlog::error("--inject_fault: cannot start the stalled source: {}",
                    stalled.status().ToString());
    }
  }
  if (options_.overread_transfer > 0 && n == options_.overread_transfer && reads.ok()) {
    // The injected fault: one more read, of the first block the offer did
    // not name, into the request's first block.
    int32_t unoffered = 0;
    while (std::find(remote_blocks.begin(), remote_blocks.end(), unoffered) !=
           remote_blocks.end()) {
      ++unoffered;
    }
    const std::vector<int32_t> into = {blocks.front()}, from = {unoffered};
    absl::StatusOr<kvtransfer::KvPageReads> extra = kvtransfer::PlanKvPageReads(
        kv_->shape, kv_->region, into, remote_shape, source.region(), from);
    if (extra.ok()) {
      reads->local.push_back(extra->local.front());
      reads->remote.push_back(extra->remote.front());
      spdlog::warn(
          "request {}: injected fault: the KV transfer also asks for block {}, which "
          "was not offered",
          call->handoff().request_id(), unoffered);
    }
  }
  absl::StatusOr<kvtransfer::TransferId> id = absl::UnknownError("not posted");
  if (!reads.ok()) {
    id = reads.status();
  } else {
    std::span<const kvtransfer::Descriptor> local = reads->local, remote = reads->remote;
    if (fail) {
      // The injected fault: half the pages land, then the transfer "breaks".
      local = local.first((local.size() + 1) / 2);
      remote = remote.first(local.size());
      spdlog::warn("request {}: injected fault: the KV transfer fails half way",
                   call->handoff().request_id());
    }
    id = kv_->agent->PostRead(from, local, remote, token, call->handoff().request_id());
  }
  if (!id.ok()) {
    metrics_->OnKvTransferFailure("in", "transfer");
    call->TransferFailed(
        absl::UnavailableError(StrCat("the KV transfer could not start: ", id.status().message())));
    return;
  }
  const uint64_t bytes = reads->bytes;
  const absl::Time posted = absl::Now();
  // Past the lease the prefill daemon may reuse the pages, and a read that
  // has not finished holds this daemon's blocks for as long as the transport
  // takes to give up. UCX cannot cancel one read: the peer's endpoint is
  // closed, which fails every read in flight on it (each request goes on on
  // its prefill daemon; the next offer from there connects again), and the
  // blocks are freed when the failure is reported, after the close.
  auto overran = std::make_shared<std::atomic<bool>>(false);
  poller_.Watch(
      *id,
      [this, call, bytes, posted, injected, overran](const kvtransfer::TransferStatus& status) {
        TransferEnded(call, status, bytes, posted, injected, overran->load());
      },
      call->lease_end(),
      [this, from, overran, request = call->handoff().request_id()] {
        overran->store(true);
        spdlog::warn(
            "request {}: the KV transfer has not finished within its lease: closing the "
            "connection to its source",
            request);
        ForgetPeer(from);
      });
}

absl::StatusOr<PeerService::Stalled> PeerService::StalledSource(const kernels::KvCacheShape& shape,
                                                                uint32_t region) {
  absl::MutexLock lock(&peers_mu_);
  if (stalled_agent_ == nullptr) {
    absl::StatusOr<std::unique_ptr<kvtransfer::TransferAgent>> agent =
        kvtransfer::CreateUcxAgent({.transports = options_.kv_transport, .tcp_ports = ""});
    if (!agent.ok()) return agent.status();
    stalled_agent_ = *std::move(agent);
    stalled_memory_.resize(static_cast<size_t>(shape.blocks) * shape.BytesPerBlock());
    absl::StatusOr<uint32_t> registered = stalled_agent_->RegisterMemory(
        stalled_memory_.data(), stalled_memory_.size(), kvtransfer::MemoryKind::kHost);
    if (!registered.ok()) return registered.status();
    if (*registered != region) return absl::InternalError("the stalled source's region differs");
  }
  absl::StatusOr<std::string> metadata = stalled_agent_->LocalMetadata();
  if (!metadata.ok()) return metadata.status();
  const kvtransfer::Descriptor all{region, 0, stalled_memory_.size()};
  absl::StatusOr<kvtransfer::ReadGrant> grant =
      stalled_agent_->GrantReads({&all, 1}, absl::InfiniteFuture());
  if (!grant.ok()) return grant.status();
  absl::StatusOr<kvtransfer::PeerId> peer = kv_->agent->AddPeer(*metadata);  // while it answers
  if (!peer.ok()) return peer.status();
  stalled_agent_->StopAnsweringForTesting(options_.stall_duration);
  return Stalled{*peer, grant->token};
}

void PeerService::ForgetPeer(kvtransfer::PeerId peer) {
  {
    absl::MutexLock lock(&peers_mu_);
    absl::erase_if(peers_, [peer](const auto& entry) { return entry.second == peer; });
  }
  kv_->agent->RemovePeer(peer);
}

void PeerService::TransferEnded(const std::shared_ptr<Call>& call,
                                const kvtransfer::TransferStatus& status, uint64_t bytes,
                                absl::Time posted, const std::string& injected, bool overran) {
  if (overran || status.state == kvtransfer::TransferState::kFailed || !injected.empty()) {
    // "denied": the source's agent would not answer a read (no live grant
    // covers it).
    const bool denied = status.error.code() == absl::StatusCode::kPermissionDenied;
    metrics_->OnKvTransferFailure("in", overran ? "lease" : denied ? "denied" : "transfer");
    const absl::Status why =
        overran ? absl::UnavailableError("the KV transfer did not finish within its lease")
        : !injected.empty()
            ? absl::UnavailableError(injected)
            : absl::UnavailableError(StrCat("the KV transfer failed: ", status.error.message()));
    spdlog::warn("request {}: {}", call->handoff().request_id(), std::string(why.message()));
    call->TransferFailed(why);
    return;
  }
  metrics_->OnKvTransfer("in", bytes);
  if (!call->TransferDone()) return;
  v1::DecodeEvent event;
  event.mutable_pages_read()->set_bytes(bytes);
  event.mutable_pages_read()->set_transfer_ms(absl::ToDoubleMilliseconds(absl::Now() - posted));
  call->Send(std::move(event));
}

}  // namespace tandem::server
