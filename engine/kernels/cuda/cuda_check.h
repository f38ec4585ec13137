// Error checks for CUDA runtime and cuBLAS calls in the CUDA backend's host
// code. An operation of the Backend interface has no way to return an error,
// and a failed launch or copy leaves the CUDA context unusable, so a failure
// there ends the process with the call and the error named (the daemon's
// supervisor restarts it); allocations return errors instead (Allocate,
// CreateKvCache, UploadWeight).
#ifndef TANDEM_ENGINE_KERNELS_CUDA_CUDA_CHECK_H_
#define TANDEM_ENGINE_KERNELS_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace tandem::kernels::cuda {

// Aborts, naming `what` and the error, unless `error` is success.
void CheckCuda(cudaError_t error, const char* what);
void CheckCublas(cublasStatus_t status, const char* what);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_CUDA_CHECK_H_
