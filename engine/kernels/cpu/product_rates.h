// What --cpu_matmul=auto decides on: how fast this CPU runs the two products
// the float32 and bfloat16 modes are built on. Machines differ in the ratio,
// not by a little: AMD Zen 4 issues bfloat16 dot products (two products a
// lane) at the float32 FMA rate, so bf16 halves a prompt's compute; Intel
// cores with AVX-512 BF16 but no AMX run them at half that rate, so f32 (the
// exact mode) is as fast there. A short measurement of the ratio tells the
// two apart with a wide margin (about 2 against 0.5), so the choice does
// not flip with the run-to-run noise of shared machines.
#ifndef TANDEM_ENGINE_KERNELS_CPU_PRODUCT_RATES_H_
#define TANDEM_ENGINE_KERNELS_CPU_PRODUCT_RATES_H_

#include <string>

#include "engine/kernels/cpu/matmul.h"

namespace tandem::kernels::cpu {

// Peak rates in GFLOP/s on one thread (0: the instructions are missing).
struct ProductRates {
  double fp32_fma_gflops = 0;
  double bf16_dot_gflops = 0;
};

// 12 independent chains in registers of `iterations` float32 FMAs (16
// lanes) or bfloat16 dot products (16 lanes, two products each); returns a
// value to keep the work alive. 0 without the instructions.
float Fp32FmaChains(long iterations);
float Bf16DotChains(long iterations);

// Both rates on the calling thread: the best of three alternating runs of
// each, ~20 ms in all.
ProductRates MeasureProductRates();

// bf16 where its dot products do at least this many times the float32
// FMA's flops, else f32.
inline constexpr double kBf16AutoAdvantage = 1.5;
MatMulMode ChooseAutoMatMulMode(const ProductRates& rates);

// The auto mode of this process: measured once, on first use.
struct AutoMatMulChoice {
  MatMulMode mode;
  std::string reason;  // the rates and the rule, for the start-up log
};
const AutoMatMulChoice& AutoMatMulMode();

}  // namespace tandem::kernels::cpu

#endif  // TANDEM_ENGINE_KERNELS_CPU_PRODUCT_RATES_H_
