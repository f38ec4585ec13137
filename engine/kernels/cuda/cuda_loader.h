// Loads the CUDA backend module (libtandem_cuda.so) at run time, if present,
// and makes backends from it.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_CUDA_LOADER_H_
#define TANDEM_ENGINE_KERNELS_CUDA_CUDA_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"

namespace tandem::kernels::cuda {

struct CudaProbe {
  int devices = 0;
  std::string description;   // device names, or why there are none
  bool has_backend = false;  // the module can make backends
};

// Loads `module_path` and asks it for CUDA devices. NotFound when the module
// is absent (built without CUDA); other errors when it cannot be loaded;
// zero devices, without loading it, when the machine has no NVIDIA driver
// library. A module that loads stays loaded for the life of the process
// (unloading the CUDA runtime is not supported), and CreateCudaBackend uses
// it.
absl::StatusOr<CudaProbe> ProbeCudaModule(const std::string& module_path);

// A backend on CUDA device 0 for `lane` (`decode_sms`: --cuda_decode_sms),
// from the module the last successful ProbeCudaModule loaded.
// FAILED_PRECONDITION when none was loaded or the device cannot be used.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(LanePriority lane, int decode_sms = -1);

// The module's path next to a binary in build/bin: build/lib/libtandem_cuda.so.
std::string DefaultCudaModulePath();

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_CUDA_LOADER_H_
