// The model file the integration tests run on: $TANDEM_TEST_MODEL, else the
// one CMake was configured with (scripts/test passes the fetched model).
// Tests fail, not skip, without it: CI must never pass by running nothing.
#ifndef TANDEM_TESTS_INTEGRATION_TEST_MODEL_H_
#define TANDEM_TESTS_INTEGRATION_TEST_MODEL_H_

#include <cstdlib>
#include <string>

#include "tests/test_paths.h"

namespace tandem::testing {

inline std::string TestModelPath() {
  const char* path = std::getenv("TANDEM_TEST_MODEL");
  return path != nullptr ? path : paths::kTestModel;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_TEST_MODEL_H_
