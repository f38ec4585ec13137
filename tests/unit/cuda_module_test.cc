// The CUDA backend module loads and answers on any machine: with no GPU or
// driver it reports zero devices and why, instead of failing (the daemon
// relies on this to start on CPU-only machines). Skips when the build has no
// CUDA module (TANDEM_CUDA=OFF).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

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

TEST(CudaModuleTest, WithoutADriverTheModuleIsNotLoaded) {
  // A CPU-only machine: probing answers zero devices without loading the
  // module, whose CUDA libraries would stay resident (~60 MB of cuBLAS Lt).
  if (void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL); driver != nullptr) {
    ::dlclose(driver);
    GTEST_SKIP() << "this machine has an NVIDIA driver";
  }
  absl::StatusOr<CudaProbe> probe = ProbeCudaModule(testing::CudaModulePath());
  if (probe.status().code() == absl::StatusCode::kNotFound) {
    GTEST_SKIP() << "built without the CUDA module: " << probe.status();
  }
  ASSERT_TRUE(probe.ok()) << probe.status();
  EXPECT_EQ(probe->devices, 0);
  EXPECT_NE(probe->description.find("no NVIDIA driver"), std::string::npos) << probe->description;
  std::ifstream maps("/proc/self/maps");
  const std::string mapped((std::istreambuf_iterator<char>(maps)),
                           std::istreambuf_iterator<char>());
  EXPECT_EQ(mapped.find("libtandem_cuda"), std::string::npos);
  EXPECT_EQ(mapped.find("libcublas"), std::string::npos);
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
