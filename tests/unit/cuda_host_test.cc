// The CUDA backend's host-side pieces, which run on every machine: the bf16
// weights it uploads (against the scalar dequantization and an exact
// rounding rule), the flattened attention inputs (exact words), the
// key-split policy and the lanes' SM partition policy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/cpu/to_bf16.h"
#include "engine/kernels/cuda/attention_rows.h"
#include "engine/kernels/cuda/lane_partition.h"
#include "engine/kernels/half.h"
#include "tests/unit/random_weights.h"

namespace tandem::kernels {
namespace {

using ::testing::ElementsAre;

TEST(FloatToBf16Test, RoundsToNearestEvenAndKeepsSpecialValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  // 1 + 2^-8 is half way between 1 and 1 + 2^-7: ties go to the even (1.0).
  EXPECT_EQ(FloatToBf16(Bits2Float(0x3f808000u)), 0x3f80);
  // 1 + 3 * 2^-8 is half way between 1 + 2^-7 (odd) and 1 + 2^-6: up.
  EXPECT_EQ(FloatToBf16(Bits2Float(0x3f818000u)), 0x3f82);
  // Just above half way rounds up.
  EXPECT_EQ(FloatToBf16(Bits2Float(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(-2.5f), 0xc020);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  // The largest float rounds to infinity, as IEEE rounding does.
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::max()), 0x7f80);
  const uint16_t nan = FloatToBf16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_TRUE(std::isnan(Bf16ToFloat(nan)));
  // A NaN whose payload sits in the low bits stays a NaN (no rounding to inf).
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(Bits2Float(0x7f800001u)))));
}

TEST(DequantizeToBf16Test, EveryTypeMatchesTheScalarDecodeRounded) {
  std::mt19937 rng(std::random_device{}());
  for (DType type : kAllTypes) {
    const int64_t rows = 37;
    const int64_t cols = 512;
    const std::vector<uint8_t> bytes = RandomWeights(type, rows, cols, rng);
    for (int threads : {1, 4}) {
      std::vector<uint16_t> out(static_cast<size_t>(rows * cols));
      cpu::DequantizeToBf16(type, bytes.data(), rows, cols, out.data(), threads);
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        cpu::DequantizeRow(type, bytes.data() + static_cast<size_t>(r) * RowBytes(type, cols), cols,
                           row.data());
        for (int64_t c = 0; c < cols; ++c) {
          ASSERT_EQ(out[static_cast<size_t>(r * cols + c)],
                    FloatToBf16(row[static_cast<size_t>(c)]))
              << Info(type).name << " row " << r << " col " << c << " threads " << threads;
        }
      }
    }
  }
}

TEST(AttentionRowsTest, FlattensSpansIntoExactWords) {
  const std::vector<int32_t> table_a = {7, 2};
  const std::vector<int32_t> table_b = {5};
  const std::vector<int32_t> table_c = {9, 1, 4};
  // A 3-token prompt chunk from position 17, one decode row at 4, and a
  // 2-token verify at 40; rows in that order.
  const AttentionSpan spans[] = {{0, 3, 17, table_a}, {3, 1, 4, table_b}, {4, 2, 40, table_c}};
  const cuda::AttentionRows packed = cuda::PackAttentionRows(spans, 6);
  // Tables start at 12 (2 x 6 rows): a at 12, b at 14, c at 15.
  EXPECT_THAT(packed.words, ElementsAre(12, 12, 12, 14, 15, 15,  // table starts
                                        18, 19, 20, 5, 41, 42,   // keys: position + 1
                                        7, 2, 5, 9, 1, 4));      // tables
  EXPECT_EQ(packed.max_keys, 42);
}

TEST(AttentionRowsTest, RowsNoSpanCoversAttendNothing) {
  const std::vector<int32_t> table = {3};
  const AttentionSpan spans[] = {{1, 1, 0, table}};
  const cuda::AttentionRows packed = cuda::PackAttentionRows(spans, 3);
  EXPECT_THAT(packed.words, ElementsAre(0, 6, 0, 0, 1, 0, 3));
  EXPECT_EQ(packed.max_keys, 1);
}

TEST(AttentionRowsTest, ARecordedStepPadsToAFixedNumberOfWords) {
  const std::vector<int32_t> table = {3, 8};
  const AttentionSpan spans[] = {{0, 1, 20, table}};
  // Two rows (one padding), at most 4 blocks a row: 2 x 2 + 2 x 4 words.
  const cuda::AttentionRows packed = cuda::PackAttentionRows(spans, 2, 12);
  EXPECT_THAT(packed.words, ElementsAre(4, 0, 21, 0, 3, 8, 0, 0, 0, 0, 0, 0));
}

TEST(AttentionRowsTest, LongSpansGoToQueryTilesAndTheRestToTheRowKernel) {
  const std::vector<int32_t> table_a = {4};
  const std::vector<int32_t> table_b = {6, 7, 9};
  // A decode row at position 10, then a 40-row prompt chunk from position 2:
  // tiles of 16 rows cover the chunk as 16 + 16 + 8.
  const AttentionSpan spans[] = {{0, 1, 10, table_a}, {1, 40, 2, table_b}};
  const cuda::AttentionRows packed = cuda::PackAttentionRows(spans, 41, 0, 16);
  ASSERT_EQ(packed.tiles, 3);
  EXPECT_EQ(packed.max_keys, 11) << "only the rows outside tiles";
  EXPECT_EQ(packed.untiled_rows, 1);
  EXPECT_EQ(packed.words[41], 11);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(packed.words[42 + i], -(2 + i + 1)) << "row " << 1 + i;
  EXPECT_EQ(packed.tile_offset, 82 + 4);
  const std::vector<int32_t> tiles(packed.words.begin() + packed.tile_offset, packed.words.end());
  EXPECT_THAT(tiles, ElementsAre(1, 16, 2, 83,     // rows 1-16 from position 2, table b
                                 17, 16, 18, 83,   // rows 17-32 from position 18
                                 33, 8, 34, 83));  // rows 33-40 from position 34
  // A short span is never tiled.
  const AttentionSpan short_span[] = {{0, 15, 0, table_b}};
  EXPECT_EQ(cuda::PackAttentionRows(short_span, 15, 0, 16).tiles, 0);
}

TEST(KeySplitsTest, SplitsOnlyLongContextsThatLeaveTheDeviceIdle) {
  // Batch 1, 32 heads, 8k context on 132 SMs (528 target blocks): 17 splits
  // of at least 256 keys fill the device.
  EXPECT_EQ(cuda::ChooseKeySplits(1, 32, 8192, 528), 17);
  // The same with a 1k context: as many splits as 256-key pieces.
  EXPECT_EQ(cuda::ChooseKeySplits(1, 32, 1024, 528), 4);
  // Short contexts and large batches are not split.
  EXPECT_EQ(cuda::ChooseKeySplits(1, 32, 200, 528), 1);
  EXPECT_EQ(cuda::ChooseKeySplits(64, 32, 8192, 528), 1);
  // Never more than 64.
  EXPECT_EQ(cuda::ChooseKeySplits(1, 1, 1 << 20, 100000), 64);
}

// --cuda_decode_sms: auto is an eighth of the SMs, rounded up (17 of an H200's 132),
// 0 is off, a count stays, and the prefill lane always keeps the larger part.
TEST(LanePartitionTest, DecodeReservedSmsFollowsTheFlagWithinHalfTheDevice) {
  EXPECT_EQ(cuda::DecodeReservedSms(132, -1), 17);
  EXPECT_EQ(cuda::DecodeReservedSms(108, -1), 14);
  EXPECT_EQ(cuda::DecodeReservedSms(132, 0), 0);
  EXPECT_EQ(cuda::DecodeReservedSms(132, 24), 24);
  EXPECT_EQ(cuda::DecodeReservedSms(132, 100), 66);
  EXPECT_EQ(cuda::DecodeReservedSms(1, -1), 0);
  EXPECT_EQ(cuda::DecodeReservedSms(132, -5), 17);
}

// The decode lane counts as busy while a step runs and for as long after it
// as that step took; nested steps (two decode backends) end with the last.
TEST(LanePartitionTest, TheDecodeLaneIsBusyDuringAStepAndForItsDurationAfter) {
  cuda::LatencyLaneActivity activity;
  using std::chrono::milliseconds;
  const cuda::LatencyLaneActivity::Clock::time_point t0{};
  EXPECT_FALSE(activity.Busy(t0));
  activity.StepBegan(t0 + milliseconds(100));
  EXPECT_TRUE(activity.Busy(t0 + milliseconds(100)));
  EXPECT_TRUE(activity.Busy(t0 + milliseconds(10'000)));
  activity.StepEnded(t0 + milliseconds(110));  // a 10 ms step
  EXPECT_TRUE(activity.Busy(t0 + milliseconds(119)));
  EXPECT_FALSE(activity.Busy(t0 + milliseconds(120)));
  activity.StepBegan(t0 + milliseconds(200));
  activity.StepBegan(t0 + milliseconds(201));
  activity.StepEnded(t0 + milliseconds(202));
  EXPECT_TRUE(activity.Busy(t0 + milliseconds(500)));  // one still runs
  activity.StepEnded(t0 + milliseconds(204));          // 4 ms from the first start
  EXPECT_TRUE(activity.Busy(t0 + milliseconds(207)));
  EXPECT_FALSE(activity.Busy(t0 + milliseconds(208)));
  activity.StepEnded(t0 + milliseconds(300));  // unmatched: ignored
  EXPECT_FALSE(activity.Busy(t0 + milliseconds(300)));
}

// Both lanes' backends of one device see one record; another device its own.
TEST(LanePartitionTest, EachDeviceHasOneSharedActivityRecord) {
  std::shared_ptr<cuda::LatencyLaneActivity> a = cuda::LatencyLaneActivity::ForDevice(0);
  std::shared_ptr<cuda::LatencyLaneActivity> b = cuda::LatencyLaneActivity::ForDevice(0);
  std::shared_ptr<cuda::LatencyLaneActivity> c = cuda::LatencyLaneActivity::ForDevice(1);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), c.get());
}

}  // namespace
}  // namespace tandem::kernels
