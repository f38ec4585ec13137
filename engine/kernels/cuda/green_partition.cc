#include "engine/kernels/cuda/green_partition.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <string>

#include "common/strings.h"

namespace tandem::kernels::cuda {

struct GreenPartition::Driver {
  PFN_cuDeviceGet_v2000 device_get = nullptr;
  PFN_cuGetErrorString_v6000 error_string = nullptr;
  PFN_cuDeviceGetDevResource_v12040 get_resource = nullptr;
  PFN_cuDevSmResourceSplitByCount_v12040 split = nullptr;
  PFN_cuDevResourceGenerateDesc_v12040 describe = nullptr;
  PFN_cuGreenCtxCreate_v12040 create = nullptr;
  PFN_cuGreenCtxDestroy_v12040 destroy = nullptr;
  PFN_cuGreenCtxStreamCreate_v12050 stream_create = nullptr;
  PFN_cuStreamDestroy_v4000 stream_destroy = nullptr;
  PFN_cuGreenCtxRecordEvent_v12040 record_event = nullptr;

  std::string Error(const char* call, CUresult result) const {
    const char* text = nullptr;
    if (error_string != nullptr) error_string(result, &text);
    return StrCat(call, ": ", text != nullptr ? text : "CUDA driver error ",
                  text != nullptr ? "" : std::to_string(static_cast<int>(result)));
  }
};

namespace {

// The driver's entry point `name` as of CUDA `version` (e.g. 12040).
template <typename Fn>
absl::Status Lookup(const char* name, unsigned int version, Fn* fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t error =
      cudaGetDriverEntryPointByVersion(name, &address, version, cudaEnableDefault, &found);
  if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    cudaGetLastError();  // not sticky; clear it
    return absl::UnimplementedError(StrCat("the CUDA driver has no ", name, " (CUDA ",
                                           version / 1000, ".", version % 1000 / 10, "+)"));
  }
  *fn = reinterpret_cast<Fn>(address);
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const GreenPartition::Driver>> LoadDriver() {
  auto driver = std::make_shared<GreenPartition::Driver>();
  for (absl::Status s : {
           Lookup("cuDeviceGet", 2000, &driver->device_get),
           Lookup("cuGetErrorString", 6000, &driver->error_string),
           Lookup("cuDeviceGetDevResource", 12040, &driver->get_resource),
           Lookup("cuDevSmResourceSplitByCount", 12040, &driver->split),
           Lookup("cuDevResourceGenerateDesc", 12040, &driver->describe),
           Lookup("cuGreenCtxCreate", 12040, &driver->create),
           Lookup("cuGreenCtxDestroy", 12040, &driver->destroy),
           Lookup("cuGreenCtxStreamCreate", 12050, &driver->stream_create),
           Lookup("cuStreamDestroy", 4000, &driver->stream_destroy),
           Lookup("cuGreenCtxRecordEvent", 12040, &driver->record_event),
       }) {
    if (!s.ok()) return s;
  }
  return driver;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GreenPartition>> GreenPartition::Create(int device, int reserved_sms,
                                                                       int priority) {
  absl::StatusOr<std::shared_ptr<const Driver>> loaded = LoadDriver();
  if (!loaded.ok()) return loaded.status();
  const Driver& d = **loaded;
  CUdevice dev = 0;
  if (CUresult r = d.device_get(&dev, device); r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(d.Error("cuDeviceGet", r));
  }
  CUdevResource all{};
  if (CUresult r = d.get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM); r != CUDA_SUCCESS) {
    return absl::UnimplementedError(d.Error("cuDeviceGetDevResource", r));
  }
  const int total = static_cast<int>(all.sm.smCount);
  const int alignment = std::max(1, static_cast<int>(all.sm.smCoscheduledAlignment));
  const int minimum = std::max(1, static_cast<int>(all.sm.minSmPartitionSize));
  // The prefill partition: what is left after the reserve, rounded down to
  // the alignment (the split rounds a count up, which would eat into it).
  const int wanted = (total - reserved_sms) / alignment * alignment;
  if (reserved_sms <= 0 || wanted < minimum) {
    return absl::FailedPreconditionError(StrCat("cannot leave ", reserved_sms, " of ", total,
                                                " SMs out of a partition (at least ", minimum,
                                                " SMs, in multiples of ", alignment, ")"));
  }
  CUdevResource group{};
  CUdevResource rest{};
  unsigned int groups = 1;
  if (CUresult r = d.split(&group, &groups, &all, &rest, 0, static_cast<unsigned int>(wanted));
      r != CUDA_SUCCESS || groups != 1 || group.sm.smCount >= all.sm.smCount) {
    return absl::FailedPreconditionError(
        r != CUDA_SUCCESS ? d.Error("cuDevSmResourceSplitByCount", r)
                          : StrCat("splitting ", wanted, " of ", total, " SMs gave ", groups,
                                   " group(s) of ", group.sm.smCount));
  }
  CUdevResourceDesc desc = nullptr;
  if (CUresult r = d.describe(&desc, &group, 1); r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(d.Error("cuDevResourceGenerateDesc", r));
  }
  std::unique_ptr<GreenPartition> partition(new GreenPartition());
  partition->driver_ = *loaded;
  partition->device_sms_ = total;
  partition->sms_ = static_cast<int>(group.sm.smCount);
  CUgreenCtx context = nullptr;
  if (CUresult r = d.create(&context, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM); r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(d.Error("cuGreenCtxCreate", r));
  }
  partition->context_ = context;
  CUstream stream = nullptr;
  if (CUresult r = d.stream_create(&stream, context, CU_STREAM_NON_BLOCKING, priority);
      r != CUDA_SUCCESS) {
    return absl::FailedPreconditionError(d.Error("cuGreenCtxStreamCreate", r));
  }
  // The runtime's stream handle is the driver's.
  partition->stream_ = reinterpret_cast<cudaStream_t>(stream);
  return partition;
}

absl::Status GreenPartition::RecordEvent(cudaEvent_t event) const {
  // The partition issues into one stream only, so what the green context
  // has been given is what that stream has.
  if (CUresult r = driver_->record_event(static_cast<CUgreenCtx>(context_),
                                         reinterpret_cast<CUevent>(event));
      r != CUDA_SUCCESS) {
    return absl::InternalError(driver_->Error("cuGreenCtxRecordEvent", r));
  }
  return absl::OkStatus();
}

GreenPartition::~GreenPartition() {
  if (driver_ == nullptr) return;
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    driver_->stream_destroy(reinterpret_cast<CUstream>(stream_));
  }
  if (context_ != nullptr) driver_->destroy(static_cast<CUgreenCtx>(context_));
}

}  // namespace tandem::kernels::cuda
