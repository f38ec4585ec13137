#include "engine/kernels/cpu/to_bf16.h"

#include <algorithm>
#include <thread>
#include <vector>

#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {

void DequantizeToBf16(DType type, const void* src, int64_t rows, int64_t cols, uint16_t* dst,
                      int threads) {
  const size_t row_bytes = RowBytes(type, cols);
  const auto* base = static_cast<const uint8_t*>(src);
  auto convert = [&](int64_t first, int64_t end) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = first; r < end; ++r) {
      DequantizeRow(type, base + static_cast<size_t>(r) * row_bytes, cols, row.data());
      uint16_t* out = dst + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = FloatToBf16(row[static_cast<size_t>(c)]);
    }
  };
  // Below a few million elements a thread costs more than it saves.
  const int64_t useful = std::max<int64_t>(1, rows * cols / (int64_t{1} << 22));
  const int64_t n = std::clamp<int64_t>(std::min<int64_t>(threads, useful), 1, rows);
  if (n <= 1) {
    convert(0, rows);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    workers.emplace_back(convert, rows * t / n, rows * (t + 1) / n);
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace tandem::kernels::cpu
