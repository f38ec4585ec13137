// The KV-transfer seam without a model: the metadata blob's framing (every
// corruption an INVALID_ARGUMENT), which bytes move for a block list, and the
// UCX agent moving bytes between two agents over TCP, with its notification,
// its argument checks and a peer that goes away.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/free_port.h"
#include "kvtransfer/agent_metadata.h"
#include "kvtransfer/kv_pages.h"
#include "kvtransfer/read_grants.h"
#include "kvtransfer/transfer_poller.h"
#include "kvtransfer/ucx_agent.h"

namespace tandem::kvtransfer {
namespace {

TEST(AgentMetadataTest, RoundTripsAndRejectsEveryTruncation) {
  AgentMetadata metadata{"ucx",
                         std::string("\x01\x02\x00\x03", 4),
                         {{0x1000, 4096, "key-a"}, {0x7fff0000, 1 << 20, std::string(1, '\0')}}};
  const std::string blob = EncodeAgentMetadata(metadata);
  absl::StatusOr<AgentMetadata> decoded = DecodeAgentMetadata(blob);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(*decoded, metadata);
  for (size_t n = 0; n < blob.size(); ++n) {
    EXPECT_EQ(DecodeAgentMetadata(blob.substr(0, n)).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "truncated to " << n;
  }
  EXPECT_EQ(DecodeAgentMetadata(absl::StrCat(blob, "x")).status().message(),
            "KV-transfer metadata: trailing bytes");
  EXPECT_EQ(DecodeAgentMetadata(absl::StrCat("NOPE", blob.substr(4))).status().message(),
            "KV-transfer metadata: not a Tandem agent's (bad magic)");
}

TEST(AgentMetadataTest, RejectsCountsAndLengthsNoAgentHas) {
  std::string blob = EncodeAgentMetadata({"ucx", "addr", {}});
  // The region count is the last 8 bytes: claim 2^40 regions.
  blob[blob.size() - 3] = 1;
  EXPECT_EQ(DecodeAgentMetadata(blob).status().message(),
            "KV-transfer metadata: 1099511627776 regions (at most 4096)");
}

kernels::KvCacheShape Shape(int blocks) {
  kernels::KvCacheShape shape;
  shape.layers = 2;
  shape.blocks = blocks;
  shape.block_size = 4;
  shape.kv_heads = 2;
  shape.head_dim = 8;
  return shape;  // 2 * 4 * 2 * 8 = 128 bytes per block and pool
}

TEST(KvPagesTest, MergesRunsOfConsecutiveBlocksInEveryPool) {
  const std::vector<int32_t> local = {3, 4, 1};
  const std::vector<int32_t> remote = {0, 1, 5};
  absl::StatusOr<KvPageReads> reads = PlanKvPageReads(Shape(8), 7, local, Shape(6), 2, remote);
  ASSERT_TRUE(reads.ok()) << reads.status();
  // Two runs (3,4 <- 0,1 and 1 <- 5) in each of 4 pools (K and V of 2 layers).
  ASSERT_EQ(reads->local.size(), 8u);
  ASSERT_EQ(reads->remote.size(), 8u);
  EXPECT_EQ(reads->local[0], (Descriptor{7, 3 * 128, 256}));
  EXPECT_EQ(reads->remote[0], (Descriptor{2, 0, 256}));
  EXPECT_EQ(reads->local[1], (Descriptor{7, 1 * 128, 128}));
  EXPECT_EQ(reads->remote[1], (Descriptor{2, 5 * 128, 128}));
  // Pool 3 (layer 1's V): local pools are 8 blocks long, remote ones 6.
  EXPECT_EQ(reads->local[6], (Descriptor{7, 3 * 8 * 128 + 3 * 128, 256}));
  EXPECT_EQ(reads->remote[6], (Descriptor{2, 3 * 6 * 128, 256}));
  EXPECT_EQ(reads->remote[7], (Descriptor{2, 3 * 6 * 128 + 5 * 128, 128}));
  EXPECT_EQ(reads->bytes, 3u * 4 * 128);
}

TEST(KvPagesTest, RejectsMismatchedShapesAndBlocksOutOfRange) {
  kernels::KvCacheShape other = Shape(8);
  other.head_dim = 16;
  const std::vector<int32_t> one = {1};
  EXPECT_EQ(PlanKvPageReads(Shape(8), 0, one, other, 0, one).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> past_end = {6};
  EXPECT_EQ(PlanKvPageReads(Shape(8), 0, one, Shape(6), 0, past_end).status().message(),
            "block pair 0 (1 <- 6) out of range");
  const std::vector<int32_t> two = {1, 2};
  EXPECT_EQ(PlanKvPageReads(Shape(8), 0, two, Shape(8), 0, one).status().message(),
            "2 local blocks for 1 remote ones");
}

// Two UCX agents in this process over TCP (what two hosts use here).
class UcxAgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TransferAgent>> owner =
        CreateUcxAgent({.transports = "tcp", .tcp_ports = ""});
    ASSERT_TRUE(owner.ok()) << owner.status();
    owner_ = *std::move(owner);
    absl::StatusOr<std::unique_ptr<TransferAgent>> reader =
        CreateUcxAgent({.transports = "tcp", .tcp_ports = ""});
    ASSERT_TRUE(reader.ok()) << reader.status();
    reader_ = *std::move(reader);
    source_.resize(kBytes);
    for (size_t i = 0; i < kBytes; ++i) source_[i] = static_cast<char>(i * 131 + 7);
    target_.assign(kBytes, 0);
    ASSERT_EQ(*owner_->RegisterMemory(source_.data(), kBytes, MemoryKind::kHost), 0u);
    ASSERT_EQ(*reader_->RegisterMemory(target_.data(), kBytes, MemoryKind::kHost), 0u);
    absl::StatusOr<std::string> metadata = owner_->LocalMetadata();
    ASSERT_TRUE(metadata.ok()) << metadata.status();
    absl::StatusOr<PeerId> peer = reader_->AddPeer(*metadata);
    ASSERT_TRUE(peer.ok()) << peer.status();
    peer_ = *peer;
    const std::vector<Descriptor> all = {{0, 0, kBytes}};
    absl::StatusOr<ReadGrant> grant = owner_->GrantReads(all, absl::InfiniteFuture());
    ASSERT_TRUE(grant.ok()) << grant.status();
    token_ = grant->token;
  }

  // Polls until the transfer leaves kInProgress, for at most 20 s.
  TransferStatus Wait(TransferId id) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    TransferStatus status = reader_->Poll(id);
    while (status.state == TransferState::kInProgress && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
      status = reader_->Poll(id);
    }
    return status;
  }

  // Waits for the owner's notifications, for at most 20 s.
  std::vector<std::string> OwnerNotifications(size_t count) {
    std::vector<std::string> all;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (all.size() < count && absl::Now() < deadline) {
      for (std::string& n : owner_->TakeNotifications()) all.push_back(std::move(n));
      absl::SleepFor(absl::Milliseconds(1));
    }
    return all;
  }

  // More than kChunksInFlight chunks of 4 MiB, the last one partial.
  static constexpr size_t kBytes = (18 << 20) + 12345;
  std::vector<char> source_, target_;
  std::unique_ptr<TransferAgent> owner_, reader_;
  PeerId peer_ = 0;
  std::string token_;  // the owner's grant of all of source_
};

TEST_F(UcxAgentTest, ReadsExactlyTheDescribedBytesAndThenNotifiesTheOwner) {
  const std::vector<Descriptor> local = {{0, 100, 5000}, {0, 700000, 1}, {0, 200000, 65536}};
  const std::vector<Descriptor> remote = {{0, 9000, 5000}, {0, 0, 1}, {0, 900000, 65536}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, local, remote, token_, "lease-42 done");
  ASSERT_TRUE(id.ok()) << id.status();
  const TransferStatus status = Wait(*id);
  ASSERT_EQ(status.state, TransferState::kDone) << status.error;
  std::vector<char> expected(kBytes, 0);
  for (size_t i = 0; i < local.size(); ++i) {
    std::memcpy(expected.data() + local[i].offset, source_.data() + remote[i].offset,
                local[i].bytes);
  }
  EXPECT_TRUE(target_ == expected);
  EXPECT_EQ(OwnerNotifications(1), std::vector<std::string>{"lease-42 done"});
  reader_->Release(*id);
  EXPECT_EQ(reader_->Poll(*id).error.code(), absl::StatusCode::kNotFound);
}

TEST_F(UcxAgentTest, ManyTransfersInFlightEachNotifyOnce) {
  std::vector<TransferId> ids;
  for (int t = 0; t < 16; ++t) {
    const uint64_t offset = static_cast<uint64_t>(t) * 65536;
    const std::vector<Descriptor> d = {{0, offset, 65536}};
    absl::StatusOr<TransferId> id = reader_->PostRead(peer_, d, d, token_, absl::StrCat("t", t));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (TransferId id : ids) ASSERT_EQ(Wait(id).state, TransferState::kDone);
  EXPECT_TRUE(std::equal(source_.begin(), source_.begin() + 16 * 65536, target_.begin()));
  EXPECT_TRUE(
      std::all_of(target_.begin() + 16 * 65536, target_.end(), [](char c) { return c == 0; }));
  std::vector<std::string> notes = OwnerNotifications(16);
  std::sort(notes.begin(), notes.end());
  std::vector<std::string> expected;
  for (int t = 0; t < 16; ++t) expected.push_back(absl::StrCat("t", t));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(notes, expected);
  EXPECT_TRUE(owner_->TakeNotifications().empty());
}

TEST_F(UcxAgentTest, BadRequestsAreRefusedBeforeAnythingMoves) {
  const std::vector<Descriptor> one = {{0, 0, 16}};
  const std::vector<Descriptor> two = {{0, 0, 16}, {0, 16, 16}};
  EXPECT_EQ(reader_->PostRead(peer_, one, two, token_, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<Descriptor> bigger = {{0, 0, 17}};
  EXPECT_EQ(reader_->PostRead(peer_, one, bigger, token_, "").status().message(),
            "PostRead: descriptor 0 reads 17 bytes into 16");
  const std::vector<Descriptor> past_end = {{0, kBytes - 8, 16}};
  EXPECT_EQ(reader_->PostRead(peer_, one, past_end, token_, "").status().code(),
            absl::StatusCode::kOutOfRange);
  const std::vector<Descriptor> no_region = {{3, 0, 16}};
  EXPECT_EQ(reader_->PostRead(peer_, one, no_region, token_, "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reader_->PostRead(peer_ + 1, one, one, token_, "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reader_->PostRead(peer_, one, one, token_, std::string(kMaxNotificationBytes + 1, 'x'))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(reader_->AddPeer("garbage").status().code(), absl::StatusCode::kInvalidArgument);
  AgentMetadata other{"nixl", "addr", {}};
  EXPECT_EQ(reader_->AddPeer(EncodeAgentMetadata(other)).status().message(),
            "KV-transfer metadata from a \"nixl\" agent; this one is \"ucx\"");
  EXPECT_TRUE(std::all_of(target_.begin(), target_.end(), [](char c) { return c == 0; }));
  EXPECT_TRUE(owner_->TakeNotifications().empty());
}

TEST_F(UcxAgentTest, ARemovedPeerFailsItsTransfersAndTakesNoMore) {
  const std::vector<Descriptor> all = {{0, 0, kBytes}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, token_, "x");
  ASSERT_TRUE(id.ok());
  reader_->RemovePeer(peer_);
  // Either it finished before the removal or it failed; never stuck.
  const TransferStatus status = Wait(*id);
  EXPECT_NE(status.state, TransferState::kInProgress);
  EXPECT_EQ(reader_->PostRead(peer_, all, all, token_, "y").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(UcxAgentTest, AnOwnerThatGoesAwayFailsTheReadsInsteadOfHangingThem) {
  owner_.reset();  // its worker, sockets and registrations are gone
  const std::vector<Descriptor> all = {{0, 0, kBytes}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, token_, "x");
  if (!id.ok()) {
    // The connection's failure was already known.
    EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
    return;
  }
  const TransferStatus status = Wait(*id);
  EXPECT_EQ(status.state, TransferState::kFailed);
  EXPECT_EQ(status.error.code(), absl::StatusCode::kUnavailable) << status.error;
}

// A source that stops answering holds a read in flight (nothing in UCX ends
// it soon); the poller's deadline is where the reader cuts it off: removing
// the peer fails the read, and the poller reports the failure.
TEST_F(UcxAgentTest, AReadFromASilentSourceIsCutOffAtItsDeadline) {
  owner_->StopAnsweringForTesting(absl::Seconds(30));
  const std::vector<Descriptor> all = {{0, 0, kBytes}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, token_, "x");
  ASSERT_TRUE(id.ok()) << id.status();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(reader_->Poll(*id).state, TransferState::kInProgress);  // stalled, not failed

  TransferPoller poller(reader_.get(), "test-poller");
  absl::Notification ended, overdue;
  TransferStatus final_status;
  const absl::Time start = absl::Now();
  poller.Watch(
      *id,
      [&](const TransferStatus& status) {
        final_status = status;
        ended.Notify();
      },
      start + absl::Milliseconds(200),
      [&] {
        overdue.Notify();
        reader_->RemovePeer(peer_);
      });
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(overdue.HasBeenNotified());
  EXPECT_EQ(final_status.state, TransferState::kFailed);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(200));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// A transfer that ends before its deadline is never overdue.
TEST_F(UcxAgentTest, AReadThatFinishesInTimeIsNotCutOff) {
  const std::vector<Descriptor> all = {{0, 0, kBytes}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, token_, "x");
  ASSERT_TRUE(id.ok()) << id.status();
  TransferPoller poller(reader_.get(), "test-poller");
  absl::Notification ended;
  std::atomic<bool> overdue{false};
  TransferStatus final_status;
  poller.Watch(
      *id,
      [&](const TransferStatus& status) {
        final_status = status;
        ended.Notify();
      },
      absl::Now() + absl::Seconds(20), [&] { overdue = true; });
  ASSERT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_EQ(final_status.state, TransferState::kDone);
  EXPECT_FALSE(overdue.load());
  EXPECT_TRUE(target_ == source_);
}

// The owner answers only what a live grant covers: a read of a byte it did
// not grant fails with the reason and writes nothing, whoever asks.
TEST_F(UcxAgentTest, AReadOfBytesThatWereNotGrantedIsRefusedAndLandsNothing) {
  const std::vector<Descriptor> offered = {{0, 8192, 4096}, {0, 65536, 4096}};
  absl::StatusOr<ReadGrant> grant = owner_->GrantReads(offered, absl::InfiniteFuture());
  ASSERT_TRUE(grant.ok()) << grant.status();
  // What was offered reads (both ranges, in one transfer).
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, offered, offered, grant->token, "ok");
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(Wait(*id).state, TransferState::kDone);
  EXPECT_TRUE(std::equal(source_.begin() + 8192, source_.begin() + 12288, target_.begin() + 8192));

  struct Case {
    Descriptor read;
    std::string why;
  };
  const Case cases[] = {
      {{0, 12288, 4096}, "range 0 (region 0, bytes 12288..16384) was not granted"},
      {{0, 8192 + 4000, 200}, "range 0 (region 0, bytes 12192..12392) was not granted"},
      {{0, 0, 16}, "range 0 (region 0, bytes 0..16) was not granted"},
  };
  for (const Case& c : cases) {
    const std::vector<Descriptor> one = {c.read};
    absl::StatusOr<TransferId> refused = reader_->PostRead(peer_, one, one, grant->token, "no");
    ASSERT_TRUE(refused.ok()) << refused.status();
    const TransferStatus status = Wait(*refused);
    EXPECT_EQ(status.state, TransferState::kFailed);
    EXPECT_EQ(status.error.code(), absl::StatusCode::kPermissionDenied) << status.error;
    EXPECT_EQ(status.error.message(), "the owner refused the read: " + c.why);
  }
  // Nothing but the granted ranges landed.
  for (size_t i = 0; i < kBytes; ++i) {
    const bool granted = (i >= 8192 && i < 12288) || (i >= 65536 && i < 69632);
    if (target_[i] != (granted ? source_[i] : 0)) FAIL() << "byte " << i;
  }
  EXPECT_EQ(OwnerNotifications(1), std::vector<std::string>{"ok"});
}

TEST_F(UcxAgentTest, ARevokedOrExpiredGrantOrAForgedTokenReadsNothing) {
  const std::vector<Descriptor> offered = {{0, 0, 4096}};
  auto read = [&](const std::string& token) {
    absl::StatusOr<TransferId> id = reader_->PostRead(peer_, offered, offered, token, "");
    EXPECT_TRUE(id.ok()) << id.status();
    return Wait(*id).error;
  };
  absl::StatusOr<ReadGrant> grant = owner_->GrantReads(offered, absl::InfiniteFuture());
  ASSERT_TRUE(grant.ok()) << grant.status();
  EXPECT_TRUE(read(grant->token).ok());

  std::string forged = grant->token;
  forged.back() ^= 1;
  EXPECT_EQ(read(forged).message(),
            "the owner refused the read: the read's grant is unknown or was revoked");
  EXPECT_EQ(read("").message(),
            "the owner refused the read: the read's grant is unknown or was revoked");
  owner_->RevokeReads(grant->id);
  EXPECT_EQ(read(grant->token).message(),
            "the owner refused the read: the read's grant is unknown or was revoked");

  const absl::Time until = absl::Now() + absl::Milliseconds(300);
  absl::StatusOr<ReadGrant> brief = owner_->GrantReads(offered, until);
  ASSERT_TRUE(brief.ok());
  absl::SleepFor(until - absl::Now() + absl::Milliseconds(1));  // the grant's own end
  EXPECT_EQ(read(brief->token).message(),
            "the owner refused the read: the read's grant has expired");
  EXPECT_TRUE(std::all_of(target_.begin() + 4096, target_.end(), [](char c) { return c == 0; }));
}

// A UCX context of its own, outside any agent, connected to an agent's
// worker: what a stranger who reaches the transport's port can do. It
// speaks the agent's round trip (ucx_agent.cc's message ids 20 and 21):
// once the agent answers a ping, it has handled everything sent before it
// on the same connection.
class Stranger {
 public:
  static constexpr unsigned kPingAmId = 20, kPongAmId = 21;

  explicit Stranger(const std::string& address) {
    ucp_config_t* config = nullptr;
    EXPECT_EQ(ucp_config_read(nullptr, nullptr, &config), UCS_OK);
    EXPECT_EQ(ucp_config_modify(config, "TLS", "tcp"), UCS_OK);
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_AM;
    EXPECT_EQ(ucp_init(&params, config, &context_), UCS_OK);
    ucp_config_release(config);
    ucp_worker_params_t worker_params{};
    EXPECT_EQ(ucp_worker_create(context_, &worker_params, &worker_), UCS_OK);
    ucp_am_handler_param_t handler{};
    handler.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                         UCP_AM_HANDLER_PARAM_FIELD_ARG;
    handler.id = kPongAmId;
    handler.cb = &Stranger::OnPong;
    handler.arg = &pongs_;
    EXPECT_EQ(ucp_worker_set_am_recv_handler(worker_, &handler), UCS_OK);
    ucp_ep_params_t ep_params{};
    ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep_params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ep_params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    EXPECT_EQ(ucp_ep_create(worker_, &ep_params, &ep_), UCS_OK);
  }

  ~Stranger() {
    // Closing ends whatever is still in flight (cancelled).
    ucp_request_param_t close{};
    close.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    close.flags = UCP_EP_CLOSE_FLAG_FORCE;
    void* closing = ucp_ep_close_nbx(ep_, &close);
    if (UCS_PTR_IS_PTR(closing)) {
      while (ucp_request_check_status(closing) == UCS_INPROGRESS) ucp_worker_progress(worker_);
      ucp_request_free(closing);
    }
    for (void* request : requests_) ucp_request_free(request);
    if (key_ != nullptr) ucp_rkey_destroy(key_);
    if (memory_ != nullptr) ucp_mem_unmap(context_, memory_);
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
  }

  // Sends an active message (eager, with a reply endpoint). Its header
  // and data are kept until the stranger goes (UCX may send them later).
  void Send(unsigned am_id, const void* header, size_t header_bytes, std::string data) {
    const std::string& h = kept_.emplace_back(static_cast<const char*>(header), header_bytes);
    const std::string& d = kept_.emplace_back(std::move(data));
    ucp_request_param_t send{};
    send.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    send.flags = UCP_AM_SEND_FLAG_EAGER | UCP_AM_SEND_FLAG_REPLY;
    void* request = ucp_am_send_nbx(ep_, am_id, h.data(), h.size(), d.data(), d.size(), &send);
    ASSERT_FALSE(UCS_PTR_IS_ERR(request));
    if (request != nullptr) requests_.push_back(request);
  }

  // Pings the agent and waits (at most 20 s) for its answer.
  bool Ping() {
    const uint64_t nonce = ++pings_;
    Send(kPingAmId, &nonce, sizeof(nonce), "");
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (pongs_ < nonce && absl::Now() < deadline) ucp_worker_progress(worker_);
    return pongs_ >= nonce;
  }

  // A one-sided get of `bytes` at `address` of the agent's process, with a
  // key for the stranger's own memory (TCP's keys carry nothing). Returns
  // the request (or null when UCX finished it at once).
  void* Get(std::vector<char>& into, uint64_t address) {
    ucp_mem_map_params_t map{};
    map.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    map.address = into.data();
    map.length = into.size();
    EXPECT_EQ(ucp_mem_map(context_, &map, &memory_), UCS_OK);
    void* packed = nullptr;
    size_t packed_bytes = 0;
    EXPECT_EQ(ucp_rkey_pack(context_, memory_, &packed, &packed_bytes), UCS_OK);
    EXPECT_EQ(ucp_ep_rkey_unpack(ep_, packed, &key_), UCS_OK);
    ucp_rkey_buffer_release(packed);
    ucp_request_param_t get{};
    void* request = ucp_get_nbx(ep_, into.data(), into.size(), address, key_, &get);
    if (UCS_PTR_IS_PTR(request)) requests_.push_back(request);
    return request;
  }

  void Progress() { ucp_worker_progress(worker_); }

 private:
  static ucs_status_t OnPong(void* arg, const void*, size_t, void*, size_t,
                             const ucp_am_recv_param_t*) {
    ++*static_cast<uint64_t*>(arg);
    return UCS_OK;
  }

  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_ep_h ep_ = nullptr;
  ucp_mem_h memory_ = nullptr;
  ucp_rkey_h key_ = nullptr;
  uint64_t pings_ = 0, pongs_ = 0;
  std::vector<void*> requests_;
  std::deque<std::string> kept_;  // what sends in flight read
};

// The agent's context has no one-sided gets: a stranger that asks for the
// owner's memory with a get of its own (over TCP, UCX would answer one for
// any address of the process) gets nothing. Once the owner has answered a
// ping sent after the get, it has handled the get, and an answer to it
// would have come first.
TEST_F(UcxAgentTest, AOneSidedGetFromAnotherUcxContextReadsNothing) {
  absl::StatusOr<AgentMetadata> metadata = DecodeAgentMetadata(*owner_->LocalMetadata());
  ASSERT_TRUE(metadata.ok());
  std::vector<char> stolen(4096, 0);
  {
    Stranger stranger(metadata->address);
    void* request = stranger.Get(stolen, metadata->regions[0].base);
    ASSERT_NE(request, nullptr) << "the get completed at once";
    ASSERT_TRUE(stranger.Ping()) << "the owner did not answer the ping";
    stranger.Progress();
    EXPECT_NE(UCS_PTR_IS_ERR(request) ? UCS_PTR_STATUS(request) : ucp_request_check_status(request),
              UCS_OK)
        << "a one-sided get read the owner's memory";
  }
  EXPECT_TRUE(std::all_of(stolen.begin(), stolen.end(), [](char c) { return c == 0; }));
}

// A reader takes an answer only for a chunk it asked for, carrying its
// transfer's nonce: a stranger who guesses the transfer's number can
// neither write into the reader's memory nor fail its transfer, and the
// real answer still lands.
TEST_F(UcxAgentTest, AForgedAnswerIsDroppedAndTheRealOneLands) {
  // The owner answers nothing for a while (far longer than the forgery
  // takes), so the ask is outstanding.
  owner_->StopAnsweringForTesting(absl::Seconds(5));
  const std::vector<Descriptor> all = {{0, 0, 4096}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, token_, "x");
  ASSERT_TRUE(id.ok()) << id.status();
  absl::StatusOr<AgentMetadata> reader = DecodeAgentMetadata(*reader_->LocalMetadata());
  ASSERT_TRUE(reader.ok());
  // ucx_agent.cc's answer: its header's layout (message id 19).
  struct ForgedAnswer {
    uint64_t transfer;
    uint64_t chunk;
    unsigned char nonce[16];
    uint32_t refused;
    uint32_t reserved;
  };
  {
    Stranger stranger(reader->address);
    ForgedAnswer bytes{*id, 0, {}, 0, 0};
    stranger.Send(19, &bytes, sizeof(bytes), std::string(4096, 'X'));
    ForgedAnswer refusal{*id, 0, {}, 1, 0};
    stranger.Send(19, &refusal, sizeof(refusal), "forged");
    ASSERT_TRUE(stranger.Ping());
  }
  EXPECT_EQ(reader_->Poll(*id).state, TransferState::kInProgress);
  EXPECT_TRUE(std::all_of(target_.begin(), target_.begin() + 4096, [](char c) { return c == 0; }));
  const TransferStatus status = Wait(*id);  // the owner answers after its stall
  ASSERT_EQ(status.state, TransferState::kDone) << status.error;
  EXPECT_TRUE(std::equal(source_.begin(), source_.begin() + 4096, target_.begin()));
}

TEST_F(UcxAgentTest, GrantsOutsideTheOwnersRegionsAreRefused) {
  const std::vector<Descriptor> past_end = {{0, kBytes - 8, 16}};
  EXPECT_EQ(owner_->GrantReads(past_end, absl::InfiniteFuture()).status().message(),
            "GrantReads: range 0 leaves its region");
  const std::vector<Descriptor> no_region = {{1, 0, 16}};
  EXPECT_EQ(owner_->GrantReads(no_region, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(owner_->GrantReads({}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ReadGrantsTest, CoversMergedRangesOnlyAndForgetsExpiredGrants) {
  ReadGrants grants;
  const absl::Time now = absl::Now();
  // Two adjacent ranges cover a read across their seam; region 1 is apart.
  const std::vector<Descriptor> ranges = {{0, 100, 50}, {0, 150, 50}, {1, 0, 10}};
  absl::StatusOr<ReadGrant> grant = grants.Grant(ranges, now + absl::Hours(1));
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->token.size(), ReadGrants::kTokenBytes);
  const std::vector<Descriptor> across = {{0, 120, 70}, {1, 5, 5}};
  EXPECT_TRUE(grants.Check(grant->token, across, now).ok());
  const std::vector<Descriptor> past = {{0, 190, 11}};
  EXPECT_EQ(grants.Check(grant->token, past, now).code(), absl::StatusCode::kPermissionDenied);
  const std::vector<Descriptor> other_region = {{2, 0, 1}};
  EXPECT_EQ(grants.Check(grant->token, other_region, now).message(),
            "range 0 (region 2, bytes 0..1) was not granted");
  EXPECT_EQ(grants.Check(grant->token, across, now + absl::Hours(1)).message(),
            "the read's grant has expired");
  // Two grants' tokens differ in their secret, not only in their number.
  absl::StatusOr<ReadGrant> second = grants.Grant(ranges, now - absl::Seconds(1));
  ASSERT_TRUE(second.ok());
  EXPECT_NE(grant->token.substr(8), second->token.substr(8));
  EXPECT_EQ(grants.live(), 2u);
  // The next grant forgets the expired one.
  ASSERT_TRUE(grants.Grant(ranges, now + absl::Hours(1)).ok());
  EXPECT_EQ(grants.live(), 2u);
  EXPECT_EQ(grants.Check(second->token, across, now - absl::Seconds(2)).message(),
            "the read's grant is unknown or was revoked");
}

// --kv_transport_ports: the agent listens for its peers on a port of the
// range it is given (here a range of one), and reads work as before.
TEST(UcxAgentPortsTest, TheAgentListensOnAPortOfItsRange) {
  const int port = FreeLoopbackPort();
  absl::StatusOr<std::unique_ptr<TransferAgent>> owner =
      CreateUcxAgent({.transports = "tcp", .tcp_ports = absl::StrCat(port, "-", port)});
  ASSERT_TRUE(owner.ok()) << owner.status();
  // The port is taken now: binding it fails.
  const int probe = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  const int bound = bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  const int error = errno;
  close(probe);
  EXPECT_EQ(bound, -1);
  EXPECT_EQ(error, EADDRINUSE);

  std::vector<char> source(4096, 'k'), target(4096, 0);
  ASSERT_TRUE((*owner)->RegisterMemory(source.data(), source.size(), MemoryKind::kHost).ok());
  const std::vector<Descriptor> all = {{0, 0, 4096}};
  absl::StatusOr<ReadGrant> grant = (*owner)->GrantReads(all, absl::InfiniteFuture());
  ASSERT_TRUE(grant.ok()) << grant.status();
  absl::StatusOr<std::unique_ptr<TransferAgent>> reader =
      CreateUcxAgent({.transports = "tcp", .tcp_ports = ""});
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->RegisterMemory(target.data(), target.size(), MemoryKind::kHost).ok());
  absl::StatusOr<PeerId> peer = (*reader)->AddPeer(*(*owner)->LocalMetadata());
  ASSERT_TRUE(peer.ok()) << peer.status();
  absl::StatusOr<TransferId> id = (*reader)->PostRead(*peer, all, all, grant->token, "n");
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while ((*reader)->Poll(*id).state == TransferState::kInProgress && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ((*reader)->Poll(*id).state, TransferState::kDone);
  EXPECT_TRUE(target == source);
}

}  // namespace
}  // namespace tandem::kvtransfer
