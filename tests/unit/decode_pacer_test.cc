// The decode lane's pacing on shared compute, and the auto threshold's
// arithmetic: exact expectations on injected times and costs.
#include "scheduler/decode_pacer.h"

#include <gtest/gtest.h>

#include "scheduler/disaggregation_policy.h"

namespace tandem::scheduler {
namespace {

absl::Time Ms(double ms) { return absl::UnixEpoch() + absl::Milliseconds(ms); }

TEST(DecodePacerTest, AnIdlePrefillLaneHoldsNothingBack) {
  DecodePacer pacer({absl::Milliseconds(25), 0.5});
  EXPECT_TRUE(pacer.MayStart(Ms(0), /*prefill_busy=*/true));  // no step yet
  pacer.OnStart(Ms(0));
  pacer.OnEnd(Ms(6));
  EXPECT_TRUE(pacer.MayStart(Ms(6), /*prefill_busy=*/false));
  EXPECT_FALSE(pacer.MayStart(Ms(6), /*prefill_busy=*/true));
}

TEST(DecodePacerTest, ShortStepsStartOncePerInterval) {
  DecodePacer pacer({absl::Milliseconds(25), 0.5});
  pacer.OnStart(Ms(100));
  pacer.OnEnd(Ms(106));
  EXPECT_EQ(pacer.NextStart(), Ms(125));
  EXPECT_FALSE(pacer.MayStart(Ms(124.9), true));
  EXPECT_TRUE(pacer.MayStart(Ms(125), true));
}

TEST(DecodePacerTest, LongStepsLeaveThePrefillLaneItsShare) {
  // A 40 ms step with share 0.5 is followed by 40 ms of prefill; with share
  // 0.2 by 10 ms (then the 25 ms interval no longer binds either way).
  DecodePacer half({absl::Milliseconds(25), 0.5});
  half.OnStart(Ms(0));
  half.OnEnd(Ms(40));
  EXPECT_EQ(half.NextStart(), Ms(80));
  DecodePacer fifth({absl::Milliseconds(25), 0.2});
  fifth.OnStart(Ms(0));
  fifth.OnEnd(Ms(40));
  EXPECT_EQ(fifth.NextStart(), Ms(50));
}

TEST(DecodePacerTest, ZeroIntervalAndShareNeverHold) {
  DecodePacer pacer({absl::ZeroDuration(), 0.0});
  pacer.OnStart(Ms(0));
  pacer.OnEnd(Ms(7));
  EXPECT_TRUE(pacer.MayStart(Ms(7), true));
}

TEST(DecodePacerTest, OptionsOutOfRangeNameTheFlag) {
  absl::Status s = ValidatePacing({absl::Milliseconds(-1), 0.5});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--decode_step_interval"), std::string::npos) << s;
  for (double share : {-0.1, 1.0, 2.0}) {
    s = ValidatePacing({absl::Milliseconds(25), share});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << share;
    EXPECT_NE(s.message().find("--prefill_min_share"), std::string::npos) << s;
  }
  EXPECT_TRUE(ValidatePacing({absl::Milliseconds(25), 0.0}).ok());
}

TEST(AutoOutputThresholdTest, ChunkInterferenceFarAboveTheExtraPassMovesAtOnce) {
  // As measured on 2 CPU cores: a 128-token chunk step takes ~35x a decode
  // pass. I = 241 - 7 = 234, P = 7 - 6 = 1: threshold ceil(7 / 233) = 1.
  EXPECT_EQ(AutoOutputThreshold({7.0, 235.0, 241.0}), 1);
}

TEST(AutoOutputThresholdTest, TheMoveIsRecoveredAfterHOverIMinusPTokens) {
  // I = 12 - 4 = 8, P = 4 - (12 - 11) = 3: gain 5 per token, H = 4 -> 1.
  EXPECT_EQ(AutoOutputThreshold({4.0, 11.0, 12.0}), 1);
  // I = 10 - 8 = 2, P = 8 - (10 - 9.5) = 7.5: never pays.
  EXPECT_EQ(AutoOutputThreshold({8.0, 9.5, 10.0}), std::nullopt);
  // I = 30 - 10 = 20, P = 10 - (30 - 21) = 1: gain 19, H = 10 -> 1.
  EXPECT_EQ(AutoOutputThreshold({10.0, 21.0, 30.0}), 1);
  // I = 18 - 10 = 8, P = 10 - (18 - 10.5) = 2.5: gain 5.5, H = 10 -> 2.
  EXPECT_EQ(AutoOutputThreshold({10.0, 10.5, 18.0}), 2);
  // I = 14 - 10 = 4, P = 10 - (14 - 10.5) = 6.5: never.
  EXPECT_EQ(AutoOutputThreshold({10.0, 10.5, 14.0}), std::nullopt);
  // Gain 0.5 per token: I = 20.5 - 10 = 10.5, P = 10 - 0 = 10 -> 20.
  EXPECT_EQ(AutoOutputThreshold({10.0, 20.5, 20.5}), 20);
}

TEST(AutoOutputThresholdTest, NoMeasurementNoThreshold) {
  EXPECT_EQ(AutoOutputThreshold({}), std::nullopt);
}

}  // namespace
}  // namespace tandem::scheduler
