#include "engine/tokenizer/jinja/error.h"

#include <pthread.h>

#include <algorithm>
#include <cstdint>

namespace tandem::jinja::internal {

void Fail(std::string message) {
  throw Error(absl::StatusCode::kInvalidArgument, std::move(message));
}

void FailLimit(std::string message) {
  throw Error(absl::StatusCode::kResourceExhausted, std::move(message));
}

namespace {

// Bytes of stack left below `here` on this thread; 0 where unknown.
size_t StackLeft(const char* here) {
#if defined(__linux__)
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return 0;
  void* low = nullptr;
  size_t size = 0;
  int rc = pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_destroy(&attr);
  if (rc != 0 || low == nullptr) return 0;
  auto lo = reinterpret_cast<uintptr_t>(low);
  auto at = reinterpret_cast<uintptr_t>(here);
  if (at <= lo || at > lo + size) return 0;
  return at - lo;
#else
  (void)here;
  return 0;
#endif
}

}  // namespace

StackGuard::StackGuard() : base_(static_cast<const char*>(__builtin_frame_address(0))) {
  size_t left = StackLeft(base_);
  constexpr size_t kMargin = 128 << 10;  // for the library calls below the deepest check
  if (left == 0) {
    budget_ = kMaxStackBytes / 4;
  } else {
    budget_ = left > 2 * kMargin ? std::min(kMaxStackBytes, left - kMargin) : left / 2;
  }
}

void StackGuard::Check() const {
  const char* here = static_cast<const char*>(__builtin_frame_address(0));
  size_t used = base_ > here ? static_cast<size_t>(base_ - here) : 0;
  if (used > budget_) FailLimit("template nesting too deep (stack limit)");
}

}  // namespace tandem::jinja::internal
