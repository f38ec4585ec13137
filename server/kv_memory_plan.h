// Sizing the KV cache from the memory a device has free
// (--kv_cache_memory_fraction): what else that memory must hold, and how
// many blocks the fraction of the rest buys.
#ifndef TANDEM_SERVER_KV_MEMORY_PLAN_H_
#define TANDEM_SERVER_KV_MEMORY_PLAN_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"
#include "engine/model/gguf_file.h"

namespace tandem::server {

struct KvMemoryPlan {
  // Taken whatever the cache's size: the device copies of the model's and a
  // separate draft model's weights (rotary tables included),
  // --decode_kv_cache_bytes (the decode lane's own pages), and, when the
  // backend's memory is the host's, the host memory the daemon keeps
  // besides (--speculation_cache_bytes).
  int64_t fixed_bytes = 0;
  // The pages one block id takes: the model's, plus a separate draft
  // model's (it keeps as many blocks as the model, in its own shape).
  int64_t bytes_per_block = 0;
};

// `shape` is the model's KV shape (its block count unused); `draft` may be
// null; `host_bytes`: host memory the daemon takes beside the backend's.
// Errors are the model files' (a draft that is not a model).
absl::StatusOr<KvMemoryPlan> PlanKvMemory(const model::GgufFile& model,
                                          const kernels::KvCacheShape& shape,
                                          const model::GgufFile* draft,
                                          const kernels::Backend& backend,
                                          int64_t decode_kv_cache_bytes, int64_t host_bytes = 0);

// floor(fraction * max(0, free_bytes - fixed_bytes) / bytes_per_block).
// REQUIRES plan.bytes_per_block > 0.
int64_t KvBlocksFromFreeMemory(double fraction, int64_t free_bytes, const KvMemoryPlan& plan);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_KV_MEMORY_PLAN_H_
