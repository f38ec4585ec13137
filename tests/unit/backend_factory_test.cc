// --device: what each value resolves to for every state of the CUDA module,
// and the backends the factory makes.
#include "engine/kernels/backend_factory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::kernels {
namespace {

using ::testing::HasSubstr;

const absl::StatusOr<cuda::CudaProbe> kNoModule = absl::NotFoundError("no module");
const absl::StatusOr<cuda::CudaProbe> kBrokenModule = absl::InternalError("bad ABI 7");
const absl::StatusOr<cuda::CudaProbe> kNoDevice = cuda::CudaProbe{0, "no driver", true};
const absl::StatusOr<cuda::CudaProbe> kOneH200 = cuda::CudaProbe{1, "NVIDIA H200", true};
// A module of an older build: it counts devices but makes no backend.
const absl::StatusOr<cuda::CudaProbe> kProbeOnlyModule = cuda::CudaProbe{1, "NVIDIA H200", false};

TEST(BackendFactoryTest, CpuIsTheCpuWhateverTheModuleSays) {
  for (const auto* probe : {&kNoModule, &kBrokenModule, &kNoDevice, &kOneH200}) {
    absl::StatusOr<DeviceChoice> choice = ChooseDevice("cpu", *probe);
    ASSERT_TRUE(choice.ok());
    EXPECT_EQ(choice->device, Device::kCpu);
  }
}

TEST(BackendFactoryTest, AutoFallsBackToTheCpuSayingWhy) {
  const std::vector<std::pair<const absl::StatusOr<cuda::CudaProbe>*, std::string>> cases = {
      {&kNoModule, "this build has no CUDA module"},
      {&kBrokenModule, "the CUDA module cannot be loaded: bad ABI 7"},
      {&kNoDevice, "no CUDA device (no driver)"},
  };
  for (const auto& [probe, why] : cases) {
    absl::StatusOr<DeviceChoice> choice = ChooseDevice("auto", *probe);
    ASSERT_TRUE(choice.ok());
    EXPECT_EQ(choice->device, Device::kCpu) << why;
    EXPECT_THAT(choice->reason, HasSubstr(why));
    EXPECT_THAT(choice->reason, HasSubstr("serving on the CPU"));
  }
  // A device, but a module without a backend.
  absl::StatusOr<DeviceChoice> choice = ChooseDevice("auto", kProbeOnlyModule);
  ASSERT_TRUE(choice.ok());
  EXPECT_EQ(choice->device, Device::kCpu);
  EXPECT_THAT(choice->reason,
              HasSubstr("1 CUDA device(s) (NVIDIA H200), but the CUDA module has no backend"));
}

TEST(BackendFactoryTest, AutoAndCudaTakeTheGpuWhenEverythingIsThere) {
  for (const char* flag : {"auto", "cuda"}) {
    absl::StatusOr<DeviceChoice> choice = ChooseDevice(flag, kOneH200);
    ASSERT_TRUE(choice.ok()) << flag;
    EXPECT_EQ(choice->device, Device::kCuda) << flag;
    EXPECT_THAT(choice->reason, HasSubstr("NVIDIA H200"));
  }
}

TEST(BackendFactoryTest, CudaWhereItCannotBeHadIsAnErrorSayingWhy) {
  for (const auto* probe : {&kNoModule, &kBrokenModule, &kNoDevice, &kProbeOnlyModule}) {
    absl::StatusOr<DeviceChoice> choice = ChooseDevice("cuda", *probe);
    EXPECT_TRUE(absl::IsFailedPrecondition(choice.status())) << choice.status();
    EXPECT_THAT(choice.status().message(), HasSubstr("--device=cuda: "));
  }
  EXPECT_TRUE(absl::IsInvalidArgument(ChooseDevice("gpu", kOneH200).status()));
}

TEST(BackendFactoryTest, TheFactoryMakesCpuBackendsAndRefusesWhatIsNotBuilt) {
  auto pool = std::make_shared<cpu::ComputePool>(1, std::vector<int>{}, false);
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend({Device::kCpu, pool, LanePriority::kLatency, cpu::MatMulMode::kF32});
  ASSERT_TRUE(backend.ok()) << backend.status();
  EXPECT_THAT((*backend)->name(), HasSubstr("cpu"));
  EXPECT_FALSE(
      CreateBackend({Device::kCpu, nullptr, LanePriority::kLatency, cpu::MatMulMode::kF32}).ok());
  // No CUDA module was loaded in this process: asking for a CUDA backend is
  // an error, never a CPU backend.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      CreateBackend({Device::kCuda, pool, LanePriority::kLatency, cpu::MatMulMode::kF32})
          .status()));
}

}  // namespace
}  // namespace tandem::kernels
