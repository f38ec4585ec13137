// A stream on part of a GPU's SMs: a green context (an SM partition) made
// through the CUDA driver API, whose entry points are looked up at run time
// (cudaGetDriverEntryPointByVersion), so the module links no libcuda and
// loads on drivers without green contexts (CUDA 12.4+ for the partition,
// 12.5+ for its streams).
//
// The prefill lane issues into this stream while the decode lane is busy
// (lane_partition.h): kernels there run only on the partition's SMs, so the
// SMs left out stay free for decode kernels, which run in the primary
// context on every SM.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_GREEN_PARTITION_H_
#define TANDEM_ENGINE_KERNELS_CUDA_GREEN_PARTITION_H_

#include <cuda_runtime_api.h>

#include <memory>

#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

class GreenPartition {
 public:
  // A partition of `device` that leaves at least `reserved_sms` SMs out
  // (rounded to the device's SM alignment), with one non-blocking stream of
  // `priority`. UNIMPLEMENTED when the driver lacks green contexts;
  // FAILED_PRECONDITION when the device cannot be split so (too few SMs).
  static absl::StatusOr<std::unique_ptr<GreenPartition>> Create(int device, int reserved_sms,
                                                                int priority);
  ~GreenPartition();
  GreenPartition(const GreenPartition&) = delete;
  GreenPartition& operator=(const GreenPartition&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Records `event` (made in the primary context) after the work issued so
  // far into the partition. cudaEventRecord cannot do this: an event and the
  // stream it is recorded on must belong to one context, and this stream
  // belongs to the green context (waiting across contexts is allowed).
  absl::Status RecordEvent(cudaEvent_t event) const;
  int sms() const { return sms_; }  // in the partition
  int device_sms() const { return device_sms_; }

  struct Driver;  // the driver entry points it uses (green_partition.cc)

 private:
  GreenPartition() = default;

  void* context_ = nullptr;  // CUgreenCtx
  cudaStream_t stream_ = nullptr;
  int sms_ = 0;
  int device_sms_ = 0;
  std::shared_ptr<const Driver> driver_;
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_GREEN_PARTITION_H_
