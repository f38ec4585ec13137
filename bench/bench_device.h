// The device a benchmark's --device flag names, chosen as the daemon
// chooses it (engine/kernels/backend_factory.h).
#ifndef TANDEM_BENCH_BENCH_DEVICE_H_
#define TANDEM_BENCH_BENCH_DEVICE_H_

#include <iostream>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/kernels/backend_factory.h"
#include "engine/kernels/cuda/cuda_loader.h"

namespace tandem {

// The choice for `flag` (cpu, cuda, auto), its reason printed to stderr; or
// the error, printed to stderr.
inline absl::StatusOr<kernels::DeviceChoice> ChooseBenchDevice(std::string_view flag) {
  absl::StatusOr<kernels::DeviceChoice> device = kernels::ChooseDevice(
      flag, kernels::cuda::ProbeCudaModule(kernels::cuda::DefaultCudaModulePath()));
  if (!device.ok()) {
    std::cerr << device.status() << "\n";
  } else {
    std::cerr << device->reason << std::endl;
  }
  return device;
}

}  // namespace tandem

#endif  // TANDEM_BENCH_BENCH_DEVICE_H_
