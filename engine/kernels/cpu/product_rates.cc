#include "engine/kernels/cpu/product_rates.h"

#include <algorithm>
#include <chrono>

#include "common/strings.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/packed_matmul_int8.h"
#include "engine/kernels/cpu/simd.h"

namespace tandem::kernels::cpu {
namespace {

// (Unused where the build has no AVX-512 kernels.)
[[maybe_unused]] constexpr int kChains = 12;
constexpr long kMeasuredIterations = 400'000;  // ~3 ms a run on a 3.5 GHz Zen 4 core

// GFLOP/s of one run of `chains(kMeasuredIterations)`, `flops` per iteration.
template <typename Chains>
double Rate(Chains chains, double flops_per_iteration) {
  static volatile float sink = 0;
  const auto start = std::chrono::steady_clock::now();
  sink = sink + chains(kMeasuredIterations);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return kMeasuredIterations * flops_per_iteration / std::max(seconds, 1e-9) / 1e9;
}

}  // namespace

#ifdef TANDEM_CPU_AVX512
float Fp32FmaChains(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], b, c);
  }
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  return sum;
}
#else
float Fp32FmaChains(long) { return 0; }
#endif

#if defined(TANDEM_CPU_AVX512) && defined(__AVX512BF16__)
float Bf16DotChains(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_setzero_ps();
  const __m512i one = _mm512_set1_epi16(0x3f80);  // bfloat16 1.0
  const __m512bh ones = reinterpret_cast<const __m512bh&>(one);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], ones, ones);
  }
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  return sum;
}
#else
float Bf16DotChains(long) { return 0; }
#endif

ProductRates MeasureProductRates() {
  ProductRates rates;
#ifdef TANDEM_CPU_AVX512
  for (int round = 0; round < 3; ++round) {
    // 12 chains x 16 lanes x 2 flops; a dot product does two products a lane.
    rates.fp32_fma_gflops =
        std::max(rates.fp32_fma_gflops, Rate(Fp32FmaChains, kChains * 16.0 * 2));
    if (HasBf16Products()) {
      rates.bf16_dot_gflops =
          std::max(rates.bf16_dot_gflops, Rate(Bf16DotChains, kChains * 16.0 * 4));
    }
  }
#endif
  return rates;
}

MatMulMode ChooseAutoMatMulMode(const ProductRates& rates) {
  return rates.bf16_dot_gflops > 0 &&
                 rates.bf16_dot_gflops >= kBf16AutoAdvantage * rates.fp32_fma_gflops
             ? MatMulMode::kBf16
             : MatMulMode::kF32;
}

const AutoMatMulChoice& AutoMatMulMode() {
  static const AutoMatMulChoice choice = [] {
    const ProductRates rates = MeasureProductRates();
    const MatMulMode mode = ChooseAutoMatMulMode(rates);
    std::string reason =
        rates.bf16_dot_gflops == 0
            ? StrCat("this CPU has no AVX-512 BF16 products",
                     rates.fp32_fma_gflops > 0
                         ? StrCat(" (float32 FMA ", static_cast<int>(rates.fp32_fma_gflops),
                                  " GFLOP/s a thread)")
                         : "",
                     HasInt8Products() ? "; --cpu_matmul=q8 multiplies 8-bit activations by "
                                         "integer products, faster here and less exact "
                                         "(docs/operations.md)"
                                       : "")
            : StrCat("bfloat16 dot products ", static_cast<int>(rates.bf16_dot_gflops),
                     " GFLOP/s a thread against float32 FMA ",
                     static_cast<int>(rates.fp32_fma_gflops), " (bf16 where at least ",
                     kBf16AutoAdvantage, "x)");
    return AutoMatMulChoice{mode, std::move(reason)};
  }();
  return choice;
}

}  // namespace tandem::kernels::cpu
