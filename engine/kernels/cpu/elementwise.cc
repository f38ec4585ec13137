#include "engine/kernels/cpu/elementwise.h"

#include <cmath>

#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {

void RmsNormRow(const float* x, const float* weight, int64_t n, float eps, float* out) {
  const float mean_square = DotF32(x, x, n) / static_cast<float>(n);
  const float scale = 1.0f / std::sqrt(mean_square + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * weight[i];
}

void RmsNorm(ComputeLane& pool, const Matrix& x, const float* weight, float eps, Matrix out) {
  pool.ParallelFor(x.rows,
                   [&](int64_t r, int) { RmsNormRow(x.Row(r), weight, x.cols, eps, out.Row(r)); });
}

void Rope(ComputeLane& pool, Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
          const RopeSpec& rope) {
  const int pairs = rope.rotary_dims / 2;
  const auto* table = static_cast<const float*>(rope.table.data);
  pool.ParallelFor(x.rows, [&](int64_t r, int) {
    const float* cos_sin = table + int64_t{positions[static_cast<size_t>(r)]} * pairs * 2;
    float* row = x.Row(r);
    for (int h = 0; h < heads; ++h) {
      float* v = row + int64_t{h} * head_dim;
      for (int i = 0; i < pairs; ++i) {
        const int a = rope.neox ? i : 2 * i;
        const int b = rope.neox ? i + pairs : 2 * i + 1;
        const float c = cos_sin[2 * i];
        const float s = cos_sin[2 * i + 1];
        const float x0 = v[a];
        const float x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  });
}

namespace {

// out = (x / (1 + exp(Arg(x)))) * up with x = gate: a gated product whose
// activation is x * sigmoid(-Arg(x)). Arg has a vector (8 lanes) and a
// scalar form doing the same operations.
template <typename Arg>
void GatedProduct(ComputeLane& pool, const Matrix& gate, const Matrix& up, Matrix out) {
  pool.ParallelFor(gate.rows, [&](int64_t r, int) {
    const float* g = gate.Row(r);
    const float* u = up.Row(r);
    float* o = out.Row(r);
    int64_t i = 0;
#ifdef TANDEM_CPU_AVX2
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= gate.cols; i += 8) {
      const __m256 x = _mm256_loadu_ps(g + i);
      const __m256 activated = _mm256_div_ps(x, _mm256_add_ps(one, Exp8(Arg::Vector(x))));
      _mm256_storeu_ps(o + i, _mm256_mul_ps(activated, _mm256_loadu_ps(u + i)));
    }
#endif
    for (; i < gate.cols; ++i) o[i] = (g[i] / (1.0f + ExpApprox(Arg::Scalar(g[i])))) * u[i];
  });
}

// silu(x) = x * sigmoid(x).
struct SiluArg {
#ifdef TANDEM_CPU_AVX2
  static __m256 Vector(__m256 x) { return _mm256_sub_ps(_mm256_setzero_ps(), x); }
#endif
  static float Scalar(float x) { return -x; }
};

// gelu(x) = x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): GELU's tanh
// form, 0.5 x (1 + tanh(u)), rewritten with tanh(u) = 2 sigmoid(2u) - 1 so it
// takes the exponential SiLU takes (vector and scalar lanes alike).
constexpr float kGeluTwoC = 2.0f * 0.7978845608028654f;  // 2 sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

struct GeluArg {
#ifdef TANDEM_CPU_AVX2
  static __m256 Vector(__m256 x) {
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 inner = _mm256_add_ps(x, _mm256_mul_ps(_mm256_set1_ps(kGeluCubic), x3));
    return _mm256_mul_ps(_mm256_set1_ps(-kGeluTwoC), inner);
  }
#endif
  static float Scalar(float x) { return -kGeluTwoC * (x + kGeluCubic * ((x * x) * x)); }
};

}  // namespace

void SiluMul(ComputeLane& pool, const Matrix& gate, const Matrix& up, Matrix out) {
  GatedProduct<SiluArg>(pool, gate, up, out);
}

void GeluMul(ComputeLane& pool, const Matrix& gate, const Matrix& up, Matrix out) {
  GatedProduct<GeluArg>(pool, gate, up, out);
}

void Scale(ComputeLane& pool, Matrix x, float factor) {
  pool.ParallelFor(x.rows, [&](int64_t r, int) {
    float* row = x.Row(r);
    for (int64_t i = 0; i < x.cols; ++i) row[i] *= factor;
  });
}

// cap * tanh(x / cap) = cap * (2 / (1 + exp(-2x / cap)) - 1).
void SoftcapRow(float* x, int64_t n, float cap) {
  const float minus_two_over_cap = -2.0f / cap;
  int64_t i = 0;
#ifdef TANDEM_CPU_AVX2
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 two = _mm256_set1_ps(2.0f);
  const __m256 vcap = _mm256_set1_ps(cap);
  const __m256 vscale = _mm256_set1_ps(minus_two_over_cap);
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_mul_ps(vscale, _mm256_loadu_ps(x + i)));
    const __m256 t = _mm256_sub_ps(_mm256_div_ps(two, _mm256_add_ps(one, e)), one);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(vcap, t));
  }
#endif
  for (; i < n; ++i) {
    const float e = ExpApprox(minus_two_over_cap * x[i]);
    x[i] = cap * (2.0f / (1.0f + e) - 1.0f);
  }
}

void Softcap(ComputeLane& pool, Matrix x, float cap) {
  pool.ParallelFor(x.rows, [&](int64_t r, int) { SoftcapRow(x.Row(r), x.cols, cap); });
}

void Add(ComputeLane& pool, Matrix acc, const Matrix& x) {
  pool.ParallelFor(acc.rows, [&](int64_t r, int) {
    float* a = acc.Row(r);
    const float* b = x.Row(r);
    for (int64_t i = 0; i < acc.cols; ++i) a[i] += b[i];
  });
}

}  // namespace tandem::kernels::cpu
