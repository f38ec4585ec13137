// How many pages of a KV storage are resident in memory (mincore): what
// tests of ReleaseKvPages observe, since released pages must leave the
// process's memory, not only read as zeros.
#ifndef TANDEM_TESTS_UNIT_RESIDENT_PAGES_H_
#define TANDEM_TESTS_UNIT_RESIDENT_PAGES_H_

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "engine/kernels/backend.h"

namespace tandem::testing {

// The storage's page count.
inline size_t PagesOf(const kernels::KvStorage& storage) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (storage.bytes + page - 1) / page;
}

// Its pages in memory now (a failed mincore fails the test).
inline std::ptrdiff_t ResidentPages(const kernels::KvStorage& storage) {
  std::vector<unsigned char> in_core(PagesOf(storage));
  EXPECT_EQ(::mincore(storage.data, storage.bytes, in_core.data()), 0);
  return std::count_if(in_core.begin(), in_core.end(), [](unsigned char c) { return c & 1; });
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_UNIT_RESIDENT_PAGES_H_
