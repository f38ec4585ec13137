// Loads the CUDA backend module (libtandem_cuda.so) at run time, if present.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_CUDA_LOADER_H_
#define TANDEM_ENGINE_KERNELS_CUDA_CUDA_LOADER_H_

#include <string>

#include "absl/status/statusor.h"

namespace tandem::kernels::cuda {

struct CudaProbe {
  int devices = 0;
  std::string description;  // device names, or why there are none
};

// Loads `module_path` and asks it for CUDA devices. NotFound when the module
// is absent (built without CUDA); other errors when it cannot be loaded.
absl::StatusOr<CudaProbe> ProbeCudaModule(const std::string& module_path);

// The module's path next to a binary in build/bin: build/lib/libtandem_cuda.so.
std::string DefaultCudaModulePath();

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_CUDA_LOADER_H_
