// Small host arrays (token ids, positions, KV slots, block tables) on their
// way to the device for one operation, without a synchronous copy each.
//
// Each Upload() copies the array into pinned host memory at the next free
// offset and queues an asynchronous copy to the same offset of a device
// buffer on the stream; the device pointer is valid for kernels queued after
// it. Offsets are reused only after the stream was synchronised (Reset(),
// which the backend calls after every wait; or a full arena, which waits and
// grows), so a queued copy never reads host memory that was overwritten. An
// array equal to the last one uploaded under the same `kind` since the last
// reset is not copied again (the positions and block tables of a step are
// the same for every layer).
//
// Recorded steps (CUDA graphs): a recording holds the copies with their
// addresses. Replaying it, the backend runs the step's uploads in
// staging-only mode, which writes the host side at the same offsets (the same
// uploads in the same order give the same offsets) and queues nothing: the
// recording's copies move them. A grown arena has new addresses, so its
// generation() changes and recordings made before are void.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_UPLOAD_ARENA_H_
#define TANDEM_ENGINE_KERNELS_CUDA_UPLOAD_ARENA_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

class UploadArena {
 public:
  enum class Kind : uint8_t {
    kIds,
    kPositions,
    kSlots,
    kAttentionRows,
    kGatherRows,
    kScatterRows,
    kScatterWeights,
    kDraws,
    kTokens,
    kCount
  };

  UploadArena() = default;
  ~UploadArena();
  UploadArena(const UploadArena&) = delete;
  UploadArena& operator=(const UploadArena&) = delete;

  // Allocates `bytes` of pinned host memory and as much device memory.
  absl::Status Init(size_t bytes, cudaStream_t stream);
  // Queues later copies on `stream`, which the caller has made wait for the
  // old one (so a wait for it is a wait for every copy queued before).
  void set_stream(cudaStream_t stream) { stream_ = stream; }

  // The device copy of `values` (see above).
  const int32_t* Upload(Kind kind, std::span<const int32_t> values);
  // Two uploads whose device copies are both valid afterwards (a growth
  // between two plain Upload() calls would free the first one's copy).
  std::pair<const int32_t*, const int32_t*> UploadPair(Kind kind_a, std::span<const int32_t> a,
                                                       Kind kind_b, std::span<const int32_t> b);
  bool empty() const { return used_ == 0; }
  // Changes at every Reset(): device copies from an earlier epoch may be
  // overwritten.
  int64_t epoch() const { return epoch_; }

  // The stream was synchronised: every queued copy is done.
  void Reset();

  // Staging only: Upload() writes the host side and queues no copy.
  void set_staging_only(bool staging_only) { staging_only_ = staging_only; }
  // Whether Upload() may wait and reallocate (not while a stream records).
  void set_may_grow(bool may_grow) { may_grow_ = may_grow; }
  // Changes whenever the buffers move.
  int64_t generation() const { return generation_; }

 private:
  struct Last {
    size_t offset = 0;
    size_t bytes = 0;
    bool valid = false;
  };
  // Waits for the stream, then reallocates (twice what the epoch needed).
  void Grow(size_t bytes);
  // Whether `values` equals the last upload of `kind` (no copy needed).
  bool Hits(Kind kind, std::span<const int32_t> values) const;

  cudaStream_t stream_ = nullptr;
  uint8_t* host_ = nullptr;
  uint8_t* device_ = nullptr;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t epoch_bytes_ = 0;  // uploaded since the last Reset(), across growth
  int64_t epoch_ = 0;
  int64_t generation_ = 0;
  bool staging_only_ = false;
  bool may_grow_ = true;
  Last last_[static_cast<size_t>(Kind::kCount)];
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_UPLOAD_ARENA_H_
