#include "engine/kernels/cpu/matmul_q8.h"

#include <algorithm>
#include <cmath>

#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {
namespace {

// Activation rows that share one unpacking of a weight block.
constexpr int kTileRows = 4;
// Weight rows per panel (see the loops below).
constexpr int64_t kPanelRows = 16;

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
void DotTile(const BlockQ8_0* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
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
void DotTile(const BlockQ4_0* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
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
void DotTile(const BlockQ4_1* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
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
void DotTile(const BlockQ8_0* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
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
void DotTile(const BlockQ4_0* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
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
void DotTile(const BlockQ4_1* w, const ActivationBlock* const* act, int64_t blocks, float* out) {
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

// weight rows [n0, n1) against every activation row, tiled by kTileRows.
template <typename Block>
void Rows(const Weight& weight, const ActivationBlock* activations, int64_t rows, int64_t n0,
          int64_t n1, const float* bias, const Matrix& out) {
  const int64_t blocks = weight.cols / 32;
  const auto* base = static_cast<const Block*>(weight.data);
  // Weight rows in panels that stay in L1 while every activation tile
  // passes over them.
  for (int64_t p0 = n0; p0 < n1; p0 += kPanelRows) {
    const int64_t p1 = std::min(n1, p0 + kPanelRows);
    for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
      const int tile = static_cast<int>(std::min<int64_t>(kTileRows, rows - r0));
      const ActivationBlock* act[kTileRows];
      for (int r = 0; r < tile; ++r) act[r] = activations + (r0 + r) * blocks;
      for (int64_t n = p0; n < p1; ++n) {
        const Block* w = base + n * blocks;
        float dots[kTileRows];
        if (tile == kTileRows) {
          DotTile<kTileRows>(w, act, blocks, dots);
        } else {
          for (int r = 0; r < tile; ++r) DotTile<1>(w, &act[r], blocks, &dots[r]);
        }
        for (int r = 0; r < tile; ++r) {
          out.Row(r0 + r)[n] = bias != nullptr ? dots[r] + bias[n] : dots[r];
        }
      }
    }
  }
}

}  // namespace

void MatMulQ8Rows(const Weight& weight, const ActivationBlock* activations, int64_t rows,
                  int64_t n0, int64_t n1, const float* bias, const Matrix& out) {
  switch (weight.dtype) {
    case DType::kQ8_0:
      return Rows<BlockQ8_0>(weight, activations, rows, n0, n1, bias, out);
    case DType::kQ4_0:
      return Rows<BlockQ4_0>(weight, activations, rows, n0, n1, bias, out);
    case DType::kQ4_1:
      return Rows<BlockQ4_1>(weight, activations, rows, n0, n1, bias, out);
    default:
      return;
  }
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
    out[b].d = RoundThroughHalf(d);
    out[b].s = RoundThroughHalf(d * static_cast<float>(sum));
  }
}

}  // namespace tandem::kernels::cpu
