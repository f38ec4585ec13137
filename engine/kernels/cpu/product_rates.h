// What --cpu_matmul=auto decides on: how long this CPU takes, in each mode
// that keeps answers as an exact evaluation gives them, for the two kinds of
// product a request makes: a prompt's many rows and a decode step's one.
// Those modes, most exact first: f32 (the model's own arithmetic), q16
// (two-digit integer activations on VNNI: logits within ~0.03 of float64 on
// the default model, where f32's are within ~0.02) and bf16 (~0.4). Machines
// differ, and not by a little: AMD Zen 4 issues bfloat16 dot products at the
// float32 FMA's rate (two products a lane), so bf16 halves a prompt's
// compute; Intel cores with AVX-512 BF16 but no AMX run them at half that
// rate, while their VNNI integer dot products run at four times the FMA's
// (four products a lane), so q16's two per quad still double it, and its
// weights need no decoding to floats. Which wins over a request depends on
// both kinds of product and on how good each mode's kernels are now, which
// peak instruction rates cannot see: so the choice times the real kernels
// on one weight.
//
// q8 is timed too, for the log, and never chosen: its 8-bit activations
// keep >= 95% of greedy choices an exact evaluation makes (tests/reference),
// but the choices they change are visible ones (the default model's answer
// to "What is the capital of France?" becomes llama.cpp's nonsense, where
// the other modes answer as transformers does).
#ifndef TANDEM_ENGINE_KERNELS_CPU_PRODUCT_RATES_H_
#define TANDEM_ENGINE_KERNELS_CPU_PRODUCT_RATES_H_

#include <string>

#include "engine/kernels/cpu/matmul.h"

namespace tandem::kernels::cpu {

// 12 independent chains in registers of `iterations` float32 FMAs (16
// lanes) or bfloat16 dot products (16 lanes, two products each); returns a
// value to keep the work alive. 0 without the instructions. (The peak rates
// tandem-roofline reports.)
float Fp32FmaChains(long iterations);
float Bf16DotChains(long iterations);

// One mode's kernel times on one thread for a Q4_K weight of 256 x 1024
// (the type of most published GGUFs; small enough to stay in L2, so what is
// timed is the kernels' arithmetic, the part the modes differ in: both read
// the same packed panels): microseconds for a product of 64 rows (a
// prompt's), and for one row (a decode step's).
struct KernelTimes {
  double prompt_64_rows_us = 0;
  double decode_row_us = 0;
};
struct ModeTimings {
  KernelTimes f32;
  KernelTimes bf16;  // zeros without the AVX-512 BF16 instructions
  KernelTimes q8;    // zeros without integer products (HasInt8Products)
  KernelTimes q16;   // zeros without AVX-512 VNNI (HasTwoDigitProducts)
};

// The best of five alternating rounds of each, after a warm-up: ~25 ms.
ModeTimings MeasureModeTimings();

// The reference request the modes are weighed on: llama-bench's pp512 +
// tg128, the shape compare-llamacpp reports too. Its product time is
// 512 / 64 prompt products plus 128 one-row ones.
inline constexpr int kReferencePromptTokens = 512;
inline constexpr int kReferenceOutputTokens = 128;
double ReferenceRequestUs(const KernelTimes& times);

// Of f32, q16 and bf16 (most exact first), the least exact mode whose
// reference request every more exact mode needs at least this many times
// the time of (a more exact mode wins near parity, and the margin keeps the
// choice from flipping with a shared machine's noise). Never q8.
inline constexpr double kAutoAdvantage = 1.2;
MatMulMode ChooseAutoMatMulMode(const ModeTimings& timings);

// The auto mode of this process: measured once, on first use.
struct AutoMatMulChoice {
  MatMulMode mode;
  std::string reason;  // the timings and the rule, for the start-up log
};
const AutoMatMulChoice& AutoMatMulMode();

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_PRODUCT_RATES_H_
