// Which bytes move when KV blocks move between two paged KV storages (the
// layout of engine/kernels/backend.h's KvStorage): for each block pair, the
// block's slice of every layer's K and V pool. Runs of consecutive block
// ids on both sides become one descriptor per pool.
#ifndef TANDEM_KVTRANSFER_KV_PAGES_H_
#define TANDEM_KVTRANSFER_KV_PAGES_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

struct KvPageReads {
  std::vector<Descriptor> local;   // where the bytes land
  std::vector<Descriptor> remote;  // where they are read from
  uint64_t bytes = 0;              // in all
};

// Reads that copy remote block remote_blocks[i] into local block
// local_blocks[i], for every i. The two storages must agree in layers,
// block size, KV heads and head size (their block counts may differ);
// INVALID_ARGUMENT otherwise, or when a block id is out of range or the
// lists differ in length.
absl::StatusOr<KvPageReads> PlanKvPageReads(const kernels::KvCacheShape& local_shape,
                                            uint32_t local_region,
                                            std::span<const int32_t> local_blocks,
                                            const kernels::KvCacheShape& remote_shape,
                                            uint32_t remote_region,
                                            std::span<const int32_t> remote_blocks);

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_KV_PAGES_H_
