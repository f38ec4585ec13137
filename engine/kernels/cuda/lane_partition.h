// How the two lanes on one GPU share its SMs (plain C++: no CUDA here, so it
// is tested on every machine).
//
// The elastic-compute contract (backend.h, LanePriority): a decode step takes
// the compute it needs from a running prefill within a small bound, and
// gives it back when it ends. On a GPU, stream priorities alone let a decode
// kernel's blocks go first only as the prefill's running blocks finish, and
// a prefill's next kernel can again fill every SM. With green contexts (SM
// partitions) the prefill lane keeps to a partition that leaves
// DecodeReservedSms() SMs free while the decode lane is busy, and widens to
// the whole device when it is not: the partition is resized at run time by
// switching the prefill's work between two streams (cuda_backend.cc).
#ifndef TANDEM_ENGINE_KERNELS_CUDA_LANE_PARTITION_H_
#define TANDEM_ENGINE_KERNELS_CUDA_LANE_PARTITION_H_

#include <chrono>
#include <memory>
#include <mutex>

namespace tandem::kernels::cuda {

// The SMs the prefill lane leaves to the decode lane while a decode step
// runs, for --cuda_decode_sms=`flag` on a device of `device_sms`: -1 (auto)
// is an eighth of them, rounded up; 0 turns partitions off (stream
// priorities only); a count is kept as given. Never more than half the
// device (the prefill lane keeps the larger part), never negative.
int DecodeReservedSms(int device_sms, int flag);

// Whether the decode lane of one device is busy: a decode step is running,
// or one ended less than its own duration ago (a decode loop's gaps between
// steps are shorter than its steps, so the prefill lane does not widen and
// narrow again between two of them). Shared by both lanes' backends of a
// device; thread-safe.
class LatencyLaneActivity {
 public:
  using Clock = std::chrono::steady_clock;

  // The one activity record of `device`, shared process-wide.
  static std::shared_ptr<LatencyLaneActivity> ForDevice(int device);

  void StepBegan(Clock::time_point now);
  void StepEnded(Clock::time_point now);
  bool Busy(Clock::time_point now) const;

 private:
  mutable std::mutex mu_;
  int running_ = 0;                  // steps begun and not ended
  Clock::time_point began_;          // the running step's start
  Clock::time_point last_end_;       // when the last step ended
  Clock::duration last_duration_{};  // how long it took
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_LANE_PARTITION_H_
