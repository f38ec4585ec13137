// Names the calling thread (as `top -H`, perf and gdb show it), so that a
// profile of the daemon says which time is the scheduler's, a worker's or a
// compute thread's. Linux keeps the first 15 characters.
#ifndef TANDEM_COMMON_THREAD_NAME_H_
#define TANDEM_COMMON_THREAD_NAME_H_

#include <pthread.h>

#include <string>
#include <string_view>

namespace tandem {

inline void NameThisThread(std::string_view name) {
  const std::string truncated(name.substr(0, 15));
  pthread_setname_np(pthread_self(), truncated.c_str());
}

}  // namespace tandem

#endif  // TANDEM_COMMON_THREAD_NAME_H_
