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
  epoch_bytes_ = 0;
  ++epoch_;
  for (Last& last : last_) last.valid = false;
}

void UploadArena::Grow(size_t bytes) {
  if (!may_grow_) {
    CheckCuda(cudaErrorInvalidValue, "upload arena growth while a step is recorded or replayed");
  }
  // Every queued copy must finish before its memory goes. The new size holds
  // twice everything uploaded since the last wait, so once a step has run
  // whole, the same step fits from an empty arena (a recorded step never
  // needs to wait here).
  CheckCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (upload arena)");
  const size_t needed = AlignUp(std::max(2 * (epoch_bytes_ + bytes), 2 * capacity_));
  const size_t epoch = epoch_bytes_;
  Reset();
  epoch_bytes_ = epoch;
  cudaFreeHost(host_);
  cudaFree(device_);
  capacity_ = needed;
  CheckCuda(cudaMallocHost(reinterpret_cast<void**>(&host_), capacity_),
            "cudaMallocHost (upload arena)");
  CheckCuda(cudaMalloc(reinterpret_cast<void**>(&device_), capacity_), "cudaMalloc (upload arena)");
  ++generation_;
}

bool UploadArena::Hits(Kind kind, std::span<const int32_t> values) const {
  const Last& last = last_[static_cast<size_t>(kind)];
  const size_t bytes = values.size_bytes();
  return last.valid && last.bytes == bytes &&
         (bytes == 0 || std::memcmp(host_ + last.offset, values.data(), bytes) == 0);
}

const int32_t* UploadArena::Upload(Kind kind, std::span<const int32_t> values) {
  Last& last = last_[static_cast<size_t>(kind)];
  if (Hits(kind, values)) return reinterpret_cast<const int32_t*>(device_ + last.offset);
  const size_t bytes = values.size_bytes();
  if (used_ + AlignUp(bytes) > capacity_) Grow(AlignUp(bytes));
  const size_t offset = used_;
  used_ += AlignUp(bytes);
  epoch_bytes_ += AlignUp(bytes);
  if (bytes > 0) {
    std::memcpy(host_ + offset, values.data(), bytes);
    if (!staging_only_) {  // a replay's copies are the recording's
      CheckCuda(
          cudaMemcpyAsync(device_ + offset, host_ + offset, bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync (upload)");
    }
  }
  last = {offset, bytes, true};
  return reinterpret_cast<const int32_t*>(device_ + offset);
}

std::pair<const int32_t*, const int32_t*> UploadArena::UploadPair(Kind kind_a,
                                                                  std::span<const int32_t> a,
                                                                  Kind kind_b,
                                                                  std::span<const int32_t> b) {
  const size_t needed = (Hits(kind_a, a) ? 0 : AlignUp(a.size_bytes())) +
                        (Hits(kind_b, b) ? 0 : AlignUp(b.size_bytes()));
  // Growing forgets every earlier upload, so then both need room.
  if (used_ + needed > capacity_) Grow(AlignUp(a.size_bytes()) + AlignUp(b.size_bytes()));
  const int32_t* first = Upload(kind_a, a);
  return {first, Upload(kind_b, b)};
}

}  // namespace tandem::kernels::cuda
