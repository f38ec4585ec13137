// The KV-transfer seam without a model: the metadata blob's framing (every
// corruption an INVALID_ARGUMENT), which bytes move for a block list, and the
// UCX agent moving bytes between two agents over TCP, with its notification,
// its argument checks and a peer that goes away.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/free_port.h"
#include "kvtransfer/agent_metadata.h"
#include "kvtransfer/kv_pages.h"
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

  static constexpr size_t kBytes = 1 << 20;
  std::vector<char> source_, target_;
  std::unique_ptr<TransferAgent> owner_, reader_;
  PeerId peer_ = 0;
};

TEST_F(UcxAgentTest, ReadsExactlyTheDescribedBytesAndThenNotifiesTheOwner) {
  const std::vector<Descriptor> local = {{0, 100, 5000}, {0, 700000, 1}, {0, 200000, 65536}};
  const std::vector<Descriptor> remote = {{0, 9000, 5000}, {0, 0, 1}, {0, 900000, 65536}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, local, remote, "lease-42 done");
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
    absl::StatusOr<TransferId> id = reader_->PostRead(peer_, d, d, absl::StrCat("t", t));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  for (TransferId id : ids) ASSERT_EQ(Wait(id).state, TransferState::kDone);
  EXPECT_TRUE(target_ == source_);
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
  EXPECT_EQ(reader_->PostRead(peer_, one, two, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<Descriptor> bigger = {{0, 0, 17}};
  EXPECT_EQ(reader_->PostRead(peer_, one, bigger, "").status().message(),
            "PostRead: descriptor 0 reads 17 bytes into 16");
  const std::vector<Descriptor> past_end = {{0, kBytes - 8, 16}};
  EXPECT_EQ(reader_->PostRead(peer_, one, past_end, "").status().code(),
            absl::StatusCode::kOutOfRange);
  const std::vector<Descriptor> no_region = {{3, 0, 16}};
  EXPECT_EQ(reader_->PostRead(peer_, one, no_region, "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reader_->PostRead(peer_ + 1, one, one, "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(reader_->PostRead(peer_, one, one, std::string(kMaxNotificationBytes + 1, 'x'))
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
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, "x");
  ASSERT_TRUE(id.ok());
  reader_->RemovePeer(peer_);
  // Either it finished before the removal or it failed; never stuck.
  const TransferStatus status = Wait(*id);
  EXPECT_NE(status.state, TransferState::kInProgress);
  EXPECT_EQ(reader_->PostRead(peer_, all, all, "y").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(UcxAgentTest, AnOwnerThatGoesAwayFailsTheReadsInsteadOfHangingThem) {
  owner_.reset();  // its worker, sockets and registrations are gone
  const std::vector<Descriptor> all = {{0, 0, kBytes}};
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, "x");
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
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, "x");
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
  absl::StatusOr<TransferId> id = reader_->PostRead(peer_, all, all, "x");
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
  absl::StatusOr<std::unique_ptr<TransferAgent>> reader =
      CreateUcxAgent({.transports = "tcp", .tcp_ports = ""});
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->RegisterMemory(target.data(), target.size(), MemoryKind::kHost).ok());
  absl::StatusOr<PeerId> peer = (*reader)->AddPeer(*(*owner)->LocalMetadata());
  ASSERT_TRUE(peer.ok()) << peer.status();
  const std::vector<Descriptor> all = {{0, 0, 4096}};
  absl::StatusOr<TransferId> id = (*reader)->PostRead(*peer, all, all, "n");
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
