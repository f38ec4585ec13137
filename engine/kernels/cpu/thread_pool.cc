#include "engine/kernels/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

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

// Spin this long (tens of microseconds) for the next kernel before sleeping:
// long enough to bridge the gap between two kernels of a forward pass, short
// enough not to steal a shared core from other work for long.
constexpr int kSpinIterations = 4000;

}  // namespace

namespace {

// Pins the calling thread to `cpu`; failures (a CPU outside the allowed set)
// leave it unpinned, which costs only performance.
void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

}  // namespace

ThreadPool::ThreadPool(int threads, std::vector<int> cpus) : cpus_(std::move(cpus)) {
  for (int t = 1; t < threads; ++t) {
    workers_.emplace_back([this, t] {
      if (!cpus_.empty()) PinTo(cpus_[static_cast<size_t>(t) % cpus_.size()]);
      WorkerLoop(t);
    });
  }
}

void ThreadPool::PinCallingThread() const {
  if (!cpus_.empty()) PinTo(cpus_[0]);
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (std::thread& w : workers_) w.join();
}

void ThreadPool::RunTasks(int thread) {
  for (;;) {
    const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
    if (i >= count_) break;
    (*fn_)(i, thread);
  }
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i, 0);
    return;
  }
  fn_ = &fn;
  count_ = n;
  next_.store(0, std::memory_order_relaxed);
  busy_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  RunTasks(0);
  // Wait for the workers: spin briefly, then sleep until the last one
  // finishing wakes us (a descheduled worker must not cost a busy core).
  for (int spin = 0; busy_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) {
      CpuRelax();
    } else {
      const int busy = busy_.load(std::memory_order_acquire);
      if (busy != 0) busy_.wait(busy, std::memory_order_acquire);
    }
  }
  fn_ = nullptr;
}

void ThreadPool::WorkerLoop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t current = generation_.load(std::memory_order_acquire);
    for (int spin = 0; current == seen && spin < kSpinIterations; ++spin) {
      CpuRelax();
      current = generation_.load(std::memory_order_acquire);
    }
    if (current == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      continue;
    }
    seen = current;
    if (stop_.load()) return;
    RunTasks(thread);
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_.notify_one();
  }
}

}  // namespace tandem::kernels::cpu
