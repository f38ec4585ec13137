#include "engine/kernels/cpu/product_rates.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/strings.h"
#include "engine/kernels/cpu/matmul_q8.h"
#include "engine/kernels/cpu/packed_matmul.h"
#include "engine/kernels/cpu/packed_matmul_int8.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/dtype.h"

namespace tandem::kernels::cpu {
namespace {

// (Unused where the build has no AVX-512 kernels.)
[[maybe_unused]] constexpr int kChains = 12;

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

namespace {

[[maybe_unused]] constexpr int64_t kTimedWeightRows = 256;
[[maybe_unused]] constexpr int64_t kTimedWeightCols = 1024;
constexpr int64_t kTimedPromptRows = 64;
[[maybe_unused]] constexpr int kDecodeRepeats = 8;  // one-row products per timing (each ~20-40 us)
[[maybe_unused]] constexpr int kRounds = 5;

template <typename Fn>
double MicrosecondsOf(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

#ifdef TANDEM_CPU_AVX512
ModeTimings MeasureModeTimings() {
  // The values do not matter to the time (no kernel branches on them); 0x11
  // bytes make every scale a normal half and every quant 1.
  std::vector<uint8_t> bytes(RowBytes(DType::kQ4_K, kTimedWeightCols) * kTimedWeightRows, 0x11);
  const Weight weight{DType::kQ4_K, kTimedWeightRows, kTimedWeightCols, bytes.data()};
  const std::unique_ptr<PackedWeight> packed = PackWeight(weight);
  const bool int8 = HasInt8Products();
  const bool two_digit = HasTwoDigitProducts();
  const std::unique_ptr<PackedWeight> packed_int8 = int8 ? PackWeightInt8(weight) : nullptr;
  std::vector<float> x(static_cast<size_t>(kTimedPromptRows * kTimedWeightCols), 0.5f);
  std::vector<float> out(static_cast<size_t>(kTimedPromptRows * kTimedWeightRows));
  std::vector<uint16_t> xb(x.size());
  std::vector<float> sums(static_cast<size_t>(kTimedPromptRows * kTimedWeightCols / 32));
  std::vector<float> scratch;
  const Matrix out_rows{out.data(), kTimedPromptRows, kTimedWeightRows};
  const bool bf16 = HasBf16Products();
  for (int64_t r = 0; r < kTimedPromptRows && bf16; ++r) {
    RoundActivationsToBf16(x.data() + r * kTimedWeightCols, kTimedWeightCols,
                           xb.data() + r * kTimedWeightCols,
                           sums.data() + r * kTimedWeightCols / 32);
  }
  std::vector<ActivationBlock> blocks(
      static_cast<size_t>(kTimedPromptRows * kTimedWeightCols / 32));
  std::vector<TwoDigitBlock> two_digit_blocks(blocks.size());
  for (int64_t r = 0; r < kTimedPromptRows; ++r) {
    if (int8) {
      QuantizeActivationRow(x.data() + r * kTimedWeightCols, kTimedWeightCols,
                            blocks.data() + r * kTimedWeightCols / 32);
    }
    if (two_digit) {
      QuantizeTwoDigitRow(x.data() + r * kTimedWeightCols, kTimedWeightCols,
                          two_digit_blocks.data() + r * kTimedWeightCols / 32);
    }
  }
  auto f32_product = [&](int64_t rows) {
    MatMulPackedRows(*packed, Matrix{x.data(), rows, kTimedWeightCols}, 0, kTimedWeightRows,
                     nullptr, scratch, out_rows.FirstRows(rows));
  };
  auto bf16_product = [&](int64_t rows) {
    MatMulPackedBf16Rows(*packed, xb.data(), sums.data(), rows, 0, kTimedWeightRows, nullptr,
                         scratch, out_rows.FirstRows(rows));
  };
  auto q8_product = [&](int64_t rows) {
    MatMulPackedInt8Rows(*packed_int8, blocks.data(), rows, 0, kTimedWeightRows, nullptr,
                         out_rows.FirstRows(rows));
  };
  auto q16_product = [&](int64_t rows) {
    MatMulPackedTwoDigitRows(*packed_int8, two_digit_blocks.data(), rows, 0, kTimedWeightRows,
                             nullptr, out_rows.FirstRows(rows));
  };
  auto time = [&](auto& product, KernelTimes& best, bool timed) {
    const double prompt = MicrosecondsOf([&] { product(kTimedPromptRows); });
    const double decode = MicrosecondsOf([&] {
                            for (int i = 0; i < kDecodeRepeats; ++i) product(1);
                          }) /
                          kDecodeRepeats;
    if (!timed) return;
    best.prompt_64_rows_us =
        best.prompt_64_rows_us == 0 ? prompt : std::min(best.prompt_64_rows_us, prompt);
    best.decode_row_us = best.decode_row_us == 0 ? decode : std::min(best.decode_row_us, decode);
  };
  ModeTimings timings;
  for (int round = 0; round <= kRounds; ++round) {  // round 0 warms up
    time(f32_product, timings.f32, round > 0);
    if (bf16) time(bf16_product, timings.bf16, round > 0);
    if (int8) time(q8_product, timings.q8, round > 0);
    if (two_digit) time(q16_product, timings.q16, round > 0);
  }
  return timings;
}
#else
ModeTimings MeasureModeTimings() { return {}; }
#endif

double ReferenceRequestUs(const KernelTimes& times) {
  return double{kReferencePromptTokens} / kTimedPromptRows * times.prompt_64_rows_us +
         kReferenceOutputTokens * times.decode_row_us;
}

MatMulMode ChooseAutoMatMulMode(const ModeTimings& timings) {
  // Most exact first. A mode is taken where every more exact one (with
  // timings) needs at least kAutoAdvantage times its time; the least exact
  // such mode is then also the fastest of those it passed.
  const std::pair<MatMulMode, double> modes[] = {
      {MatMulMode::kF32, ReferenceRequestUs(timings.f32)},
      {MatMulMode::kQ16, ReferenceRequestUs(timings.q16)},
      {MatMulMode::kBf16, ReferenceRequestUs(timings.bf16)}};
  MatMulMode chosen = MatMulMode::kF32;
  for (size_t m = 1; m < std::size(modes); ++m) {
    if (modes[m].second <= 0) continue;
    bool clearly_faster = true;
    for (size_t e = 0; e < m; ++e) {
      if (modes[e].second > 0 && modes[e].second < kAutoAdvantage * modes[m].second) {
        clearly_faster = false;
      }
    }
    if (clearly_faster) chosen = modes[m].first;
  }
  return chosen;
}

const AutoMatMulChoice& AutoMatMulMode() {
  static const AutoMatMulChoice choice = [] {
    const ModeTimings timings = MeasureModeTimings();
    const MatMulMode mode = ChooseAutoMatMulMode(timings);
    auto figures = [](std::string_view name, const KernelTimes& t) {
      return StrCat(name, " ", static_cast<int>(t.prompt_64_rows_us), " us for 64 prompt rows and ",
                    static_cast<int>(t.decode_row_us * 10) / 10.0, " us for a decode row (",
                    static_cast<int>(ReferenceRequestUs(t)), " us for ", kReferencePromptTokens,
                    " prompt and ", kReferenceOutputTokens, " output tokens)");
    };
    std::string reason;
    if (timings.f32.decode_row_us == 0) {
      reason = "this CPU has no AVX-512: f32";
    } else {
      reason = StrCat("a Q4_K product on one thread: ", figures("f32", timings.f32));
      if (timings.q16.decode_row_us > 0) reason += StrCat("; ", figures("q16", timings.q16));
      if (timings.bf16.decode_row_us > 0) reason += StrCat("; ", figures("bf16", timings.bf16));
      reason += StrCat(
          "; of f32, q16 and bf16 (most exact first), the least exact mode that "
          "every more exact one needs at least ",
          kAutoAdvantage, "x the time of");
    }
    if (timings.q8.decode_row_us > 0) {
      const double chosen_us = ReferenceRequestUs(mode == MatMulMode::kBf16  ? timings.bf16
                                                  : mode == MatMulMode::kQ16 ? timings.q16
                                                                             : timings.f32);
      reason += StrCat("; ", figures("q8", timings.q8), ": --cpu_matmul=q8 takes ",
                       static_cast<int>(100 * ReferenceRequestUs(timings.q8) / chosen_us),
                       "% of the time and changes some greedy answers (docs/operations.md)");
    } else if (HasInt8Products()) {
      reason +=
          "; --cpu_matmul=q8 (integer products) is faster and changes some greedy answers "
          "(docs/operations.md)";
    }
    return AutoMatMulChoice{mode, std::move(reason)};
  }();
  return choice;
}

}  // namespace tandem::kernels::cpu
