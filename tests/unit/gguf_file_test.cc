#include "engine/model/gguf_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "tests/unit/gguf_builder.h"

namespace tandem::model {
namespace {

using tandem::testing::GgufBuilder;
using ::testing::HasSubstr;

class GgufFileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) {
    return ::testing::TempDir() + "/gguf_" + std::to_string(::getpid()) + "_" + name;
  }
  absl::StatusOr<std::unique_ptr<GgufFile>> OpenBytes(const std::vector<uint8_t>& bytes) {
    const tandem::testing::ScopedFile file(Path("file.gguf"), bytes);
    return GgufFile::Open(file.path());
  }
  static std::vector<uint8_t> F32(std::vector<float> v) {
    std::vector<uint8_t> out(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  static GgufBuilder Valid(uint32_t version = 3) {
    GgufBuilder b(version);
    b.String("general.architecture", "llama")
        .Uint32("llama.block_count", 2)
        .Float32("llama.rope.freq_base", 10000.0f)
        .Bool("tokenizer.ggml.add_bos_token", true)
        .StringArray("tokenizer.ggml.tokens", {"a", "b", "<s>"})
        .Int32Array("tokenizer.ggml.token_type", {1, 1, 3})
        .Tensor("w", {4, 2}, 0, F32({1, 2, 3, 4, 5, 6, 7, 8}))
        .Tensor("v", {32}, 8, std::vector<uint8_t>(34, 1));  // one Q8_0 block
    return b;
  }
};

TEST_F(GgufFileTest, ReadsMetadataAndTensorsOfVersions2And3) {
  for (uint32_t version : {2u, 3u}) {
    auto file = OpenBytes(Valid(version).Build());
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ((*file)->version(), version);
    EXPECT_EQ(*(*file)->GetString("general.architecture"), "llama");
    EXPECT_EQ(*(*file)->GetUint("llama.block_count"), 2u);
    EXPECT_FLOAT_EQ(static_cast<float>(*(*file)->GetFloat("llama.rope.freq_base")), 10000.0f);
    EXPECT_TRUE(*(*file)->GetBool("tokenizer.ggml.add_bos_token"));
    EXPECT_THAT(*(*file)->GetStringArray("tokenizer.ggml.tokens"),
                ::testing::ElementsAre("a", "b", "<s>"));
    EXPECT_THAT(*(*file)->GetIntArray("tokenizer.ggml.token_type"),
                ::testing::ElementsAre(1, 1, 3));
    const GgufTensor* w = (*file)->FindTensor("w");
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(w->dims, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(w->dtype, kernels::DType::kF32);
    EXPECT_EQ(w->bytes, 32u);
    float values[8];
    std::memcpy(values, w->data, sizeof(values));
    EXPECT_EQ(values[7], 8.0f);
    const GgufTensor* v = (*file)->FindTensor("v");
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->dtype, kernels::DType::kQ8_0);
    EXPECT_EQ(v->bytes, 34u);
    EXPECT_EQ(v->offset % 32, 0u);
  }
}

TEST_F(GgufFileTest, TypedGettersNameTheKeyOnMismatch) {
  auto file = OpenBytes(Valid().Build());
  ASSERT_TRUE(file.ok());
  absl::StatusOr<std::string_view> s = (*file)->GetString("llama.block_count");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("llama.block_count"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("uint32"));
  EXPECT_EQ((*file)->GetUint("missing.key").status().code(), absl::StatusCode::kNotFound);
}

// Every proper prefix of a valid file is rejected with an error, never a crash
// or an out-of-bounds read.
TEST_F(GgufFileTest, EveryTruncationIsAnError) {
  const std::vector<uint8_t> bytes = Valid().Build();
  for (size_t n = 0; n < bytes.size(); ++n) {
    // The last tensor's padding is not needed; stop at its end.
    std::vector<uint8_t> prefix(bytes.begin(), bytes.begin() + static_cast<long>(n));
    auto file = OpenBytes(prefix);
    if (n >= bytes.size() - 30) continue;  // inside the final tensor's alignment padding
    EXPECT_FALSE(file.ok()) << "a file truncated to " << n << " bytes was accepted";
  }
  auto whole = OpenBytes(bytes);
  EXPECT_TRUE(whole.ok()) << whole.status();
}

TEST_F(GgufFileTest, TruncatedTensorDataNamesTheTensor) {
  std::vector<uint8_t> bytes = Valid().Build();
  bytes.resize(bytes.size() - 40);
  auto file = OpenBytes(bytes);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("tensor 'v'"));
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("truncated"));
}

TEST_F(GgufFileTest, RejectsBadHeaders) {
  struct Case {
    std::string what;
    size_t offset;
    std::vector<uint8_t> bytes;
    std::string message;
  };
  const std::vector<uint8_t> valid = Valid().Build();
  auto patched = [&](size_t offset, std::vector<uint8_t> with) {
    std::vector<uint8_t> b = valid;
    std::copy(with.begin(), with.end(), b.begin() + static_cast<long>(offset));
    return b;
  };
  auto u64 = [](uint64_t v) {
    std::vector<uint8_t> b(8);
    std::memcpy(b.data(), &v, 8);
    return b;
  };
  const std::vector<Case> cases = {
      {"magic", 0, patched(0, {'G', 'G', 'M', 'L'}), "not a GGUF file"},
      {"version 1", 4, patched(4, {1, 0, 0, 0}), "version 1 is not supported"},
      {"version 4", 4, patched(4, {4, 0, 0, 0}), "version 4 is not supported"},
      {"tensor count", 8, patched(8, u64(uint64_t{1} << 40)), "tensor count"},
      {"metadata count", 16, patched(16, u64(uint64_t{1} << 40)), "metadata count"},
      {"key length", 24, patched(24, u64(uint64_t{1} << 50)), "has length"},
  };
  for (const Case& c : cases) {
    auto file = OpenBytes(c.bytes);
    ASSERT_FALSE(file.ok()) << c.what;
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(c.message)) << c.what;
  }
}

TEST_F(GgufFileTest, RejectsBadValuesAndTensors) {
  struct Case {
    GgufBuilder builder;
    uint32_t alignment;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({GgufBuilder().Uint32("a", 1).Uint32("a", 2), 32, "appears twice"});
  cases.push_back(
      {GgufBuilder().Tensor("t", {4}, 0, F32({1, 2, 3, 4})).Tensor("t", {4}, 0, F32({1, 2, 3, 4})),
       32, "appears twice"});
  cases.push_back({GgufBuilder().Tensor("t", {4}, 99, F32({1, 2, 3, 4})), 32, "tensor type 99"});
  cases.push_back({GgufBuilder().Tensor("t", {0}, 0, {}), 32, "invalid dimension 0"});
  cases.push_back({GgufBuilder().Tensor("t", {1, 1, 1, 1, 1}, 0, F32({1})), 32, "rank 5"});
  cases.push_back({GgufBuilder().Tensor("t", {16}, 8, std::vector<uint8_t>(34)), 32,
                   "not a multiple of the Q8_0 block size 32"});
  cases.push_back({GgufBuilder().Uint32("general.alignment", 3), 32, "not a power of two"});
  for (Case& c : cases) {
    auto file = OpenBytes(c.builder.Build(c.alignment));
    ASSERT_FALSE(file.ok()) << c.message;
    EXPECT_THAT(std::string(file.status().message()), HasSubstr(c.message));
  }
}

TEST_F(GgufFileTest, RejectsInvalidBoolAndUnknownValueType) {
  std::vector<uint8_t> bytes = GgufBuilder().Bool("flag", true).Build();
  // header (24) + key length (8) + "flag" (4) + type (4) = the bool's byte
  bytes[40] = 7;
  auto file = OpenBytes(bytes);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("invalid value 7"));
  bytes[36] = 42;  // the value type
  file = OpenBytes(bytes);
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("unknown type 42"));
}

TEST_F(GgufFileTest, MisalignedTensorOffsetIsRejected) {
  auto file = OpenBytes(Valid().WithOffset(36).Build());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("tensor 'v' has offset 36"));
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("not a multiple of the alignment"));
}

TEST_F(GgufFileTest, TensorOffsetPastTheEndIsRejected) {
  auto file = OpenBytes(Valid().WithOffset(uint64_t{1} << 40).Build());
  ASSERT_FALSE(file.ok());
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("extends past the end of the file"));
}

// Random corruption never crashes the reader (run under the sanitizers for
// out-of-bounds reads: see docs/operations.md).
TEST_F(GgufFileTest, RandomByteFlipsNeverCrash) {
  const std::vector<uint8_t> valid = Valid().Build();
  std::mt19937 rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<uint8_t> bytes = valid;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f)
      bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    auto file = OpenBytes(bytes);
    if (!file.ok()) ++rejected;
  }
  EXPECT_GT(rejected, 500);  // most corruptions hit checked fields
}

TEST_F(GgufFileTest, MissingFileIsNotFound) {
  auto file = GgufFile::Open(Path("does-not-exist.gguf"));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("does-not-exist.gguf"));
}

}  // namespace
}  // namespace tandem::model
