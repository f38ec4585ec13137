#include "engine/kernels/cpu/compute_pool.h"

#include <pthread.h>
#include <sched.h>

#include <limits>

#include "common/check.h"
#include "common/strings.h"
#include "common/thread_name.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tandem::kernels::cpu {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// Idle helpers spin this long (tens of microseconds) for the next loop before
// sleeping: long enough to bridge the gap between two kernels of a forward
// pass, short enough not to hold a core other threads need for long.
constexpr int kSpinIterations = 4000;
// A caller waiting for others' indices, or a latency step for the throughput
// indices still running, spins this much before sleeping (a few microseconds:
// the thread it waits for may need this very core).
constexpr int kShortSpin = 200;

// Pins the calling thread to `cpu`; failures (a CPU outside the allowed set)
// leave it unpinned, which costs only performance.
void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

int ComputeLane::size() const { return pool_->size(); }

void ComputeLane::ParallelFor(int64_t n, const Fn& fn) { pool_->ParallelFor(priority_, n, fn); }

absl::Duration ComputeLane::BeginStep() {
  if (priority_ == LanePriority::kLatency) return pool_->BeginLatencyStep();
  pool_->throughput_step_held_ns_ = pool_->LatencyHeldNs();
  return absl::ZeroDuration();
}

absl::Duration ComputeLane::EndStep() {
  if (priority_ == LanePriority::kLatency) {
    pool_->EndLatencyStep();
    return absl::ZeroDuration();
  }
  return absl::Nanoseconds(pool_->LatencyHeldNs() - pool_->throughput_step_held_ns_);
}

void ComputeLane::PinCallingThread() const {
  if (pool_->pin_callers_ && !pool_->cpus_.empty()) PinTo(pool_->cpus_[0]);
}

ComputePool::ComputePool(int threads, std::vector<int> cpus, bool pin_callers)
    : lanes_{ComputeLane(this, LanePriority::kLatency),
             ComputeLane(this, LanePriority::kThroughput)},
      cpus_(std::move(cpus)),
      pin_callers_(pin_callers) {
  for (int t = 1; t < threads; ++t) {
    helpers_.emplace_back([this, t] {
      NameThisThread(StrCat("tandem-compute", t));
      if (!cpus_.empty()) PinTo(cpus_[static_cast<size_t>(t) % cpus_.size()]);
      HelperLoop(t);
    });
  }
}

ComputePool::~ComputePool() {
  stop_.store(true);
  WakeHelpers();
  for (std::thread& h : helpers_) h.join();
}

bool ComputePool::EnterThroughputIndex() {
  // Counted before the check, so that BeginLatencyStep (flag, then count)
  // either sees this index or this index sees the flag.
  throughput_running_.fetch_add(1);
  if (latency_step_.load()) {
    LeaveThroughputIndex();
    return false;
  }
  return true;
}

void ComputePool::LeaveThroughputIndex() {
  if (throughput_running_.fetch_sub(1) == 1 && latency_step_.load()) {
    throughput_running_.notify_all();
  }
}

void ComputePool::ParkWhileLatencyStep() {
  while (latency_step_.load() != 0) latency_step_.wait(1);
}

int64_t ComputePool::LatencyHeldNs() const {
  int64_t held = latency_held_ns_.load();
  if (latency_step_.load()) {
    held += absl::ToInt64Nanoseconds(absl::Now() - epoch_) - latency_step_begin_ns_.load();
  }
  return held;
}

absl::Duration ComputePool::BeginLatencyStep() {
  const absl::Time start = absl::Now();
  latency_step_begin_ns_.store(absl::ToInt64Nanoseconds(start - epoch_));
  latency_step_.store(1);
  for (int spin = 0;; ++spin) {
    const int running = throughput_running_.load();
    if (running == 0) break;
    if (spin < kShortSpin) {
      CpuRelax();
    } else {
      throughput_running_.wait(running);
    }
  }
  return absl::Now() - start;
}

void ComputePool::EndLatencyStep() {
  latency_held_ns_.fetch_add(absl::ToInt64Nanoseconds(absl::Now() - epoch_) -
                             latency_step_begin_ns_.load());
  latency_step_.store(0);
  latency_step_.notify_all();  // the parked throughput caller
  WakeHelpers();               // throughput indices may be waiting
}

void ComputePool::WakeHelpers() {
  wake_.fetch_add(1);
  if (sleepers_.load() > 0) wake_.notify_all();
}

bool ComputePool::HasUnclaimed(LanePriority priority) const {
  const Job& job = jobs_[Index(priority)];
  return job.active.load() &&
         job.next.load(std::memory_order_relaxed) < job.count.load(std::memory_order_relaxed);
}

bool ComputePool::RunIndices(LanePriority priority, int thread) {
  const bool throughput = priority == LanePriority::kThroughput;
  Job& job = jobs_[Index(priority)];
  bool ran = false;
  for (;;) {
    if (throughput && !EnterThroughputIndex()) return ran;
    const int64_t i = job.next.fetch_add(1);
    if (i >= job.count.load(std::memory_order_relaxed)) {
      if (throughput) LeaveThroughputIndex();
      return ran;
    }
    (*job.fn)(i, thread);
    if (throughput) LeaveThroughputIndex();
    ran = true;
    if (job.remaining.fetch_sub(1) == 1 && job.caller_waiting.load()) job.remaining.notify_all();
  }
}

void ComputePool::ParallelFor(LanePriority priority, int64_t n, const ComputeLane::Fn& fn) {
  if (n <= 0) return;
  const bool throughput = priority == LanePriority::kThroughput;
  if (helpers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) {
      if (throughput) {
        while (!EnterThroughputIndex()) ParkWhileLatencyStep();
      }
      fn(i, 0);
      if (throughput) LeaveThroughputIndex();
    }
    return;
  }
  TANDEM_CHECK(n <= std::numeric_limits<int32_t>::max(),
               "ParallelFor takes at most 2^31 - 1 indices");
  Job& job = jobs_[Index(priority)];
  job.fn = &fn;
  job.count.store(n, std::memory_order_relaxed);
  job.next.store(0);
  job.remaining.store(static_cast<int32_t>(n));
  job.active.store(true);
  WakeHelpers();
  // The caller runs indices too (slot 0); when the rest are claimed it
  // waits for them, spinning briefly, then sleeping.
  for (int spin = 0;;) {
    const int32_t remaining = job.remaining.load();
    if (remaining == 0) break;
    if (HasUnclaimed(priority)) {
      if (throughput && latency_step_.load()) {
        ParkWhileLatencyStep();
      } else {
        RunIndices(priority, 0);
      }
      spin = 0;
      continue;
    }
    if (spin++ < kSpinIterations) {
      CpuRelax();
      continue;
    }
    job.caller_waiting.store(true);
    if (const int32_t now = job.remaining.load(); now != 0) job.remaining.wait(now);
    job.caller_waiting.store(false);
    spin = 0;
  }
  // Helpers that entered the job must be out before it can be reused.
  job.active.store(false);
  while (job.users.load() != 0) CpuRelax();
  job.fn = nullptr;
}

bool ComputePool::ServeJob(LanePriority priority, int thread) {
  Job& job = jobs_[Index(priority)];
  if (!job.active.load()) return false;
  job.users.fetch_add(1);
  const bool ran = job.active.load() && RunIndices(priority, thread);
  job.users.fetch_sub(1);
  return ran;
}

bool ComputePool::HasWorkForHelpers() const {
  if (latency_step_.load()) return HasUnclaimed(LanePriority::kLatency);
  return HasUnclaimed(LanePriority::kThroughput) || HasUnclaimed(LanePriority::kLatency);
}

void ComputePool::HelperLoop(int thread) {
  int idle = 0;
  for (;;) {
    if (stop_.load()) return;
    const uint32_t seen = wake_.load();
    bool ran = false;
    if (latency_step_.load()) {
      ran = ServeJob(LanePriority::kLatency, thread);
    } else {
      ran = ServeJob(LanePriority::kThroughput, thread);
      ran = ServeJob(LanePriority::kLatency, thread) || ran;
    }
    if (ran) {
      idle = 0;
      continue;
    }
    if (idle++ < kSpinIterations) {
      CpuRelax();
      continue;
    }
    // Sleep until a loop is published, a latency step ends or the pool
    // stops. A publisher bumps wake_ after publishing, so a change since
    // `seen` ends the wait at once.
    sleepers_.fetch_add(1);
    if (!stop_.load() && !HasWorkForHelpers()) wake_.wait(seen);
    sleepers_.fetch_sub(1);
    idle = 0;
  }
}

}  // namespace tandem::kernels::cpu
