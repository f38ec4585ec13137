#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "engine/kernels/cuda/cuda_module.h"

extern "C" int tandem_cuda_module_abi() { return kTandemCudaModuleAbi; }

extern "C" int tandem_cuda_probe(char* message, size_t size) {
  int count = 0;  // left untouched on error (BUILD-NOTES, pitfall 5)
  const cudaError_t error = cudaGetDeviceCount(&count);
  std::string text;
  if (error != cudaSuccess) {
    count = 0;
    text = std::string("no CUDA device: ") + cudaGetErrorString(error);
  } else {
    for (int d = 0; d < count; ++d) {
      cudaDeviceProp prop{};
      if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
      char line[256];
      std::snprintf(line, sizeof(line), "%s%d: %s (sm_%d%d, %zu MiB)", d ? "; " : "", d, prop.name,
                    prop.major, prop.minor, prop.totalGlobalMem >> 20);
      text += line;
    }
    if (count == 0) text = "no CUDA device";
  }
  if (size > 0) {
    std::snprintf(message, size, "%s", text.c_str());
  }
  return count;
}
