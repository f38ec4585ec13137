// A fixed set of threads that run data-parallel loops for one caller.
//
// ParallelFor(n, fn) runs fn(i) for every i in [0, n), spread over the pool's
// threads and the calling thread, and returns when all are done. Which thread
// runs which index is not fixed; kernels must make each index's result depend
// only on its inputs (they do: see backend.h, determinism contract).
//
// Idle threads spin briefly (a kernel launch follows another within
// microseconds during a forward pass) and then sleep on a futex.
//
// Thread safety: one caller at a time.
#ifndef TANDEM_ENGINE_KERNELS_CPU_THREAD_POOL_H_
#define TANDEM_ENGINE_KERNELS_CPU_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace tandem::kernels::cpu {

class ThreadPool {
 public:
  // `threads` counts the caller: ThreadPool(1) starts no thread. With
  // `cpus`, pool thread i runs on cpus[i % cpus.size()]; the caller is
  // thread 0 and pins itself with PinCallingThread().
  explicit ThreadPool(int threads, std::vector<int> cpus = {});

  // Pins the calling thread to cpus[0] (no-op without cpus). Called once by
  // the thread that will call ParallelFor (a worker's own thread).
  void PinCallingThread() const;
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // fn(index, thread) with thread in [0, size()): a slot for per-thread scratch.
  void ParallelFor(int64_t n, const std::function<void(int64_t index, int thread)>& fn);

 private:
  void WorkerLoop(int thread);
  void RunTasks(int thread);

  std::vector<int> cpus_;
  std::vector<std::thread> workers_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int> busy_{0};
  std::atomic<bool> stop_{false};
  int64_t count_ = 0;
  const std::function<void(int64_t, int)>* fn_ = nullptr;
};

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_THREAD_POOL_H_
