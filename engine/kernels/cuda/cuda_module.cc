#include "engine/kernels/cuda/cuda_module.h"

#include <cuda_runtime_api.h>

#include <cstdio>
#include <string>

#include "engine/kernels/cuda/cuda_backend.h"

extern "C" int tandem_cuda_module_abi() { return kTandemCudaModuleAbi; }

extern "C" int tandem_cuda_probe(char* message, size_t size) {
  int count = 0;  // left untouched on error
  const cudaError_t error = cudaGetDeviceCount(&count);
  std::string text;
  if (error != cudaSuccess) {
    count = 0;
    text = std::string("no CUDA device: ") + cudaGetErrorString(error);
  } else {
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
      text += std::string(d ? "; " : "") + std::to_string(d) + ": " + prop.name + " (sm_" +
              std::to_string(prop.major) + std::to_string(prop.minor) + ", " +
              std::to_string(prop.totalGlobalMem >> 20) + " MiB)";
    }
    if (count == 0) text = "no CUDA device";
  }
  if (size > 0) std::snprintf(message, size, "%s", text.c_str());
  return count;
}

extern "C" int tandem_cuda_create_backend(int device, int lane, int decode_sms,
                                          tandem::kernels::Backend** backend, char* error,
                                          size_t size) {
  using tandem::kernels::LanePriority;
  absl::StatusOr<std::unique_ptr<tandem::kernels::cuda::CudaBackend>> made =
      tandem::kernels::cuda::CudaBackend::Create(
          device, lane == 0 ? LanePriority::kLatency : LanePriority::kThroughput, decode_sms);
  if (!made.ok()) {
    if (size > 0) std::snprintf(error, size, "%s", std::string(made.status().message()).c_str());
    return -1;
  }
  *backend = made->release();
  return 0;
}
