// The arithmetic of sampling a token from a row of logits, written once for
// the host and the device so that both compute the same bits.
//
// A sampled token must not depend on where it was drawn: a request that
// moves between a CPU and a GPU daemon, or a test that checks the GPU
// against the CPU, needs the token the host would have drawn from the same
// logits. Floating-point sums depend on their order, and exp() differs
// between libraries, so the sampling distribution is defined by integers:
//
//   m   = the row's largest logit
//   w_i = floor(2^43 * ExpNonPositive((l_i - m) * (1 / T)))     (integer)
//
// ExpNonPositive uses only correctly rounded double additions,
// multiplications and one division, which IEEE 754 fixes bit for bit; the
// host never fuses them (the project compiles with -ffp-contract=off) and
// the device says so explicitly (__dadd_rn and friends). Sums of w are
// exact and associative, so any order (a block-wide reduction, a serial
// loop) gives the same mass, and the draw is an integer comparison.
// Weights are multiples of 2^-43 of the largest one: a token 30 nats below
// the top has weight 0 at temperature 1 (probability below 1e-13).
//
// The rest of the definition (top-k and top-p cuts, the draw) is in
// sample_row.h; this header holds what the device shares.
#ifndef TANDEM_ENGINE_KERNELS_SAMPLING_ARITHMETIC_H_
#define TANDEM_ENGINE_KERNELS_SAMPLING_ARITHMETIC_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_HOST_DEVICE __host__ __device__
#else
#define TANDEM_HOST_DEVICE
#endif

namespace tandem::kernels {

// One row's sampling parameters and its uniform number: what a backend
// needs to draw the row's token (Backend::SampleRows). Plain 32- and 64-bit
// fields, the same layout for the host and the device compilers.
struct RowDraw {
  float temperature = 0.0f;  // <= 0: greedy (the largest logit, the lowest id among equal ones)
  int32_t top_k = 0;         // <= 0 or >= the row's length: no cut
  float top_p = 1.0f;        // >= 1: no cut; else in (0, 1)
  int32_t reserved = 0;      // keeps `u` 8-byte aligned in both layouts
  double u = 0.0;            // in [0, 1)
};
static_assert(sizeof(RowDraw) == 24);

// A token's part of the distribution a draw samples from (SampleRowWithShare
// in sample_row.h): the token is drawn with probability weight / mass,
// exactly (integers, so every backend gives the same pair). Verifying a
// draft sampled from a distribution needs only this of the target's row at
// each drafted token.
struct NucleusShare {
  uint64_t weight = 0;  // the token's weight in the nucleus; 0 outside it
  uint64_t mass = 1;    // the nucleus' mass, > 0
};
static_assert(sizeof(NucleusShare) == 16);

namespace sampling_arithmetic {

// w_i is at most kWeightScale, so a vocabulary below 2^20 tokens keeps every
// mass below 2^63.
inline constexpr double kWeightScale = 0x1p43;
inline constexpr int64_t kMaxVocabulary = int64_t{1} << 20;

TANDEM_HOST_DEVICE inline double Add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

TANDEM_HOST_DEVICE inline double Sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

TANDEM_HOST_DEVICE inline double Mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

TANDEM_HOST_DEVICE inline double Div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

// 2^k for -1022 <= k <= 1023, exactly.
TANDEM_HOST_DEVICE inline double PowerOfTwo(int k) {
  const uint64_t bits = static_cast<uint64_t>(1023 + k) << 52;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
#endif
}

// e^x for -40 <= x <= 0, relative error below 1e-15, without branches (so
// the host's compiler can vectorise loops over it: vector and scalar IEEE
// operations round alike). Cody-Waite reduction x = k ln2 + r with
// |r| <= ln2 / 2 (ln2's high part has trailing zeros, so k * kLn2High is
// exact), a degree-13 Taylor polynomial in Horner form, and an exact scaling
// by 2^k.
TANDEM_HOST_DEVICE inline double ExpCore(double x) {
  constexpr double kInverseLn2 = 0x1.71547652b82fep+0;
  constexpr double kLn2High = 0x1.62e42fee00000p-1;
  constexpr double kLn2Low = 0x1.a39ef35793c76p-33;
  // The nearest integer to x / ln2 (x <= 0, so truncating 0.5 - t floors it).
  const int k = -static_cast<int>(Sub(0.5, Mul(x, kInverseLn2)));
  const double kd = static_cast<double>(k);
  const double r = Sub(Sub(x, Mul(kd, kLn2High)), Mul(kd, kLn2Low));
  // Coefficients 1/n!, correctly rounded, n = 13 down to 0 (written out:
  // a loop here keeps the host's compiler from vectorising callers).
  double p = 0x1.6124613a86d09p-33;
  p = Add(Mul(p, r), 0x1.1eed8eff8d898p-29);
  p = Add(Mul(p, r), 0x1.ae64567f544e4p-26);
  p = Add(Mul(p, r), 0x1.27e4fb7789f5cp-22);
  p = Add(Mul(p, r), 0x1.71de3a556c734p-19);
  p = Add(Mul(p, r), 0x1.a01a01a01a01ap-16);
  p = Add(Mul(p, r), 0x1.a01a01a01a01ap-13);
  p = Add(Mul(p, r), 0x1.6c16c16c16c17p-10);
  p = Add(Mul(p, r), 0x1.1111111111111p-7);
  p = Add(Mul(p, r), 0x1.5555555555555p-5);
  p = Add(Mul(p, r), 0x1.5555555555555p-3);
  p = Add(Mul(p, r), 0x1.0000000000000p-1);
  p = Add(Mul(p, r), 1.0);
  p = Add(Mul(p, r), 1.0);
  return Mul(p, PowerOfTwo(k));
}

// e^x for x <= 0: ExpCore above -40, else 0 (also for NaN).
TANDEM_HOST_DEVICE inline double ExpNonPositive(double x) { return x > -40.0 ? ExpCore(x) : 0.0; }

TANDEM_HOST_DEVICE inline double InverseTemperature(float temperature) {
  return Div(1.0, static_cast<double>(temperature));
}

// w for a logit l <= max (see the top of this file): at most kWeightScale,
// exactly kWeightScale for l == max, also when max is infinite (inf - inf
// would be NaN), so a row's mass is never 0.
TANDEM_HOST_DEVICE inline uint64_t Weight(float logit, float max, double inverse_temperature) {
  const double x = logit == max ? 0.0
                                : Mul(Sub(static_cast<double>(logit), static_cast<double>(max)),
                                      inverse_temperature);
  // Branch-free, as ExpNonPositive(x) * kWeightScale rounded down: weights
  // are below 2^63, so the signed conversion equals the unsigned one.
  const bool negligible = !(x > -40.0);
  const double e = negligible ? 0.0 : ExpCore(negligible ? -40.0 : x);
  return static_cast<uint64_t>(static_cast<int64_t>(Mul(e, kWeightScale)));
}

// `token`'s share of a greedy draw's distribution, the point mass on the
// argmax: {1, 1} there, {0, 1} elsewhere (also for token -1).
TANDEM_HOST_DEVICE inline NucleusShare PointMassShare(int32_t argmax, int32_t token) {
  return {token >= 0 && token == argmax ? uint64_t{1} : uint64_t{0}, 1};
}

// A 32-bit key that orders floats as `<` does (-0 equals +0; NaN lowest).
// Branch-free: adding +0 turns -0 into +0 (IEEE round-to-nearest), and a
// negative float's bits flip whole while a positive one's sign bit is set.
TANDEM_HOST_DEVICE inline uint32_t OrderKey(float value) {
  const float positive_zero = value + 0.0f;
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(positive_zero);
#else
  std::memcpy(&bits, &positive_zero, sizeof(bits));
#endif
  const uint32_t negative = static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31);
  const uint32_t key = bits ^ (negative | 0x80000000u);
  return value != value ? 0u : key;
}

// The sampler's total order as one 64-bit key: a larger logit first, the
// lower id first among equal logits. Distinct for distinct ids.
TANDEM_HOST_DEVICE inline uint64_t RankKey(float logit, int32_t id) {
  return (static_cast<uint64_t>(OrderKey(logit)) << 32) |
         static_cast<uint64_t>(0xFFFFFFFFu - static_cast<uint32_t>(id));
}

// The mass a top-p nucleus must reach: ceil(top_p * mass) in double
// arithmetic, at least 1 and at most `mass` (`mass` when top_p >= 1; 1 for
// top_p <= 0, which callers refuse: the cast of a negative double would
// differ between host and device).
TANDEM_HOST_DEVICE inline uint64_t NucleusMass(float top_p, uint64_t mass) {
  if (!(top_p < 1.0f)) return mass;
  if (!(top_p > 0.0f)) return mass < 1 ? mass : 1;  // out of contract: the top token
  const double target = Mul(static_cast<double>(top_p), static_cast<double>(mass));
  uint64_t out = static_cast<uint64_t>(target);
  if (static_cast<double>(out) < target) ++out;
  if (out < 1) out = 1;
  return out > mass ? mass : out;
}

// The draw's position in a nucleus of `mass` (> 0): floor(u * mass), below
// `mass`. The token drawn is the first, in id order, whose cumulative weight
// exceeds it.
TANDEM_HOST_DEVICE inline uint64_t DrawTarget(double u, uint64_t mass) {
  const uint64_t target = static_cast<uint64_t>(Mul(u, static_cast<double>(mass)));
  return target >= mass ? mass - 1 : target;
}

}  // namespace sampling_arithmetic
}  // namespace tandem::kernels

#endif  // TANDEM_ENGINE_KERNELS_SAMPLING_ARITHMETIC_H_
