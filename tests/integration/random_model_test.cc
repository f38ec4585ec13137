// --model=random:NAME: a model of a known shape with random weights, built
// in memory. The smollm2-135m shape must be exactly the real model file's
// (the independent reference here: its GGUF metadata and tensor shapes);
// the vocabulary round-trips any bytes; the forward pass runs and gives
// finite logits; the seed fixes the weights.
#include "engine/model/random_model.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_config.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "tests/integration/test_model.h"

namespace tandem::model {
namespace {

std::unique_ptr<GgufFile> Open(const std::string& flag) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = OpenRandomModel(flag);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? *std::move(file) : nullptr;
}

TEST(RandomModelTest, TheSmolLm2ShapeIsTheRealModelsShape) {
  ASSERT_FALSE(testing::TestModelPath().empty()) << "set TANDEM_TEST_MODEL";
  absl::StatusOr<std::unique_ptr<GgufFile>> real = GgufFile::Open(testing::TestModelPath());
  ASSERT_TRUE(real.ok()) << real.status();
  std::unique_ptr<GgufFile> random = Open("random:smollm2-135m");
  ASSERT_NE(random, nullptr);
  absl::StatusOr<ModelConfig> want = ReadModelConfig(**real);
  absl::StatusOr<ModelConfig> got = ReadModelConfig(*random);
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  EXPECT_EQ(got->architecture, want->architecture);
  EXPECT_EQ(got->name, "random:smollm2-135m");
  EXPECT_EQ(got->layers, want->layers);
  EXPECT_EQ(got->embedding, want->embedding);
  EXPECT_EQ(got->ffn, want->ffn);
  EXPECT_EQ(got->heads, want->heads);
  EXPECT_EQ(got->kv_heads, want->kv_heads);
  EXPECT_EQ(got->head_dim, want->head_dim);
  EXPECT_EQ(got->vocab, want->vocab);
  EXPECT_EQ(got->context_length, want->context_length);
  EXPECT_EQ(got->rotary_dims, want->rotary_dims);
  EXPECT_EQ(got->rope_base, want->rope_base);
  EXPECT_EQ(got->norm_eps, want->norm_eps);
  // Every tensor of the real model exists with the same dimensions.
  for (const GgufTensor& t : (*real)->tensors()) {
    const GgufTensor* r = random->FindTensor(t.name);
    ASSERT_NE(r, nullptr) << t.name;
    EXPECT_EQ(r->dims, t.dims) << t.name;
  }
  EXPECT_EQ(random->tensors().size(), (*real)->tensors().size());
}

TEST(RandomModelTest, ItsVocabularyRoundTripsAnyBytesAndItsTemplateIsChatMl) {
  std::unique_ptr<GgufFile> file = Open("random:smollm2-135m");
  ASSERT_NE(file, nullptr);
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
      tokenizer::BpeTokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->vocab_size(), 49152);
  std::string text = "Paris, ol\xc3\xa9 \xe2\x9c\x93 \x01\xff";
  const std::vector<tokenizer::TokenId> ids = (*tok)->Encode(text, /*parse_special=*/false);
  EXPECT_EQ(ids.size(), text.size()) << "one token per byte (no merges)";
  EXPECT_EQ((*tok)->Decode(ids, /*skip_control=*/true), text);
  absl::StatusOr<std::string_view> chat_template = file->GetString("tokenizer.chat_template");
  ASSERT_TRUE(chat_template.ok());
  absl::StatusOr<tokenizer::ChatTemplate> chat =
      tokenizer::ChatTemplate::Create(*chat_template, "");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->family_name(), "chatml");
}

TEST(RandomModelTest, TheForwardPassRunsAndTheSeedFixesTheWeights) {
  std::unique_ptr<GgufFile> a = Open("random:smollm2-135m@7");
  std::unique_ptr<GgufFile> b = Open("random:smollm2-135m@7");
  std::unique_ptr<GgufFile> c = Open("random:smollm2-135m@8");
  ASSERT_TRUE(a && b && c);
  const GgufTensor* ta = a->FindTensor("blk.3.ffn_up.weight");
  const GgufTensor* tb = b->FindTensor("blk.3.ffn_up.weight");
  const GgufTensor* tc = c->FindTensor("blk.3.ffn_up.weight");
  ASSERT_TRUE(ta && tb && tc);
  EXPECT_EQ(std::memcmp(ta->data, tb->data, ta->bytes), 0);
  EXPECT_NE(std::memcmp(ta->data, tc->data, ta->bytes), 0);

  const std::shared_ptr<const GgufFile> file(std::move(a));
  kernels::cpu::CpuBackend backend(1);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(file, &backend, 8, 16);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> tokens = {72, 101, 108, 108, 111, 44, 32, 119};
  const std::vector<int32_t> table = {0};
  SequenceInput in;
  in.tokens = tokens;
  in.first_position = 0;
  in.block_table = table;
  in.logits = 1;
  std::vector<float> logits;
  ASSERT_TRUE((*model)->Forward({&in, 1}, &logits).ok());
  ASSERT_EQ(logits.size(), 49152u);
  double spread = 0;
  for (float v : logits) {
    ASSERT_TRUE(std::isfinite(v));
    spread = std::max(spread, std::abs(static_cast<double>(v)));
  }
  EXPECT_GT(spread, 0.0) << "the logits are all zero";
}

// After a pass that picks tokens where the logits are, the rows asked for
// (in any order, repeated) are the rows Forward() gives; none from another
// kind of pass, none out of range.
TEST(RandomModelTest, TheLastPassesRowsAreForwardsRows) {
  const std::shared_ptr<const GgufFile> file(Open("random:smollm2-135m@3"));
  ASSERT_NE(file, nullptr);
  kernels::cpu::CpuBackend backend(1);
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = LlamaModel::Create(file, &backend, 8, 16);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> a = {72, 101, 108}, b = {44, 32}, table_a = {0}, table_b = {1};
  const std::vector<SequenceInput> inputs = {{a, 0, table_a, 2}, {b, 0, table_b, 1}};
  std::vector<float> all;
  ASSERT_TRUE((*model)->Forward(inputs, &all).ok());
  std::vector<float> rows;
  auto one_row = [&](int32_t row) { return (*model)->LastLogitsRows({&row, 1}, &rows); };
  EXPECT_TRUE(absl::IsInvalidArgument(one_row(0)))
      << "Forward() picked nothing: its rows are not kept";
  const std::vector<kernels::RowDraw> greedy(3);
  std::vector<int32_t> tokens;
  ASSERT_TRUE((*model)->ForwardSample(inputs, greedy, &tokens).ok());
  const size_t vocab = 49152;
  const std::vector<int32_t> asked = {2, 0, 2};
  ASSERT_TRUE((*model)->LastLogitsRows(asked, &rows).ok());
  ASSERT_EQ(rows.size(), 3 * vocab);
  for (size_t i = 0; i < asked.size(); ++i) {
    EXPECT_TRUE(std::equal(rows.begin() + static_cast<long>(i * vocab),
                           rows.begin() + static_cast<long>((i + 1) * vocab),
                           all.begin() + static_cast<long>(asked[i] * vocab)))
        << "asked row " << i;
  }
  ASSERT_TRUE(one_row(1).ok());
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), all.begin() + static_cast<long>(vocab)));
  EXPECT_TRUE(absl::IsInvalidArgument(one_row(3)));
  const std::vector<int32_t> outside = {1, -1};
  EXPECT_TRUE(absl::IsInvalidArgument((*model)->LastLogitsRows(outside, &rows)));
  // A refused pass leaves no rows behind.
  const int64_t passes = (*model)->forward_passes();
  EXPECT_FALSE((*model)->ForwardSample(inputs, std::span(greedy).first(2), &tokens).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(one_row(0)));
  ASSERT_TRUE((*model)->ForwardGreedy(inputs, &tokens).ok());
  EXPECT_EQ((*model)->forward_passes(), passes + 1);
  ASSERT_TRUE(one_row(0).ok()) << "ForwardGreedy keeps its rows too";
  EXPECT_TRUE(std::equal(rows.begin(), rows.end(), all.begin()));
}

// A mixture of experts gathers each chosen expert's tokens from the batch
// (LlamaModel::IssueExperts): a token's logits must not depend on which
// other tokens share its batch or chunk, or on the thread count.
TEST(RandomModelTest, AMixtureOfExpertsGivesATokenTheSameBitsInAnyBatchOrChunk) {
  RandomModelShape shape{"test-moe", "olmoe", 2, 256, 128, 4, 4, 512, 1024};
  shape.experts = 8;
  shape.experts_used = 2;
  absl::StatusOr<std::unique_ptr<GgufFile>> opened = OpenRandomModel(shape, 5);
  ASSERT_TRUE(opened.ok()) << opened.status();
  const std::shared_ptr<const GgufFile> file(*std::move(opened));
  constexpr int kBlockSize = 16;
  std::vector<int32_t> a(600), b(37), c(5);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>((i * 7919) % 500);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>((i * 104729) % 500);
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<int32_t>(3 + i);
  auto table = [](int32_t first, size_t tokens) {
    std::vector<int32_t> t((tokens + kBlockSize - 1) / kBlockSize);
    for (size_t i = 0; i < t.size(); ++i) t[i] = first + static_cast<int32_t>(i);
    return t;
  };
  const std::vector<int32_t> table_a = table(0, a.size()), table_b = table(40, b.size()),
                             table_c = table(45, c.size());
  // a's last token's logits: in one pass of 600 tokens, or in chunks of
  // `chunk` tokens.
  auto logits_of_a = [&](LlamaModel& m, size_t chunk) {
    std::vector<float> logits;
    for (size_t pos = 0; pos < a.size(); pos += chunk) {
      const size_t n = std::min(chunk, a.size() - pos);
      const SequenceInput in{std::span(a).subspan(pos, n), static_cast<int32_t>(pos), table_a,
                             pos + n == a.size() ? 1 : 0};
      EXPECT_TRUE(m.Forward({&in, 1}, &logits).ok());
    }
    return logits;
  };
  kernels::cpu::CpuBackend one_thread(1);
  absl::StatusOr<std::unique_ptr<LlamaModel>> alone =
      LlamaModel::Create(file, &one_thread, 64, kBlockSize);
  ASSERT_TRUE(alone.ok()) << alone.status();
  ASSERT_TRUE((*alone)->config().IsMoe());
  const std::vector<float> reference = logits_of_a(**alone, 1);
  ASSERT_EQ(reference.size(), 512u);
  for (size_t chunk : {size_t{600}, size_t{7}, size_t{129}}) {
    EXPECT_EQ(logits_of_a(**alone, chunk), reference) << "chunks of " << chunk;
  }
  kernels::cpu::CpuBackend three_threads(3);
  absl::StatusOr<std::unique_ptr<LlamaModel>> batched =
      LlamaModel::Create(file, &three_threads, 64, kBlockSize);
  ASSERT_TRUE(batched.ok()) << batched.status();
  const std::vector<SequenceInput> batch = {
      {b, 0, table_b, 1}, {a, 0, table_a, 1}, {c, 0, table_c, 1}};
  std::vector<float> logits;
  ASSERT_TRUE((*batched)->Forward(batch, &logits).ok());
  ASSERT_EQ(logits.size(), 3 * reference.size());
  EXPECT_TRUE(std::equal(reference.begin(), reference.end(), logits.begin() + 512))
      << "a between two other sequences, on 3 threads";
  // The control: the logits of different tokens differ (the test can fail).
  EXPECT_FALSE(std::equal(reference.begin(), reference.end(), logits.begin()));
}

TEST(RandomModelTest, UnknownNamesAndBadSeedsAreRefusedNamingWhatIsKnown) {
  absl::StatusOr<std::unique_ptr<GgufFile>> unknown = OpenRandomModel("random:gpt-5");
  EXPECT_TRUE(absl::IsInvalidArgument(unknown.status()));
  EXPECT_NE(
      unknown.status().message().find(
          "llama3-8b, llama3.2-1b, qwen2.5-3b, qwen2.5-7b, qwen3-8b, olmoe-1b-7b, smollm2-135m"),
      std::string_view::npos)
      << unknown.status();
  EXPECT_TRUE(absl::IsInvalidArgument(OpenRandomModel("random:smollm2-135m@x").status()));
  EXPECT_TRUE(IsRandomModel("random:llama3-8b"));
  EXPECT_FALSE(IsRandomModel("models/random.gguf"));
}

}  // namespace
}  // namespace tandem::model
