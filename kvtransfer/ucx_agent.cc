#include "kvtransfer/ucx_agent.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "kvtransfer/agent_metadata.h"

namespace tandem::kvtransfer {
namespace {

constexpr char kBackend[] = "ucx";
// The active-message id notifications travel on.
constexpr unsigned kNotifyAmId = 17;

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat("UCX: ", what, ": ", ucs_status_string(status)));
}

struct Region {
  void* base = nullptr;
  size_t bytes = 0;
  ucp_mem_h memory = nullptr;
  std::string packed_key;
};

struct Peer {
  ucp_ep_h endpoint = nullptr;
  std::vector<RegionMetadata> regions;
  std::vector<ucp_rkey_h> keys;  // one per region
  absl::Status failure;          // set when the endpoint failed
};

// One PostRead. Completion callbacks run on the progress thread with the
// agent's lock held (they are called from ucp_worker_progress).
struct Transfer {
  PeerId peer = 0;
  int64_t outstanding_reads = 0;
  ucs_status_t first_error = UCS_OK;
  std::string notification;
  bool notifying = false;  // the notification's send is in flight
  TransferStatus status;
};

class UcxAgent final : public TransferAgent {
 public:
  UcxAgent() = default;
  ~UcxAgent() override;

  absl::Status Start(const UcxAgentOptions& options);

  std::string backend() const override { return kBackend; }
  absl::StatusOr<uint32_t> RegisterMemory(void* base, size_t bytes, MemoryKind kind) override;
  absl::StatusOr<std::string> LocalMetadata() override;
  absl::StatusOr<PeerId> AddPeer(std::string_view metadata) override;
  void RemovePeer(PeerId peer) override;
  absl::StatusOr<TransferId> PostRead(PeerId peer, std::span<const Descriptor> local,
                                      std::span<const Descriptor> remote,
                                      std::string notification) override;
  TransferStatus Poll(TransferId transfer) override;
  void Release(TransferId transfer) override;
  std::vector<std::string> TakeNotifications() override;
  void StopAnsweringForTesting(absl::Duration duration) override {
    silent_until_ns_ = absl::ToUnixNanos(absl::Now() + duration);
  }

 private:
  static void OnRead(void* request, ucs_status_t status, void* user_data);
  static void OnNotified(void* request, ucs_status_t status, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h endpoint, ucs_status_t status);
  static ucs_status_t OnNotification(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param);

  void ProgressLoop();
  // Runs UCX's progress until it has nothing left to do, then moves
  // transfers forward. REQUIRES: mu_ held.
  void ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceLocked(Transfer& transfer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked(ucp_ep_h endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseEndpointLocked(ucp_ep_h endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();

  absl::Mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ ABSL_GUARDED_BY(mu_) = nullptr;
  int worker_fd_ = -1;  // readable when the worker has events (after ucp_worker_arm)
  int wake_fd_ = -1;    // an eventfd: new work, or stop
  std::vector<Region> regions_ ABSL_GUARDED_BY(mu_);
  // Peers and transfers stay at one address: UCX callbacks point at them.
  absl::flat_hash_map<PeerId, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TransferId, std::unique_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> notifications_ ABSL_GUARDED_BY(mu_);
  PeerId next_peer_ ABSL_GUARDED_BY(mu_) = 1;
  TransferId next_transfer_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> silent_until_ns_{0};  // StopAnsweringForTesting
  std::thread progress_thread_;
};

absl::Status UcxAgent::Start(const UcxAgentOptions& options) {
  ucp_config_t* config = nullptr;
  if (ucs_status_t s = ucp_config_read(nullptr, nullptr, &config); s != UCS_OK) {
    return UcxError("reading the configuration", s);
  }
  if (!options.transports.empty()) {
    if (ucs_status_t s = ucp_config_modify(config, "TLS", options.transports.c_str());
        s != UCS_OK) {
      ucp_config_release(config);
      return UcxError(absl::StrCat("transports \"", options.transports, "\""), s);
    }
  }
  if (!options.tcp_ports.empty()) {
    // The TCP transport's key (UCX_TCP_PORT_RANGE) without its prefix: UCP
    // hands keys it does not know to the transports' own tables.
    if (ucs_status_t s = ucp_config_modify(config, "PORT_RANGE", options.tcp_ports.c_str());
        s != UCS_OK) {
      ucp_config_release(config);
      return UcxError(absl::StrCat("TCP port range \"", options.tcp_ports, "\""), s);
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  const ucs_status_t init = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (init != UCS_OK) return UcxError("starting", init);

  absl::MutexLock lock(&mu_);
  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Every call into the worker holds mu_.
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  if (ucs_status_t s = ucp_worker_create(context_, &worker_params, &worker_); s != UCS_OK) {
    return UcxError("creating a worker", s);
  }
  if (ucs_status_t s = ucp_worker_get_efd(worker_, &worker_fd_); s != UCS_OK) {
    return UcxError("getting the worker's event descriptor", s);
  }
  ucp_am_handler_param_t handler{};
  handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
  handler.id = kNotifyAmId;
  handler.cb = &UcxAgent::OnNotification;
  handler.arg = this;
  if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &handler); s != UCS_OK) {
    return UcxError("registering the notification handler", s);
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  progress_thread_ = std::thread([this] { ProgressLoop(); });
  return absl::OkStatus();
}

UcxAgent::~UcxAgent() {
  if (progress_thread_.joinable()) {
    stop_ = true;
    Wake();
    progress_thread_.join();
  }
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, peer] : peers_) {
      // Keys only once no operation can use them: after the close.
      CloseEndpointLocked(peer->endpoint);
      for (ucp_rkey_h key : peer->keys) ucp_rkey_destroy(key);
    }
    peers_.clear();
    for (Region& region : regions_) ucp_mem_unmap(context_, region.memory);
    regions_.clear();
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
  }
  if (context_ != nullptr) ucp_cleanup(context_);
  if (wake_fd_ >= 0) close(wake_fd_);
}

void UcxAgent::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void UcxAgent::ProgressLoop() {
  while (!stop_) {
    if (absl::ToUnixNanos(absl::Now()) < silent_until_ns_.load()) {
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    bool armed = false;
    {
      absl::MutexLock lock(&mu_);
      ProgressLocked();
      // UCS_OK: nothing pending, the descriptor will signal new events.
      armed = ucp_worker_arm(worker_) == UCS_OK;
    }
    if (!armed) continue;  // more to do at once
    pollfd fds[2] = {{worker_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    // The timeout bounds how long a missed wake-up could delay anything.
    poll(fds, 2, /*timeout_ms=*/10);
    if (fds[1].revents & POLLIN) {
      uint64_t count = 0;
      [[maybe_unused]] ssize_t n = read(wake_fd_, &count, sizeof(count));
    }
  }
}

void UcxAgent::ProgressLocked() {
  while (ucp_worker_progress(worker_) != 0) {
  }
  for (auto& [id, transfer] : transfers_) AdvanceLocked(*transfer);
}

void UcxAgent::AdvanceLocked(Transfer& transfer) {
  if (transfer.status.state != TransferState::kInProgress || transfer.notifying ||
      transfer.outstanding_reads > 0) {
    return;
  }
  auto peer = peers_.find(transfer.peer);
  if (transfer.first_error != UCS_OK || peer == peers_.end() || !peer->second->failure.ok()) {
    transfer.status.state = TransferState::kFailed;
    transfer.status.error = peer == peers_.end() ? absl::UnavailableError("the peer was removed")
                            : !peer->second->failure.ok()
                                ? peer->second->failure
                                : UcxError("a read failed", transfer.first_error);
    return;
  }
  // Every read landed: tell the owner of the memory.
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.send = &UcxAgent::OnNotified;
  param.user_data = &transfer;
  void* request =
      ucp_am_send_nbx(peer->second->endpoint, kNotifyAmId, nullptr, 0, transfer.notification.data(),
                      transfer.notification.size(), &param);
  if (UCS_PTR_IS_ERR(request)) {
    transfer.status.state = TransferState::kFailed;
    transfer.status.error = UcxError("sending the notification", UCS_PTR_STATUS(request));
    return;
  }
  transfer.notifying = true;
}

void UcxAgent::OnRead(void* request, ucs_status_t status, void* user_data) {
  auto* transfer = static_cast<Transfer*>(user_data);
  if (status != UCS_OK && transfer->first_error == UCS_OK) transfer->first_error = status;
  --transfer->outstanding_reads;
  ucp_request_free(request);
}

void UcxAgent::OnNotified(void* request, ucs_status_t status, void* user_data) {
  auto* transfer = static_cast<Transfer*>(user_data);
  transfer->notifying = false;
  if (status == UCS_OK) {
    transfer->status.state = TransferState::kDone;
  } else {
    transfer->status.state = TransferState::kFailed;
    transfer->status.error = UcxError("sending the notification", status);
  }
  ucp_request_free(request);
}

void UcxAgent::OnEndpointError(void* arg, ucp_ep_h /*endpoint*/, ucs_status_t status) {
  // Runs inside ucp_worker_progress, lock held; `arg` is the Peer.
  static_cast<Peer*>(arg)->failure = UcxError("the peer's connection failed", status);
}

ucs_status_t UcxAgent::OnNotification(void* arg, const void* /*header*/, size_t /*header_length*/,
                                      void* data, size_t length, const ucp_am_recv_param_t* param) {
  // Notifications are at most kMaxNotificationBytes, always sent eagerly: a
  // rendezvous one (data not here yet) cannot come from a Tandem agent.
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_OK;
  auto* agent = static_cast<UcxAgent*>(arg);
  agent->mu_.AssertHeld();
  agent->notifications_.emplace_back(static_cast<const char*>(data), length);
  return UCS_OK;
}

absl::StatusOr<uint32_t> UcxAgent::RegisterMemory(void* base, size_t bytes, MemoryKind kind) {
  if (base == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("RegisterMemory: an empty region");
  }
  absl::MutexLock lock(&mu_);
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
  params.address = base;
  params.length = bytes;
  params.memory_type = kind == MemoryKind::kCuda ? UCS_MEMORY_TYPE_CUDA : UCS_MEMORY_TYPE_HOST;
  Region region{base, bytes, nullptr, {}};
  if (ucs_status_t s = ucp_mem_map(context_, &params, &region.memory); s != UCS_OK) {
    return UcxError(absl::StrCat("registering ", bytes, " bytes"), s);
  }
  void* packed = nullptr;
  size_t packed_bytes = 0;
  if (ucs_status_t s = ucp_rkey_pack(context_, region.memory, &packed, &packed_bytes);
      s != UCS_OK) {
    ucp_mem_unmap(context_, region.memory);
    return UcxError("packing a remote key", s);
  }
  region.packed_key.assign(static_cast<const char*>(packed), packed_bytes);
  ucp_rkey_buffer_release(packed);
  regions_.push_back(std::move(region));
  return static_cast<uint32_t>(regions_.size() - 1);
}

absl::StatusOr<std::string> UcxAgent::LocalMetadata() {
  absl::MutexLock lock(&mu_);
  ucp_address_t* address = nullptr;
  size_t address_bytes = 0;
  if (ucs_status_t s = ucp_worker_get_address(worker_, &address, &address_bytes); s != UCS_OK) {
    return UcxError("getting the worker's address", s);
  }
  AgentMetadata metadata;
  metadata.backend = kBackend;
  metadata.address.assign(reinterpret_cast<const char*>(address), address_bytes);
  ucp_worker_release_address(worker_, address);
  for (const Region& region : regions_) {
    metadata.regions.push_back({reinterpret_cast<uint64_t>(region.base),
                                static_cast<uint64_t>(region.bytes), region.packed_key});
  }
  return EncodeAgentMetadata(metadata);
}

absl::StatusOr<PeerId> UcxAgent::AddPeer(std::string_view metadata_bytes) {
  absl::StatusOr<AgentMetadata> metadata = DecodeAgentMetadata(metadata_bytes);
  if (!metadata.ok()) return metadata.status();
  if (metadata->backend != kBackend) {
    return absl::InvalidArgumentError(absl::StrCat("KV-transfer metadata from a \"",
                                                   metadata->backend, "\" agent; this one is \"",
                                                   kBackend, "\""));
  }
  absl::MutexLock lock(&mu_);
  auto owned = std::make_unique<Peer>();
  Peer& peer = *owned;
  peer.regions = metadata->regions;
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(metadata->address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;  // a dead peer fails its transfers
  params.err_handler.cb = &UcxAgent::OnEndpointError;
  params.err_handler.arg = &peer;
  if (ucs_status_t s = ucp_ep_create(worker_, &params, &peer.endpoint); s != UCS_OK) {
    return UcxError("connecting to the peer", s);
  }
  for (const RegionMetadata& region : peer.regions) {
    ucp_rkey_h key = nullptr;
    if (ucs_status_t s = ucp_ep_rkey_unpack(peer.endpoint, region.key.data(), &key); s != UCS_OK) {
      for (ucp_rkey_h k : peer.keys) ucp_rkey_destroy(k);
      CloseEndpointLocked(peer.endpoint);
      return absl::InvalidArgumentError(
          absl::StrCat("KV-transfer metadata: a region's remote key: ", ucs_status_string(s)));
    }
    peer.keys.push_back(key);
  }
  // Finish connecting now (a flush completes the wire-up handshake), so that
  // no handshake message is still queued when either side later goes away:
  // UCX 1.13 aborts the process when a TCP connection fails with one queued.
  if (absl::Status s = FlushLocked(peer.endpoint); !s.ok()) {
    for (ucp_rkey_h k : peer.keys) ucp_rkey_destroy(k);
    CloseEndpointLocked(peer.endpoint);
    return s;
  }
  const PeerId id = next_peer_++;
  peers_[id] = std::move(owned);
  Wake();
  return id;
}

absl::Status UcxAgent::FlushLocked(ucp_ep_h endpoint) {
  ucp_request_param_t param{};
  void* request = ucp_ep_flush_nbx(endpoint, &param);
  if (request == nullptr) return absl::OkStatus();
  if (UCS_PTR_IS_ERR(request)) return UcxError("connecting to the peer", UCS_PTR_STATUS(request));
  // Bounded: an unreachable peer fails the flush (UCX's connect timeout).
  ucs_status_t status;
  while ((status = ucp_request_check_status(request)) == UCS_INPROGRESS) {
    ucp_worker_progress(worker_);
  }
  ucp_request_free(request);
  return status == UCS_OK ? absl::OkStatus() : UcxError("connecting to the peer", status);
}

void UcxAgent::CloseEndpointLocked(ucp_ep_h endpoint) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;  // outstanding operations end cancelled
  void* request = ucp_ep_close_nbx(endpoint, &param);
  if (UCS_PTR_IS_PTR(request)) {
    while (ucp_request_check_status(request) == UCS_INPROGRESS) ucp_worker_progress(worker_);
    ucp_request_free(request);
  }
}

void UcxAgent::RemovePeer(PeerId id) {
  absl::MutexLock lock(&mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  // Closing completes the peer's outstanding reads (cancelled), so their
  // transfers fail rather than wait; the keys go after, when no operation
  // can use them any more (UCX's rule for ucp_rkey_destroy).
  CloseEndpointLocked(it->second->endpoint);
  for (ucp_rkey_h key : it->second->keys) ucp_rkey_destroy(key);
  it->second->keys.clear();
  peers_.erase(it);
  ProgressLocked();
}

absl::StatusOr<TransferId> UcxAgent::PostRead(PeerId peer_id, std::span<const Descriptor> local,
                                              std::span<const Descriptor> remote,
                                              std::string notification) {
  if (local.size() != remote.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PostRead: ", local.size(), " local descriptors for ", remote.size(), " remote ones"));
  }
  if (notification.size() > kMaxNotificationBytes) {
    return absl::InvalidArgumentError(absl::StrCat("PostRead: a notification of ",
                                                   notification.size(), " bytes (at most ",
                                                   kMaxNotificationBytes, ")"));
  }
  absl::MutexLock lock(&mu_);
  auto found = peers_.find(peer_id);
  if (found == peers_.end()) return absl::NotFoundError(absl::StrCat("no peer ", peer_id));
  Peer& peer = *found->second;
  if (!peer.failure.ok()) return peer.failure;
  // Check everything before posting anything.
  for (size_t i = 0; i < local.size(); ++i) {
    const Descriptor& l = local[i];
    const Descriptor& r = remote[i];
    if (l.bytes != r.bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("PostRead: descriptor ", i, " reads ", r.bytes, " bytes into ", l.bytes));
    }
    if (l.region >= regions_.size() || r.region >= peer.regions.size()) {
      return absl::NotFoundError(absl::StrCat("PostRead: descriptor ", i, " names region ",
                                              l.region >= regions_.size() ? l.region : r.region,
                                              ", which is not registered"));
    }
    const uint64_t local_size = regions_[l.region].bytes;
    const uint64_t remote_size = peer.regions[r.region].bytes;
    if (l.offset > local_size || l.bytes > local_size - l.offset || r.offset > remote_size ||
        r.bytes > remote_size - r.offset) {
      return absl::OutOfRangeError(absl::StrCat("PostRead: descriptor ", i, " leaves its region"));
    }
  }
  const TransferId id = next_transfer_++;
  auto owned = std::make_unique<Transfer>();
  Transfer& transfer = *owned;
  transfer.peer = peer_id;
  transfer.notification = std::move(notification);
  transfers_[id] = std::move(owned);
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.cb.send = &UcxAgent::OnRead;
  param.user_data = &transfer;
  for (size_t i = 0; i < local.size(); ++i) {
    if (local[i].bytes == 0) continue;
    char* into = static_cast<char*>(regions_[local[i].region].base) + local[i].offset;
    const uint64_t from = peer.regions[remote[i].region].base + remote[i].offset;
    void* request =
        ucp_get_nbx(peer.endpoint, into, local[i].bytes, from, peer.keys[remote[i].region], &param);
    if (UCS_PTR_IS_ERR(request)) {
      if (transfer.first_error == UCS_OK) transfer.first_error = UCS_PTR_STATUS(request);
      break;  // those posted complete (or fail) on their own; the transfer fails
    }
    if (request != nullptr) ++transfer.outstanding_reads;
  }
  AdvanceLocked(transfer);
  Wake();
  return id;
}

TransferStatus UcxAgent::Poll(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it == transfers_.end()) {
    return {TransferState::kFailed, absl::NotFoundError(absl::StrCat("no transfer ", id))};
  }
  ProgressLocked();
  return it->second->status;
}

void UcxAgent::Release(TransferId id) {
  absl::MutexLock lock(&mu_);
  auto it = transfers_.find(id);
  if (it != transfers_.end() && it->second->status.state != TransferState::kInProgress) {
    transfers_.erase(it);
  }
}

std::vector<std::string> UcxAgent::TakeNotifications() {
  absl::MutexLock lock(&mu_);
  ProgressLocked();
  std::vector<std::string> out(std::make_move_iterator(notifications_.begin()),
                               std::make_move_iterator(notifications_.end()));
  notifications_.clear();
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TransferAgent>> CreateUcxAgent(const UcxAgentOptions& options) {
  auto agent = std::make_unique<UcxAgent>();
  if (absl::Status s = agent->Start(options); !s.ok()) return s;
  return agent;
}

}  // namespace tandem::kvtransfer
