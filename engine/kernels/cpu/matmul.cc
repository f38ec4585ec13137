#include "engine/kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {
namespace {

// Weight rows handled by one task. Small enough that a task's weight rows stay
// in L1 while they meet every activation row; the task count stays high enough
// for load balance on the narrow K/V projections.
constexpr int64_t kRowsPerTask = 16;
// Activation rows that share one unpacking of a weight block.
constexpr int kTileRows = 4;

inline float RoundThroughHalf(float x) { return HalfToFloat(FloatToHalf(x)); }

#ifdef TANDEM_CPU_AVX2

// 32 signed weight bytes times 32 signed activation bytes, pairwise summed
// into 8 int32 lanes (lane l covers elements 4l..4l+3). Exact.
inline __m256i DotI8(__m256i w, __m256i a) {
  const __m256i products = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
  return _mm256_madd_epi16(products, _mm256_set1_epi16(1));
}

// The same for unsigned weight bytes (0..15).
inline __m256i DotU8I8(__m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1));
}

// 16 bytes of packed nibbles -> 32 bytes: low nibbles (elements 0..15), then
// high nibbles (elements 16..31).
inline __m256i UnpackNibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(packed, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

inline __m256i LoadActivation(const ActivationBlock& a) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q));
}

template <int R>
void DotTileQ8_0(const BlockQ8_0* w, const ActivationBlock* const* act, int64_t blocks,
                 float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i wq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    const float dw = HalfToFloat(w[b].d);
    for (int r = 0; r < R; ++r) {
      const ActivationBlock& a = act[r][b];
      const __m256 p = _mm256_cvtepi32_ps(DotI8(wq, LoadActivation(a)));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), p, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

template <int R>
void DotTileQ4_0(const BlockQ4_0* w, const ActivationBlock* const* act, int64_t blocks,
                 float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i wq = _mm256_sub_epi8(UnpackNibbles(w[b].qs), eight);
    const float dw = HalfToFloat(w[b].d);
    for (int r = 0; r < R; ++r) {
      const ActivationBlock& a = act[r][b];
      const __m256 p = _mm256_cvtepi32_ps(DotI8(wq, LoadActivation(a)));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), p, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]);
}

template <int R>
void DotTileQ4_1(const BlockQ4_1* w, const ActivationBlock* const* act, int64_t blocks,
                 float* out) {
  __m256 acc[R];
  float mins[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    mins[r] = 0.0f;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const __m256i wq = UnpackNibbles(w[b].qs);
    const float dw = HalfToFloat(w[b].d);
    const float mw = HalfToFloat(w[b].m);
    for (int r = 0; r < R; ++r) {
      const ActivationBlock& a = act[r][b];
      const __m256 p = _mm256_cvtepi32_ps(DotU8I8(wq, LoadActivation(a)));
      acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), p, acc[r]);
      mins[r] += mw * a.s;
    }
  }
  for (int r = 0; r < R; ++r) out[r] = HorizontalSum(acc[r]) + mins[r];
}

#else  // portable versions: exact integer block sums, float accumulation in block order

template <int R>
void DotTileQ8_0(const BlockQ8_0* w, const ActivationBlock* const* act, int64_t blocks,
                 float* out) {
  for (int r = 0; r < R; ++r) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) sum += w[b].qs[j] * act[r][b].q[j];
      acc += HalfToFloat(w[b].d) * act[r][b].d * static_cast<float>(sum);
    }
    out[r] = acc;
  }
}

template <int R>
void DotTileQ4_0(const BlockQ4_0* w, const ActivationBlock* const* act, int64_t blocks,
                 float* out) {
  for (int r = 0; r < R; ++r) {
    float acc = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t sum = 0;
      for (int j = 0; j < 16; ++j) {
        sum += ((w[b].qs[j] & 0x0f) - 8) * act[r][b].q[j];
        sum += ((w[b].qs[j] >> 4) - 8) * act[r][b].q[j + 16];
      }
      acc += HalfToFloat(w[b].d) * act[r][b].d * static_cast<float>(sum);
    }
    out[r] = acc;
  }
}

template <int R>
void DotTileQ4_1(const BlockQ4_1* w, const ActivationBlock* const* act, int64_t blocks,
                 float* out) {
  for (int r = 0; r < R; ++r) {
    float acc = 0.0f;
    float mins = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t sum = 0;
      for (int j = 0; j < 16; ++j) {
        sum += (w[b].qs[j] & 0x0f) * act[r][b].q[j];
        sum += (w[b].qs[j] >> 4) * act[r][b].q[j + 16];
      }
      acc += HalfToFloat(w[b].d) * act[r][b].d * static_cast<float>(sum);
      mins += HalfToFloat(w[b].m) * act[r][b].s;
    }
    out[r] = acc + mins;
  }
}

#endif  // TANDEM_CPU_AVX2

template <int R>
void DotTile(DType dtype, const void* w, const ActivationBlock* const* act, int64_t blocks,
             float* out) {
  switch (dtype) {
    case DType::kQ8_0:
      return DotTileQ8_0<R>(static_cast<const BlockQ8_0*>(w), act, blocks, out);
    case DType::kQ4_0:
      return DotTileQ4_0<R>(static_cast<const BlockQ4_0*>(w), act, blocks, out);
    case DType::kQ4_1:
      return DotTileQ4_1<R>(static_cast<const BlockQ4_1*>(w), act, blocks, out);
    default:
      return;
  }
}

// One task of the integer path: weight rows [n0, n1) against every row.
void QuantizedTask(const Weight& weight, const ActivationBlock* activations, int64_t rows,
                   int64_t n0, int64_t n1, const float* bias, const Matrix& out) {
  const int64_t blocks = weight.cols / 32;
  const size_t row_bytes = RowBytes(weight.dtype, weight.cols);
  const auto* base = static_cast<const uint8_t*>(weight.data);
  for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const int tile = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
    const ActivationBlock* act[kTileRows];
    for (int r = 0; r < tile; ++r) act[r] = activations + (r0 + r) * blocks;
    for (int64_t n = n0; n < n1; ++n) {
      const void* w = base + n * row_bytes;
      float dots[kTileRows];
      if (tile == kTileRows) {
        DotTile<kTileRows>(weight.dtype, w, act, blocks, dots);
      } else {
        for (int r = 0; r < tile; ++r) DotTile<1>(weight.dtype, w, &act[r], blocks, &dots[r]);
      }
      for (int r = 0; r < tile; ++r) {
        out.Row(r0 + r)[n] = bias != nullptr ? dots[r] + bias[n] : dots[r];
      }
    }
  }
}

// One task of the float path: dequantize weight rows [n0, n1), then multiply.
void FloatTask(const Weight& weight, const Matrix& x, int64_t n0, int64_t n1, const float* bias,
               std::vector<float>& scratch, const Matrix& out) {
  const int64_t k = weight.cols;
  const float* rows_f32;
  if (weight.dtype == DType::kF32) {
    rows_f32 = static_cast<const float*>(weight.data) + n0 * k;
  } else {
    scratch.resize(static_cast<size_t>((n1 - n0) * k));
    const size_t row_bytes = RowBytes(weight.dtype, k);
    const auto* base = static_cast<const uint8_t*>(weight.data);
    for (int64_t n = n0; n < n1; ++n) {
      DequantizeRow(weight.dtype, base + n * row_bytes, k, scratch.data() + (n - n0) * k);
    }
    rows_f32 = scratch.data();
  }
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xr = x.Row(r);
    float* o = out.Row(r);
    for (int64_t n = n0; n < n1; ++n) {
      const float dot = DotF32(xr, rows_f32 + (n - n0) * k, k);
      o[n] = bias != nullptr ? dot + bias[n] : dot;
    }
  }
}

}  // namespace

bool UsesQuantizedActivations(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1;
}

void QuantizeActivationRow(const float* x, int64_t elements, ActivationBlock* out) {
  for (int64_t b = 0; b < elements / 32; ++b) {
    const float* v = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float d = amax / 127.0f;
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(v[j] * inverse));
      out[b].q[j] = static_cast<int8_t>(q);
      sum += q;
    }
    out[b].d = d;
    out[b].s = d * static_cast<float>(sum);
  }
}

float DotQuantizedRow(DType dtype, const void* weight_row, const ActivationBlock* act,
                      int64_t blocks) {
  float out = 0.0f;
  DotTile<1>(dtype, weight_row, &act, blocks, &out);
  return out;
}

void MatMul(ThreadPool& pool, MatMulScratch& scratch, const Matrix& x,
            std::span<const Weight* const> weights, std::span<const Weight* const> biases,
            std::span<const Matrix> outs) {
  const int64_t rows = x.rows;
  const int64_t k = x.cols;
  bool any_quantized = false;
  for (const Weight* w : weights) any_quantized |= UsesQuantizedActivations(w->dtype);
  if (any_quantized) {
    const int64_t blocks = k / 32;
    scratch.activations.resize(static_cast<size_t>(rows * blocks));
    pool.ParallelFor(rows, [&](int64_t r, int) {
      QuantizeActivationRow(x.Row(r), k, scratch.activations.data() + r * blocks);
    });
  }
  scratch.dequantized.resize(static_cast<size_t>(pool.size()));

  // Tasks: (weight, chunk of kRowsPerTask output features), numbered densely.
  std::vector<int64_t> first_task(weights.size() + 1, 0);
  for (size_t w = 0; w < weights.size(); ++w) {
    first_task[w + 1] = first_task[w] + (weights[w]->rows + kRowsPerTask - 1) / kRowsPerTask;
  }
  pool.ParallelFor(first_task.back(), [&](int64_t task, int thread) {
    size_t w = 0;
    while (task >= first_task[w + 1]) ++w;
    const Weight& weight = *weights[w];
    const int64_t n0 = (task - first_task[w]) * kRowsPerTask;
    const int64_t n1 = std::min(weight.rows, n0 + kRowsPerTask);
    const float* bias =
        w < biases.size() && biases[w] != nullptr ? static_cast<const float*>(biases[w]->data)
                                                  : nullptr;
    if (UsesQuantizedActivations(weight.dtype)) {
      QuantizedTask(weight, scratch.activations.data(), rows, n0, n1, bias, outs[w]);
    } else {
      FloatTask(weight, x, n0, n1, bias, scratch.dequantized[static_cast<size_t>(thread)],
                outs[w]);
    }
  });
}

}  // namespace tandem::kernels::cpu
