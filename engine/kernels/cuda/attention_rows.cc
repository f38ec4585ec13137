#include "engine/kernels/cuda/attention_rows.h"

#include <algorithm>

namespace tandem::kernels::cuda {

AttentionRows PackAttentionRows(std::span<const AttentionSpan> spans, int64_t rows,
                                size_t min_words, int32_t tile_rows) {
  AttentionRows packed;
  size_t table_words = 0;
  for (const AttentionSpan& span : spans) table_words += span.block_table.size();
  packed.words.assign(static_cast<size_t>(2 * rows) + table_words, 0);
  std::vector<int32_t> tiles;
  size_t next_table = static_cast<size_t>(2 * rows);
  for (const AttentionSpan& span : spans) {
    const auto table_start = static_cast<int32_t>(next_table);
    std::copy(span.block_table.begin(), span.block_table.end(),
              packed.words.begin() + static_cast<std::ptrdiff_t>(next_table));
    next_table += span.block_table.size();
    const bool tiled = tile_rows > 0 && span.rows >= kMinTiledRows;
    for (int32_t i = 0; i < span.rows; ++i) {
      const int64_t row = int64_t{span.first_row} + i;
      const int32_t keys = span.first_position + i + 1;
      packed.words[static_cast<size_t>(row)] = table_start;
      packed.words[static_cast<size_t>(rows + row)] = tiled ? -keys : keys;
      if (!tiled) {
        packed.max_keys = std::max(packed.max_keys, keys);
        ++packed.untiled_rows;
      }
    }
    for (int32_t first = 0; tiled && first < span.rows; first += tile_rows) {
      tiles.insert(tiles.end(), {span.first_row + first, std::min(tile_rows, span.rows - first),
                                 span.first_position + first, table_start});
    }
  }
  packed.tile_offset = static_cast<int32_t>(packed.words.size());
  packed.tiles = static_cast<int32_t>(tiles.size() / 4);
  packed.words.insert(packed.words.end(), tiles.begin(), tiles.end());
  if (packed.words.size() < min_words) packed.words.resize(min_words, 0);
  return packed;
}

int ChooseKeySplits(int64_t rows, int heads, int32_t max_keys, int target_blocks,
                    int min_keys_per_split) {
  const int64_t blocks = rows * heads;
  if (blocks >= target_blocks || max_keys <= min_keys_per_split) return 1;
  const int64_t by_device = (target_blocks + blocks - 1) / blocks;
  const int64_t by_keys = (max_keys + min_keys_per_split - 1) / min_keys_per_split;
  return static_cast<int>(std::clamp<int64_t>(std::min(by_device, by_keys), 1, 64));
}

}  // namespace tandem::kernels::cuda
