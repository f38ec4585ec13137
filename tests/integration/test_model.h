// The model file the integration tests run on: $TANDEM_TEST_MODEL (ctest sets
// it to the model scripts/fetch-model caches). Tests fail, not skip, without
// it: CI must never pass by running nothing.
#ifndef TANDEM_TESTS_INTEGRATION_TEST_MODEL_H_
#define TANDEM_TESTS_INTEGRATION_TEST_MODEL_H_

#include <cstdlib>
#include <string>

namespace tandem::testing {

inline std::string TestModelPath() {
  const char* path = std::getenv("TANDEM_TEST_MODEL");
  return path != nullptr ? path : "";
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_TEST_MODEL_H_
