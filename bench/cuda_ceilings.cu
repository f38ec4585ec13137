// tandem-cuda-ceilings: the two ceilings the CUDA backend is judged against,
// measured on the GPU at hand in the same run as the backend's own figures
// (scripts/gpu-check):
//
//   copy_bandwidth_gbs  device-to-device cudaMemcpy of a 4 GiB buffer,
//                       counting the bytes read and written (GB/s)
//   read_bandwidth_gbs  half of that: the rate at which a kernel that only
//                       reads (decode reading weights) can stream memory
//   bf16_gemm_tflops    cuBLAS bf16 x bf16 -> float32 (float32 accumulation),
//                       8192 x 8192 x 8192: the products the backend runs
//
// Each is the median of 10 timed runs after 3 warm-ups, printed as
// "key value" lines. Exits 1, saying why, without a usable GPU.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace {

bool Ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

template <typename Run>
float MedianMs(Run run) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start);
    run();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0.0f;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

__global__ void Fill(__nv_bfloat16* p, size_t n, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    // A cheap hash: non-trivial bits (zeros run faster on tensor cores).
    const unsigned h = static_cast<unsigned>(i) * 2654435761u;
    p[i] = __float2bfloat16(scale * (static_cast<float>(h >> 8) / 16777216.0f - 0.5f));
  }
}

}  // namespace

int main() {
  int devices = 0;
  if (!Ok(cudaGetDeviceCount(&devices), "cudaGetDeviceCount") || devices == 0) return 1;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("device %s\n", prop.name);

  const size_t bytes = size_t{4} << 30;
  void *a = nullptr, *b = nullptr;
  if (!Ok(cudaMalloc(&a, bytes), "cudaMalloc") || !Ok(cudaMalloc(&b, bytes), "cudaMalloc"))
    return 1;
  cudaMemset(a, 1, bytes);
  const float copy_ms = MedianMs([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  const double copy_gbs = 2.0 * static_cast<double>(bytes) / (copy_ms * 1e-3) / 1e9;
  std::printf("copy_bandwidth_gbs %.1f\nread_bandwidth_gbs %.1f\n", copy_gbs, copy_gbs / 2.0);
  cudaFree(a);
  cudaFree(b);

  const int n = 8192;
  const size_t elements = static_cast<size_t>(n) * n;
  __nv_bfloat16 *x = nullptr, *w = nullptr;
  float* out = nullptr;
  if (!Ok(cudaMalloc(&x, elements * 2), "cudaMalloc") ||
      !Ok(cudaMalloc(&w, elements * 2), "cudaMalloc") ||
      !Ok(cudaMalloc(&out, elements * 4), "cudaMalloc")) {
    return 1;
  }
  Fill<<<1024, 256>>>(x, elements, 1.0f);
  Fill<<<1024, 256>>>(w, elements, 0.05f);
  cublasHandle_t handle;
  if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) return 1;
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
  const float gemm_ms = MedianMs([&] {
    status = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, w, CUDA_R_16BF, n, x,
                          CUDA_R_16BF, n, &beta, out, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
  });
  if (status != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cublasGemmEx: %s\n", cublasGetStatusString(status));
    return 1;
  }
  std::printf("bf16_gemm_tflops %.1f\n",
              2.0 * n * static_cast<double>(n) * n / (gemm_ms * 1e-3) / 1e12);
  cublasDestroy(handle);
  return 0;
}
