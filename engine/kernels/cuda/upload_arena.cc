#include "engine/kernels/cuda/upload_arena.h"

#include <algorithm>
#include <cstring>

#include "common/strings.h"
#include "engine/kernels/cuda/cuda_check.h"

namespace tandem::kernels::cuda {
namespace {

constexpr size_t kAlignment = 256;  // cudaMalloc's; keeps every upload aligned

size_t AlignUp(size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

UploadArena::~UploadArena() {
  if (host_ != nullptr) cudaFreeHost(host_);
  if (device_ != nullptr) cudaFree(device_);
}

absl::Status UploadArena::Init(size_t bytes, cudaStream_t stream) {
  stream_ = stream;
  capacity_ = AlignUp(bytes);
  if (cudaMallocHost(reinterpret_cast<void**>(&host_), capacity_) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&device_), capacity_) != cudaSuccess) {
    return absl::ResourceExhaustedError(
        StrCat("cannot allocate ", capacity_, " bytes of upload staging"));
  }
  return absl::OkStatus();
}

void UploadArena::Reset() {
  used_ = 0;
  for (Last& last : last_) last.valid = false;
}

void UploadArena::Grow(size_t bytes) {
  if (!may_grow_) {
    CheckCuda(cudaErrorInvalidValue, "upload arena growth while a step is recorded");
  }
  // Every queued copy must finish before its memory goes. The arena grows
  // (rather than only starting over) so that, once warm, a whole step's
  // uploads fit: a recorded step never needs to wait here.
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (upload arena)");
  const size_t needed = AlignUp(std::max(used_ + bytes, 2 * capacity_));
  Reset();
  cudaFreeHost(host_);
  cudaFree(device_);
  capacity_ = needed;
  CheckCuda(cudaMallocHost(reinterpret_cast<void**>(&host_), capacity_),
            "cudaMallocHost (upload arena)");
  CheckCuda(cudaMalloc(reinterpret_cast<void**>(&device_), capacity_), "cudaMalloc (upload arena)");
  ++generation_;
}

const int32_t* UploadArena::Upload(Kind kind, std::span<const int32_t> values) {
  const size_t bytes = values.size_bytes();
  Last& last = last_[static_cast<size_t>(kind)];
  if (last.valid && last.bytes == bytes &&
      (bytes == 0 || std::memcmp(host_ + last.offset, values.data(), bytes) == 0)) {
    return reinterpret_cast<const int32_t*>(device_ + last.offset);
  }
  if (used_ + AlignUp(bytes) > capacity_) Grow(AlignUp(bytes));
  const size_t offset = used_;
  used_ += AlignUp(bytes);
  if (bytes > 0) {
    std::memcpy(host_ + offset, values.data(), bytes);
    CheckCuda(
        cudaMemcpyAsync(device_ + offset, host_ + offset, bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (upload)");
  }
  last = {offset, bytes, true};
  return reinterpret_cast<const int32_t*>(device_ + offset);
}

}  // namespace tandem::kernels::cuda
