#include "kvtransfer/kv_pages.h"

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {

absl::StatusOr<KvPageReads> PlanKvPageReads(const kernels::KvCacheShape& local_shape,
                                            uint32_t local_region,
                                            std::span<const int32_t> local_blocks,
                                            const kernels::KvCacheShape& remote_shape,
                                            uint32_t remote_region,
                                            std::span<const int32_t> remote_blocks) {
  if (local_shape.layers != remote_shape.layers ||
      local_shape.block_size != remote_shape.block_size ||
      local_shape.kv_heads != remote_shape.kv_heads ||
      local_shape.head_dim != remote_shape.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV pages of different shapes: layers ", local_shape.layers, " vs ", remote_shape.layers,
        ", block size ", local_shape.block_size, " vs ", remote_shape.block_size, ", KV heads ",
        local_shape.kv_heads, " vs ", remote_shape.kv_heads, ", head size ", local_shape.head_dim,
        " vs ", remote_shape.head_dim));
  }
  if (local_blocks.size() != remote_blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(local_blocks.size(), " local blocks for ",
                                                   remote_blocks.size(), " remote ones"));
  }
  for (size_t i = 0; i < local_blocks.size(); ++i) {
    if (local_blocks[i] < 0 || local_blocks[i] >= local_shape.blocks || remote_blocks[i] < 0 ||
        remote_blocks[i] >= remote_shape.blocks) {
      return absl::InvalidArgumentError(absl::StrCat("block pair ", i, " (", local_blocks[i],
                                                     " <- ", remote_blocks[i], ") out of range"));
    }
  }
  // One pool's slice of one block: block_size slots of kv_heads x head_dim halves.
  const uint64_t block_bytes = uint64_t{2} * static_cast<uint64_t>(local_shape.block_size) *
                               static_cast<uint64_t>(local_shape.kv_heads) *
                               static_cast<uint64_t>(local_shape.head_dim);
  // Runs of consecutive ids on both sides, found once and used in every pool.
  struct Run {
    int32_t local = 0;
    int32_t remote = 0;
    int32_t blocks = 0;
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < local_blocks.size(); ++i) {
    if (!runs.empty() && runs.back().local + runs.back().blocks == local_blocks[i] &&
        runs.back().remote + runs.back().blocks == remote_blocks[i]) {
      ++runs.back().blocks;
    } else {
      runs.push_back({local_blocks[i], remote_blocks[i], 1});
    }
  }
  KvPageReads reads;
  const int pools = 2 * local_shape.layers;  // K and V of each layer
  reads.local.reserve(runs.size() * static_cast<size_t>(pools));
  reads.remote.reserve(runs.size() * static_cast<size_t>(pools));
  for (int pool = 0; pool < pools; ++pool) {
    const uint64_t local_pool = uint64_t(pool) * uint64_t(local_shape.blocks) * block_bytes;
    const uint64_t remote_pool = uint64_t(pool) * uint64_t(remote_shape.blocks) * block_bytes;
    for (const Run& run : runs) {
      const uint64_t bytes = uint64_t(run.blocks) * block_bytes;
      reads.local.push_back({local_region, local_pool + uint64_t(run.local) * block_bytes, bytes});
      reads.remote.push_back(
          {remote_region, remote_pool + uint64_t(run.remote) * block_bytes, bytes});
      reads.bytes += bytes;
    }
  }
  return reads;
}

}  // namespace tandem::kvtransfer
