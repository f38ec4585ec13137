#include "engine/kernels/backend_factory.h"

#include "common/strings.h"
#include "engine/kernels/cpu/cpu_backend.h"

namespace tandem::kernels {

std::string_view DeviceName(Device device) { return device == Device::kCpu ? "cpu" : "cuda"; }

absl::StatusOr<DeviceChoice> ChooseDevice(std::string_view flag,
                                          const absl::StatusOr<cuda::CudaProbe>& probe) {
  if (flag != "auto" && flag != "cpu" && flag != "cuda") {
    return absl::InvalidArgumentError(StrCat("--device='", flag, "': expected auto, cpu or cuda"));
  }
  if (flag == "cpu") return DeviceChoice{Device::kCpu, "--device=cpu"};
  // Why CUDA cannot be used, if it cannot.
  std::string missing;
  if (!probe.ok()) {
    missing = absl::IsNotFound(probe.status())
                  ? std::string("this build has no CUDA module")
                  : StrCat("the CUDA module cannot be loaded: ", probe.status().message());
  } else if (probe->devices == 0) {
    missing = StrCat("no CUDA device (", probe->description, ")");
  } else if (!probe->has_backend) {
    missing = StrCat(probe->devices, " CUDA device(s) (", probe->description,
                     "), but the CUDA module has no backend");
  }
  if (missing.empty()) {
    return DeviceChoice{Device::kCuda, StrCat("--device=", flag, ": ", probe->devices,
                                              " CUDA device(s) (", probe->description, ")")};
  }
  if (flag == "cuda") return absl::FailedPreconditionError(StrCat("--device=cuda: ", missing));
  return DeviceChoice{Device::kCpu, StrCat("--device=auto: ", missing, "; serving on the CPU")};
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const BackendSpec& spec) {
  if (spec.device == Device::kCuda) return cuda::CreateCudaBackend(spec.lane, spec.cuda_decode_sms);
  if (spec.pool == nullptr) return absl::InvalidArgumentError("a CPU backend needs a compute pool");
  return std::make_unique<cpu::CpuBackend>(spec.pool, spec.lane, spec.matmul);
}

}  // namespace tandem::kernels
