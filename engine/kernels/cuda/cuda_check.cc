#include "engine/kernels/cuda/cuda_check.h"

#include <cstdio>
#include <cstdlib>

namespace tandem::kernels::cuda {

void CheckCuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "tandem CUDA backend: %s failed: %s (%s)\n", what, cudaGetErrorString(error),
               cudaGetErrorName(error));
  std::abort();
}

void CheckCublas(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "tandem CUDA backend: %s failed: %s\n", what, cublasGetStatusString(status));
  std::abort();
}

}  // namespace tandem::kernels::cuda
