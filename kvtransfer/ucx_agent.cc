#include "kvtransfer/ucx_agent.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "kvtransfer/agent_metadata.h"
#include "kvtransfer/read_grants.h"

namespace tandem::kvtransfer {
namespace {

// How reads move. A reader never touches the owner's memory itself: UCX's
// one-sided gets are not used (over TCP, UCX answers a get for any address
// of the process without checking a key), and the context is started
// without them, so no peer can issue one. Instead the reader asks, with an
// active message per chunk of the transfer (the ranges and the grant's
// token), and the owner's agent checks the grant, copies the ranges' bytes
// into a buffer of the answer while it holds its lock (so a revoked grant's
// memory is never read afterwards) and sends them back. The reader lands
// each answer in a buffer and copies it into its own memory, again under
// its lock and only while the transfer is live: a transfer cut off at its
// lease writes nothing after.
constexpr char kBackend[] = "ucx";
constexpr unsigned kNotifyAmId = 17;  // a transfer's notification
constexpr unsigned kReadAmId = 18;    // a reader asks for one chunk
constexpr unsigned kAnswerAmId = 19;  // the owner's answer: the bytes, or why not
constexpr unsigned kPingAmId = 20;    // AddPeer's round trip ...
constexpr unsigned kPongAmId = 21;    // ... and its answer
// How long AddPeer waits for the peer's answer.
constexpr absl::Duration kConnectTimeout = absl::Seconds(10);
// A chunk is at most this many bytes; this many chunks of a transfer are
// asked for at once (the owner copies the next while one is on the wire).
constexpr uint64_t kChunkBytes = uint64_t{4} << 20;
constexpr size_t kChunksInFlight = 4;
// An ask names at most this many ranges (a chunk of single-slot pieces of
// a large model stays far below it).
constexpr size_t kMaxRangesPerAsk = 1 << 16;
// Notifications kept for TakeNotifications, newest last; older ones are
// dropped (a daemon that never takes them holds no more than this).
constexpr size_t kMaxQueuedNotifications = 4096;

// The messages. Both ends run this code (AddPeer checks the backend), on
// machines of one byte order.
struct WireRange {
  uint32_t region = 0;
  uint32_t reserved = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};
// A transfer's ask and the answer echo the transfer's nonce (random, 16
// bytes): the reader takes an answer only for a chunk it asked for and has
// not landed, carrying that nonce, so no one who merely reaches its port
// can write into its KV memory or fail its transfers this way.
struct ReadHeader {
  uint64_t transfer = 0;
  uint64_t chunk = 0;
  unsigned char nonce[16] = {};
  char token[ReadGrants::kTokenBytes] = {};
};
struct PingHeader {
  uint64_t nonce = 0;
};
struct AnswerHeader {
  uint64_t transfer = 0;
  uint64_t chunk = 0;
  unsigned char nonce[16] = {};
  uint32_t refused = 0;  // 1: the data is the reason, not the bytes
  uint32_t reserved = 0;
};

absl::Status UcxError(absl::string_view what, ucs_status_t status) {
  return absl::UnavailableError(absl::StrCat("UCX: ", what, ": ", ucs_status_string(status)));
}

struct Region {
  void* base = nullptr;
  size_t bytes = 0;
};

struct Peer {
  ucp_ep_h endpoint = nullptr;
  std::vector<RegionMetadata> regions;
  absl::Status failure;  // set when the endpoint failed
};

struct Chunk {
  std::vector<Descriptor> local;  // where its bytes land, in order
  std::vector<WireRange> remote;  // what is asked for, in the same order
  uint64_t bytes = 0;
};

// One PostRead, on the reader's side. Callbacks run on whichever thread
// progresses the worker, with the agent's lock held.
enum class ChunkState : uint8_t { kWaiting, kAsked, kLanding, kLanded };

class UcxAgent;

struct Transfer {
  UcxAgent* agent = nullptr;
  TransferId id = 0;
  PeerId peer = 0;
  std::string token;
  unsigned char nonce[16] = {};
  std::vector<Chunk> chunks;
  std::vector<ChunkState> state;  // one per chunk
  size_t asked = 0;               // chunks asked for so far (in order)
  size_t landed = 0;              // chunks whose bytes are in local memory
  std::string notification;
  bool notifying = false;  // the notification's send is in flight
  bool released = false;   // Release came while notifying: erased after
  TransferStatus status;
};

// A message in flight, kept until UCX is done with its buffers.
struct Outgoing {
  UcxAgent* agent = nullptr;
  TransferId transfer = 0;  // a reader's ask: the transfer it is for
  ReadHeader read;
  AnswerHeader answer;
  PingHeader ping;
  std::string payload;
};

// An answer arriving by rendezvous: its bytes land here first.
struct Landing {
  UcxAgent* agent = nullptr;
  TransferId transfer = 0;
  uint64_t chunk = 0;
  std::string bytes;
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
  absl::StatusOr<ReadGrant> GrantReads(std::span<const Descriptor> ranges,
                                       absl::Time until) override;
  void RevokeReads(GrantId grant) override;
  absl::StatusOr<TransferId> PostRead(PeerId peer, std::span<const Descriptor> local,
                                      std::span<const Descriptor> remote,
                                      std::string_view grant_token,
                                      std::string notification) override;
  TransferStatus Poll(TransferId transfer) override;
  void Release(TransferId transfer) override;
  std::vector<std::string> TakeNotifications() override;
  void StopAnsweringForTesting(absl::Duration duration) override {
    // Under the lock: the progress thread checks it there, so nothing is
    // answered once this returns.
    absl::MutexLock lock(&mu_);
    silent_until_ns_ = absl::ToUnixNanos(absl::Now() + duration);
  }

 private:
  static void OnNotified(void* request, ucs_status_t status, void* user_data);
  static void OnSent(void* request, ucs_status_t status, void* user_data);
  static void OnLanded(void* request, ucs_status_t status, size_t length, void* user_data);
  static void OnEndpointError(void* arg, ucp_ep_h endpoint, ucs_status_t status);
  static ucs_status_t OnNotification(void* arg, const void* header, size_t header_length,
                                     void* data, size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnRead(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnAnswer(void* arg, const void* header, size_t header_length, void* data,
                               size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnPing(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);
  static ucs_status_t OnPong(void* arg, const void* header, size_t header_length, void* data,
                             size_t length, const ucp_am_recv_param_t* param);

  void ProgressLoop();
  // Runs UCX's progress until it has nothing left to do, then moves
  // transfers forward.
  void ProgressLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AdvanceLocked(TransferId id, Transfer& transfer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AskLocked(TransferId id, Transfer& transfer, Peer& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `out` (kept until UCX is done with it) on `endpoint`.
  ucs_status_t SendLocked(ucp_ep_h endpoint, unsigned am_id, std::unique_ptr<Outgoing> out,
                          const void* header, size_t header_bytes, uint32_t flags)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The owner's side of a read: checks, copies and answers.
  void AnswerLocked(ucp_ep_h reply, const ReadHeader& read, std::span<const WireRange> ranges)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Copies `bytes` (the chunk's, in order) into the transfer's local memory.
  void LandLocked(TransferId id, uint64_t chunk, const char* bytes, size_t length)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(TransferId id, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status FlushLocked(ucp_ep_h endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A round trip to the peer of `endpoint`: when it returns OK, both sides'
  // connections are set up (the peer answered over its own). Releases the
  // lock while it waits (at most kConnectTimeout).
  absl::Status PingLocked(ucp_ep_h endpoint, const Peer& peer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseEndpointLocked(ucp_ep_h endpoint) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Wake();

  absl::Mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ ABSL_GUARDED_BY(mu_) = nullptr;
  int worker_fd_ = -1;  // readable when the worker has events (after ucp_worker_arm)
  int wake_fd_ = -1;    // an eventfd: new work, or stop
  std::vector<Region> regions_ ABSL_GUARDED_BY(mu_);
  ReadGrants grants_ ABSL_GUARDED_BY(mu_);
  // Peers and transfers stay at one address: UCX callbacks point at them.
  absl::flat_hash_map<PeerId, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<TransferId, std::unique_ptr<Transfer>> transfers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Outgoing*, std::unique_ptr<Outgoing>> outgoing_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Landing*, std::unique_ptr<Landing>> landings_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> notifications_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> pings_ ABSL_GUARDED_BY(mu_);  // awaiting an answer
  absl::flat_hash_set<uint64_t> pongs_ ABSL_GUARDED_BY(mu_);  // answered pings' nonces
  uint64_t next_nonce_ ABSL_GUARDED_BY(mu_) = 1;
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
  // No UCP_FEATURE_RMA: without it this process answers no one-sided get.
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
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
  const std::pair<unsigned, ucp_am_recv_callback_t> handlers[] = {
      {kNotifyAmId, &UcxAgent::OnNotification}, {kReadAmId, &UcxAgent::OnRead},
      {kAnswerAmId, &UcxAgent::OnAnswer},       {kPingAmId, &UcxAgent::OnPing},
      {kPongAmId, &UcxAgent::OnPong},
  };
  for (const auto& [id, callback] : handlers) {
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    handler.id = id;
    handler.cb = callback;
    handler.arg = this;
    handler.flags = UCP_AM_FLAG_WHOLE_MSG;
    if (ucs_status_t s = ucp_worker_set_am_recv_handler(worker_, &handler); s != UCS_OK) {
      return UcxError("registering a message handler", s);
    }
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
    for (auto& [id, peer] : peers_) CloseEndpointLocked(peer->endpoint);
    peers_.clear();
    // Answers still on their way to readers (on connections UCX made, which
    // closing ours does not end) finish first, sent or failed with their
    // connection: UCX 1.13 asserts when a worker is destroyed with a send
    // outstanding. Bounded, for a reader that neither reads nor goes away.
    const absl::Time deadline = absl::Now() + kConnectTimeout;
    while ((!outgoing_.empty() || !landings_.empty()) && worker_ != nullptr &&
           absl::Now() < deadline) {
      ucp_worker_progress(worker_);
    }
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    // Buffers UCX may have used up to the worker's end.
    outgoing_.clear();
    landings_.clear();
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
    bool silent = false, armed = false;
    {
      absl::MutexLock lock(&mu_);
      silent = absl::ToUnixNanos(absl::Now()) < silent_until_ns_.load();
      if (!silent) {
        ProgressLocked();
        // UCS_OK: nothing pending, the descriptor will signal new events.
        armed = ucp_worker_arm(worker_) == UCS_OK;
      }
    }
    if (silent) {
      absl::SleepFor(absl::Milliseconds(10));
      continue;
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
  for (auto& [id, transfer] : transfers_) AdvanceLocked(id, *transfer);
}

void UcxAgent::FailLocked(TransferId id, absl::Status why) {
  auto it = transfers_.find(id);
  if (it == transfers_.end() || it->second->status.state != TransferState::kInProgress) return;
  it->second->status.state = TransferState::kFailed;
  it->second->status.error = std::move(why);
}

void UcxAgent::AdvanceLocked(TransferId id, Transfer& transfer) {
  if (transfer.status.state != TransferState::kInProgress || transfer.notifying) return;
  auto found = peers_.find(transfer.peer);
  if (found == peers_.end() || !found->second->failure.ok()) {
    FailLocked(id, found == peers_.end() ? absl::UnavailableError("the peer was removed")
                                         : found->second->failure);
    return;
  }
  Peer& peer = *found->second;
  if (transfer.landed < transfer.chunks.size()) {
    AskLocked(id, transfer, peer);
    return;
  }
  // Every byte landed: tell the owner of the memory.
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.send = &UcxAgent::OnNotified;
  param.user_data = &transfer;
  // Set first: UCX may report the completion before the call returns.
  transfer.notifying = true;
  void* request =
      ucp_am_send_nbx(peer.endpoint, kNotifyAmId, nullptr, 0, transfer.notification.data(),
                      transfer.notification.size(), &param);
  if (UCS_PTR_IS_ERR(request)) {
    transfer.notifying = false;
    FailLocked(id, UcxError("sending the notification", UCS_PTR_STATUS(request)));
  }
}

void UcxAgent::AskLocked(TransferId id, Transfer& transfer, Peer& peer) {
  while (transfer.asked < transfer.chunks.size() &&
         transfer.asked - transfer.landed < kChunksInFlight) {
    const size_t index = transfer.asked++;
    transfer.state[index] = ChunkState::kAsked;
    auto out = std::make_unique<Outgoing>();
    out->transfer = id;
    out->read.transfer = id;
    out->read.chunk = index;
    std::memcpy(out->read.nonce, transfer.nonce, sizeof(out->read.nonce));
    std::memcpy(out->read.token, transfer.token.data(),
                std::min(transfer.token.size(), sizeof(out->read.token)));
    const std::vector<WireRange>& ranges = transfer.chunks[index].remote;
    out->payload.assign(reinterpret_cast<const char*>(ranges.data()),
                        ranges.size() * sizeof(WireRange));
    const void* header = &out->read;
    // Eager, so the owner sees the whole ask in its handler; the reply
    // endpoint is what it answers on.
    const ucs_status_t s =
        SendLocked(peer.endpoint, kReadAmId, std::move(out), header, sizeof(ReadHeader),
                   UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
    if (s != UCS_OK) {
      FailLocked(id, UcxError("asking for KV pages", s));
      return;
    }
  }
}

ucs_status_t UcxAgent::SendLocked(ucp_ep_h endpoint, unsigned am_id, std::unique_ptr<Outgoing> out,
                                  const void* header, size_t header_bytes, uint32_t flags) {
  Outgoing* raw = out.get();
  ucp_request_param_t param{};
  param.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  param.cb.send = &UcxAgent::OnSent;
  param.user_data = raw;
  param.flags = flags;
  raw->agent = this;
  // Kept before the call, in case UCX completes it before returning.
  outgoing_.emplace(raw, std::move(out));
  void* request = ucp_am_send_nbx(endpoint, am_id, header, header_bytes, raw->payload.data(),
                                  raw->payload.size(), &param);
  if (request == nullptr || UCS_PTR_IS_ERR(request)) {
    outgoing_.erase(raw);  // done at once, or never sent
    return request == nullptr ? UCS_OK : UCS_PTR_STATUS(request);
  }
  return UCS_OK;
}

void UcxAgent::OnSent(void* request, ucs_status_t status, void* user_data) {
  // Runs inside ucp_worker_progress (or a close), lock held.
  auto* out = static_cast<Outgoing*>(user_data);
  ucp_request_free(request);
  UcxAgent* agent = out->agent;
  agent->mu_.AssertHeld();
  if (status != UCS_OK && out->transfer != 0) {
    agent->FailLocked(out->transfer, UcxError("asking for KV pages", status));
  }
  agent->outgoing_.erase(out);
}

void UcxAgent::OnNotified(void* request, ucs_status_t status, void* user_data) {
  auto* transfer = static_cast<Transfer*>(user_data);
  ucp_request_free(request);
  UcxAgent* agent = transfer->agent;
  agent->mu_.AssertHeld();
  transfer->notifying = false;
  if (transfer->released) {
    agent->transfers_.erase(transfer->id);  // destroys `transfer`
    return;
  }
  if (transfer->status.state == TransferState::kInProgress) {
    if (status == UCS_OK) {
      transfer->status.state = TransferState::kDone;
    } else {
      transfer->status.state = TransferState::kFailed;
      transfer->status.error = UcxError("sending the notification", status);
    }
  }
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
  if (agent->notifications_.size() >= kMaxQueuedNotifications) agent->notifications_.pop_front();
  agent->notifications_.emplace_back(static_cast<const char*>(data), length);
  return UCS_OK;
}

ucs_status_t UcxAgent::OnRead(void* arg, const void* header, size_t header_length, void* data,
                              size_t length, const ucp_am_recv_param_t* param) {
  auto* agent = static_cast<UcxAgent*>(arg);
  agent->mu_.AssertHeld();
  // Asks are eager and carry a reply endpoint; anything else is not from a
  // Tandem agent and gets no answer.
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0) return UCS_ERR_INVALID_PARAM;
  if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr ||
      header_length != sizeof(ReadHeader) || length % sizeof(WireRange) != 0) {
    return UCS_OK;
  }
  ReadHeader read;
  std::memcpy(&read, header, sizeof(read));
  std::vector<WireRange> ranges(length / sizeof(WireRange));
  if (length > 0) std::memcpy(ranges.data(), data, length);
  agent->AnswerLocked(param->reply_ep, read, ranges);
  return UCS_OK;
}

void UcxAgent::AnswerLocked(ucp_ep_h reply, const ReadHeader& read,
                            std::span<const WireRange> ranges) {
  auto out = std::make_unique<Outgoing>();
  out->answer.transfer = read.transfer;
  out->answer.chunk = read.chunk;
  std::memcpy(out->answer.nonce, read.nonce, sizeof(out->answer.nonce));
  std::vector<Descriptor> reads;
  uint64_t total = 0;
  absl::Status allowed = absl::OkStatus();
  if (ranges.size() > kMaxRangesPerAsk) {
    allowed = absl::PermissionDeniedError("the read names too many ranges");
  } else {
    reads.reserve(ranges.size());
  }
  for (size_t i = 0; allowed.ok() && i < ranges.size(); ++i) {
    const WireRange& r = ranges[i];
    if (r.region >= regions_.size() || r.offset > regions_[r.region].bytes ||
        r.bytes > regions_[r.region].bytes - r.offset) {
      allowed = absl::PermissionDeniedError("the read leaves the owner's memory");
    } else if (r.bytes > kChunkBytes - total) {
      // One answer carries one chunk at most (what an agent asks for).
      allowed = absl::PermissionDeniedError("the read asks for more than a chunk");
    } else {
      reads.push_back({r.region, r.offset, r.bytes});
      total += r.bytes;
    }
  }
  if (allowed.ok()) {
    allowed = grants_.Check(std::string_view(read.token, sizeof(read.token)), reads, absl::Now());
  }
  if (allowed.ok()) {
    // Copied now, under the lock: a grant revoked after this returns is
    // never read again, whatever happens to the message on the wire.
    out->payload.resize(total);
    char* to = out->payload.data();
    for (const Descriptor& d : reads) {
      std::memcpy(to, static_cast<const char*>(regions_[d.region].base) + d.offset, d.bytes);
      to += d.bytes;
    }
  } else {
    out->answer.refused = 1;
    out->payload = std::string(allowed.message());
  }
  const void* header = &out->answer;
  // A failure to send reaches the reader as its transfer's failure (its
  // connection broke) or its lease's end.
  SendLocked(reply, kAnswerAmId, std::move(out), header, sizeof(AnswerHeader), 0);
}

ucs_status_t UcxAgent::OnAnswer(void* arg, const void* header, size_t header_length, void* data,
                                size_t length, const ucp_am_recv_param_t* param) {
  auto* agent = static_cast<UcxAgent*>(arg);
  agent->mu_.AssertHeld();
  if (header_length != sizeof(AnswerHeader)) return UCS_OK;
  AnswerHeader answer;
  std::memcpy(&answer, header, sizeof(answer));
  auto found = agent->transfers_.find(answer.transfer);
  // A transfer that ended (cut off, failed) takes nothing more.
  if (found == agent->transfers_.end() ||
      found->second->status.state != TransferState::kInProgress) {
    return UCS_OK;
  }
  const bool rendezvous = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  Transfer& transfer = *found->second;
  // Only an answer to an outstanding ask of this transfer counts; anything
  // else (a stale or repeated answer, or one from someone who does not
  // know the nonce) is dropped unread.
  if (std::memcmp(answer.nonce, transfer.nonce, sizeof(answer.nonce)) != 0 ||
      answer.chunk >= transfer.chunks.size() ||
      transfer.state[answer.chunk] != ChunkState::kAsked) {
    return UCS_OK;
  }
  if (answer.refused != 0) {
    std::string why =
        rendezvous ? std::string("(no reason given)")
                   : std::string(static_cast<const char*>(data), std::min<size_t>(length, 512));
    agent->FailLocked(answer.transfer, absl::PermissionDeniedError(
                                           absl::StrCat("the owner refused the read: ", why)));
    return UCS_OK;
  }
  if (length != transfer.chunks[answer.chunk].bytes) {
    agent->FailLocked(answer.transfer,
                      absl::DataLossError("the owner answered a read with the wrong bytes"));
    return UCS_OK;
  }
  if (!rendezvous) {
    agent->LandLocked(answer.transfer, answer.chunk, static_cast<const char*>(data), length);
    return UCS_OK;
  }
  auto landing = std::make_unique<Landing>();
  Landing* raw = landing.get();
  raw->agent = agent;
  raw->transfer = answer.transfer;
  raw->chunk = answer.chunk;
  raw->bytes.resize(length);
  transfer.state[answer.chunk] = ChunkState::kLanding;
  ucp_request_param_t receive{};
  receive.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  receive.cb.recv_am = &UcxAgent::OnLanded;
  receive.user_data = raw;
  // Kept before the call, in case UCX completes it before returning.
  agent->landings_.emplace(raw, std::move(landing));
  void* request = ucp_am_recv_data_nbx(agent->worker_, data, raw->bytes.data(), length, &receive);
  if (request == nullptr) {
    agent->LandLocked(raw->transfer, raw->chunk, raw->bytes.data(), raw->bytes.size());
    agent->landings_.erase(raw);
  } else if (UCS_PTR_IS_ERR(request)) {
    agent->FailLocked(answer.transfer, UcxError("receiving KV pages", UCS_PTR_STATUS(request)));
    agent->landings_.erase(raw);
  }
  return UCS_OK;
}

void UcxAgent::OnLanded(void* request, ucs_status_t status, size_t /*length*/, void* user_data) {
  auto* landing = static_cast<Landing*>(user_data);
  UcxAgent* agent = landing->agent;
  agent->mu_.AssertHeld();
  if (status == UCS_OK) {
    agent->LandLocked(landing->transfer, landing->chunk, landing->bytes.data(),
                      landing->bytes.size());
  } else {
    agent->FailLocked(landing->transfer, UcxError("receiving KV pages", status));
  }
  ucp_request_free(request);
  agent->landings_.erase(landing);
}

void UcxAgent::LandLocked(TransferId id, uint64_t chunk, const char* bytes, size_t length) {
  auto found = transfers_.find(id);
  if (found == transfers_.end() || found->second->status.state != TransferState::kInProgress) {
    return;  // cut off meanwhile: its memory may be someone else's now
  }
  Transfer& transfer = *found->second;
  if (chunk >= transfer.chunks.size() || transfer.state[chunk] == ChunkState::kLanded ||
      transfer.state[chunk] == ChunkState::kWaiting) {
    return;  // each chunk lands once, and only once asked for
  }
  const Chunk& c = transfer.chunks[chunk];
  if (length != c.bytes) return;
  transfer.state[chunk] = ChunkState::kLanded;
  const char* from = bytes;
  for (const Descriptor& d : c.local) {
    std::memcpy(static_cast<char*>(regions_[d.region].base) + d.offset, from, d.bytes);
    from += d.bytes;
  }
  ++transfer.landed;
}

absl::StatusOr<uint32_t> UcxAgent::RegisterMemory(void* base, size_t bytes, MemoryKind kind) {
  if (base == nullptr || bytes == 0) {
    return absl::InvalidArgumentError("RegisterMemory: an empty region");
  }
  if (kind != MemoryKind::kHost) {
    // Answers copy the granted bytes on the host; a device region would need
    // a device copy here (and Debian's UCX has no CUDA transport).
    return absl::UnimplementedError(
        "RegisterMemory: the UCX agent moves host memory only (device KV pages cannot be served "
        "over the KV transport)");
  }
  absl::MutexLock lock(&mu_);
  regions_.push_back({base, bytes});
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
  // No key: a region is read only through a grant (GrantReads).
  for (const Region& region : regions_) {
    metadata.regions.push_back(
        {reinterpret_cast<uint64_t>(region.base), static_cast<uint64_t>(region.bytes), ""});
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
  // Finish connecting now, both ways, so that no handshake message is still
  // queued when either side later goes away: UCX 1.13 aborts the process
  // when a TCP connection fails with one queued. A flush completes this
  // side's handshake; the peer's answer to a ping comes over its own
  // connection, after its handshake messages.
  absl::Status connected = FlushLocked(peer.endpoint);
  if (connected.ok()) connected = PingLocked(peer.endpoint, peer);
  if (absl::Status s = connected; !s.ok()) {
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

absl::Status UcxAgent::PingLocked(ucp_ep_h endpoint, const Peer& peer) {
  const uint64_t nonce = next_nonce_++;
  pings_.insert(nonce);
  auto out = std::make_unique<Outgoing>();
  out->ping.nonce = nonce;
  const void* header = &out->ping;
  if (ucs_status_t s = SendLocked(endpoint, kPingAmId, std::move(out), header, sizeof(PingHeader),
                                  UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY);
      s != UCS_OK) {
    pings_.erase(nonce);
    return UcxError("connecting to the peer", s);
  }
  // The progress thread receives the answer; the lock is released while
  // waiting, so a peer slow to answer holds up no other transfer.
  Wake();
  auto answered = [this, nonce, &peer]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pongs_.contains(nonce) || !peer.failure.ok();
  };
  mu_.AwaitWithTimeout(absl::Condition(&answered), kConnectTimeout);
  pings_.erase(nonce);
  if (pongs_.erase(nonce) > 0) return absl::OkStatus();
  if (!peer.failure.ok()) return peer.failure;
  return absl::UnavailableError(absl::StrCat("UCX: connecting to the peer: no answer within ",
                                             absl::FormatDuration(kConnectTimeout)));
}

ucs_status_t UcxAgent::OnPing(void* arg, const void* header, size_t header_length, void* /*data*/,
                              size_t /*length*/, const ucp_am_recv_param_t* param) {
  auto* agent = static_cast<UcxAgent*>(arg);
  agent->mu_.AssertHeld();
  if (header_length != sizeof(PingHeader) ||
      (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) == 0 || param->reply_ep == nullptr) {
    return UCS_OK;
  }
  auto out = std::make_unique<Outgoing>();
  std::memcpy(&out->ping, header, sizeof(PingHeader));
  const void* pong = &out->ping;
  agent->SendLocked(param->reply_ep, kPongAmId, std::move(out), pong, sizeof(PingHeader),
                    UCP_AM_SEND_FLAG_EAGER);
  return UCS_OK;
}

ucs_status_t UcxAgent::OnPong(void* arg, const void* header, size_t header_length, void* /*data*/,
                              size_t /*length*/, const ucp_am_recv_param_t* /*param*/) {
  auto* agent = static_cast<UcxAgent*>(arg);
  agent->mu_.AssertHeld();
  if (header_length != sizeof(PingHeader)) return UCS_OK;
  PingHeader pong;
  std::memcpy(&pong, header, sizeof(pong));
  // Only pings still awaited: a stray or late answer is dropped.
  if (agent->pings_.contains(pong.nonce)) agent->pongs_.insert(pong.nonce);
  return UCS_OK;
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
  // Closing cancels the asks in flight; the transfers still waiting for
  // answers fail in the progress below (their peer is gone), so nothing
  // lands in their memory after this returns.
  CloseEndpointLocked(it->second->endpoint);
  peers_.erase(it);
  ProgressLocked();
}

absl::StatusOr<ReadGrant> UcxAgent::GrantReads(std::span<const Descriptor> ranges,
                                               absl::Time until) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const Descriptor& r = ranges[i];
    if (r.region >= regions_.size() || r.offset > regions_[r.region].bytes ||
        r.bytes > regions_[r.region].bytes - r.offset) {
      return absl::InvalidArgumentError(
          absl::StrCat("GrantReads: range ", i, " leaves its region"));
    }
  }
  return grants_.Grant(ranges, until);
}

void UcxAgent::RevokeReads(GrantId grant) {
  // Answers are copied with the lock held: once it is ours, none is
  // half-way through the grant's memory.
  absl::MutexLock lock(&mu_);
  grants_.Revoke(grant);
}

absl::StatusOr<TransferId> UcxAgent::PostRead(PeerId peer_id, std::span<const Descriptor> local,
                                              std::span<const Descriptor> remote,
                                              std::string_view grant_token,
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
  transfer.agent = this;
  transfer.id = id;
  transfer.peer = peer_id;
  transfer.token = std::string(grant_token);
  if (absl::Status s = RandomBytes(transfer.nonce, sizeof(transfer.nonce)); !s.ok()) return s;
  transfer.notification = std::move(notification);
  // Chunks of at most kChunkBytes, cutting descriptors where they cross.
  for (size_t i = 0; i < local.size(); ++i) {
    uint64_t done = 0;
    while (done < local[i].bytes) {
      if (transfer.chunks.empty() || transfer.chunks.back().bytes == kChunkBytes) {
        transfer.chunks.emplace_back();
      }
      Chunk& chunk = transfer.chunks.back();
      const uint64_t piece = std::min(local[i].bytes - done, kChunkBytes - chunk.bytes);
      chunk.local.push_back({local[i].region, local[i].offset + done, piece});
      chunk.remote.push_back({remote[i].region, 0, remote[i].offset + done, piece});
      chunk.bytes += piece;
      done += piece;
    }
  }
  transfer.state.assign(transfer.chunks.size(), ChunkState::kWaiting);
  transfers_[id] = std::move(owned);
  AdvanceLocked(id, transfer);
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
  if (it == transfers_.end() || it->second->status.state == TransferState::kInProgress) return;
  if (it->second->notifying) {
    it->second->released = true;  // OnNotified erases it (UCX still points at it)
  } else {
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
