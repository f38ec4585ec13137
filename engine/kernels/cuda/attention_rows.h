// The host side of the CUDA attention kernel's inputs: a ragged batch's
// spans (backend.h's AttentionSpan, block tables in host memory) flattened
// into one int32 array that is uploaded in one copy, and how many splits the
// keys of a step get. Plain C++, tested on machines without a GPU.
#ifndef TANDEM_ENGINE_KERNELS_CUDA_ATTENTION_ROWS_H_
#define TANDEM_ENGINE_KERNELS_CUDA_ATTENTION_ROWS_H_

#include <cstdint>
#include <span>
#include <vector>

#include "engine/kernels/backend.h"

namespace tandem::kernels::cuda {

// Layout, for a batch of `rows` query rows:
//   [0, rows)        for each row, the index in this array where its
//                    sequence's block table starts
//   [rows, 2 rows)   for each row, how many keys it attends (its position +
//                    1), negated for rows a query tile covers
//   [2 rows, ...)    the spans' block tables, one after another
//   [tile_offset, +4 tiles)  the query tiles, 4 words each: first row, row
//                    count, first row's position, table start
// Rows no span covers attend nothing (key count 0).
//
// Query tiles (the prefill kernel): with `tile_rows` > 0, every span of at
// least kMinTiledRows rows is cut into tiles of up to `tile_rows`
// consecutive rows, which the tiled kernel computes; the per-row kernel
// skips their rows (negative key count) and computes the rest.
//
// `min_words` pads the array with zeros to that length (a recorded step
// uploads the same number of words every time).
inline constexpr int32_t kMinTiledRows = 16;
struct AttentionRows {
  std::vector<int32_t> words;
  int32_t max_keys = 0;      // the largest key count of a row not in a tile
  int64_t untiled_rows = 0;  // rows the per-row kernel computes
  int32_t tiles = 0;         // query tiles
  int32_t tile_offset = 0;   // where the tiles start in `words`
};
AttentionRows PackAttentionRows(std::span<const AttentionSpan> spans, int64_t rows,
                                size_t min_words = 0, int32_t tile_rows = 0);

// Key splits per (row, head) so that a step has about `target_blocks` thread
// blocks, with at least `min_keys_per_split` keys in each split; 1 when the
// rows and heads alone fill the device. At most 64.
int ChooseKeySplits(int64_t rows, int heads, int32_t max_keys, int target_blocks,
                    int min_keys_per_split = 256);

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_ATTENTION_ROWS_H_
