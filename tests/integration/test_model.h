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

// The compute threads a test's model work may take: $TANDEM_TEST_THREADS,
// which scripts/test sets to the CPUs per ctest job (1 on a 2-core machine
// at -j2), else `fallback` (a test run alone). Two tests side by side, each
// computing on every CPU, make two pools wait on each other's preempted
// threads: two reference tests took 220-227 s so, against 57-80 s on one
// thread each. Tests whose subject is the threads ask for theirs explicitly.
inline int TestComputeThreads(int fallback) {
  const char* threads = std::getenv("TANDEM_TEST_THREADS");
  const int n = threads != nullptr ? std::atoi(threads) : 0;
  return n > 0 ? n : fallback;
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_INTEGRATION_TEST_MODEL_H_
