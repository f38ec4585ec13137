#include "engine/kernels/cpu/matmul_f32.h"

#include <algorithm>

#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/cpu/matmul_tiling.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/half.h"

namespace tandem::kernels::cpu {
namespace {

#ifdef TANDEM_CPU_AVX512

// AVX-512: a block decodes to its 32 dequantized weights (exactly the values
// DequantizeRow gives) through a 16-entry table lookup per nibble, and the
// dot product is a plain float product with the activations.
constexpr bool kNeedsBlockSums = false;

struct DecodedBlock {
  __m512 w[2];  // elements 0..15 and 16..31
};

inline void DecodeNibbleTable(const uint8_t* qs, __m512 table, DecodedBlock* out) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(packed, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
  out->w[0] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(lo), table);
  out->w[1] = _mm512_permutexvar_ps(_mm512_cvtepu8_epi32(hi), table);
}

inline __m512 Iota16() {
  return _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

inline void Decode(const BlockQ4_1& b, DecodedBlock* out) {
  // table[q] = d * q + m, rounded as the dequantizer rounds (no fused add).
  const __m512 table = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(HalfToFloat(b.d)), Iota16()),
                                     _mm512_set1_ps(HalfToFloat(b.m)));
  DecodeNibbleTable(b.qs, table, out);
}

inline void Decode(const BlockQ4_0& b, DecodedBlock* out) {
  const __m512 table = _mm512_mul_ps(_mm512_set1_ps(HalfToFloat(b.d)),
                                     _mm512_sub_ps(Iota16(), _mm512_set1_ps(8.0f)));
  DecodeNibbleTable(b.qs, table, out);
}

inline void Decode(const BlockQ8_0& b, DecodedBlock* out) {
  const __m512 d = _mm512_set1_ps(HalfToFloat(b.d));
  for (int i = 0; i < 2; ++i) {
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16 * i));
    out->w[i] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(bytes)));
  }
}

// Two independent sums (one per half-block), so that a single row's products
// are not serialised on one chain of FMA latencies.
struct Accumulator {
  __m512 low = _mm512_setzero_ps();
  __m512 high = _mm512_setzero_ps();

  inline void Add(int64_t /*block*/, const DecodedBlock& w, const float* x, float /*x_sum*/) {
    low = _mm512_fmadd_ps(w.w[0], _mm512_loadu_ps(x), low);
    high = _mm512_fmadd_ps(w.w[1], _mm512_loadu_ps(x + 16), high);
  }

  inline float Total() const { return _mm512_reduce_add_ps(_mm512_add_ps(low, high)); }
};

#else  // AVX2 and portable: integer values times activations, scaled per block

constexpr bool kNeedsBlockSums = true;

// A weight block decoded to integer values as floats, with its scale and the
// multiplier of the activation block sum (m for Q4_1, -8d for Q4_0, 0 for Q8_0).
struct DecodedBlock {
#ifdef TANDEM_CPU_AVX2
  __m256 q[4];
#else
  float q[32];
#endif
  float d;
  float sum_scale;
};

#ifdef TANDEM_CPU_AVX2
inline void DecodeNibbles(const uint8_t* qs, __m256* q) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(packed, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
}
#else
inline void DecodeNibbles(const uint8_t* qs, float* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<float>(qs[j] & 0x0f);
    q[j + 16] = static_cast<float>(qs[j] >> 4);
  }
}
#endif

inline void Decode(const BlockQ4_1& b, DecodedBlock* out) {
  DecodeNibbles(b.qs, out->q);
  out->d = HalfToFloat(b.d);
  out->sum_scale = HalfToFloat(b.m);
}

inline void Decode(const BlockQ4_0& b, DecodedBlock* out) {
  DecodeNibbles(b.qs, out->q);
  out->d = HalfToFloat(b.d);
  out->sum_scale = -8.0f * out->d;
}

inline void Decode(const BlockQ8_0& b, DecodedBlock* out) {
#ifdef TANDEM_CPU_AVX2
  for (int i = 0; i < 4; ++i) {
    const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * i));
    out->q[i] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  }
#else
  for (int j = 0; j < 32; ++j) out->q[j] = static_cast<float>(b.qs[j]);
#endif
  out->d = HalfToFloat(b.d);
  out->sum_scale = 0.0f;
}

// One row's running sums for one weight row.
struct Accumulator {
#ifdef TANDEM_CPU_AVX2
  __m256 scaled = _mm256_setzero_ps();
#else
  float scaled = 0.0f;
#endif
  float sums = 0.0f;

  // Adds block `w` times the 32 activations at x (whose sum is x_sum).
  inline void Add(int64_t /*block*/, const DecodedBlock& w, const float* x, float x_sum) {
#ifdef TANDEM_CPU_AVX2
    __m256 t = _mm256_mul_ps(_mm256_loadu_ps(x), w.q[0]);
    t = _mm256_fmadd_ps(_mm256_loadu_ps(x + 8), w.q[1], t);
    t = _mm256_fmadd_ps(_mm256_loadu_ps(x + 16), w.q[2], t);
    t = _mm256_fmadd_ps(_mm256_loadu_ps(x + 24), w.q[3], t);
    scaled = _mm256_fmadd_ps(_mm256_set1_ps(w.d), t, scaled);
#else
    float t = 0.0f;
    for (int j = 0; j < 32; ++j) t += x[j] * w.q[j];
    scaled += w.d * t;
#endif
    sums += w.sum_scale * x_sum;
  }

  inline float Total() const {
#ifdef TANDEM_CPU_AVX2
    return HorizontalSum(scaled) + sums;
#else
    return scaled + sums;
#endif
  }
};

#endif  // TANDEM_CPU_AVX512

template <typename Block, int R>
inline void DotTile(const Block* w, const float* const* x, const float* const* x_sums,
                    int64_t blocks, float* out) {
  Accumulator acc[R];
  DecodedBlock decoded;
  for (int64_t b = 0; b < blocks; ++b) {
    Decode(w[b], &decoded);
    for (int r = 0; r < R; ++r) {
      acc[r].Add(b, decoded, x[r] + b * 32, kNeedsBlockSums ? x_sums[r][b] : 0.0f);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = acc[r].Total();
}

template <typename Block>
void FusedRows(const Weight& weight, const Matrix& x, const float* block_sums, int64_t n0,
               int64_t n1, const float* bias, const Matrix& out) {
  const int64_t blocks = weight.cols / 32;
  const auto* base = static_cast<const Block*>(weight.data);
  ForEachTile(x.rows, n0, n1, bias, out, [&]<int R>(int64_t first_row, int64_t n, float* dots) {
    const float* rows[R];
    const float* sums[R];
    for (int r = 0; r < R; ++r) {
      rows[r] = x.Row(first_row + r);
      sums[r] = kNeedsBlockSums ? block_sums + (first_row + r) * blocks : nullptr;
    }
    DotTile<Block, R>(base + n * blocks, rows, sums, blocks, dots);
  });
}

}  // namespace

bool FusedF32KernelNeedsBlockSums() { return kNeedsBlockSums; }

bool HasFusedF32Kernel(DType dtype) {
  return dtype == DType::kQ8_0 || dtype == DType::kQ4_0 || dtype == DType::kQ4_1;
}

void BlockSums(const float* x, int64_t elements, float* sums) {
  for (int64_t b = 0; b < elements / 32; ++b) {
    float s = 0.0f;
    for (int j = 0; j < 32; ++j) s += x[b * 32 + j];
    sums[b] = s;
  }
}

void MatMulF32FusedRows(const Weight& weight, const Matrix& x, const float* block_sums, int64_t n0,
                        int64_t n1, const float* bias, const Matrix& out) {
  switch (weight.dtype) {
    case DType::kQ8_0:
      return FusedRows<BlockQ8_0>(weight, x, block_sums, n0, n1, bias, out);
    case DType::kQ4_0:
      return FusedRows<BlockQ4_0>(weight, x, block_sums, n0, n1, bias, out);
    case DType::kQ4_1:
      return FusedRows<BlockQ4_1>(weight, x, block_sums, n0, n1, bias, out);
    default:
      return;
  }
}

void MatMulF32DequantRows(const Weight& weight, const Matrix& x, int64_t n0, int64_t n1,
                          const float* bias, std::vector<float>& scratch, const Matrix& out) {
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

}  // namespace tandem::kernels::cpu
