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
// and, for the products of a decode step of an 8B Llama shape (1 and 8
// rows; Q/K/V and gate/up as one call of several weights), the weight bytes
// read per second by cuBLAS (one GEMM per weight, as the backend ran them
// before) and by our few-row kernel (skinny_matmul.h, all weights in one
// launch): "product_<name>_rows<r>_cublas_gbs" and "..._ours_gbs", at 1, 4
// and 8 rows. Each run reads another copy of the weights, so none come from
// L2; 20 runs are queued per timed sample. Our outputs are checked against
// cuBLAS's (normalised error at most 1e-3): a mismatch exits 1.
//
// Each is the median of 10 timed runs after 3 warm-ups, printed as
// "key value" lines. Exits 1, saying why, without a usable GPU.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/kernels/cuda/skinny_matmul.h"

namespace {

bool Ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}

// The median time of one run() over 10 samples after 3 warm-ups; a sample
// queues `per_sample` runs back to back and divides (short kernels would
// otherwise be timed with the host's launch gap on an idle GPU).
template <typename Run>
float MedianMs(Run run, int per_sample = 1) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) run();
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(start);
    for (int j = 0; j < per_sample; ++j) run();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float t = 0.0f;
    cudaEventElapsedTime(&t, start, stop);
    ms.push_back(t / static_cast<float>(per_sample));
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

// A decode step's products of one 8B layer (and the output projection).
struct ProductShape {
  const char* name;
  int64_t k;
  std::vector<int64_t> n;  // the weights of one MatMul call
};

// Prints the cuBLAS and few-row kernel read rates of each shape; returns 1
// if a call failed.
int DecodeProducts(cublasHandle_t handle) {
  constexpr int kRunsPerSample = 20;
  using tandem::kernels::cuda::LaunchSkinnyMatMul;
  using tandem::kernels::cuda::SkinnyMatMulArgs;
  using tandem::kernels::cuda::SkinnyMatMulFits;
  const std::vector<ProductShape> shapes = {
      {"qkv", 4096, {4096, 1024, 1024}}, {"o", 4096, {4096}},
      {"gate_up", 4096, {14336, 14336}}, {"down", 14336, {4096}},
      {"output", 4096, {128256}},
  };
  for (const ProductShape& shape : shapes) {
    int64_t rows_total = 0;
    for (int64_t n : shape.n) rows_total += n;
    const size_t set_bytes = static_cast<size_t>(rows_total * shape.k) * 2;
    // Copies enough to pass 512 MiB: more than L2 holds, whatever the GPU.
    const size_t copies = std::max<size_t>(2, (size_t{512} << 20) / set_bytes + 1);
    __nv_bfloat16 *weights = nullptr, *x = nullptr;
    float* out = nullptr;
    const int max_rows = SkinnyMatMulArgs::kMaxRows;
    if (!Ok(cudaMalloc(&weights, set_bytes * copies), "cudaMalloc") ||
        !Ok(cudaMalloc(&x, static_cast<size_t>(max_rows * shape.k) * 2), "cudaMalloc") ||
        !Ok(cudaMalloc(&out, static_cast<size_t>(max_rows * rows_total) * 4), "cudaMalloc")) {
      return 1;
    }
    Fill<<<1024, 256>>>(weights, set_bytes * copies / 2, 0.05f);
    Fill<<<1024, 256>>>(x, static_cast<size_t>(max_rows * shape.k), 1.0f);
    for (int rows : {1, 4, max_rows}) {
      size_t turn = 0;
      // Weight i of copy c, and its output, as the backend lays them out.
      auto weight = [&](size_t c, size_t i) {
        int64_t first = 0;
        for (size_t j = 0; j < i; ++j) first += shape.n[j];
        return weights + c * (set_bytes / 2) + static_cast<size_t>(first * shape.k);
      };
      auto output = [&](size_t i) {
        int64_t first = 0;
        for (size_t j = 0; j < i; ++j) first += shape.n[j];
        return out + static_cast<size_t>(first * rows);
      };
      cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
      const float alpha = 1.0f, beta = 0.0f;
      const float cublas_ms = MedianMs(
          [&] {
            const size_t c = turn++ % copies;
            for (size_t i = 0; i < shape.n.size(); ++i) {
              const int n = static_cast<int>(shape.n[i]);
              const cublasStatus_t s =
                  cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, static_cast<int>(shape.k),
                               &alpha, weight(c, i), CUDA_R_16BF, static_cast<int>(shape.k), x,
                               CUDA_R_16BF, static_cast<int>(shape.k), &beta, output(i), CUDA_R_32F,
                               n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
              if (s != CUBLAS_STATUS_SUCCESS) status = s;
            }
          },
          kRunsPerSample);
      if (status != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "cublasGemmEx (%s): %s\n", shape.name, cublasGetStatusString(status));
        return 1;
      }
      SkinnyMatMulArgs args;
      args.x = reinterpret_cast<const uint16_t*>(x);
      args.rows = rows;
      args.k = shape.k;
      args.weights = static_cast<int>(shape.n.size());
      for (size_t i = 0; i < shape.n.size(); ++i) {
        args.n[i] = shape.n[i];
        args.out[i] = output(i);
        args.ld[i] = shape.n[i];
      }
      bool fits = true;
      const float ours_ms = MedianMs(
          [&] {
            const size_t c = turn++ % copies;
            for (size_t i = 0; i < shape.n.size(); ++i) {
              args.w[i] = reinterpret_cast<const uint16_t*>(weight(c, i));
            }
            fits = fits && SkinnyMatMulFits(args);
            if (fits) LaunchSkinnyMatMul(args, nullptr);
          },
          kRunsPerSample);
      if (!fits || !Ok(cudaGetLastError(), "LaunchSkinnyMatMul") ||
          !Ok(cudaDeviceSynchronize(), "LaunchSkinnyMatMul")) {
        return 1;
      }
      // The same product both ways, on copy 0: ours against cuBLAS's.
      std::vector<float> ours(static_cast<size_t>(rows * rows_total));
      std::vector<float> reference(ours.size());
      for (size_t i = 0; i < shape.n.size(); ++i) {
        args.w[i] = reinterpret_cast<const uint16_t*>(weight(0, i));
      }
      LaunchSkinnyMatMul(args, nullptr);
      cudaMemcpy(ours.data(), out, ours.size() * 4, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < shape.n.size(); ++i) {
        const int n = static_cast<int>(shape.n[i]);
        cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, static_cast<int>(shape.k), &alpha,
                     weight(0, i), CUDA_R_16BF, static_cast<int>(shape.k), x, CUDA_R_16BF,
                     static_cast<int>(shape.k), &beta, output(i), CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      }
      if (!Ok(cudaMemcpy(reference.data(), out, reference.size() * 4, cudaMemcpyDeviceToHost),
              "cudaMemcpy")) {
        return 1;
      }
      double diff = 0.0, norm = 0.0;
      for (size_t j = 0; j < ours.size(); ++j) {
        diff += (static_cast<double>(ours[j]) - reference[j]) * (ours[j] - reference[j]);
        norm += static_cast<double>(reference[j]) * reference[j];
      }
      const double error = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
      std::printf("product_%s_rows%d_error %.2e\n", shape.name, rows, error);
      if (!(error <= 1e-3)) {
        std::fprintf(stderr, "the few-row kernel differs from cuBLAS on %s, %d rows: %.2e\n",
                     shape.name, rows, error);
        return 1;
      }
      const double gb = static_cast<double>(set_bytes) / 1e9;
      std::printf("product_%s_rows%d_cublas_gbs %.1f\nproduct_%s_rows%d_ours_gbs %.1f\n",
                  shape.name, rows, gb / (cublas_ms * 1e-3), shape.name, rows,
                  gb / (ours_ms * 1e-3));
    }
    cudaFree(weights);
    cudaFree(x);
    cudaFree(out);
  }
  return 0;
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
  cudaFree(x);
  cudaFree(w);
  cudaFree(out);
  const int failed = DecodeProducts(handle);
  cublasDestroy(handle);
  return failed;
}
