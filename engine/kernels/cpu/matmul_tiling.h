// The loop nest shared by the block-format matrix-product kernels.
#ifndef TANDEM_ENGINE_KERNELS_CPU_MATMUL_TILING_H_
#define TANDEM_ENGINE_KERNELS_CPU_MATMUL_TILING_H_

#include <algorithm>
#include <cstdint>

#include "engine/kernels/backend.h"

namespace tandem::kernels::cpu {

// Activation rows that share one decoding of a weight block.
inline constexpr int kTileRows = 4;
// Weight rows per panel: a panel stays in L1 while every activation tile
// passes over it.
inline constexpr int64_t kPanelRows = 16;

// Computes out[r][n] (+ bias[n]) for every activation row r < rows and weight
// row n in [n0, n1). `dot.template operator()<R>(first_row, n, dots)` fills
// dots[0..R) with the products of activation rows first_row.. and weight row
// n; it is called with R = kTileRows for full tiles and R = 1, row by row,
// for the rest. Batch invariance requires both to give each row the same
// result (the kernels do: every row gets the same instruction sequence).
template <typename Dot>
void ForEachTile(int64_t rows, int64_t n0, int64_t n1, const float* bias, const Matrix& out,
                 Dot&& dot) {
  for (int64_t p0 = n0; p0 < n1; p0 += kPanelRows) {
    const int64_t p1 = std::min(n1, p0 + kPanelRows);
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int tile = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
      for (int64_t n = p0; n < p1; ++n) {
        float dots[kTileRows];
        if (tile == kTileRows) {
          dot.template operator()<kTileRows>(r0, n, dots);
        } else {
          for (int r = 0; r < tile; ++r) dot.template operator()<1>(r0 + r, n, &dots[r]);
        }
        for (int r = 0; r < tile; ++r) {
          out.Row(r0 + r)[n] = bias != nullptr ? dots[r] + bias[n] : dots[r];
        }
      }
    }
  }
}

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_MATMUL_TILING_H_
