// Abseil's Mutex and CondVar, re-implemented for ThreadSanitizer builds only.
//
// The system's Abseil (Debian's libabsl) is not compiled with TSan, so TSan
// cannot see its locks: every field guarded by an absl::Mutex would look
// racy. scripts/test --sanitize=thread links this file into every program
// it builds, ahead of libabsl, with -rdynamic: these definitions then stand
// in for Abseil's own, for our code and for the shared libraries that use
// absl::Mutex (gRPC among them). They are a plain lock built on
// instrumented std::atomic operations, so TSan sees every acquire and
// release. Waiting polls (CondVar may wake spuriously; Await re-checks its
// condition under the lock), which is slow but correct.
//
// The lock word is Abseil's own (one std::atomic<intptr_t>, 0 when free), so a
// Mutex constructed by inline header code works unchanged. Never built into
// a normal build.
#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace {

void Backoff(int& spins) {
  if (++spins < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

// The lock: 0 free, 1 held (readers take it exclusively too).
void Mutex::Lock() {
  int spins = 0;
  intptr_t expected = 0;
  while (!mu_.compare_exchange_weak(expected, 1, std::memory_order_acquire)) {
    expected = 0;
    Backoff(spins);
  }
}
void Mutex::Unlock() { mu_.store(0, std::memory_order_release); }
bool Mutex::TryLock() {
  intptr_t expected = 0;
  return mu_.compare_exchange_strong(expected, 1, std::memory_order_acquire);
}
void Mutex::ReaderLock() { Lock(); }
void Mutex::ReaderUnlock() { Unlock(); }
bool Mutex::ReaderTryLock() { return TryLock(); }
void Mutex::AssertHeld() const {}
void Mutex::AssertReaderHeld() const {}
void Mutex::AssertNotHeld() const {}

bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  int spins = 0;
  while (!cond.Eval()) {
    if (absl::Now() >= deadline) return false;
    Unlock();
    Backoff(spins);
    Lock();
  }
  return true;
}
void Mutex::Await(const Condition& cond) { AwaitWithDeadline(cond, absl::InfiniteFuture()); }
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  return AwaitWithDeadline(cond, absl::Now() + timeout);
}
void Mutex::LockWhen(const Condition& cond) {
  Lock();
  Await(cond);
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  Lock();
  return AwaitWithDeadline(cond, deadline);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return LockWhenWithDeadline(cond, absl::Now() + timeout);
}
void Mutex::ReaderLockWhen(const Condition& cond) { LockWhen(cond); }
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  return LockWhenWithDeadline(cond, deadline);
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return LockWhenWithTimeout(cond, timeout);
}

// Every wait is a spurious wake-up after a short pause, which CondVar's
// contract allows; callers re-check their predicate.
bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  mu->Unlock();
  std::this_thread::sleep_for(std::chrono::microseconds(50));
  mu->Lock();
  return absl::Now() >= deadline;
}
void CondVar::Wait(Mutex* mu) { WaitWithDeadline(mu, absl::InfiniteFuture()); }
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  return WaitWithDeadline(mu, absl::Now() + timeout);
}
void CondVar::Signal() {}
void CondVar::SignalAll() {}

ABSL_NAMESPACE_END
}  // namespace absl
