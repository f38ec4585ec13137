// The sampling fields' validation shared by Generate and a handoff from a
// prefill daemon (peer_service): every bad value is INVALID_ARGUMENT naming
// its field, so nothing out of contract reaches the sampler.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "server/request_builder.h"

namespace tandem::server {
namespace {

step::SamplingParams Valid() {
  step::SamplingParams s;
  s.temperature = 0.8f;
  s.top_k = 40;
  s.top_p = 0.95f;
  return s;
}

void ExpectInvalid(const step::SamplingParams& s, int32_t logprobs, const std::string& prefix,
                   const std::string& field) {
  const absl::Status status = ValidateSampling(s, logprobs, prefix);
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_EQ(std::string(status.message()).rfind(field + ": ", 0), 0u) << status.message();
}

TEST(ValidateSamplingTest, AcceptsTheBoundsOfEveryField) {
  step::SamplingParams s = Valid();
  EXPECT_TRUE(ValidateSampling(s, 0, "").ok());
  EXPECT_TRUE(ValidateSampling(s, kMaxLogprobs, "").ok());
  s.temperature = 0.0f;
  s.top_k = 0;
  s.top_p = 1.0f;
  EXPECT_TRUE(ValidateSampling(s, 0, "sampling.").ok());
}

TEST(ValidateSamplingTest, NamesTheFieldOfEachBadValue) {
  for (const std::string prefix : {"", "sampling."}) {
    for (float t : {-0.1f, NAN, INFINITY}) {
      step::SamplingParams s = Valid();
      s.temperature = t;
      ExpectInvalid(s, 0, prefix, prefix + "temperature");
    }
    step::SamplingParams k = Valid();
    k.top_k = -1;
    ExpectInvalid(k, 0, prefix, prefix + "top_k");
    for (float p : {0.0f, -0.5f, 1.01f, NAN}) {
      step::SamplingParams s = Valid();
      s.top_p = p;
      ExpectInvalid(s, 0, prefix, prefix + "top_p");
    }
    ExpectInvalid(Valid(), -1, prefix, "logprobs");
    ExpectInvalid(Valid(), kMaxLogprobs + 1, prefix, "logprobs");
  }
}

}  // namespace
}  // namespace tandem::server
