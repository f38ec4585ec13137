// Writing weights in GGUF block formats (engine/model/quantize.h) and the
// tensor types of a file type (file_type.h). Round trips are decoded by our
// reference dequantizer; tests/reference/test_quantizer.py holds the same
// blocks to llama.cpp's quantizer and the gguf package's decoder.
#include "engine/model/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/dtype.h"
#include "engine/kernels/half.h"
#include "engine/model/file_type.h"
#include "engine/model/iq4_levels.h"

namespace tandem::model {
namespace {

using kernels::DType;

std::vector<float> Normal(int n, float std, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, std);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = normal(rng);
  return x;
}

std::vector<float> RoundTrip(DType type, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> blocks(kernels::RowBytes(type, n));
  QuantizeRow(type, x.data(), n, blocks.data());
  std::vector<float> y(x.size());
  kernels::cpu::DequantizeRow(type, blocks.data(), n, y.data());
  return y;
}

double RelativeRmsError(const std::vector<float>& x, const std::vector<float>& y) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    error += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    norm += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(error / norm);
}

// Rounding to the nearest of 2^bits levels spread over a block's range
// (about +-2.2 standard deviations for 32 normal values) leaves an RMS error
// near step / sqrt(12): about 7% of the standard deviation for 4 bits, 3.5%
// for 5, 1.8% for 6, 0.5% for 8. The bounds leave a third more. IQ4's
// sixteen non-linear levels come about as close as four linear bits.
TEST(QuantizeTest, EachTypeRoundTripsWithinItsPrecision) {
  const std::vector<float> x = Normal(4096, 0.02f, 1);
  const struct {
    DType type;
    double bound;
  } cases[] = {
      {DType::kQ4_K, 0.095},   {DType::kQ5_K, 0.048},   {DType::kQ6_K, 0.024},
      {DType::kQ5_0, 0.06},    {DType::kQ5_1, 0.06},    {DType::kQ8_0, 0.008},
      {DType::kF16, 0.001},    {DType::kBF16, 0.005},   {DType::kF32, 0.0},
      {DType::kIQ4_NL, 0.095}, {DType::kIQ4_XS, 0.095},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(kernels::Info(c.type).name);
    ASSERT_TRUE(CanQuantize(c.type));
    const double error = RelativeRmsError(x, RoundTrip(c.type, x));
    EXPECT_LE(error, c.bound);
    // More bits, less error: no format may be far better than its bits allow
    // (which would mean the comparison decodes something else).
    if (c.bound > 0.01) {
      EXPECT_GE(error, c.bound / 4);
    }
  }
  EXPECT_FALSE(CanQuantize(DType::kQ4_0));
  EXPECT_FALSE(CanQuantize(DType::kQ4_1));
}

// Q8_0 rounds each element to the nearest multiple of amax / 127 (ggml's
// reference quantizer): every element within half a step, the largest exact
// up to the half-precision scale.
TEST(QuantizeTest, Q8_0RoundsEachElementToTheNearestStep) {
  const std::vector<float> x = Normal(256, 1.0f, 2);
  const std::vector<float> y = RoundTrip(DType::kQ8_0, x);
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float step = kernels::HalfToFloat(kernels::FloatToHalf(amax / 127.0f));
    for (size_t i = b; i < b + 32; ++i) {
      EXPECT_NEAR(y[i], x[i], step * 0.5f + amax * 1e-3f) << "element " << i;
    }
  }
}

// A sub-block whose values are all equal, all zero, or all positive (no
// minimum to subtract) still decodes close to its values.
TEST(QuantizeTest, FlatZeroAndOneSidedBlocksDecode) {
  for (DType type : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K, DType::kQ5_0, DType::kQ5_1,
                     DType::kIQ4_NL, DType::kIQ4_XS}) {
    SCOPED_TRACE(kernels::Info(type).name);
    std::vector<float> zeros(256, 0.0f);
    for (float v : RoundTrip(type, zeros)) EXPECT_EQ(v, 0.0f);
    std::vector<float> flat(256, 0.25f);
    for (float v : RoundTrip(type, flat)) EXPECT_NEAR(v, 0.25f, 0.25f * 0.01f);
    std::vector<float> positive = Normal(256, 0.02f, 3);
    for (float& v : positive) v = std::fabs(v) + 0.01f;
    // IQ4's levels are symmetric with no minimum: positive values use the
    // eight upper ones, three bits' worth.
    const bool symmetric_levels = type == DType::kIQ4_NL || type == DType::kIQ4_XS;
    EXPECT_LE(RelativeRmsError(positive, RoundTrip(type, positive)),
              symmetric_levels ? 0.09 : 0.05);
  }
}

// ggml's best_index_int8 as llama.cpp writes it: a binary search for the
// levels that bracket x, then the nearer (a tie goes up).
int GgmlBestIndex(float x) {
  const int8_t* val = kernels::kIq4NlLevels;
  if (x <= val[0]) return 0;
  if (x >= val[15]) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < val[mav]) {
      mu = mav;
    } else {
      ml = mav;
    }
  }
  return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

TEST(Iq4LevelsTest, BothSearchesChooseAsGgmlsBinarySearchDoes) {
  // Every level, every midpoint between neighbours (an exact tie in float:
  // it goes up), the floats either side of each, the ends, and random values.
  std::vector<float> x = {-1000.0f, 1000.0f, 0.0f, -0.0f};
  for (int i = 0; i < 16; ++i) {
    std::vector<float> points = {static_cast<float>(kernels::kIq4NlLevels[i])};
    if (i < 15) points.push_back(0.5f * (kernels::kIq4NlLevels[i] + kernels::kIq4NlLevels[i + 1]));
    for (float p : points) {
      x.insert(x.end(), {p, std::nextafter(p, -1e9f), std::nextafter(p, 1e9f)});
    }
  }
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-140.0f, 140.0f);
  while (x.size() % 32 != 0 || x.size() < 4096) x.push_back(uniform(rng));
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(NearestIq4Level(x[i]), GgmlBestIndex(x[i])) << "x = " << x[i];
  }
  // The 32-wide search (AVX-512 where built) with a scale applied first.
  for (const float scale : {1.0f, 0.37f, -2.5f}) {
    for (size_t b = 0; b < x.size(); b += 32) {
      uint8_t out[32];
      NearestIq4Levels32(scale, x.data() + b, out);
      for (size_t j = 0; j < 32; ++j) {
        ASSERT_EQ(out[j], GgmlBestIndex(scale * x[b + j]))
            << "x = " << x[b + j] << ", scale " << scale;
      }
    }
  }
}

TEST(FileTypeTest, ParsesTheKnownNamesInAnyCase) {
  EXPECT_EQ(*ParseFileType("q4_k_m"), FileType::kQ4_K_M);
  EXPECT_EQ(*ParseFileType("Q8_0"), FileType::kQ8_0);
  EXPECT_EQ(LlamaFileTypeId(FileType::kQ4_K_M), 15u);
  EXPECT_EQ(LlamaFileTypeId(FileType::kQ5_K_M), 17u);
  EXPECT_EQ(*ParseFileType("iq4_xs"), FileType::kIQ4_XS);
  EXPECT_EQ(LlamaFileTypeId(FileType::kIQ4_XS), 30u);
  const absl::Status bad = ParseFileType("IQ3_M").status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad));
  EXPECT_NE(bad.message().find("Q4_K_M"), std::string::npos) << bad;
}

// llama-quantize's "more bits" layers of 36: the first and last eighth
// (0-3, 31-35) and every third between (6, 9, ..., 30).
TEST(FileTypeTest, MoreBitsLayersAreTheEighthsAndEveryThird) {
  std::vector<int> more;
  for (int i = 0; i < 36; ++i) {
    if (UseMoreBits(i, 36)) more.push_back(i);
  }
  EXPECT_EQ(more,
            (std::vector<int>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 31, 32, 33, 34, 35}));
}

DType TypeOf(FileType type, std::string_view name, int64_t row, int layer, bool tied = false,
             int rank = 2, int query_heads_per_kv_head = 1) {
  return TensorTypeFor(type, {name, rank, row, layer, 36, tied, query_heads_per_kv_head});
}

TEST(FileTypeTest, Q4_K_MGivesLlamaQuantizesTypes) {
  const FileType f = FileType::kQ4_K_M;
  EXPECT_EQ(TypeOf(f, "output.weight", 4096, -1), DType::kQ6_K);
  EXPECT_EQ(TypeOf(f, "token_embd.weight", 4096, -1), DType::kQ4_K);
  EXPECT_EQ(TypeOf(f, "token_embd.weight", 4096, -1, /*tied=*/true), DType::kQ6_K);
  EXPECT_EQ(TypeOf(f, "token_embd.weight", 576, -1, /*tied=*/true), DType::kQ8_0);
  EXPECT_EQ(TypeOf(f, "blk.0.attn_v.weight", 4096, 0), DType::kQ6_K);
  EXPECT_EQ(TypeOf(f, "blk.4.attn_v.weight", 4096, 4), DType::kQ4_K);
  EXPECT_EQ(TypeOf(f, "blk.6.ffn_down.weight", 12288, 6), DType::kQ6_K);
  EXPECT_EQ(TypeOf(f, "blk.7.ffn_down_exps.weight", 1024, 7), DType::kQ4_K);
  EXPECT_EQ(TypeOf(f, "blk.6.attn_q.weight", 4096, 6), DType::kQ4_K);
  EXPECT_EQ(TypeOf(f, "blk.6.attn_q.weight", 576, 6), DType::kQ5_0);
  EXPECT_EQ(TypeOf(f, "blk.0.attn_v.weight", 576, 0), DType::kQ8_0);
  EXPECT_EQ(TypeOf(f, "blk.0.attn_q.weight", 100, 0), DType::kF16);
  EXPECT_EQ(TypeOf(f, "blk.0.attn_norm.weight", 4096, 0, false, 1), DType::kF32);
  EXPECT_EQ(TypeOf(f, "blk.0.attn_q_norm.weight", 128, 0), DType::kF32);
  EXPECT_EQ(TypeOf(f, "blk.0.ffn_gate_inp.weight", 2048, 0), DType::kF32);
  EXPECT_EQ(TypeOf(f, "blk.0.attn_q.bias", 4096, 0, false, 1), DType::kF32);
}

// llama-quantize's IQ4_XS (no importance matrix): Q5_K values where four or
// more query heads share them, Q5_K ffn_down in the first eighth of the
// layers (36 / 8 = 4: layers 0-3), Q6_K output, IQ4_NL where 256 does not
// divide a row (Q5_1 for a Q5_K one, Q8_0 for the output).
TEST(FileTypeTest, IQ4_XSGivesLlamaQuantizesTypes) {
  const FileType f = FileType::kIQ4_XS;
  EXPECT_EQ(TypeOf(f, "output.weight", 4096, -1), DType::kQ6_K);
  EXPECT_EQ(TypeOf(f, "token_embd.weight", 4096, -1), DType::kIQ4_XS);
  EXPECT_EQ(TypeOf(f, "token_embd.weight", 576, -1, /*tied=*/true), DType::kQ8_0);
  EXPECT_EQ(TypeOf(f, "blk.5.attn_v.weight", 4096, 5, false, 2, 4), DType::kQ5_K);
  EXPECT_EQ(TypeOf(f, "blk.5.attn_v.weight", 4096, 5, false, 2, 3), DType::kIQ4_XS);
  EXPECT_EQ(TypeOf(f, "blk.5.attn_v.weight", 576, 5, false, 2, 4), DType::kQ5_1);
  EXPECT_EQ(TypeOf(f, "blk.5.attn_qkv.weight", 4096, 5, false, 2, 8), DType::kQ5_K);
  EXPECT_EQ(TypeOf(f, "blk.3.ffn_down.weight", 14336, 3), DType::kQ5_K);
  EXPECT_EQ(TypeOf(f, "blk.4.ffn_down.weight", 14336, 4), DType::kIQ4_XS);
  EXPECT_EQ(TypeOf(f, "blk.0.ffn_down_exps.weight", 1024, 0), DType::kQ5_K);
  EXPECT_EQ(TypeOf(f, "blk.9.attn_q.weight", 576, 9), DType::kIQ4_NL);
  EXPECT_EQ(TypeOf(f, "blk.9.attn_norm.weight", 4096, 9, false, 1), DType::kF32);
}

TEST(FileTypeTest, OtherFileTypesFollowTheirBase) {
  EXPECT_EQ(TypeOf(FileType::kQ5_K_M, "blk.4.attn_v.weight", 4096, 4), DType::kQ5_K);
  EXPECT_EQ(TypeOf(FileType::kQ5_K_M, "blk.4.attn_v.weight", 576, 4), DType::kQ5_1);
  EXPECT_EQ(TypeOf(FileType::kQ5_K_M, "blk.3.ffn_down.weight", 4096, 3), DType::kQ6_K);
  EXPECT_EQ(TypeOf(FileType::kQ6_K, "blk.4.attn_q.weight", 4096, 4), DType::kQ6_K);
  EXPECT_EQ(TypeOf(FileType::kQ6_K, "output.weight", 576, -1), DType::kQ8_0);
  EXPECT_EQ(TypeOf(FileType::kQ8_0, "output.weight", 4096, -1), DType::kQ8_0);
  EXPECT_EQ(TypeOf(FileType::kQ8_0, "blk.0.attn_v.weight", 4096, 0), DType::kQ8_0);
  EXPECT_EQ(TypeOf(FileType::kF16, "token_embd.weight", 4096, -1, true), DType::kF16);
  EXPECT_EQ(TypeOf(FileType::kBF16, "blk.0.attn_v.weight", 4096, 0), DType::kBF16);
  EXPECT_EQ(TypeOf(FileType::kF32, "output.weight", 4096, -1), DType::kF32);
}

}  // namespace
}  // namespace tandem::model
