// KV pages of the real model moved between two CPU backends that share no
// storage (what a prefill daemon and a decode daemon are), through the UCX
// agent over TCP: the decode side's next-token logits from the moved pages
// are bitwise those the prefill side computes from its own, and the bytes
// moved are exactly the blocks' pages.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/llama_model.h"
#include "kvtransfer/kv_pages.h"
#include "kvtransfer/ucx_agent.h"
#include "tests/integration/test_model.h"

namespace tandem {
namespace {

constexpr int kBlockSize = 16;

struct Side {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<kvtransfer::TransferAgent> agent;
};

Side Load(const std::shared_ptr<const model::GgufFile>& file, int blocks) {
  Side side;
  side.backend = std::make_unique<kernels::cpu::CpuBackend>(1);
  auto m = model::LlamaModel::Create(file, side.backend.get(), blocks, kBlockSize);
  EXPECT_TRUE(m.ok()) << m.status();
  side.model = *std::move(m);
  auto agent = kvtransfer::CreateUcxAgent({.transports = "tcp", .tcp_ports = ""});
  EXPECT_TRUE(agent.ok()) << agent.status();
  side.agent = *std::move(agent);
  const kernels::KvStorage storage = side.backend->kv_storage();
  EXPECT_EQ(*side.agent->RegisterMemory(storage.data, storage.bytes, kvtransfer::MemoryKind::kHost),
            0u);
  return side;
}

// Runs `tokens` at positions first.. on `table`; returns the last token's logits.
std::vector<float> Forward(model::LlamaModel& m, std::span<const int32_t> tokens, int32_t first,
                           const std::vector<int32_t>& table) {
  model::SequenceInput in;
  in.tokens = tokens;
  in.first_position = first;
  in.block_table = table;
  in.logits = 1;
  std::vector<float> logits;
  EXPECT_TRUE(m.Forward({&in, 1}, &logits).ok());
  return logits;
}

int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

TEST(KvTransferModelTest, DecodingFromMovedPagesIsBitwiseDecodingFromTheOriginals) {
  ASSERT_FALSE(testing::TestModelPath().empty()) << "set TANDEM_TEST_MODEL";
  auto file = model::GgufFile::Open(testing::TestModelPath());
  ASSERT_TRUE(file.ok()) << file.status();
  const std::shared_ptr<const model::GgufFile> shared(*std::move(file));
  // Different pool sizes and different block ids on the two sides.
  Side prefill = Load(shared, 64);
  Side decode = Load(shared, 40);

  std::vector<int32_t> prompt;
  for (int i = 0; i < 45; ++i) prompt.push_back(200 + (i * 7919) % 40000);
  const std::vector<int32_t> prefill_table = {5, 9, 2};
  const std::vector<int32_t> decode_table = {30, 31, 7};
  const int32_t next = Argmax(Forward(*prefill.model, prompt, 0, prefill_table));
  const std::vector<float> expected =
      Forward(*prefill.model, std::span<const int32_t>(&next, 1), 45, prefill_table);

  // The decode side, before any transfer, does not get them (so the check
  // below can fail).
  ASSERT_NE(Forward(*decode.model, std::span<const int32_t>(&next, 1), 45, decode_table), expected);

  // The prefill side publishes its metadata (over gRPC in a daemon); the
  // decode side reads the prompt's three blocks into its own.
  absl::StatusOr<std::string> metadata = prefill.agent->LocalMetadata();
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  absl::StatusOr<kvtransfer::PeerId> peer = decode.agent->AddPeer(*metadata);
  ASSERT_TRUE(peer.ok()) << peer.status();
  absl::StatusOr<kvtransfer::KvPageReads> reads =
      kvtransfer::PlanKvPageReads(decode.backend->kv_cache_shape(), 0, decode_table,
                                  prefill.backend->kv_cache_shape(), 0, prefill_table);
  ASSERT_TRUE(reads.ok()) << reads.status();
  EXPECT_EQ(reads->bytes, 3 * prefill.backend->kv_cache_shape().BytesPerBlock());
  // The prefill side grants exactly those pages (a daemon sends the token
  // with its offer).
  absl::StatusOr<kvtransfer::ReadGrant> grant =
      prefill.agent->GrantReads(reads->remote, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(grant.ok()) << grant.status();
  absl::StatusOr<kvtransfer::TransferId> id =
      decode.agent->PostRead(*peer, reads->local, reads->remote, grant->token, "request-1");
  ASSERT_TRUE(id.ok()) << id.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  kvtransfer::TransferStatus status = decode.agent->Poll(*id);
  while (status.state == kvtransfer::TransferState::kInProgress && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
    status = decode.agent->Poll(*id);
  }
  ASSERT_EQ(status.state, kvtransfer::TransferState::kDone) << status.error;

  // The token after the prompt, decoded where the pages landed: the 46th
  // position's logits bit for bit.
  EXPECT_EQ(Forward(*decode.model, std::span<const int32_t>(&next, 1), 45, decode_table), expected);
  std::vector<std::string> notes;
  while (notes.empty() && absl::Now() < deadline) notes = prefill.agent->TakeNotifications();
  EXPECT_EQ(notes, std::vector<std::string>{"request-1"});
}

}  // namespace
}  // namespace tandem
