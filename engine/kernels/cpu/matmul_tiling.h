// The loop nests shared by the matrix-product kernels.
#ifndef TANDEM_ENGINE_KERNELS_CPU_MATMUL_TILING_H_
#define TANDEM_ENGINE_KERNELS_CPU_MATMUL_TILING_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "common/check.h"
#include "engine/kernels/backend.h"

namespace tandem::kernels::cpu {

// Calls fn(std::integral_constant<int, i>{}) for i in [kBegin, kEnd), in
// order: a kernel's loop over a block's vectors unrolled, so shifts and
// lanes are constants.
template <int kBegin, int kEnd, typename Fn>
inline void Unroll(Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (fn(std::integral_constant<int, kBegin + I>{}), ...);
  }
  (std::make_integer_sequence<int, kEnd - kBegin>{});
}

// Activation rows that share one decoding of a weight block, at most.
inline constexpr int kTileRows = 8;
// Weight rows per panel: a panel stays in L1 while every activation tile
// passes over it.
inline constexpr int64_t kPanelRows = 16;

// Calls dot.template operator()<R>(args...) for the runtime tile size r in
// 1..kTileRows.
template <typename Dot>
inline void DispatchTile(int r, Dot& dot, int64_t first_row, int64_t n, float* dots) {
  switch (r) {
    case 1:
      return dot.template operator()<1>(first_row, n, dots);
    case 2:
      return dot.template operator()<2>(first_row, n, dots);
    case 3:
      return dot.template operator()<3>(first_row, n, dots);
    case 4:
      return dot.template operator()<4>(first_row, n, dots);
    case 5:
      return dot.template operator()<5>(first_row, n, dots);
    case 6:
      return dot.template operator()<6>(first_row, n, dots);
    case 7:
      return dot.template operator()<7>(first_row, n, dots);
    default:
      return dot.template operator()<8>(first_row, n, dots);
  }
}

// Calls fn(std::integral_constant<int, value>{}) for value in 1..kMax: a
// runtime tile size turned into a template argument.
template <int kMax, typename Fn>
inline void WithConstant(int value, Fn&& fn) {
  [&]<int... I>(std::integer_sequence<int, I...>) {
    (void)((value == I + 1 ? (fn(std::integral_constant<int, I + 1>{}), true) : false) || ...);
  }
  (std::make_integer_sequence<int, kMax>{});
}

// The loop nest of the kernels that decode the weights inside the product
// (few activation rows, packed panels): for each run of P panels in the
// weight rows [n0, n1) (multiples of kPanelRows) and each tile of up to
// kTileRows activation rows from row0, calls tile(R, P, n, row0), R and P
// as std::integral_constant. P is 4 for one or two rows (enough independent
// chains to hide the products' latency) and 2 for more (the tile's sums
// fill the registers); so no tile of more than two rows takes more than two
// panels, and those are not instantiated.
template <typename Tile>
void ForEachOnTheFlyTile(int64_t rows, int64_t n0, int64_t n1, Tile&& tile) {
  const int64_t max_panels = rows <= 2 ? 4 : 2;
  for (int64_t n = n0; n < n1;) {
    const int panels = static_cast<int>(std::min(max_panels, (n1 - n) / kPanelRows));
    for (int64_t row0 = 0; row0 < rows; row0 += kTileRows) {
      const int tile_rows = static_cast<int>(std::min<int64_t>(kTileRows, rows - row0));
      WithConstant<kTileRows>(tile_rows, [&](auto r) {
        WithConstant<4>(panels, [&](auto p) {
          if constexpr (r() <= 2 || p() <= 2) {
            tile(r, p, n, row0);
          } else {
            TANDEM_CHECK(false, "no tile of more than two rows takes more than two panels");
          }
        });
      });
    }
    n += panels * kPanelRows;
  }
}

// Computes out[r][n] (+ bias[n]) for every activation row r < rows and weight
// row n in [n0, n1). `dot.template operator()<R>(first_row, n, dots)` fills
// dots[0..R) with the products of activation rows first_row.. and weight row
// n; it is called with R = kTileRows for full tiles and R = the remainder for
// the last tile, so a few rows (a decode step verifying drafted tokens) cost
// one decoding of each weight block, not one per row. Batch invariance
// requires every R to give each row the same result (the kernels do: each
// row has its own accumulators and the same instruction sequence).
template <typename Dot>
void ForEachTile(int64_t rows, int64_t n0, int64_t n1, const float* bias, const Matrix& out,
                 Dot&& dot) {
  static_assert(kTileRows == 8, "DispatchTile covers tiles of 1..8 rows");
  for (int64_t p0 = n0; p0 < n1; p0 += kPanelRows) {
    const int64_t p1 = std::min(n1, p0 + kPanelRows);
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int tile = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
      for (int64_t n = p0; n < p1; ++n) {
        float dots[kTileRows];
        DispatchTile(tile, dot, r0, n, dots);
        for (int r = 0; r < tile; ++r) {
          out.Row(r0 + r)[n] = bias != nullptr ? dots[r] + bias[n] : dots[r];
        }
      }
    }
  }
}

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_MATMUL_TILING_H_
