#include "server/api_keys.h"

#include <gtest/gtest.h>

namespace tandem::server {
namespace {

TEST(ApiKeysTest, EveryMethodButHealthNeedsOneOfTheKeys) {
  const ApiKeys keys({"key-one", "key-two"});
  for (const char* method :
       {"/tandem.v1.Generation/Generate", "/tandem.v1.Generation/GetLoad",
        "/tandem.v1.Generation/SomeMethodAddedLater",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", ""}) {
    EXPECT_TRUE(keys.Check(method, "Bearer key-one").ok()) << method;
    EXPECT_TRUE(keys.Check(method, "Bearer key-two").ok()) << method;
    const absl::Status missing = keys.Check(method, std::nullopt);
    EXPECT_TRUE(absl::IsUnauthenticated(missing)) << method;
    EXPECT_EQ(missing.message(), "missing 'authorization: Bearer <key>' metadata");
    EXPECT_EQ(keys.Check(method, "key-one").message(),
              "the authorization metadata is not a bearer token");
    for (const char* wrong : {"Bearer key-on", "Bearer key-one ", "Bearer KEY-ONE", "Bearer "}) {
      const absl::Status refused = keys.Check(method, wrong);
      EXPECT_TRUE(absl::IsUnauthenticated(refused)) << method << " " << wrong;
      EXPECT_EQ(refused.message(), "invalid API key");  // never the key itself
    }
  }
  // Load balancers and Kubernetes probes send no key.
  EXPECT_TRUE(keys.Check("/grpc.health.v1.Health/Check", std::nullopt).ok());
  EXPECT_TRUE(keys.Check("/grpc.health.v1.Health/Watch", std::nullopt).ok());
  EXPECT_FALSE(keys.Check("/grpc.health.v1.HealthX/Check", std::nullopt).ok());
}

}  // namespace
}  // namespace tandem::server
