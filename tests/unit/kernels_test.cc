// CPU kernels: numerical correctness against float64 references, and the
// batch-invariance contract (backend.h): a row's result is bitwise the same
// alone, in batches of any size and order, chunked, and on any thread count.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/kernels/cpu/attention_bf16.h"
#include "engine/kernels/cpu/block32.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/kernels/cpu/dequantize.h"
#include "engine/kernels/cpu/matmul_q8.h"
#include "engine/kernels/cpu/packed_matmul_int8.h"
#include "engine/kernels/cpu/product_rates.h"
#include "engine/kernels/cpu/simd.h"
#include "engine/kernels/half.h"
#include "tests/unit/random_weights.h"
#include "tests/unit/resident_pages.h"

namespace tandem::kernels::cpu {
namespace {

std::vector<float> RandomRows(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = n(rng);
  return x;
}

Matrix View(std::vector<float>& v, int64_t rows, int64_t cols) { return {v.data(), rows, cols}; }

bool SameBits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, sizeof(float) * static_cast<size_t>(n)) == 0;
}

// The weight as `backend` uses it: uploaded, so that the backend makes its
// own layout (packed panels) where it has one.
Weight Upload(CpuBackend& backend, DType type, int64_t rows, int64_t cols,
              const std::vector<uint8_t>& bytes) {
  absl::StatusOr<Weight> w = backend.UploadWeight(type, rows, cols, bytes.data());
  EXPECT_TRUE(w.ok()) << w.status();
  return *w;
}

// out = x W^T through the backend, for a subset of rows given in order.
std::vector<float> RunMatMul(CpuBackend& backend, const Weight& w, const std::vector<float>& x,
                             const std::vector<int64_t>& rows) {
  std::vector<float> in(rows.size() * static_cast<size_t>(w.cols));
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(&in[i * static_cast<size_t>(w.cols)], &x[static_cast<size_t>(rows[i] * w.cols)],
                sizeof(float) * static_cast<size_t>(w.cols));
  }
  std::vector<float> out(rows.size() * static_cast<size_t>(w.rows));
  const Weight* ws[] = {&w};
  const Matrix outs[] = {View(out, static_cast<int64_t>(rows.size()), w.rows)};
  backend.MatMul(View(in, static_cast<int64_t>(rows.size()), w.cols), ws, {}, outs);
  return out;
}

// Output-feature counts of the matmul tests. 80, 112 and 144 are whole
// numbers of packed panels; on one thread a product of one or two rows is
// split into tasks of 32, 48 and 64 of them (matmul.cc), so its tiles take
// two, three and four panels at a time. 72 is not (the unpacked kernels).
constexpr int64_t kMatMulOutputs[] = {80, 72, 112, 144};

struct MatMulCase {
  DType type;
  MatMulMode mode;
};

class MatMulTest : public ::testing::TestWithParam<MatMulCase> {};

TEST_P(MatMulTest, EachRowIsBitwiseTheSameAloneBatchedShuffledAndOnAnyThreadCount) {
  const auto [type, mode] = GetParam();
  std::mt19937 rng(11);
  const int64_t k = 512, m = 72;
  for (const int64_t n : kMatMulOutputs) {
    std::vector<uint8_t> bytes = RandomWeights(type, n, k, rng);
    const std::vector<float> x = RandomRows(m, k, rng);

    CpuBackend single(1, mode);
    const Weight single_w = Upload(single, type, n, k, bytes);
    std::vector<std::vector<float>> alone(static_cast<size_t>(m));
    for (int64_t r = 0; r < m; ++r) {
      alone[static_cast<size_t>(r)] = RunMatMul(single, single_w, x, {r});
    }
    for (int threads : {1, 3}) {
      CpuBackend backend(threads, mode);
      const Weight w = Upload(backend, type, n, k, bytes);
      // Batches on both sides of every kernel switch, with remainders: f32
      // and bf16 decode on the fly, four panels at a time for up to 2 rows
      // and two panels for tiles of up to 8 rows, up to 16 rows (f32) or 32
      // (bf16; 64 for Q4_0, Q4_1 and Q4_K), and multiply dequantized panels
      // in tiles of 8 rows above; q8 takes tiles of up to 4 rows. AVX2's
      // f32: tiles of 2 rows x one panel for up to 4 rows, then dequantized
      // panels in tiles of 6 rows.
      for (int64_t batch : {2, 3, 4, 5, 8, 9, 16, 17, 37, 64, 65, 72}) {
        std::vector<int64_t> order(static_cast<size_t>(m));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        for (int64_t start = 0; start < m; start += batch) {
          const std::vector<int64_t> rows(order.begin() + start,
                                          order.begin() + std::min(m, start + batch));
          const std::vector<float> out = RunMatMul(backend, w, x, rows);
          for (size_t i = 0; i < rows.size(); ++i) {
            ASSERT_TRUE(SameBits(&out[i * static_cast<size_t>(n)],
                                 alone[static_cast<size_t>(rows[i])].data(), n))
                << Info(type).name << " " << n << "x" << k << " row " << rows[i]
                << " differs in a batch of " << rows.size() << " on " << threads << " threads";
          }
        }
      }
    }
  }
}

TEST_P(MatMulTest, APromptSplitIntoActivationBlocksGivesEachRowItsBitsAlone) {
  // 200 rows of 1,024 inputs are 800 KB of float32 activations: matmul.cc
  // splits them into blocks of about 256 KB (64, 64, 64 and 8 rows: the
  // last decodes on the fly in f32 and bf16), each task one block times a
  // range of weight rows. Every row must still get exactly its bits alone,
  // on one thread and on three.
  const auto [type, mode] = GetParam();
  std::mt19937 rng(12);
  const int64_t k = 1024, m = 200, n = 144;
  std::vector<uint8_t> bytes = RandomWeights(type, n, k, rng);
  const std::vector<float> x = RandomRows(m, k, rng);
  CpuBackend single(1, mode);
  const Weight single_w = Upload(single, type, n, k, bytes);
  std::vector<int64_t> all(static_cast<size_t>(m));
  std::iota(all.begin(), all.end(), 0);
  for (int threads : {1, 3}) {
    CpuBackend backend(threads, mode);
    const Weight w = Upload(backend, type, n, k, bytes);
    const std::vector<float> out = RunMatMul(backend, w, x, all);
    for (int64_t r = 0; r < m; ++r) {
      const std::vector<float> alone = RunMatMul(single, single_w, x, {r});
      ASSERT_TRUE(SameBits(&out[static_cast<size_t>(r * n)], alone.data(), n))
          << Info(type).name << " row " << r << " differs in a prompt of " << m << " rows on "
          << threads << " threads";
    }
  }
}

TEST_P(MatMulTest, MatchesAFloat64ReferenceOnTheDequantizedWeights) {
  const auto [type, mode] = GetParam();
  std::mt19937 rng(5);
  const int64_t k = 768;
  for (const int64_t n : kMatMulOutputs) {
    // One row, and tiles of eight with a remainder of one: decoded on the
    // fly (9; 17 in bf16) and from dequantized panels (17 in f32; 65 in
    // bf16). AVX2's f32 decodes 1 row on the fly, 9 and 17 from panels.
    for (const int64_t m : {1, 9, 17, 65}) {
      std::vector<uint8_t> bytes = RandomWeights(type, n, k, rng);
      const std::vector<float> x = RandomRows(m, k, rng);
      std::vector<float> wf(static_cast<size_t>(n * k));
      for (int64_t r = 0; r < n; ++r) {
        DequantizeRow(type, bytes.data() + static_cast<size_t>(r) * RowBytes(type, k), k,
                      &wf[static_cast<size_t>(r * k)]);
      }
      CpuBackend backend(2, mode);
      const Weight w = Upload(backend, type, n, k, bytes);
      std::vector<int64_t> all(static_cast<size_t>(m));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<float> out = RunMatMul(backend, w, x, all);
      // f32: float rounding only. q8: each activation is rounded to 1/254 of
      // its block's largest magnitude. bf16: each activation to 8
      // significant bits (relative error at most 2^-9), the quants exact.
      // Q5_0 and IQ4_NL decode to the values of the Q8_0 blocks they widen to
      // (by panels of their own, or as those blocks where they have none); q8
      // multiplies packed weights by integer panels where the build has them
      // (AVX2 or VNNI), and without them the types it has no block kernel for by the float32
      // panels.
      // F16 is multiplied by its float32 panels in every mode, BF16 by them
      // in q8.
      const bool q8_activations =
          mode == MatMulMode::kQ8 &&
          (HasQ8Kernel(type) || WidensToQ8_0(type) ||
           (HasInt8Products() && w.packed != nullptr && HasInt8Panels(type)));
      const bool bf16_activations =
          mode == MatMulMode::kBf16 && w.packed != nullptr && HasBf16Panels(type);
      // q16: each activation to 1/65,278 of its block's largest magnitude
      // (packed quantized weights; the others as f32).
      const bool two_digit_activations =
          mode == MatMulMode::kQ16 && w.packed != nullptr && HasInt8Panels(type);
      const double tolerance = q8_activations          ? 1.5e-2
                               : bf16_activations      ? 2.5e-3
                               : two_digit_activations ? 6e-5
                                                       : 2e-6;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          double exact = 0, magnitude = 0;
          for (int64_t i = 0; i < k; ++i) {
            const double p =
                double{x[static_cast<size_t>(r * k + i)]} * wf[static_cast<size_t>(c * k + i)];
            exact += p;
            magnitude += std::fabs(p);
          }
          ASSERT_NEAR(out[static_cast<size_t>(r * n + c)], exact, tolerance * magnitude)
              << Info(type).name << " " << n << "x" << k << " (" << MatMulModeName(mode) << ") at ["
              << r << "][" << c << "] of " << m << " rows";
        }
      }
    }
  }
}

std::vector<MatMulCase> AllMatMulCases() {
  std::vector<MatMulCase> cases;
  for (DType t : kAllTypes) {
    for (MatMulMode m : {MatMulMode::kF32, MatMulMode::kQ8, MatMulMode::kBf16, MatMulMode::kQ16}) {
      if (m == MatMulMode::kBf16 && !HasBf16Products()) continue;
      if (m == MatMulMode::kQ16 && !HasTwoDigitProducts()) continue;
      cases.push_back({t, m});
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatMulTest, ::testing::ValuesIn(AllMatMulCases()),
                         [](const auto& info) {
                           return std::string(Info(info.param.type).name) + "_" +
                                  std::string(MatMulModeName(info.param.mode));
                         });

TEST(MatMulTest, Q5_0AndIq4NlWithoutPanelsOfTheirOwnBecomeQ8_0BlocksOfExactlyTheirValues) {
  // Where they get no panels of their own: in q8 without integer panels (for
  // the Q8_0 block kernel) and with rows that are not whole panels (40). 48
  // rows elsewhere keep their type, packed.
  std::mt19937 rng(5);
  const int64_t k = 96;
  for (DType type : {DType::kQ5_0, DType::kIQ4_NL}) {
    for (const int64_t n : {48, 40}) {
      std::vector<uint8_t> bytes = RandomWeights(type, n, k, rng);
      for (MatMulMode mode : {MatMulMode::kF32, MatMulMode::kQ8, MatMulMode::kBf16}) {
        if (mode == MatMulMode::kBf16 && !HasBf16Products()) continue;
        SCOPED_TRACE(std::string(Info(type).name) + " " + std::string(MatMulModeName(mode)) + " " +
                     std::to_string(n) + " rows");
        CpuBackend a(1, mode), b(1, mode);
        const Weight wa = Upload(a, type, n, k, bytes);
        const Weight wb = Upload(b, type, n, k, bytes);
        const bool own_panels =
            (mode != MatMulMode::kQ8 || HasInt8Products()) && CanPackWeight(type, n, k);
        if (own_panels) {
          EXPECT_EQ(wa.dtype, type);
          EXPECT_NE(wa.packed, nullptr);
          continue;
        }
        EXPECT_EQ(wa.dtype, DType::kQ8_0);
        EXPECT_EQ(wa.data, wb.data);  // one widened copy per process
        EXPECT_NE(wa.data, bytes.data());
        // The packed Q8_0 kernels, where the mode packs (q8 without integer
        // panels reads the blocks).
        EXPECT_EQ(wa.packed != nullptr, (mode != MatMulMode::kQ8 || HasInt8Products()) &&
                                            CanPackWeight(DType::kQ8_0, n, k));
        // Every value as the original blocks give it, bit for bit.
        for (int64_t r = 0; r < n; ++r) {
          std::vector<float> original(static_cast<size_t>(k)), widened(static_cast<size_t>(k));
          DequantizeRow(type, bytes.data() + r * RowBytes(type, k), k, original.data());
          DequantizeRow(DType::kQ8_0,
                        static_cast<const uint8_t*>(wa.data) + r * RowBytes(DType::kQ8_0, k), k,
                        widened.data());
          ASSERT_EQ(0,
                    std::memcmp(original.data(), widened.data(), original.size() * sizeof(float)))
              << "row " << r;
        }
      }
    }
  }
}

// Kernel times: microseconds for 64 prompt rows, and for one decode row.
KernelTimes Us(double prompt_64_rows, double decode_row) {
  return {.prompt_64_rows_us = prompt_64_rows, .decode_row_us = decode_row};
}

ModeTimings Timings(KernelTimes f32, KernelTimes bf16, KernelTimes q8 = {}, KernelTimes q16 = {}) {
  return {.f32 = f32, .bf16 = bf16, .q8 = q8, .q16 = q16};
}

TEST(MatMulModeTest, AutoTakesTheMoreExactModeUnlessALessExactOneIsClearlyFaster) {
  // q8 is never chosen, however fast (its rounding changes visible
  // answers; product_rates.h).
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(600, 30), Us(300, 20), Us(100, 5))), MatMulMode::kBf16);
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(500, 30), {}, Us(100, 5))), MatMulMode::kF32);
  // The Intel Xeon of 2026-12-07 (measured, rounded): q16 clearly faster
  // than f32 at both, bf16 slower at prompts: q16.
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(215, 15.4), Us(421, 10), Us(112, 3.8), Us(150, 5))),
            MatMulMode::kQ16);
  // q16 within 1.2x of f32's time: the exact mode (8 x 100 + 128 x 10 =
  // 2,080 us against 8 x 90 + 128 x 9 = 1,872).
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(100, 10), {}, {}, Us(90, 9))), MatMulMode::kF32);
  // bf16 clearly faster than f32 but not than q16, which is not clearly
  // faster than f32 either: the exact mode (f32 2,080 us, q16 1,800, bf16
  // 1,700).
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(100, 10), Us(85, 7.96875), {}, Us(90, 8.4375))),
            MatMulMode::kF32);
  // bf16 must beat q16 (not only f32) by the margin to take over from it.
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(600, 30), Us(250, 13), {}, Us(300, 15))),
            MatMulMode::kQ16);
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(600, 30), Us(200, 10), {}, Us(300, 15))),
            MatMulMode::kBf16);
  // Without q16 (no VNNI), f32 against bf16. Illustrative timings of three
  // kinds of machine (docs/performance.md has the measured ones). Zen
  // 4-like: bf16 faster at both.
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(600, 30), Us(300, 20))), MatMulMode::kBf16);
  // bf16 slower at prompts and much faster at a decode row: the reference
  // request (512 prompt rows, 128 decode rows) decides.
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(500, 60), Us(550, 25))), MatMulMode::kBf16);
  // bf16 faster per decode row, but not by enough to pay for a slower
  // prompt.
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(500, 30), Us(700, 25))), MatMulMode::kF32);
  // No bf16 instructions (AVX2 CPUs).
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(500, 60), {})), MatMulMode::kF32);
  // Near parity the exact mode wins: bf16 must be clearly faster (f32 at
  // 1.15x bf16's reference request: 8 x 100 + 128 x 10 = 2,080 us against
  // 1,808).
  EXPECT_EQ(ChooseAutoMatMulMode(Timings(Us(100, 10), Us(100, 7.875))), MatMulMode::kF32);
  EXPECT_DOUBLE_EQ(ReferenceRequestUs({.prompt_64_rows_us = 100, .decode_row_us = 10}), 2080);
  // This machine's measurement: real times, bf16 only where the build has
  // the instructions, and "auto" is what the rule makes of it.
  const ModeTimings timings = MeasureModeTimings();
#ifdef TANDEM_CPU_AVX512
  EXPECT_GT(timings.f32.prompt_64_rows_us, 0);
  EXPECT_GT(timings.f32.decode_row_us, 0);
  // 64 rows cost more than one (each row is 256 x 1024 multiply-adds).
  EXPECT_GT(timings.f32.prompt_64_rows_us, timings.f32.decode_row_us);
#endif
  EXPECT_EQ(timings.bf16.prompt_64_rows_us > 0, HasBf16Products());
#ifdef TANDEM_CPU_AVX512
  EXPECT_EQ(timings.q8.prompt_64_rows_us > 0, HasInt8Products());
#endif
  EXPECT_EQ(timings.q16.prompt_64_rows_us > 0, HasTwoDigitProducts());
  const absl::StatusOr<MatMulMode> mode = ParseMatMulMode("auto");
  ASSERT_TRUE(mode.ok());
  EXPECT_EQ(*mode, AutoMatMulMode().mode);
  EXPECT_NE(*mode, MatMulMode::kQ8);
#ifdef TANDEM_CPU_AVX512
  // The log names q8's share of the chosen mode's time where it was timed.
  if (HasInt8Products()) {
    EXPECT_NE(AutoMatMulMode().reason.find("--cpu_matmul=q8 takes "), std::string::npos);
  }
#endif
  EXPECT_NE(AutoMatMulMode().reason, "");
  std::printf("auto: %s (%s)\n", std::string(MatMulModeName(*mode)).c_str(),
              AutoMatMulMode().reason.c_str());
}

TEST(MatMulTest, BiasIsAddedPerOutputFeature) {
  std::mt19937 rng(3);
  std::vector<uint8_t> bytes = RandomWeights(DType::kF32, 8, 64, rng);
  const Weight w{DType::kF32, 8, 64, bytes.data()};
  std::vector<float> bias_values = {1, 2, 3, 4, 5, 6, 7, 8};
  const Weight bias{DType::kF32, 1, 8, bias_values.data()};
  std::vector<float> x = RandomRows(2, 64, rng);
  std::vector<float> plain(16), biased(16);
  CpuBackend backend(1);
  const Weight* ws[] = {&w};
  const Weight* bs[] = {&bias};
  const Matrix plain_out[] = {View(plain, 2, 8)};
  const Matrix biased_out[] = {View(biased, 2, 8)};
  backend.MatMul(View(x, 2, 64), ws, {}, plain_out);
  backend.MatMul(View(x, 2, 64), ws, bs, biased_out);
  for (int i = 0; i < 16; ++i)
    EXPECT_EQ(biased[static_cast<size_t>(i)],
              plain[static_cast<size_t>(i)] + bias_values[static_cast<size_t>(i % 8)]);
}

#ifdef TANDEM_CPU_AVX2
TEST(PackedMatMulTest, PackableWeightsArePackedAndStayUsableAsEmbeddingTables) {
  std::mt19937 rng(21);
  const int64_t n = 48, k = 64;
  std::vector<uint8_t> bytes = RandomWeights(DType::kQ8_0, n, k, rng);
  CpuBackend backend(1);
  const Weight w = Upload(backend, DType::kQ8_0, n, k, bytes);
  ASSERT_NE(w.packed, nullptr);
  EXPECT_EQ(Upload(backend, DType::kQ8_0, n - 8, k, bytes).packed, nullptr);  // 40 % 16 != 0
  EXPECT_EQ(CpuBackend(1, MatMulMode::kQ8).UploadWeight(DType::kQ8_0, n, k, bytes.data())->packed !=
                nullptr,
            HasInt8Products());
  // A tied embedding table reads the original rows: row 37 exactly.
  std::vector<float> row(static_cast<size_t>(k)), expected(static_cast<size_t>(k));
  const int32_t ids[] = {37};
  backend.Embed(w, ids, View(row, 1, k));
  DequantizeRow(DType::kQ8_0, bytes.data() + 37 * RowBytes(DType::kQ8_0, k), k, expected.data());
  EXPECT_TRUE(SameBits(row.data(), expected.data(), k));
}

TEST(PackedMatMulTest, FloatPanelsAreOneFmaChainOverExactlyDequantizeRowsWeights) {
  // packed_matmul.h's contract, bit for bit: out = fma(x[k], w[k], ...) in
  // input order with w as DequantizeRow gives it. A panel that decodes one
  // weight differently (a scale, a sub-block, a nibble, a rounding) differs
  // here. The K-quants and IQ4_XS are packed in every mode (q8 multiplies
  // them by these float32 panels where it has no integer ones), the others
  // in f32 and bf16; F16 and BF16 in every mode, F16 multiplied by these
  // panels in every mode and BF16 in f32 and q8.
  std::mt19937 rng(31);
  const int64_t n = 48, k = 768;
  for (DType type :
       {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kIQ4_NL, DType::kQ4_K,
        DType::kQ5_K, DType::kQ6_K, DType::kQ5_1, DType::kIQ4_XS, DType::kF16, DType::kBF16}) {
    std::vector<uint8_t> bytes = RandomWeights(type, n, k, rng);
    std::vector<float> wf(static_cast<size_t>(n * k));
    for (int64_t r = 0; r < n; ++r) {
      DequantizeRow(type, bytes.data() + static_cast<size_t>(r) * RowBytes(type, k), k,
                    &wf[static_cast<size_t>(r * k)]);
    }
    for (MatMulMode mode : {MatMulMode::kF32, MatMulMode::kQ8, MatMulMode::kBf16}) {
      if (mode == MatMulMode::kBf16 && !HasBf16Products()) continue;
      CpuBackend backend(2, mode);
      const Weight w = Upload(backend, type, n, k, bytes);
      const bool q8_kernel = HasQ8Kernel(type) || WidensToQ8_0(type);
      const bool int8_panels = mode == MatMulMode::kQ8 && HasInt8Products();
      ASSERT_EQ(w.packed != nullptr, mode != MatMulMode::kQ8 || !q8_kernel || int8_panels)
          << Info(type).name << " " << MatMulModeName(mode);
      const bool float_panels = w.packed != nullptr &&
                                !(mode == MatMulMode::kBf16 && HasBf16Panels(type)) &&
                                !(int8_panels && HasInt8Panels(type));
      if (!float_panels) continue;
      // Decoded on the fly (AVX-512: 1, 2, 3, 9; AVX2: 1, 2, 3) and from
      // dequantized panels (AVX-512: 17; AVX2: 9 and 17).
      for (const int64_t m : {1, 2, 3, 9, 17}) {
        const std::vector<float> x = RandomRows(m, k, rng);
        std::vector<int64_t> all(static_cast<size_t>(m));
        std::iota(all.begin(), all.end(), 0);
        const std::vector<float> out = RunMatMul(backend, w, x, all);
        for (int64_t r = 0; r < m; ++r) {
          for (int64_t c = 0; c < n; ++c) {
            float acc = 0.0f;
            for (int64_t i = 0; i < k; ++i) {
              acc = std::fma(x[static_cast<size_t>(r * k + i)], wf[static_cast<size_t>(c * k + i)],
                             acc);
            }
            ASSERT_EQ(Float2Bits(out[static_cast<size_t>(r * n + c)]), Float2Bits(acc))
                << Info(type).name << " (" << MatMulModeName(mode) << ") at [" << r << "][" << c
                << "] of " << m << " rows";
          }
        }
      }
    }
  }
}

// One weight block as packed_matmul_int8.h's arithmetic reads it: the
// values its quants stand for (for IQ4, the levels) and the scale of each
// run of inputs, from the GGUF block by the scalar readers.
struct IntegerBlock {
  int runs = 1;
  float d[2] = {0, 0};
  bool has_min = false;
  float m = 0;
  int v[32] = {};
};

IntegerBlock ReadIntegerBlock(DType type, const uint8_t* row, int64_t b) {
  IntegerBlock out;
  auto nibble = [](const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4; };
  if (type == DType::kQ4_0 || type == DType::kQ4_1 || type == DType::kQ5_0 ||
      type == DType::kQ8_0) {
    if (type == DType::kQ5_0) {
      const auto& block = reinterpret_cast<const BlockQ5_0*>(row)[b];
      out.d[0] = HalfToFloat(block.d);
      int q[32];
      FiveBitValues(block.qs, block.qh, q);
      for (int j = 0; j < 32; ++j) out.v[j] = q[j] - 16;
    } else if (type == DType::kQ8_0) {
      const auto& block = reinterpret_cast<const BlockQ8_0*>(row)[b];
      out.d[0] = HalfToFloat(block.d);
      for (int j = 0; j < 32; ++j) out.v[j] = block.qs[j];
    } else if (type == DType::kQ4_0) {
      const auto& block = reinterpret_cast<const BlockQ4_0*>(row)[b];
      out.d[0] = HalfToFloat(block.d);
      for (int j = 0; j < 32; ++j) out.v[j] = nibble(block.qs, j) - 8;
    } else {
      const auto& block = reinterpret_cast<const BlockQ4_1*>(row)[b];
      out.d[0] = HalfToFloat(block.d);
      out.has_min = true;
      out.m = HalfToFloat(block.m);
      for (int j = 0; j < 32; ++j) out.v[j] = nibble(block.qs, j);
    }
    return out;
  }
  const Block32 block = ReadBlock32(type, row, b);
  const bool levels = type == DType::kIQ4_NL || type == DType::kIQ4_XS;
  out.runs = type == DType::kQ6_K ? 2 : 1;
  for (int run = 0; run < out.runs; ++run) {
    out.d[run] = HalfToFloat(block.d) * static_cast<float>(block.scale[run]);
  }
  out.has_min = type == DType::kQ4_K || type == DType::kQ5_K || type == DType::kQ5_1;
  out.m = -(HalfToFloat(block.dmin) * static_cast<float>(block.min));
  for (int j = 0; j < 32; ++j) out.v[j] = levels ? kIq4NlLevels[block.q[j]] : block.q[j];
  return out;
}

// The quantized types whose packed panels have an integer arithmetic to
// check bit for bit (ReadIntegerBlock reads them all).
constexpr DType kPanelContractTypes[] = {DType::kQ8_0,   DType::kQ4_0,  DType::kQ4_1, DType::kQ5_0,
                                         DType::kQ4_K,   DType::kQ5_K,  DType::kQ6_K, DType::kQ5_1,
                                         DType::kIQ4_NL, DType::kIQ4_XS};

// For each of those types, uploads an 80 x 768 weight to a backend of
// `mode`, multiplies rows of activations from make_rows(m) for each m in
// `row_counts`, and requires every output's bits to be expected(x row,
// weight row's GGUF bytes, type, blocks). The weight must take panels of its
// own type.
template <typename MakeRows, typename Expected>
void ExpectPanelContract(MatMulMode mode, std::initializer_list<int64_t> row_counts,
                         std::mt19937& rng, MakeRows make_rows, Expected expected) {
  const int64_t n = 80, k = 768, blocks = k / 32;
  for (DType type : kPanelContractTypes) {
    std::vector<uint8_t> bytes = RandomWeights(type, n, k, rng);
    CpuBackend backend(2, mode);
    const Weight w = Upload(backend, type, n, k, bytes);
    ASSERT_NE(w.packed, nullptr) << Info(type).name;
    ASSERT_EQ(w.dtype, type) << "multiplied by panels of its own";
    for (const int64_t m : row_counts) {
      const std::vector<float> x = make_rows(m, k);
      std::vector<int64_t> all(static_cast<size_t>(m));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<float> out = RunMatMul(backend, w, x, all);
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          const uint8_t* row = bytes.data() + static_cast<size_t>(c) * RowBytes(type, k);
          const float want = expected(&x[static_cast<size_t>(r * k)], row, type, blocks);
          ASSERT_EQ(Float2Bits(out[static_cast<size_t>(r * n + c)]), Float2Bits(want))
              << Info(type).name << " at [" << r << "][" << c << "] of " << m << " rows";
        }
      }
    }
  }
}

TEST(PackedMatMulTest, IntegerPanelsFollowTheirContractBitForBit) {
  // packed_matmul_int8.h's arithmetic, computed here by scalar code from the
  // GGUF blocks: exact integer dots per run, fma(D * a.d, dot, acc), then
  // fma(M, a.ds, acc). A reordered quant, a wrong bias, a run's scale or a
  // minimum taken wrongly changes the bits. Row counts that take each tile
  // shape of both kernels: one row (VNNI: four panels at a time; AVX2: one
  // panel), two, three and nine (VNNI: tiles of four rows and a remainder;
  // AVX2: of two).
  if (!HasInt8Products()) GTEST_SKIP() << "no integer panels in this build (no AVX2)";
  std::mt19937 rng(37);
  ExpectPanelContract(
      MatMulMode::kQ8, {1, 2, 3, 9}, rng,
      [&](int64_t m, int64_t k) { return RandomRows(m, k, rng); },
      [](const float* x, const uint8_t* row, DType type, int64_t blocks) {
        std::vector<ActivationBlock> a(static_cast<size_t>(blocks));
        QuantizeActivationRow(x, blocks * 32, a.data());
        float acc = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const IntegerBlock block = ReadIntegerBlock(type, row, b);
          const ActivationBlock& ab = a[static_cast<size_t>(b)];
          const int run_inputs = 32 / block.runs;
          for (int run = 0; run < block.runs; ++run) {
            int32_t dot = 0;
            for (int j = run * run_inputs; j < (run + 1) * run_inputs; ++j) {
              dot += block.v[j] * ab.q[j];
            }
            acc = std::fma(block.d[run] * ab.d, static_cast<float>(dot), acc);
          }
          if (block.has_min) acc = std::fma(block.m, ab.ds, acc);
        }
        return acc;
      });
}

TEST(MatMulQ8Test, QuantizedActivationsAreTheirDefinitionBitForBit) {
  // matmul_q8.h's blocks, computed here one value at a time: d = amax / 127
  // rounded through half precision, q = nearbyint(x * (127 / amax)) (ties to
  // even) within -127..127 (NaN -> 0), the sums of each 16 quants, s and ds.
  // The vector code must give the same bits: a wrong lane order, rounding,
  // limit or sum changes them. Blocks of random values, of zeros, of values
  // on the rounding ties, with a NaN, with infinities, and one so small that
  // 127 / amax overflows. No quant may be -128 (AVX2's integer kernel has no
  // room for it).
  std::mt19937 rng(53);
  const int64_t blocks = 24;
  std::vector<float> x = RandomRows(1, blocks * 32, rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(32 + j)] = 0.0f;  // block 1
  for (int j = 0; j < 32; ++j) {  // block 2: amax 127, so each quant is x rounded
    x[static_cast<size_t>(64 + j)] = j == 0 ? -127.0f : static_cast<float>(j) - 15.5f;
  }
  x[100] *= 1e-30f;  // block 3: quants mostly tiny against one large
  x[101] = 3e4f;
  x[4 * 32 + 5] = std::numeric_limits<float>::quiet_NaN();  // block 4
  x[5 * 32 + 7] = std::numeric_limits<float>::infinity();   // block 5
  x[5 * 32 + 9] = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(6 * 32 + j)] = j % 3 == 0 ? 0.0f : 1e-38f;
  std::vector<ActivationBlock> got(static_cast<size_t>(blocks));
  QuantizeActivationRow(x.data(), blocks * 32, got.data());
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = &x[static_cast<size_t>(b * 32)];
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float inverse = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sums[2] = {0, 0};
    const ActivationBlock& a = got[static_cast<size_t>(b)];
    for (int j = 0; j < 32; ++j) {
      const float r = std::nearbyint(v[j] * inverse);
      const int q = std::isnan(r) ? 0 : static_cast<int>(std::clamp(r, -127.0f, 127.0f));
      ASSERT_EQ(a.q[j], q) << "block " << b << ", input " << j;
      ASSERT_GE(a.q[j], -127) << "block " << b << ", input " << j;
      sums[j / 16] += q;
    }
    const float d = HalfToFloat(FloatToHalf(amax / 127.0f));
    EXPECT_EQ(a.sums[0], sums[0]) << "block " << b;
    EXPECT_EQ(a.sums[1], sums[1]) << "block " << b;
    if (b == 4 || b == 5) continue;  // d, s and ds are NaN or infinite there
    EXPECT_EQ(Float2Bits(a.d), Float2Bits(d)) << "block " << b;
    EXPECT_EQ(Float2Bits(a.ds), Float2Bits(d * static_cast<float>(sums[0] + sums[1])))
        << "block " << b;
    EXPECT_EQ(
        Float2Bits(a.s),
        Float2Bits(HalfToFloat(FloatToHalf(amax / 127.0f * static_cast<float>(sums[0] + sums[1])))))
        << "block " << b;
  }
  // Block 2's ties went to even: -14.5 -> -14, 0.5 -> 0, 1.5 -> 2, 15.5 -> 16.
  EXPECT_EQ(got[2].q[0], -127);
  EXPECT_EQ(got[2].q[1], -14);
  EXPECT_EQ(got[2].q[16], 0);
  EXPECT_EQ(got[2].q[17], 2);
  EXPECT_EQ(got[2].q[31], 16);
  // The NaN's quant is 0. Infinities make amax infinite and the inverse 0,
  // so theirs are NaN, then 0. The tiny block's inverse is infinite: its
  // zeros give NaN (0) and the rest the limit 127.
  EXPECT_EQ(got[4].q[5], 0);
  EXPECT_EQ(got[5].q[7], 0);
  EXPECT_EQ(got[5].q[9], 0);
  EXPECT_EQ(got[6].q[0], 0);
  EXPECT_EQ(got[6].q[1], 127);
}

TEST(TwoDigitActivationsTest, BlocksAreTheirDefinitionBitForBit) {
  // two_digit_activations.h's blocks, computed here one value at a time:
  // d = amax / 32,639, Q = nearbyint(x * (32,639 / amax)) (ties to even)
  // within +-32,639 (NaN -> 0), hi = floor((Q + 128) / 256) and lo = Q -
  // 256 hi, the sums of each 16 Q and ds. The vector code must give the same
  // bits. Blocks of random values, of zeros, of values on the rounding
  // ties, with a NaN, with infinities, and one so small that the inverse
  // overflows.
  std::mt19937 rng(59);
  const int64_t blocks = 24;
  std::vector<float> x = RandomRows(1, blocks * 32, rng);
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(32 + j)] = 0.0f;  // block 1
  for (int j = 0; j < 32; ++j) {  // block 2: amax 32,639, so each Q is x rounded
    x[static_cast<size_t>(64 + j)] = j == 0 ? -32639.0f : static_cast<float>(j) * 1000.0f - 15.5f;
  }
  x[100] *= 1e-30f;  // block 3: most values tiny against one large
  x[101] = 3e4f;
  x[4 * 32 + 5] = std::numeric_limits<float>::quiet_NaN();  // block 4
  x[5 * 32 + 7] = std::numeric_limits<float>::infinity();   // block 5
  x[5 * 32 + 9] = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < 32; ++j) x[static_cast<size_t>(6 * 32 + j)] = j % 3 == 0 ? 0.0f : 1e-38f;
  std::vector<TwoDigitBlock> got(static_cast<size_t>(blocks));
  QuantizeTwoDigitRow(x.data(), blocks * 32, got.data());
  for (int64_t b = 0; b < blocks; ++b) {
    const float* v = &x[static_cast<size_t>(b * 32)];
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
    const float inverse = amax != 0.0f ? 32639.0f / amax : 0.0f;
    int sums[2] = {0, 0};
    const TwoDigitBlock& a = got[static_cast<size_t>(b)];
    for (int j = 0; j < 32; ++j) {
      const float r = std::nearbyint(v[j] * inverse);
      const int q = std::isnan(r) ? 0 : static_cast<int>(std::clamp(r, -32639.0f, 32639.0f));
      ASSERT_EQ(256 * a.hi[j] + a.lo[j], q) << "block " << b << ", input " << j;
      ASSERT_EQ(a.hi[j], static_cast<int>(std::floor((q + 128) / 256.0)))
          << "block " << b << ", input " << j;
      ASSERT_GE(a.hi[j], -127) << "block " << b << ", input " << j;
      sums[j / 16] += q;
    }
    EXPECT_EQ(a.sums[0], sums[0]) << "block " << b;
    EXPECT_EQ(a.sums[1], sums[1]) << "block " << b;
    if (b == 4 || b == 5) continue;  // d and ds are NaN or infinite there
    const float d = amax / 32639.0f;
    EXPECT_EQ(Float2Bits(a.d), Float2Bits(d)) << "block " << b;
    EXPECT_EQ(Float2Bits(a.ds), Float2Bits(d * static_cast<float>(sums[0] + sums[1])))
        << "block " << b;
  }
  // Block 2: the limit in both digits' extremes, and ties to even (984.5 ->
  // 984 = 3 x 256 + 216, so hi 4 and lo -40).
  EXPECT_EQ(got[2].hi[0], -127);
  EXPECT_EQ(got[2].lo[0], -127);
  EXPECT_EQ(256 * got[2].hi[1] + got[2].lo[1], 984);
  EXPECT_EQ(got[2].hi[1], 4);
  EXPECT_EQ(got[2].lo[1], -40);
  // The NaN's Q is 0; infinities make the inverse 0 and theirs 0; the tiny
  // block's inverse is infinite: its zeros give 0 and the rest the limit.
  EXPECT_EQ(256 * got[4].hi[5] + got[4].lo[5], 0);
  EXPECT_EQ(256 * got[5].hi[7] + got[5].lo[7], 0);
  EXPECT_EQ(256 * got[6].hi[0] + got[6].lo[0], 0);
  EXPECT_EQ(256 * got[6].hi[1] + got[6].lo[1], 32639);
}

TEST(PackedMatMulTest, TwoDigitProductsFollowTheirContractBitForBit) {
  // packed_matmul_int8.h's q16 arithmetic, computed here by scalar code
  // from the GGUF blocks: per run the exact integer 256 x (quants . hi) +
  // (quants . lo), then fma(D * a.d, that, acc), then fma(M, a.ds, acc). A
  // digit multiplied by the wrong weight, a lost shift or a wrong bias
  // changes the bits. One row (four panels at a time), two, three and nine
  // (tiles of four rows and a remainder).
  if (!HasTwoDigitProducts()) GTEST_SKIP() << "no AVX-512 VNNI in this build";
  std::mt19937 rng(41);
  ExpectPanelContract(
      MatMulMode::kQ16, {1, 2, 3, 9}, rng,
      [&](int64_t m, int64_t k) { return RandomRows(m, k, rng); },
      [](const float* x, const uint8_t* row, DType type, int64_t blocks) {
        std::vector<TwoDigitBlock> a(static_cast<size_t>(blocks));
        QuantizeTwoDigitRow(x, blocks * 32, a.data());
        float acc = 0.0f;
        for (int64_t b = 0; b < blocks; ++b) {
          const IntegerBlock block = ReadIntegerBlock(type, row, b);
          const TwoDigitBlock& ab = a[static_cast<size_t>(b)];
          const int run_inputs = 32 / block.runs;
          for (int run = 0; run < block.runs; ++run) {
            int32_t dot = 0;
            for (int j = run * run_inputs; j < (run + 1) * run_inputs; ++j) {
              dot += block.v[j] * (256 * ab.hi[j] + ab.lo[j]);
            }
            acc = std::fma(block.d[run] * ab.d, static_cast<float>(dot), acc);
          }
          if (block.has_min) acc = std::fma(block.m, ab.ds, acc);
        }
        return acc;
      });
}

TEST(PackedMatMulTest, BfloatPanelsFollowTheirContractBitForBit) {
  // packed_matmul.h's bf16 arithmetic, computed here by scalar code from the
  // GGUF blocks: per run of inputs fma(D, dot, acc), then fma(M, block sum of
  // x, acc), where the formats of nibbles and five bits multiply their
  // unsigned quants plus 128 and take the bias back in M (one rounding:
  // M = fma(-D, bias, m)). The activations are small integers, so every pair product and
  // every partial sum of a run is exact and the dot product has one value
  // whatever the instruction's internal order: the bits then check each
  // panel's decoding (a nibble, a fifth or sixth bit, a level, a scale or a
  // minimum taken wrongly changes them). 1, 3 and 9 rows decode on the fly,
  // 40 on the fly for plain nibbles and from decoded panels for the others,
  // 70 from decoded panels.
  if (!HasBf16Products()) GTEST_SKIP() << "no AVX-512 BF16 in this build";
  std::mt19937 rng(41);
  auto small_integers = [&](int64_t m, int64_t k) {
    std::uniform_int_distribution<int> small(-8, 8);
    std::vector<float> x(static_cast<size_t>(m * k));
    for (float& v : x) v = static_cast<float>(small(rng));
    return x;
  };
  ExpectPanelContract(MatMulMode::kBf16, {1, 3, 9, 40, 70}, rng, small_integers,
                      [](const float* x, const uint8_t* row, DType type, int64_t blocks) {
                        // The bias on v: 128 plus what ReadIntegerBlock took off the
                        // stored quant (Q4_0's 8, Q5_0's 16).
                        int bias = 0;
                        if (type == DType::kQ4_1 || type == DType::kQ4_K || type == DType::kQ5_K ||
                            type == DType::kQ5_1) {
                          bias = 128;
                        } else if (type == DType::kQ4_0) {
                          bias = 136;
                        } else if (type == DType::kQ5_0) {
                          bias = 144;
                        }
                        float acc = 0.0f;
                        for (int64_t b = 0; b < blocks; ++b) {
                          IntegerBlock block = ReadIntegerBlock(type, row, b);
                          if (bias != 0) {
                            for (int& v : block.v) v += bias;
                            block.m = std::fma(-block.d[0], static_cast<float>(bias),
                                               block.has_min ? block.m : 0.0f);
                            block.has_min = true;
                          }
                          const float* xb = x + b * 32;
                          const int run_inputs = 32 / block.runs;
                          for (int run = 0; run < block.runs; ++run) {
                            float dot = 0.0f;
                            for (int j = run * run_inputs; j < (run + 1) * run_inputs; ++j) {
                              dot += static_cast<float>(block.v[j]) * xb[j];
                            }
                            acc = std::fma(block.d[run], dot, acc);
                          }
                          if (block.has_min) {
                            float sum = 0.0f;
                            for (int j = 0; j < 32; ++j) sum += xb[j];
                            acc = std::fma(block.m, sum, acc);
                          }
                        }
                        return acc;
                      });
}

TEST(PackedMatMulTest, Q5_0PanelsGiveExactlyTheBitsOfTheQ8_0BlocksItWidensTo) {
  // Q5_0 kept its arithmetic when it got panels of its own: in the f32 and
  // q8 modes, at every row count on both sides of each kernel switch, its
  // products are bitwise those of the same weight widened to Q8_0 blocks.
  // (The bf16 mode multiplies five-bit quants plus a bias, bytes without
  // one: BfloatPanelsFollowTheirContractBitForBit checks each.)
  std::mt19937 rng(43);
  const int64_t n = 80, k = 768;
  const std::vector<uint8_t> bytes = RandomWeights(DType::kQ5_0, n, k, rng);
  std::vector<uint8_t> widened(static_cast<size_t>(n) * RowBytes(DType::kQ8_0, k));
  WidenToQ8_0(DType::kQ5_0, bytes.data(), n * k / 32, reinterpret_cast<BlockQ8_0*>(widened.data()));
  for (MatMulMode mode : {MatMulMode::kF32, MatMulMode::kQ8}) {
    CpuBackend a(2, mode), b(2, mode);
    const Weight own = Upload(a, DType::kQ5_0, n, k, bytes);
    const Weight as_q8_0 = Upload(b, DType::kQ8_0, n, k, widened);
    // Q8_0 blocks in q8 without integer panels (its block kernel).
    EXPECT_EQ(own.dtype == DType::kQ5_0, mode != MatMulMode::kQ8 || HasInt8Products())
        << MatMulModeName(mode);
    for (const int64_t m : {1, 4, 9, 17, 33, 70}) {
      const std::vector<float> x = RandomRows(m, k, rng);
      std::vector<int64_t> all(static_cast<size_t>(m));
      std::iota(all.begin(), all.end(), 0);
      const std::vector<float> got = RunMatMul(a, own, x, all);
      const std::vector<float> want = RunMatMul(b, as_q8_0, x, all);
      ASSERT_TRUE(SameBits(got.data(), want.data(), m * n))
          << MatMulModeName(mode) << ", " << m << " rows";
    }
  }
}

TEST(PackedMatMulTest, WeightBytesCountThePanelsAndWidenedBlocksEachModeMakes) {
  // What --kv_cache_memory_fraction takes off the free memory for a 64 x 512
  // weight (32,768 weights): the panels' bytes a weight (docs/architecture.md,
  // "Matrix products") and, for widened types, the 34-byte Q8_0 blocks.
  // q8 as the integer panels (packed_matmul_int8.h) take it, and without
  // them (blocks for Q4_0, Q4_1 and Q8_0, float panels for the others).
  struct Case {
    DType type;
    int64_t f32_bf16, q8, q8_int8;
  };
  const int64_t w = 64 * 512;
  const Case cases[] = {
      {DType::kF32, 0, 0, 0},
      {DType::kQ4_0, w * 288 / 512, 0, w * 288 / 512},  // half d, nibbles
      {DType::kQ4_1, w * 320 / 512, 0, w * 320 / 512},
      {DType::kQ8_0, w * 544 / 512, 0, w * 544 / 512},
      {DType::kQ4_K, w * (64 + 8 * 288) / 4096, w * (64 + 8 * 288) / 4096,
       w * (64 + 8 * 288) / 4096},
      // Q6_K: a nibble plane and two planes of top bits.
      {DType::kQ6_K, w * (32 + 8 * 416) / 4096, w * (32 + 8 * 416) / 4096,
       w * (32 + 8 * 416) / 4096},
      // Q5_K and Q5_1: nibbles and a plane of fifth bits; Q5_K's d and dmin
      // once per 8 blocks.
      {DType::kQ5_K, w * (64 + 8 * 352) / 4096, w * (64 + 8 * 352) / 4096,
       w * (64 + 8 * 352) / 4096},
      {DType::kQ5_1, w * 416 / 512, w * 416 / 512, w * 416 / 512},
      {DType::kIQ4_XS, w * 304 / 512, w * 304 / 512, w * 304 / 512},
      {DType::kIQ4_NL, w * 304 / 512, w * 34 / 32, w * 304 / 512},  // q8: widened, as blocks
      // Q5_0: its own panels (d, five bits), or widened to Q8_0 blocks for
      // q8's block kernel.
      {DType::kQ5_0, w * 352 / 512, w * 34 / 32, w * 352 / 512},
      // F16 and BF16: their 16-bit values, in float32 (or bfloat16) panels.
      {DType::kF16, w * 2, w * 2, w * 2},
      {DType::kBF16, w * 2, w * 2, w * 2},
  };
  for (const Case& c : cases) {
    for (MatMulMode mode : {MatMulMode::kF32, MatMulMode::kQ8, MatMulMode::kBf16}) {
      if (mode == MatMulMode::kBf16 && !HasBf16Products()) continue;
      int64_t expected = mode == MatMulMode::kQ8 ? c.q8 : c.f32_bf16;
      if (mode == MatMulMode::kQ8 && HasInt8Products()) expected = c.q8_int8;
      EXPECT_EQ(CpuBackend(1, mode).WeightBytes(c.type, 64, 512), expected)
          << Info(c.type).name << " " << MatMulModeName(mode);
    }
  }
  // Rows that are not whole panels are not packed (Q5_0 is still widened).
  EXPECT_EQ(CpuBackend(1).WeightBytes(DType::kQ4_K, 40, 512), 0);
  EXPECT_EQ(CpuBackend(1).WeightBytes(DType::kQ5_0, 40, 512), 40 * 512 * 34 / 32);
}

TEST(PackedMatMulTest, AWeightAfterAnUnpackableOneIsStillBatchInvariant) {
  // One call with two weights: 24 rows (not whole panels) and then 64 packed
  // rows. Each weight starts its own task ranges, so the packed one is cut
  // into whole panels whatever the batch.
  std::mt19937 rng(23);
  const int64_t k = 256, m = 13;
  std::vector<uint8_t> first_bytes = RandomWeights(DType::kQ4_1, 24, k, rng);
  std::vector<uint8_t> second_bytes = RandomWeights(DType::kQ4_1, 64, k, rng);
  const std::vector<float> x = RandomRows(m, k, rng);
  auto run = [&](int threads, const std::vector<int64_t>& rows) {
    CpuBackend backend(threads);
    const Weight first = Upload(backend, DType::kQ4_1, 24, k, first_bytes);
    const Weight second = Upload(backend, DType::kQ4_1, 64, k, second_bytes);
    EXPECT_EQ(first.packed, nullptr);
    EXPECT_NE(second.packed, nullptr);
    std::vector<float> in;
    for (int64_t r : rows) {
      in.insert(in.end(), x.begin() + r * k, x.begin() + (r + 1) * k);
    }
    const auto count = static_cast<int64_t>(rows.size());
    std::vector<float> out_first(static_cast<size_t>(count * 24));
    std::vector<float> out_second(static_cast<size_t>(count * 64));
    const Weight* ws[] = {&first, &second};
    const Matrix outs[] = {View(out_first, count, 24), View(out_second, count, 64)};
    backend.MatMul(View(in, count, k), ws, {}, outs);
    return out_second;
  };
  std::vector<int64_t> all(static_cast<size_t>(m));
  std::iota(all.begin(), all.end(), 0);
  for (int threads : {1, 2, 3}) {
    const std::vector<float> batched = run(threads, all);
    for (int64_t r = 0; r < m; ++r) {
      const std::vector<float> alone = run(1, {r});
      ASSERT_TRUE(SameBits(&batched[static_cast<size_t>(r * 64)], alone.data(), 64))
          << "row " << r << " on " << threads << " threads";
    }
  }
}
#endif  // TANDEM_CPU_AVX2

TEST(RmsNormTest, MatchesFloat64AndIsRowIndependent) {
  std::mt19937 rng(9);
  const int64_t rows = 9, cols = 576;
  std::vector<float> x = RandomRows(rows, cols, rng);
  std::vector<float> weight = RandomRows(1, cols, rng);
  const Weight w{DType::kF32, 1, cols, weight.data()};
  CpuBackend backend(2);
  std::vector<float> out(x.size());
  backend.RmsNorm(View(x, rows, cols), w, 1e-5f, View(out, rows, cols));
  for (int64_t r = 0; r < rows; ++r) {
    double ms = 0;
    for (int64_t i = 0; i < cols; ++i)
      ms += double{x[static_cast<size_t>(r * cols + i)]} * x[static_cast<size_t>(r * cols + i)];
    const double scale = 1.0 / std::sqrt(ms / cols + 1e-5);
    for (int64_t i = 0; i < cols; ++i) {
      const double expected =
          x[static_cast<size_t>(r * cols + i)] * scale * weight[static_cast<size_t>(i)];
      ASSERT_NEAR(out[static_cast<size_t>(r * cols + i)], expected,
                  1e-5 * std::fabs(expected) + 1e-6);
    }
    std::vector<float> alone(static_cast<size_t>(cols));
    std::vector<float> row(x.begin() + r * cols, x.begin() + (r + 1) * cols);
    backend.RmsNorm(View(row, 1, cols), w, 1e-5f, View(alone, 1, cols));
    ASSERT_TRUE(SameBits(alone.data(), &out[static_cast<size_t>(r * cols)], cols)) << "row " << r;
  }
}

TEST(RopeTest, RotatesPairsByPositionInBothLayouts) {
  const int heads = 2, head_dim = 8, rotary = 8, positions = 6;
  std::vector<float> table(static_cast<size_t>(positions * rotary));
  for (int p = 0; p < positions; ++p) {
    for (int i = 0; i < rotary / 2; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / rotary);
      table[static_cast<size_t>((p * rotary / 2 + i) * 2)] = static_cast<float>(std::cos(angle));
      table[static_cast<size_t>((p * rotary / 2 + i) * 2 + 1)] =
          static_cast<float>(std::sin(angle));
    }
  }
  for (bool neox : {false, true}) {
    RopeSpec spec{Weight{DType::kF32, positions, rotary, table.data()}, rotary, neox};
    std::mt19937 rng(1);
    std::vector<float> x = RandomRows(positions, heads * head_dim, rng);
    const std::vector<float> original = x;
    std::vector<int32_t> pos(positions);
    std::iota(pos.begin(), pos.end(), 0);
    CpuBackend backend(1);
    backend.Rope(View(x, positions, heads * head_dim), heads, head_dim, pos, spec);
    for (int p = 0; p < positions; ++p) {
      for (int h = 0; h < heads; ++h) {
        for (int i = 0; i < rotary / 2; ++i) {
          const int a = neox ? i : 2 * i, b = neox ? i + rotary / 2 : 2 * i + 1;
          const size_t base = static_cast<size_t>(p * heads * head_dim + h * head_dim);
          const double angle = p * std::pow(10000.0, -2.0 * i / rotary);
          const double x0 = original[base + a], x1 = original[base + b];
          EXPECT_NEAR(x[base + a], x0 * std::cos(angle) - x1 * std::sin(angle), 1e-5);
          EXPECT_NEAR(x[base + b], x0 * std::sin(angle) + x1 * std::cos(angle), 1e-5);
        }
      }
    }
  }
}

// Runs a gated product (SiluMul or GeluMul) on 3 rows of 100 (vector lanes
// and a scalar tail), gates spread by `spread`, and checks each output
// against activation(gate) * up in float64 within `relative`.
template <typename Run, typename Activation>
void ExpectGatedProduct(uint32_t seed, float spread, double relative, double absolute, Run run,
                        Activation activation) {
  std::mt19937 rng(seed);
  std::vector<float> g = RandomRows(3, 100, rng), u = RandomRows(3, 100, rng), out(300);
  for (float& v : g) v *= spread;
  CpuBackend backend(1);
  run(backend, View(g, 3, 100), View(u, 3, 100), View(out, 3, 100));
  for (size_t i = 0; i < out.size(); ++i) {
    const double expected = activation(double{g[i]}) * u[i];
    ASSERT_NEAR(out[i], expected, relative * std::fabs(expected) + absolute) << "x = " << g[i];
  }
}

TEST(ElementwiseTest, SiluMulMatchesFloat64) {
  ExpectGatedProduct(
      2, 8.0f, 1e-6, 1e-7,
      [](CpuBackend& b, const Matrix& g, const Matrix& u, Matrix o) { b.SiluMul(g, u, o); },
      [](double x) { return x / (1.0 + std::exp(-x)); });
}

TEST(ElementwiseTest, GeluMulMatchesFloat64TanhGelu) {
  ExpectGatedProduct(
      3, 6.0f, 2e-6, 1e-6,
      [](CpuBackend& b, const Matrix& g, const Matrix& u, Matrix o) { b.GeluMul(g, u, o); },
      [](double x) {
        return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
      });
}

TEST(ElementwiseTest, SoftcapAndScaleMatchFloat64) {
  std::mt19937 rng(5);
  std::vector<float> x = RandomRows(3, 101, rng);  // vector lanes and a scalar tail
  for (float& v : x) v *= 40.0f;
  std::vector<float> capped = x, scaled = x;
  CpuBackend backend(1);
  backend.Softcap(View(capped, 3, 101), 30.0f);
  backend.Scale(View(scaled, 3, 101), 24.0f);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(capped[i], 30.0 * std::tanh(double{x[i]} / 30.0), 1e-5) << "x = " << x[i];
    ASSERT_EQ(scaled[i], x[i] * 24.0f);
  }
}

TEST(ElementwiseTest, ScatterAddRowsAddsEachWeightedRowIntoItsTarget) {
  std::mt19937 rng(6);
  std::vector<float> acc = RandomRows(5, 40, rng), x = RandomRows(3, 40, rng);
  const std::vector<float> before = acc;
  const std::vector<int32_t> rows = {4, 0, 2};
  const std::vector<float> weights = {0.25f, -1.5f, 3.0f};
  CpuBackend backend(2);
  backend.ScatterAddRows(View(acc, 5, 40), rows, weights, View(x, 3, 40));
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 40; ++c) {
      float expected = before[static_cast<size_t>(r * 40 + c)];
      for (size_t i = 0; i < rows.size(); ++i) {
        if (rows[i] == r) expected += weights[i] * x[i * 40 + static_cast<size_t>(c)];
      }
      ASSERT_EQ(acc[static_cast<size_t>(r * 40 + c)], expected) << "row " << r << " col " << c;
    }
  }
}

TEST(SimdTest, ExpApproximationIsAccurateAndVectorMatchesScalarBitwise) {
  for (float x = -87.0f; x < 88.0f; x += 0.0137f) {
    const double exact = std::exp(double{x});
    ASSERT_NEAR(ExpApprox(x), exact, 3e-7 * exact) << x;
#ifdef TANDEM_CPU_AVX2
    float lanes[8];
    _mm256_storeu_ps(lanes, Exp8(_mm256_set1_ps(x)));
    ASSERT_EQ(Float2Bits(lanes[3]), Float2Bits(ExpApprox(x))) << x;
#endif
  }
  EXPECT_EQ(ExpApprox(-100.0f), 0.0f);
}

TEST(HalfTest, ConversionsAreExactForEveryHalf) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloatPortable(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(Float2Bits(f), Float2Bits(HalfToFloat(static_cast<uint16_t>(h)))) << h;
    ASSERT_EQ(FloatToHalf(f), h) << "round trip of half " << h;
  }
  // Round to nearest even at the halfway point between two halves.
  EXPECT_EQ(FloatToHalf(1.0f + 0.00048828125f), 0x3c00);  // 1 + 2^-11 -> 1.0
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);               // overflows to infinity
}

#ifdef TANDEM_CPU_AVX512
TEST(HalfTest, HardwareRoundingToHalfMatchesFloatToHalf) {
  // WriteKv stores K and V with the hardware conversion: every non-NaN float
  // (a stride through all of them, normal, subnormal, overflowing and
  // halfway cases included) must round as FloatToHalf does.
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 4099) {
    const float f = Bits2Float(static_cast<uint32_t>(bits));
    if (std::isnan(f)) continue;
    const uint16_t hw = static_cast<uint16_t>(
        _mm_extract_epi16(_mm_cvtps_ph(_mm_set1_ps(f), _MM_FROUND_TO_NEAREST_INT), 0));
    ASSERT_EQ(hw, FloatToHalf(f)) << "float bits " << bits;
  }
  for (const float f : {1.0f + 0.00048828125f, 65520.0f, 65519.99f, 5.96e-8f, 2.98e-8f}) {
    const uint16_t hw = static_cast<uint16_t>(
        _mm_extract_epi16(_mm_cvtps_ph(_mm_set1_ps(f), _MM_FROUND_TO_NEAREST_INT), 0));
    EXPECT_EQ(hw, FloatToHalf(f)) << f;
  }
}
#endif

// Attention over the paged cache: a sequence's outputs are bitwise the same
// computed in one pass, in chunks of any size, or batched with another
// sequence; and they match a float64 softmax attention. Two shapes: a small
// generic one, and the default model's head size (the vector path) over more
// keys and rows than the kernel converts or groups at a time; each also with
// Gemma's sliding window (shorter than the sequence, and for the vector path
// not a multiple of the 64 keys it reads at a time) and soft-capped scores.
struct AttentionCase {
  int head_dim;
  int block_size;
  int length;
  int window = 0;
  float softcap = 0.0f;
  // The bf16 mode: a bfloat16 cache and BF16 dot products (attention_bf16.h).
  bool bf16 = false;
};

class AttentionTest : public ::testing::TestWithParam<AttentionCase> {
 protected:
  static constexpr int kHeads = 6, kKvHeads = 2, kBlocks = 64;

  void SetUp() override {
    head_dim_ = GetParam().head_dim;
    block_size_ = GetParam().block_size;
    length_ = GetParam().length;
    if (GetParam().bf16 && !bf16_attention::Supported(head_dim_)) {
      GTEST_SKIP() << "this build has no AVX-512 BF16 attention";
    }
    backend_ =
        std::make_unique<CpuBackend>(3, GetParam().bf16 ? MatMulMode::kBf16 : MatMulMode::kF32);
    ASSERT_TRUE(backend_->CreateKvCache({1, kBlocks, block_size_, kKvHeads, head_dim_}).ok());
    std::mt19937 rng(4);
    q_ = RandomRows(length_, kHeads * head_dim_, rng);
    k_ = RandomRows(length_, kKvHeads * head_dim_, rng);
    v_ = RandomRows(length_, kKvHeads * head_dim_, rng);
    other_q_ = RandomRows(5, kHeads * head_dim_, rng);
    other_k_ = RandomRows(5, kKvHeads * head_dim_, rng);
    // Scattered blocks: 9, 16, 23, ... (7 is coprime to 64, so all differ).
    const int blocks = (length_ + block_size_ - 1) / block_size_;
    std::vector<bool> used(kBlocks, false);
    for (int b = 0; b < blocks; ++b) {
      table_.push_back((9 + 7 * b) % kBlocks);
      used[static_cast<size_t>(table_.back())] = true;
    }
    for (int b = 0; b < kBlocks && static_cast<int>(other_table_.size()) * block_size_ < 5; ++b) {
      if (!used[static_cast<size_t>(b)]) other_table_.push_back(b);
    }
    std::vector<int32_t> slots, other_slots;
    for (int p = 0; p < length_; ++p)
      slots.push_back(table_[p / block_size_] * block_size_ + p % block_size_);
    for (int p = 0; p < 5; ++p)
      other_slots.push_back(other_table_[p / block_size_] * block_size_ + p % block_size_);
    backend_->WriteKv(0, View(k_, length_, kKvHeads * head_dim_),
                      View(v_, length_, kKvHeads * head_dim_), slots);
    backend_->WriteKv(0, View(other_k_, 5, kKvHeads * head_dim_),
                      View(other_k_, 5, kKvHeads * head_dim_), other_slots);
  }

  AttentionShape Shape() const {
    AttentionShape shape{kHeads, kKvHeads, head_dim_,
                         1.0f / std::sqrt(static_cast<float>(head_dim_))};
    shape.window = GetParam().window;
    shape.softcap = GetParam().softcap;
    return shape;
  }

  // Runs rows [first, first+count) of the sequence, optionally after the
  // other sequence in the same batch.
  std::vector<float> Run(int first, int count, bool with_other) {
    std::vector<float> q;
    std::vector<AttentionSpan> spans;
    int row = 0;
    if (with_other) {
      q.insert(q.end(), other_q_.begin(), other_q_.end());
      spans.push_back({0, 5, 0, other_table_});
      row = 5;
    }
    q.insert(q.end(), q_.begin() + first * kHeads * head_dim_,
             q_.begin() + (first + count) * kHeads * head_dim_);
    spans.push_back({row, count, first, table_});
    std::vector<float> out(q.size());
    const int64_t rows = static_cast<int64_t>(q.size()) / (kHeads * head_dim_);
    backend_->Attention(0, View(q, rows, kHeads * head_dim_), Shape(), spans,
                        View(out, rows, kHeads * head_dim_));
    return std::vector<float>(out.begin() + row * kHeads * head_dim_, out.end());
  }

  int head_dim_ = 0, block_size_ = 0, length_ = 0;
  std::unique_ptr<CpuBackend> backend_;
  std::vector<float> q_, k_, v_, other_q_, other_k_;
  std::vector<int32_t> table_, other_table_;
};

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionTest,
    ::testing::Values(
        AttentionCase{16, 4, 23}, AttentionCase{64, 16, 150}, AttentionCase{16, 4, 23, 5, 0.0f},
        AttentionCase{64, 16, 150, 37, 0.0f}, AttentionCase{64, 16, 150, 70, 1.5f},
        AttentionCase{16, 4, 23, 0, 0.8f},
        // The head sizes of most models from 1.5B up
        // (128) and of Gemma (256).
        AttentionCase{128, 16, 150}, AttentionCase{128, 16, 150, 37, 1.5f},
        AttentionCase{256, 16, 70},
        // The bf16 mode, for each head size it has kernels for;
        // windows of odd and even length (its keys go in pairs
        // from even positions, and in tiles of 16), an odd sequence
        // length, blocks of two tiles.
        AttentionCase{64, 16, 150, 0, 0.0f, true}, AttentionCase{64, 16, 151, 37, 0.0f, true},
        AttentionCase{64, 32, 150, 70, 1.5f, true}, AttentionCase{128, 16, 149, 0, 0.0f, true},
        AttentionCase{128, 16, 150, 37, 1.5f, true}, AttentionCase{256, 16, 71, 0, 0.0f, true},
        // Keys over several chunks of 256 (a decode step's split between
        // threads at chunk boundaries, a prompt's not), with a window
        // across chunk boundaries.
        AttentionCase{64, 16, 600, 0, 0.0f, true}, AttentionCase{64, 16, 601, 300, 1.5f, true},
        AttentionCase{128, 32, 530, 0, 0.0f, true}));

TEST_P(AttentionTest, ChunkedAndBatchedAreBitwiseIdenticalToOnePass) {
  const std::vector<float> whole = Run(0, length_, false);
  for (int chunk : {1, 2, 5, 7, 16, 33}) {
    for (bool with_other : {false, true}) {
      for (int first = 0; first < length_; first += chunk) {
        const int count = std::min(chunk, length_ - first);
        const std::vector<float> part = Run(first, count, with_other);
        ASSERT_TRUE(SameBits(part.data(), &whole[static_cast<size_t>(first * kHeads * head_dim_)],
                             count * kHeads * head_dim_))
            << "chunk " << chunk << " at " << first << (with_other ? " batched" : "");
      }
    }
  }
}

// A verification: the decode token and k - 1 drafted tokens at the end of
// the sequence, as one span, for every k on both sides of the kernel's
// switches (queries read in place or converted, scored two and accumulated
// four at a time with remainders, rows split into tiles): each row gets the
// bits it has when it is computed alone.
TEST_P(AttentionTest, AVerificationsRowsGetTheBitsEachHasAlone) {
  std::vector<std::vector<float>> alone;
  for (int t = 0; t < length_; ++t) alone.push_back(Run(t, 1, false));
  const int row_floats = kHeads * head_dim_;
  for (int k = 2; k <= std::min(length_, 33); ++k) {
    const std::vector<float> rows = Run(length_ - k, k, false);
    for (int i = 0; i < k; ++i) {
      ASSERT_TRUE(SameBits(&rows[static_cast<size_t>(i * row_floats)],
                           alone[static_cast<size_t>(length_ - k + i)].data(), row_floats))
          << "row " << i << " of a verification of " << k << " rows";
    }
  }
}

// Against float64 with the operands rounded as the mode rounds them: the
// cache's halves, or bfloat16 in the bf16 mode, which also rounds the query.
// What is left is float32 summation and exp (1e-5), and in the bf16 mode
// the rounding of each softmax numerator to bfloat16 for the value sum: at
// most 2^-8 of each key's weight (bfloat16's unit roundoff), so an output
// may be off by 2^-8 of the weighted sum of its values' magnitudes, and no
// more.
TEST_P(AttentionTest, MatchesFloat64CausalSoftmaxAttention) {
  const std::vector<float> out = Run(0, length_, false);
  const int window = GetParam().window;
  const double cap = GetParam().softcap;
  const bool bf16 = GetParam().bf16;
  auto stored = [bf16](float f) {
    return bf16 ? double{Bf16ToFloat(FloatToBf16(f))} : double{HalfToFloat(FloatToHalf(f))};
  };
  auto query = [bf16](float f) { return bf16 ? double{Bf16ToFloat(FloatToBf16(f))} : double{f}; };
  for (int t = 0; t < length_; ++t) {
    for (int h = 0; h < kHeads; ++h) {
      const int kv = h / (kHeads / kKvHeads);
      std::vector<double> scores(static_cast<size_t>(t + 1), 0.0);
      const int lowest = window > 0 ? std::max(0, t - window + 1) : 0;
      double max = -1e300;
      for (int j = lowest; j <= t; ++j) {
        double s = 0;
        for (int d = 0; d < head_dim_; ++d) {
          s += query(q_[static_cast<size_t>((t * kHeads + h) * head_dim_ + d)]) *
               stored(k_[static_cast<size_t>((j * kKvHeads + kv) * head_dim_ + d)]);
        }
        s /= std::sqrt(static_cast<double>(head_dim_));
        if (cap > 0) s = cap * std::tanh(s / cap);
        scores[static_cast<size_t>(j)] = s;
        max = std::max(max, s);
      }
      double total = 0;
      for (int j = lowest; j <= t; ++j) {
        double& s = scores[static_cast<size_t>(j)];
        total += (s = std::exp(s - max));
      }
      for (int d = 0; d < head_dim_; ++d) {
        double expected = 0, magnitude = 0;
        for (int j = lowest; j <= t; ++j) {
          const double value = stored(v_[static_cast<size_t>((j * kKvHeads + kv) * head_dim_ + d)]);
          expected += scores[static_cast<size_t>(j)] / total * value;
          magnitude += scores[static_cast<size_t>(j)] / total * std::abs(value);
        }
        const double tolerance = 1e-5 + (bf16 ? magnitude / 256 : 0.0);
        ASSERT_NEAR(out[static_cast<size_t>((t * kHeads + h) * head_dim_ + d)], expected, tolerance)
            << "token " << t << " head " << h << " dim " << d;
      }
    }
  }
}

// The cache's format follows the mode: bfloat16 in the bf16 mode (for the
// head sizes its attention kernels take, in blocks of whole tiles of 16
// keys), laid out as attention_bf16.h says, halves in place otherwise,
// each value rounded to nearest even; and backends share a cache only in
// the format they would read.
TEST(CpuBackendKvCacheTest, ReleasedPagesLeaveMemoryAndReadAsZeros) {
  // Start-up's measurements write KV pages no request reads; released, they
  // stop being resident (mincore) and read as zeros, in the backend that
  // shares the storage too.
  const KvCacheShape shape{2, 64, 16, 3, 64};  // 2 layers, 64 blocks of 16 slots, 3 KV heads
  CpuBackend backend(1), sharer(1);
  ASSERT_TRUE(backend.CreateKvCache(shape).ok());
  ASSERT_TRUE(sharer.ShareKvCache(backend).ok());
  const KvStorage storage = backend.kv_storage();
  const size_t pages = testing::PagesOf(storage);
  auto resident = [&] { return testing::ResidentPages(storage); };
  EXPECT_EQ(resident(), 0);  // mapped, never touched
  std::memset(storage.data, 0x5a, storage.bytes);
  EXPECT_EQ(resident(), static_cast<std::ptrdiff_t>(pages));
  sharer.ReleaseKvPages();
  EXPECT_EQ(resident(), 0);
  const auto* bytes = static_cast<const unsigned char*>(storage.data);
  EXPECT_TRUE(std::all_of(bytes, bytes + storage.bytes, [](unsigned char b) { return b == 0; }));
}

// Sliding-window layers give back the pages of blocks no position reads
// again: exactly those blocks' parts of those layers' K and V pools read as
// zeros and leave memory, every other byte stays, and a page shared with a
// block that is not given back stays whole.
TEST(CpuBackendKvCacheTest, BlockPagesOfChosenLayersLeaveMemoryAndNothingElse) {
  if (::sysconf(_SC_PAGESIZE) != 4096) GTEST_SKIP() << "the shapes assume pages of 4 KiB";
  // A block's part of a pool is one page: 16 slots x 2 KV heads x 64 x 2 bytes.
  const KvCacheShape paged{3, 8, 16, 2, 64};
  CpuBackend backend(1);
  ASSERT_TRUE(backend.CreateKvCache(paged).ok());
  KvStorage storage = backend.kv_storage();
  std::memset(storage.data, 0x5a, storage.bytes);
  const std::vector<int32_t> blocks = {5, 2, 3};
  const std::vector<int> layers = {0, 2};
  backend.ReleaseKvBlockPages(blocks, layers);
  // (Before reading: a page read after it left maps the zero page back in.)
  EXPECT_EQ(testing::ResidentPages(storage),
            static_cast<std::ptrdiff_t>(testing::PagesOf(storage)) - 2 * 2 * 3);
  const auto* bytes = static_cast<const unsigned char*>(storage.data);
  constexpr size_t kPart = 4096;
  for (size_t pool = 0; pool < 6; ++pool) {  // [layer][K, V]
    for (size_t block = 0; block < 8; ++block) {
      const bool released =
          (pool / 2 == 0 || pool / 2 == 2) && (block == 2 || block == 3 || block == 5);
      const unsigned char* part = bytes + (pool * 8 + block) * kPart;
      const unsigned char want = released ? 0 : 0x5a;
      ASSERT_TRUE(std::all_of(part, part + kPart, [&](unsigned char b) { return b == want; }))
          << "pool " << pool << " block " << block;
    }
  }

  // Parts of a quarter page (16 slots x 1 KV head x 32 x 2 bytes): only the
  // pages wholly inside the blocks given back go.
  const KvCacheShape small{1, 8, 16, 1, 32};
  CpuBackend quarters(1);
  ASSERT_TRUE(quarters.CreateKvCache(small).ok());
  storage = quarters.kv_storage();
  std::memset(storage.data, 0x5a, storage.bytes);
  const std::vector<int> layer0 = {0};
  quarters.ReleaseKvBlockPages(std::vector<int32_t>{1, 2, 3, 4}, layer0);  // no whole page
  bytes = static_cast<const unsigned char*>(storage.data);
  EXPECT_TRUE(std::all_of(bytes, bytes + storage.bytes, [](unsigned char b) { return b == 0x5a; }));
  quarters.ReleaseKvBlockPages(std::vector<int32_t>{3, 0, 2, 1}, layer0);  // page 0 of K and of V
  for (size_t i = 0; i < storage.bytes; ++i) {
    const bool released = i % 8192 < 4096;  // each pool: blocks 0-3, then 4-7
    ASSERT_EQ(bytes[i], released ? 0 : 0x5a) << "byte " << i;
  }
}

TEST(CpuBackendKvCacheTest, StoresTheModesFormatAndSharesItOnlyWithTheSameMode) {
  if (!bf16_attention::Supported(64)) GTEST_SKIP() << "this build has no AVX-512 BF16 attention";
  constexpr int kSlots = 16, kKvHeads = 2, kDim = 64;
  const KvCacheShape shape{1, 4, kSlots, kKvHeads, kDim};  // 1 layer, 4 blocks, 2 KV heads of 64
  constexpr size_t kPool = 4 * kSlots * kKvHeads * kDim;   // one layer's K (then V) pool
  constexpr size_t kHeadWords = kSlots * kDim;             // one KV head's words in a block
  std::mt19937 rng(3);
  std::vector<float> k = RandomRows(1, kKvHeads * kDim, rng),
                     v = RandomRows(1, kKvHeads * kDim, rng);
  const std::vector<int32_t> slot = {2 * kSlots + 5};  // block 2, its sixth slot

  // The bf16 mode: each KV head's words of a block in turn; the key as
  // dimension pairs, each in the key's 32-bit lane of its tile's vector for
  // that pair; the value in the odd half of each dimension's word pair.
  CpuBackend tiled(1, MatMulMode::kBf16);
  ASSERT_TRUE(tiled.CreateKvCache(shape).ok());
  tiled.WriteKv(0, View(k, 1, kKvHeads * kDim), View(v, 1, kKvHeads * kDim), slot);
  const auto* words = static_cast<const uint16_t*>(tiled.kv_storage().data);
  std::vector<bool> written(2 * kPool, false);
  for (size_t h = 0; h < kKvHeads; ++h) {
    const size_t head = (2 * kKvHeads + h) * kHeadWords;  // block 2, KV head h
    for (size_t d = 0; d < kDim; ++d) {
      const size_t key_word = head + (d / 2 * kSlots + 5) * 2 + d % 2;
      const size_t value_word = kPool + head + 2 * kDim * 2 + 2 * d + 1;  // pair (4, 5), odd
      ASSERT_EQ(words[key_word], FloatToBf16(k[h * kDim + d])) << "K head " << h << " dim " << d;
      ASSERT_EQ(words[value_word], FloatToBf16(v[h * kDim + d])) << "V head " << h << " dim " << d;
      written[key_word] = written[value_word] = true;
    }
  }
  for (size_t i = 0; i < 2 * kPool; ++i) {
    if (!written[i]) {
      ASSERT_EQ(words[i], 0) << "word " << i << " was written";
    }
  }
  // Writing the even partner, slot 4, clears slot 5's value words.
  const std::vector<int32_t> partner = {2 * kSlots + 4};
  tiled.WriteKv(0, View(v, 1, kKvHeads * kDim), View(k, 1, kKvHeads * kDim), partner);
  for (size_t h = 0; h < kKvHeads; ++h) {
    const size_t pair = kPool + (2 * kKvHeads + h) * kHeadWords + 2 * kDim * 2;
    for (size_t d = 0; d < kDim; ++d) {
      ASSERT_EQ(words[pair + 2 * d], FloatToBf16(k[h * kDim + d]))
          << "V head " << h << " dim " << d;
      ASSERT_EQ(words[pair + 2 * d + 1], 0) << "V head " << h << " dim " << d << " of slot 5";
    }
  }

  // Halves in place, [slot][KV head][dim]: the f32 mode, and the bf16 mode
  // where blocks are not whole tiles of 16 keys.
  for (const auto& [mode, slots] :
       {std::pair{MatMulMode::kF32, kSlots}, std::pair{MatMulMode::kBf16, 8}}) {
    const KvCacheShape halves_shape{1, 4, slots, kKvHeads, kDim};
    const size_t pool = size_t{4} * static_cast<size_t>(slots) * kKvHeads * kDim;
    CpuBackend backend(1, mode);
    ASSERT_TRUE(backend.CreateKvCache(halves_shape).ok());
    const std::vector<int32_t> fifth = {5};
    backend.WriteKv(0, View(k, 1, kKvHeads * kDim), View(v, 1, kKvHeads * kDim), fifth);
    const auto* halves = static_cast<const uint16_t*>(backend.kv_storage().data);
    for (size_t i = 0; i < kKvHeads * kDim; ++i) {
      ASSERT_EQ(halves[5 * kKvHeads * kDim + i], FloatToHalf(k[i]))
          << MatMulModeName(mode) << " K " << i;
      ASSERT_EQ(halves[pool + 5 * kKvHeads * kDim + i], FloatToHalf(v[i]))
          << MatMulModeName(mode) << " V " << i;
    }
  }

  CpuBackend bf16(1, MatMulMode::kBf16), f32(1, MatMulMode::kF32), other_bf16(1, MatMulMode::kBf16);
  ASSERT_TRUE(bf16.CreateKvCache(shape).ok());
  const absl::Status refused = f32.ShareKvCache(bf16);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.message().find("'f32' and the other's 'bf16'"), std::string::npos)
      << refused.message();
  EXPECT_TRUE(other_bf16.ShareKvCache(bf16).ok());
  EXPECT_EQ(other_bf16.kv_storage().data, bf16.kv_storage().data);
  // The other way round too; a refused share leaves the backend's own cache.
  ASSERT_TRUE(f32.CreateKvCache(shape).ok());
  const void* own = f32.kv_storage().data;
  EXPECT_EQ(other_bf16.ShareKvCache(f32).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(other_bf16.kv_storage().data, bf16.kv_storage().data);
  EXPECT_EQ(f32.ShareKvCache(bf16).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f32.kv_storage().data, own);
}

TEST(BackendArgMaxRowsTest, PicksTheLargestLogitLowestIdOnTies) {
  CpuBackend backend(1);
  std::vector<float> x = {0.5f,  2.0f,  2.0f,  -1.0f,  // tie: 1 before 2
                          -3.0f, -2.0f, -2.5f, -9.0f,  // all negative
                          7.0f,  7.0f,  7.0f,  7.0f};  // all equal: 0
  std::vector<int32_t> out(3);
  backend.ArgMaxRows(View(x, 3, 4), out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 1, 0}));
}

}  // namespace
}  // namespace tandem::kernels::cpu
