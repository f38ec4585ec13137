#include "engine/kernels/cuda/cuda_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "common/strings.h"
#include "engine/kernels/cuda/cuda_module.h"

namespace tandem::kernels::cuda {
namespace {

using CreateBackendFn = int (*)(int, int, int, Backend**, char*, size_t);

// The loaded module's backend entry point (null: none loaded).
std::atomic<CreateBackendFn> loaded_create_backend{nullptr};

}  // namespace

std::string DefaultCudaModulePath() {
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "libtandem_cuda.so";
  return (exe.parent_path().parent_path() / "lib" / "libtandem_cuda.so").string();
}

absl::StatusOr<CudaProbe> ProbeCudaModule(const std::string& module_path) {
  if (::access(module_path.c_str(), F_OK) != 0) {
    return absl::NotFoundError(StrCat("no CUDA module at ", module_path));
  }
  // Without the driver's library there is no device to find, and the module
  // (which maps the CUDA runtime and cuBLAS: ~60 MB of their code stays
  // resident once loaded, and loaded it stays) is not worth loading. The
  // driver library, when present, stays loaded for the module.
  if (::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL) == nullptr) {
    CudaProbe none;
    none.description = "no CUDA device: no NVIDIA driver here (libcuda.so.1 cannot be loaded)";
    return none;
  }
  void* handle = ::dlopen(module_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::FailedPreconditionError(StrCat("cannot load ", module_path, ": ", ::dlerror()));
  }
  auto abi = reinterpret_cast<int (*)()>(::dlsym(handle, "tandem_cuda_module_abi"));
  auto probe = reinterpret_cast<int (*)(char*, size_t)>(::dlsym(handle, "tandem_cuda_probe"));
  if (abi == nullptr || probe == nullptr || abi() != kTandemCudaModuleAbi) {
    ::dlclose(handle);
    return absl::FailedPreconditionError(
        StrCat(module_path, " is not a compatible Tandem CUDA module"));
  }
  char message[1024] = {};
  CudaProbe result;
  result.devices = probe(message, sizeof(message));
  result.description = message;
  auto create = reinterpret_cast<CreateBackendFn>(::dlsym(handle, "tandem_cuda_create_backend"));
  result.has_backend = create != nullptr;
  if (create != nullptr) loaded_create_backend.store(create);
  return result;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(LanePriority lane, int decode_sms) {
  const CreateBackendFn create = loaded_create_backend.load();
  if (create == nullptr) {
    return absl::FailedPreconditionError("no CUDA module with a backend was loaded");
  }
  Backend* backend = nullptr;
  char error[1024] = {};
  if (create(0, lane == LanePriority::kLatency ? 0 : 1, decode_sms, &backend, error,
             sizeof(error)) != 0) {
    return absl::FailedPreconditionError(StrCat("CUDA backend: ", error));
  }
  return std::unique_ptr<Backend>(backend);
}

}  // namespace tandem::kernels::cuda
