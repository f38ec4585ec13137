// The KV events' wire format byte for byte (against the msgpack
// specification, not our own encoder), the replay socket, the bounded
// queue, and a bind failure naming its flag. tests/e2e/python/
// test_kv_events.py decodes the real daemon's messages as llm-d does.
#include "server/kv_event_publisher.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zmq.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kvcache/block_hash.h"
#include "prometheus/registry.h"

namespace tandem::server {
namespace {

using kvcache::BlockHash;
using kvcache::KvEvent;

std::string Bytes(std::initializer_list<int> bytes) {
  std::string out;
  for (int b : bytes) out.push_back(static_cast<char>(b));
  return out;
}

double CounterValue(prometheus::Registry& registry, const std::string& name,
                    const std::string& outcome = "") {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& m : family.metric) {
      if (outcome.empty() || (!m.label.empty() && m.label[0].value == outcome)) {
        return m.counter.value;
      }
    }
  }
  return -1;
}

TEST(KvEventWireTest, ABatchIsTheMsgpackArraysLlmDDecodes) {
  BlockHash hash;
  hash.words[0] = 0x0807060504030201;  // digest bytes 01 02 ... 08
  std::vector<KvEvent> events(3);
  events[0].kind = KvEvent::Kind::kStored;
  events[0].hashes = {hash};
  events[0].tokens = {1, 2};
  events[1].kind = KvEvent::Kind::kRemoved;
  events[1].hashes = {hash};
  events[2].kind = KvEvent::Kind::kAllCleared;
  const std::string payload =
      EncodeKvEventBatch(absl::UnixEpoch() + absl::Milliseconds(1500), events, 2);
  const std::string hash_bytes = Bytes({0xcf, 1, 2, 3, 4, 5, 6, 7, 8});  // uint 64
  const std::string expected =
      Bytes({0x93, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}) +  // [1.5 (float 64),
      Bytes({0x93}) +                                      //  [
      Bytes({0x97, 0xab}) + "BlockStored" + Bytes({0x91}) + hash_bytes +
      Bytes({0xc0, 0x92, 1, 2, 2, 0xc0, 0xc0}) +  // parent nil, [1, 2], 2, nil, nil
      Bytes({0x93, 0xac}) + "BlockRemoved" + Bytes({0x91}) + hash_bytes + Bytes({0xc0}) +
      Bytes({0x91, 0xb0}) + "AllBlocksCleared" +  //  ],
      Bytes({0x00});                              //  0]
  EXPECT_EQ(payload, expected);
  // The first 8 bytes of a real key, big-endian (the key's hex begins
  // b1fdaf2590b0b031: block_pool_test's BlockHashTest).
  EXPECT_EQ(PublishedBlockHash(kvcache::RootHash("")), 0xb1fdaf2590b0b031u);
}

class KvEventPublisherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tandem-kv-events-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Endpoint(const std::string& name) const { return "ipc://" + (dir_ / name).string(); }

  std::filesystem::path dir_;
};

// Asks the replay socket for everything from `from`; the replies' payloads
// by sequence number, up to the end marker (or an empty map on timeout).
std::vector<std::pair<uint64_t, std::string>> Replay(const std::string& endpoint, uint64_t from) {
  void* context = zmq_ctx_new();
  void* dealer = zmq_socket(context, ZMQ_DEALER);
  const int linger = 0, timeout_ms = 5000;
  zmq_setsockopt(dealer, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_setsockopt(dealer, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
  zmq_connect(dealer, endpoint.c_str());
  std::string request(8, '\0');
  for (int i = 0; i < 8; ++i)
    request[static_cast<size_t>(i)] = static_cast<char>(from >> (56 - 8 * i));
  zmq_send(dealer, "", 0, ZMQ_SNDMORE);
  zmq_send(dealer, request.data(), request.size(), 0);
  std::vector<std::pair<uint64_t, std::string>> out;
  for (;;) {
    std::vector<std::string> frames;
    int more = 1;
    while (more) {
      zmq_msg_t frame;
      zmq_msg_init(&frame);
      if (zmq_msg_recv(&frame, dealer, 0) < 0) {
        zmq_msg_close(&frame);
        out.clear();
        more = 0;
        frames.clear();
        break;
      }
      frames.emplace_back(static_cast<const char*>(zmq_msg_data(&frame)), zmq_msg_size(&frame));
      more = zmq_msg_more(&frame);
      zmq_msg_close(&frame);
    }
    if (frames.size() != 3) break;  // a timeout, or a malformed reply
    uint64_t sequence = 0;
    for (unsigned char c : frames[1]) sequence = (sequence << 8) | c;
    if (sequence == ~uint64_t{0}) break;
    out.emplace_back(sequence, frames[2]);
  }
  zmq_close(dealer);
  zmq_ctx_term(context);
  return out;
}

TEST_F(KvEventPublisherTest, MessagesAreNumberedFromAClearAndReplayedFromAnyNumber) {
  prometheus::Registry registry;
  KvEventPublisherOptions options;
  options.endpoint = Endpoint("pub");
  options.replay_endpoint = Endpoint("replay");
  options.topic = "kv@host:1@model";
  options.block_size = 2;
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> publisher =
      KvEventPublisher::Start(options, registry);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  std::vector<KvEvent> batch(1);
  batch[0].kind = KvEvent::Kind::kStored;
  batch[0].hashes = {kvcache::RootHash("x")};
  batch[0].tokens = {7, 8};
  ASSERT_TRUE((*publisher)->Publish(batch));

  // Both messages, once the thread has sent them (bounded).
  std::vector<std::pair<uint64_t, std::string>> all;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (all.size() < 2 && absl::Now() < deadline) all = Replay(options.replay_endpoint, 0);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].first, 0u);
  EXPECT_EQ(all[1].first, 1u);
  // After the timestamp (10 bytes): [["AllBlocksCleared"]], rank 0.
  EXPECT_EQ(all[0].second.substr(10), Bytes({0x91, 0x91, 0xb0}) + "AllBlocksCleared" + Bytes({0}));
  EXPECT_EQ(all[1].second.substr(10), EncodeKvEventBatch(absl::UnixEpoch(), batch, 2).substr(10));
  // From a later number: only what follows, each message counted.
  const double replayed = CounterValue(registry, "tandem_kv_events_replayed_total");
  const std::vector<std::pair<uint64_t, std::string>> later = Replay(options.replay_endpoint, 1);
  ASSERT_EQ(later.size(), 1u);
  EXPECT_EQ(later[0], all[1]);
  EXPECT_TRUE(Replay(options.replay_endpoint, 2).empty());
  EXPECT_EQ(CounterValue(registry, "tandem_kv_events_replayed_total"), replayed + 1);
  EXPECT_EQ(CounterValue(registry, "tandem_kv_events_batches_total", "published"), 2);
}

TEST_F(KvEventPublisherTest, AFullQueueDropsTheBatchAndSaysSo) {
  prometheus::Registry registry;
  KvEventPublisherOptions options;
  options.endpoint = Endpoint("pub");
  options.max_queued_batches = 0;  // every batch finds the queue full
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> publisher =
      KvEventPublisher::Start(options, registry);
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  EXPECT_FALSE((*publisher)->Publish(std::vector<KvEvent>(1)));
  EXPECT_EQ(CounterValue(registry, "tandem_kv_events_batches_total", "dropped"),
            2);  // and the clear
  EXPECT_EQ(CounterValue(registry, "tandem_kv_events_batches_total", "published"), 0);
}

TEST_F(KvEventPublisherTest, AnEndpointThatCannotBeBoundIsNamedWithItsFlag) {
  prometheus::Registry registry;
  KvEventPublisherOptions options;
  options.endpoint = Endpoint("pub");
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> first =
      KvEventPublisher::Start(options, registry);
  ASSERT_TRUE(first.ok());
  options.endpoint = "tcp://256.1.1.1:5557";
  absl::StatusOr<std::unique_ptr<KvEventPublisher>> second =
      KvEventPublisher::Start(options, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(second.status().message().find("--kv_events_endpoint='tcp://256.1.1.1:5557'"),
            std::string::npos)
      << second.status();
  options.endpoint = Endpoint("pub2");
  options.replay_endpoint = "tcp://256.1.1.1:5558";
  second = KvEventPublisher::Start(options, registry);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("--kv_events_replay_endpoint="), std::string::npos)
      << second.status();
}

}  // namespace
}  // namespace tandem::server
