// TANDEM_CHECK: invariant checks that stay on in release builds.
//
// A failed check is a bug in our own bookkeeping (never bad user input, which
// gets a Status): continuing would corrupt other requests, so it aborts with
// the file, line and message. (Debian's Abseil 20220623 predates absl/log.)
#ifndef TANDEM_COMMON_CHECK_H_
#define TANDEM_COMMON_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define TANDEM_CHECK(condition, message)                                                    \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #condition, \
                   (message));                                                              \
      std::abort();                                                                         \
    }                                                                                       \
  } while (false)

#endif  // TANDEM_COMMON_CHECK_H_
