// One set of CPU threads shared by two lanes of work: a latency lane (the
// decode worker) and a throughput lane (the prefill worker).
//
// Each lane has one caller thread (its worker's) that issues data-parallel
// loops, ParallelFor(n, fn), one at a time. The pool's `threads - 1` helper
// threads and the caller run a loop's indices; which thread runs which index
// is not fixed, so kernels make each index's result depend only on its inputs
// (backend.h, determinism contract), and outputs are bitwise the same whatever
// ran beside them.
//
// Priority. A latency-lane step (BeginStep() .. EndStep()) owns the pool:
//   - no throughput index starts once it begins; BeginStep() sleeps until
//     the throughput indices already running have finished (the start
//     delay, bounded by one index's work: kernels keep throughput indices
//     small) and returns that delay;
//   - helpers then serve only the latency lane, spinning between its loops;
//   - the throughput caller parks (futex) at its next index or loop and
//     resumes at EndStep(); its loop's remaining indices wait, unclaimed.
// Outside a latency step every thread serves the throughput lane, so an idle
// lane leaves no core idle. There is no static split of the cores; an
// operator who wants one gives each lane a pool of its own.
//
// Thread safety: each lane is driven by one thread at a time; different
// lanes may be driven concurrently. BeginStep/EndStep only on the latency lane.
#ifndef TANDEM_ENGINE_KERNELS_CPU_COMPUTE_POOL_H_
#define TANDEM_ENGINE_KERNELS_CPU_COMPUTE_POOL_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "engine/kernels/backend.h"

namespace tandem::kernels::cpu {

class ComputePool;

// The CPUs this process may run on, in order (its affinity mask).
std::vector<int> AllowedCpus();

// A lane's handle on its pool: what a backend computes with.
class ComputeLane {
 public:
  using Fn = std::function<void(int64_t index, int thread)>;

  // Threads that may run a loop's indices; fn's `thread` is in [0, size()):
  // a slot for per-thread scratch (each slot used by one thread at a time).
  int size() const;
  LanePriority priority() const { return priority_; }

  // Runs fn(i, thread) for every i in [0, n) and returns when all are done.
  void ParallelFor(int64_t n, const Fn& fn);

  // Step boundaries. Latency lane: BeginStep takes the pool from the
  // throughput lane and returns, once no throughput index runs, how long
  // that took; EndStep gives the pool back (returns zero). Throughput lane:
  // BeginStep returns zero; EndStep returns how long latency steps held the
  // pool since BeginStep.
  absl::Duration BeginStep();
  absl::Duration EndStep();

  // Pins the calling thread (the lane's caller) to the pool's first CPU
  // when the pool pins its callers; no-op otherwise.
  void PinCallingThread() const;

 private:
  friend class ComputePool;
  ComputeLane(ComputePool* pool, LanePriority priority) : pool_(pool), priority_(priority) {}

  ComputePool* pool_;
  LanePriority priority_;
};

class ComputePool {
 public:
  // `threads` >= 1 counts the caller: threads - 1 helper threads start. With
  // `cpus`, helper i (1-based) is pinned to cpus[i % cpus.size()]. A pool
  // that both lanes share leaves the callers unpinned, so that the OS runs
  // the latency caller at once when its step begins; a pool of one lane
  // (`pin_callers`) pins its caller to cpus[0].
  explicit ComputePool(int threads, std::vector<int> cpus = {}, bool pin_callers = false);
  ~ComputePool();
  ComputePool(const ComputePool&) = delete;
  ComputePool& operator=(const ComputePool&) = delete;

  int size() const { return static_cast<int>(helpers_.size()) + 1; }
  ComputeLane& lane(LanePriority priority) { return lanes_[Index(priority)]; }
  // Whether a latency step holds (or is taking) the pool now.
  bool latency_step_active() const { return latency_step_.load() != 0; }

 private:
  friend class ComputeLane;
  // The loop a lane's caller has published.
  struct Job {
    std::atomic<bool> active{false};
    const ComputeLane::Fn* fn = nullptr;  // read only by threads counted in `users`
    std::atomic<int64_t> count{0};        // also read, as a hint, by idle helpers
    std::atomic<int64_t> next{0};
    // Waited on: a 4-byte atomic, which libstdc++ waits on with a futex of
    // its own (other sizes share proxy futexes).
    std::atomic<int32_t> remaining{0};
    std::atomic<int> users{0};  // helpers inside the job
    std::atomic<bool> caller_waiting{false};
  };

  static size_t Index(LanePriority p) { return p == LanePriority::kLatency ? 0 : 1; }
  void ParallelFor(LanePriority priority, int64_t n, const ComputeLane::Fn& fn);
  // Runs unclaimed indices of `priority`'s job as `thread` until none is
  // left (or, on the throughput lane, a latency step begins); returns
  // whether it ran any.
  bool RunIndices(LanePriority priority, int thread);
  // Runs index i of the job (bookkeeping included).
  bool HasUnclaimed(LanePriority priority) const;
  // A helper's way into a lane's job (counted in the job's users).
  bool ServeJob(LanePriority priority, int thread);
  bool HasWorkForHelpers() const;
  // Throughput lane: counts an index as running unless a latency step holds
  // the pool (then false, nothing counted).
  bool EnterThroughputIndex();
  void LeaveThroughputIndex();
  // Blocks the throughput caller while a latency step holds the pool.
  void ParkWhileLatencyStep();
  absl::Duration BeginLatencyStep();
  void EndLatencyStep();
  // Latency-step time so far, the running step's included (ns).
  int64_t LatencyHeldNs() const;
  void WakeHelpers();
  void HelperLoop(int thread);

  std::array<ComputeLane, 2> lanes_;
  std::array<Job, 2> jobs_;
  std::vector<std::thread> helpers_;
  std::atomic<int32_t> latency_step_{0};    // 1 while a latency step holds the pool (waited on)
  std::atomic<int> throughput_running_{0};  // throughput indices running now
  // Latency steps: when the current one began, and the total of the ended
  // ones (ns since the pool's epoch), for the throughput lane's yielded time.
  absl::Time epoch_ = absl::Now();
  std::atomic<int64_t> latency_step_begin_ns_{0};
  std::atomic<int64_t> latency_held_ns_{0};
  int64_t throughput_step_held_ns_ = 0;  // throughput caller only: at its BeginStep
  std::atomic<uint32_t> wake_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::vector<int> cpus_;
  bool pin_callers_;
};

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_COMPUTE_POOL_H_
