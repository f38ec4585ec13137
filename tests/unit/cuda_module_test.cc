// The CUDA backend module loads and answers on any machine: with no GPU or
// driver it reports zero devices and why, instead of failing (the daemon
// relies on this to start on CPU-only machines). Skips when the build has no
// CUDA module (TANDEM_CUDA=OFF).
#include <gtest/gtest.h>

#include "engine/kernels/cuda/cuda_loader.h"
#include "tests/gpu/gpu_test_support.h"

namespace tandem::kernels::cuda {
namespace {

TEST(CudaModuleTest, LoadsAndProbesWithOrWithoutADevice) {
  absl::StatusOr<CudaProbe> probe = ProbeCudaModule(testing::CudaModulePath());
  if (probe.status().code() == absl::StatusCode::kNotFound) {
    GTEST_SKIP() << "built without the CUDA module: " << probe.status();
  }
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_GE(probe->devices, 0);
  EXPECT_FALSE(probe->description.empty());
  if (probe->devices == 0) {
    EXPECT_NE(probe->description.find("no CUDA device"), std::string::npos);
  }
}

TEST(CudaModuleTest, MissingModuleIsNotFound) {
  EXPECT_EQ(ProbeCudaModule("/nonexistent/libtandem_cuda.so").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CudaGpuTest, ReportsTheDevices) {
  absl::StatusOr<CudaProbe> probe = ProbeCudaModule(testing::CudaModulePath());
  if (!probe.ok() || probe->devices == 0) {
    GTEST_SKIP() << "no CUDA device here: "
                 << (probe.ok() ? probe->description : std::string(probe.status().message()));
  }
  EXPECT_NE(probe->description.find("sm_"), std::string::npos) << probe->description;
}

}  // namespace
}  // namespace tandem::kernels::cuda
