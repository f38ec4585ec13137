// Where the daemon's backends come from: --device picks the kind (cpu, cuda,
// or auto) and CreateBackend makes them, so the server names no backend type
// of its own. The CUDA backend lives in the separately built module
// (cuda/cuda_module.h) that the daemon loads at start-up.
#ifndef TANDEM_ENGINE_KERNELS_BACKEND_FACTORY_H_
#define TANDEM_ENGINE_KERNELS_BACKEND_FACTORY_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"
#include "engine/kernels/cpu/compute_pool.h"
#include "engine/kernels/cpu/matmul.h"
#include "engine/kernels/cuda/cuda_loader.h"

namespace tandem::kernels {

enum class Device : uint8_t { kCpu, kCuda };
std::string_view DeviceName(Device device);

// What --device resolved to, and the one line the daemon logs about it.
struct DeviceChoice {
  Device device = Device::kCpu;
  std::string reason;
};

// `flag`: cpu, cuda or auto (CUDA when the module loads, sees a device and
// has a backend; else the CPU). `probe`: the CUDA module's answer (NotFound:
// no module in this build). INVALID_ARGUMENT for an unknown flag value;
// FAILED_PRECONDITION, saying why, for cuda where it cannot be had.
absl::StatusOr<DeviceChoice> ChooseDevice(std::string_view flag,
                                          const absl::StatusOr<cuda::CudaProbe>& probe);

// One worker's backend on `device`. The CPU backend computes on `pool` in
// `lane`'s turn with `matmul` products; the CUDA backend (from the module
// that ProbeCudaModule loaded) on device 0 with `lane`'s stream priority.
struct BackendSpec {
  Device device = Device::kCpu;
  std::shared_ptr<cpu::ComputePool> pool;  // the CPU backend's; unused (may be null) for CUDA
  LanePriority lane = LanePriority::kThroughput;
  cpu::MatMulMode matmul = cpu::MatMulMode::kF32;
  // CUDA: SMs the prefill lane leaves free while decode runs (-1: an eighth
  // of the device, 0: none, stream priorities only; cuda/lane_partition.h).
  int cuda_decode_sms = -1;
};
absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendSpec& spec);

}  // namespace tandem::kernels

#endif  // TANDEM_ENGINE_KERNELS_BACKEND_FACTORY_H_
