// What the GPU tests share: the CUDA backend from this build's module, or the
// reason there is none here (the tests then skip, saying so).
#ifndef TANDEM_TESTS_GPU_GPU_TEST_SUPPORT_H_
#define TANDEM_TESTS_GPU_GPU_TEST_SUPPORT_H_

#include <cmath>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "engine/kernels/cuda/cuda_loader.h"

namespace tandem::testing {

// $TANDEM_CUDA_MODULE, else the module beside the test binaries.
inline std::string CudaModulePath() {
  const char* path = std::getenv("TANDEM_CUDA_MODULE");
  return path != nullptr ? path : kernels::cuda::DefaultCudaModulePath();
}

// A CUDA backend for `lane` (`decode_sms`: --cuda_decode_sms), or why none
// can be made here (no module in this build, no driver, no device).
inline absl::StatusOr<std::unique_ptr<kernels::Backend>> CudaBackendOrWhyNot(
    kernels::LanePriority lane = kernels::LanePriority::kThroughput, int decode_sms = -1) {
  absl::StatusOr<kernels::cuda::CudaProbe> probe = kernels::cuda::ProbeCudaModule(CudaModulePath());
  if (!probe.ok()) return probe.status();
  if (probe->devices == 0) return absl::UnavailableError(probe->description);
  if (!probe->has_backend) return absl::UnavailableError("the CUDA module has no backend");
  return kernels::cuda::CreateCudaBackend(lane, decode_sms);
}

// ||a - b|| / ||b||: the error of a against the reference b, relative to b's
// size (0 when both are zero).
inline double NormalisedError(std::span<const float> a, std::span<const float> b) {
  double diff = 0.0;
  double norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : INFINITY;
  return std::sqrt(diff / norm);
}

}  // namespace tandem::testing

#endif  // TANDEM_TESTS_GPU_GPU_TEST_SUPPORT_H_
