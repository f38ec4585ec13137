// ReadModelConfig on the metadata llama.cpp's converter writes for Gemma 2
// and 3: what each key sets, llama.cpp's defaults where a key is missing,
// and errors that name the key.
#include "engine/model/model_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>

#include "tests/unit/gguf_builder.h"

namespace tandem::model {
namespace {

using tandem::testing::GgufBuilder;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The keys every model has, for `arch` with `layers` layers of width 256
// (4 heads of 64), and a token embedding of 8 tokens.
GgufBuilder Base(const std::string& arch, uint32_t layers, uint32_t embedding = 256,
                 uint32_t heads = 4) {
  GgufBuilder b;
  b.String("general.architecture", arch)
      .Uint32(arch + ".block_count", layers)
      .Uint32(arch + ".embedding_length", embedding)
      .Uint32(arch + ".feed_forward_length", 512)
      .Uint32(arch + ".attention.head_count", heads)
      .Uint32(arch + ".attention.head_count_kv", 1)
      .Uint32(arch + ".context_length", 1024);
  return b;
}

absl::StatusOr<ModelConfig> Read(GgufBuilder b, uint32_t embedding = 256) {
  b.Tensor("token_embd.weight", {embedding, 8}, 0, std::vector<uint8_t>(embedding * 8 * 4, 0));
  const tandem::testing::ScopedFile gguf(
      ::testing::TempDir() + "/model_config_" + std::to_string(::getpid()) + ".gguf", b.Build());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(gguf.path());
  if (!file.ok()) return file.status();
  return ReadModelConfig(**file);
}

TEST(ModelConfigTest, Gemma2WithoutItsOptionalKeysGetsLlamaCppsDefaults) {
  absl::StatusOr<ModelConfig> c = Read(Base("gemma2", 4));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->activation, ModelConfig::Activation::kGeluTanh);
  EXPECT_EQ(c->embedding_scale, 16.0f);  // sqrt(256)
  EXPECT_TRUE(c->post_norms);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->rope_neox);
  EXPECT_EQ(c->attention_softcap, 50.0f);
  EXPECT_EQ(c->final_softcap, 30.0f);
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_THAT(c->sliding_layers, ElementsAre(true, false, true, false));
  EXPECT_EQ(c->rope_base_sliding, c->rope_base);
  EXPECT_EQ(c->attention_scale, 0.125f);  // 1/sqrt(64)
}

TEST(ModelConfigTest, Gemma3SlidesFiveLayersInSixWithTheirOwnRotation) {
  GgufBuilder b = Base("gemma3", 7);
  b.Uint32("gemma3.attention.sliding_window", 512)
      .Float32("gemma3.rope.freq_base", 1000000.0f)
      .String("gemma3.rope.scaling.type", "linear")
      .Float32("gemma3.rope.scaling.factor", 8.0f);
  absl::StatusOr<ModelConfig> c = Read(b);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_EQ(c->attention_softcap, 0.0f);
  EXPECT_EQ(c->final_softcap, 0.0f);
  EXPECT_EQ(c->sliding_window, 512);
  EXPECT_THAT(c->sliding_layers, ElementsAre(true, true, true, true, true, false, true));
  EXPECT_EQ(c->rope_base, 1000000.0f);
  EXPECT_EQ(c->rope_scale, 8.0f);
  EXPECT_EQ(c->rope_base_sliding, 10000.0f);
  EXPECT_EQ(c->rope_scale_sliding, 1.0f);
}

TEST(ModelConfigTest, Gemma3WithoutAWindowHasNoSlidingLayers) {
  absl::StatusOr<ModelConfig> c = Read(Base("gemma3", 2));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->HasSlidingLayers());
}

TEST(ModelConfigTest, APatternKeyChoosesTheSlidingLayers) {
  GgufBuilder period = Base("gemma3", 4);
  period.Uint32("gemma3.attention.sliding_window", 64)
      .Uint32("gemma3.attention.sliding_window_pattern", 2);
  absl::StatusOr<ModelConfig> c = Read(period);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->sliding_layers, ElementsAre(true, false, true, false));

  GgufBuilder each = Base("gemma3", 3);
  each.Uint32("gemma3.attention.sliding_window", 64)
      .BoolArray("gemma3.attention.sliding_window_pattern", {false, true, true});
  c = Read(each);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->sliding_layers, ElementsAre(false, true, true));

  GgufBuilder short_array = Base("gemma3", 3);
  short_array.Uint32("gemma3.attention.sliding_window", 64)
      .BoolArray("gemma3.attention.sliding_window_pattern", {false, true});
  c = Read(short_array);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(),
              HasSubstr("'gemma3.attention.sliding_window_pattern' has 2 values for 3 layers"));
}

TEST(ModelConfigTest, The27BShapesScaleByEmbeddingOverHeads) {
  // Gemma 3 27B: 62 layers, width 5376, 32 heads of 128 (query_pre_attn_scalar 168).
  GgufBuilder b = Base("gemma3", 62, 5376, 32);
  b.Uint32("gemma3.attention.key_length", 128);
  absl::StatusOr<ModelConfig> c = Read(b, 5376);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->attention_scale, 1.0f / std::sqrt(168.0f));
}

TEST(ModelConfigTest, ABadSoftcapIsRefusedNamingTheKey) {
  GgufBuilder b = Base("gemma2", 2);
  b.Float32("gemma2.final_logit_softcapping", -1.0f);
  absl::StatusOr<ModelConfig> c = Read(b);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("'gemma2.final_logit_softcapping'"));
}

TEST(ModelConfigTest, Qwen3MoeRenormalisesItsExpertsAndOlmoeDoesNot) {
  GgufBuilder qwen = Base("qwen3moe", 2);
  qwen.Uint32("qwen3moe.expert_count", 128)
      .Uint32("qwen3moe.expert_used_count", 8)
      .Uint32("qwen3moe.expert_feed_forward_length", 768);
  absl::StatusOr<ModelConfig> c = Read(qwen);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->IsMoe());
  EXPECT_EQ(c->experts, 128);
  EXPECT_EQ(c->experts_used, 8);
  EXPECT_EQ(c->expert_ffn, 768);
  EXPECT_TRUE(c->expert_weights_norm);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qk_norm_whole);

  GgufBuilder olmoe = Base("olmoe", 2);
  olmoe.Uint32("olmoe.expert_count", 64).Uint32("olmoe.expert_used_count", 8);
  c = Read(olmoe);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->expert_ffn, 512);  // feed_forward_length: its experts' width
  EXPECT_FALSE(c->expert_weights_norm);
  EXPECT_TRUE(c->qk_norm_whole);

  GgufBuilder too_many = Base("olmoe", 2);
  too_many.Uint32("olmoe.expert_count", 4).Uint32("olmoe.expert_used_count", 8);
  c = Read(too_many);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("expert_used_count 8 of expert_count 4"));

  GgufBuilder no_count = Base("qwen3moe", 2);
  c = Read(no_count);
  EXPECT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("qwen3moe.expert_count"));
}

TEST(ModelConfigTest, AnUnknownArchitectureNamesTheSupportedOnes) {
  absl::StatusOr<ModelConfig> c = Read(Base("mamba", 2));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(c.status().message(), HasSubstr("'mamba' is not supported"));
  EXPECT_THAT(c.status().message(), HasSubstr("gemma2, gemma3"));
}

}  // namespace
}  // namespace tandem::model
