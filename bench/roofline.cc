// The machine's own bounds for the CPU figures in docs/performance.md:
// peak float32 FMA rate, peak bfloat16 dot-product rate (AVX-512 BF16),
// peak 8-bit integer dot-product rate (AVX-512 VNNI, or AVX2's vpmaddubsw
// where there is no VNNI: the bound of --cpu_matmul=q8) and memory read
// bandwidth, each on --threads threads at once. Prints one `name value` line
// per bound.
//
//   build/bin/tandem-roofline [--threads=2]
//
// The compute loops (the float ones are those --cpu_matmul=auto measures,
// product_rates.h) run 12 independent accumulator chains per thread (more
// than the latency times the issue rate), in registers; the bandwidth loop
// streams a buffer much larger than the caches with 512-bit loads (256-bit
// on AVX2 machines, which get the float32 FMA rate, the vpmaddubsw rate
// and the bandwidth).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/kernels/cpu/product_rates.h"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

ABSL_FLAG(int, threads, 2, "threads measured at once");

namespace {

using Clock = std::chrono::steady_clock;

// Runs fn(thread) on `threads` threads at once; returns the wall seconds.
template <typename Fn>
double OnThreads(int threads, Fn fn) {
  std::vector<std::thread> pool;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back(fn, t);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr long kIterations = 100'000'000;

#if defined(__AVX512F__)
float SumBytes(const float* data, size_t floats) {
  __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
  __m512 c = _mm512_setzero_ps(), d = _mm512_setzero_ps();
  for (size_t i = 0; i + 64 <= floats; i += 64) {
    a = _mm512_add_ps(a, _mm512_loadu_ps(data + i));
    b = _mm512_add_ps(b, _mm512_loadu_ps(data + i + 16));
    c = _mm512_add_ps(c, _mm512_loadu_ps(data + i + 32));
    d = _mm512_add_ps(d, _mm512_loadu_ps(data + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
}
#elif defined(__AVX2__) && defined(__FMA__)
// Machines without AVX-512 (AVX2 and FMA): 256-bit loads, and the float32
// FMA peak in 8-lane chains.
float SumBytes(const float* data, size_t floats) {
  __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
  __m256 c = _mm256_setzero_ps(), d = _mm256_setzero_ps();
  for (size_t i = 0; i + 32 <= floats; i += 32) {
    a = _mm256_add_ps(a, _mm256_loadu_ps(data + i));
    b = _mm256_add_ps(b, _mm256_loadu_ps(data + i + 8));
    c = _mm256_add_ps(c, _mm256_loadu_ps(data + i + 16));
    d = _mm256_add_ps(d, _mm256_loadu_ps(data + i + 24));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

float Fp32FmaChains256(long iterations) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], b, c);
  }
  alignas(32) float lanes[8];
  float sum = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float lane : lanes) sum += lane;
  }
  return sum;
}
#endif

#if defined(__AVX512VNNI__)
// vpdpbusd: 16 lanes of four byte products summed into int32, in 12
// independent chains (as the float loops); one multiply and one add a
// product, as the float rates count them.
uint32_t Int8DotChains(long iterations) {
  __m512i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(1), b = _mm512_set1_epi8(1);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  // The lanes pass 2^31 on long runs: combined without arithmetic.
  __m512i all = acc[0];
  for (int i = 1; i < 12; ++i) all = _mm512_xor_si512(all, acc[i]);
  return static_cast<uint32_t>(_mm512_reduce_or_epi32(all));
}
#elif defined(__AVX2__)
// vpmaddubsw and the 16-bit add of its pair sums (what the AVX2 q8 kernel
// issues per 32 byte products, packed_matmul_int8_avx2.cc), in 12 chains,
// each multiplying its own accumulator so that no product is shared.
uint32_t Int8DotChains(long iterations) {
  __m256i acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_epi16(static_cast<int16_t>(i));
  const __m256i b = _mm256_set1_epi8(1);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) {
      acc[i] = _mm256_add_epi16(acc[i], _mm256_maddubs_epi16(acc[i], b));
    }
  }
  __m256i all = acc[0];
  for (int i = 1; i < 12; ++i) all = _mm256_xor_si256(all, acc[i]);
  return static_cast<uint32_t>(_mm256_extract_epi32(all, 0));
}
#endif

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int threads = std::max(1, absl::GetFlag(FLAGS_threads));
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
  volatile float sink = 0;
  std::printf("threads %d\n", threads);
#if !defined(__AVX512F__)
  const double fma_seconds =
      OnThreads(threads, [&](int) { sink = sink + Fp32FmaChains256(kIterations); });
  // 12 FMAs x 8 lanes x 2 flops per iteration.
  std::printf("fp32_fma_gflops %.1f\n", threads * kIterations * 12.0 * 16 / fma_seconds / 1e9);
#else
  const double fma_seconds = OnThreads(
      threads, [&](int) { sink = sink + tandem::kernels::cpu::Fp32FmaChains(kIterations); });
  // 12 FMAs x 16 lanes x 2 flops per iteration.
  std::printf("fp32_fma_gflops %.1f\n", threads * kIterations * 12.0 * 32 / fma_seconds / 1e9);
#endif
#if defined(__AVX512BF16__)
  const double bf16_seconds = OnThreads(
      threads, [&](int) { sink = sink + tandem::kernels::cpu::Bf16DotChains(kIterations); });
  // 12 dot products x 16 lanes x 2 pairs x 2 flops per iteration.
  std::printf("bf16_dot_gflops %.1f\n", threads * kIterations * 12.0 * 64 / bf16_seconds / 1e9);
#endif
  volatile uint32_t int_sink = 0;
  const double int8_seconds =
      OnThreads(threads, [&](int) { int_sink = int_sink + Int8DotChains(kIterations); });
#if defined(__AVX512VNNI__)
  // 12 dot products x 16 lanes x 4 products x 2 ops per iteration.
  std::printf("int8_dot_gops %.1f\n", threads * kIterations * 12.0 * 128 / int8_seconds / 1e9);
#else
  // 12 x 32 byte products x 2 ops per iteration.
  std::printf("int8_dot_gops %.1f\n", threads * kIterations * 12.0 * 64 / int8_seconds / 1e9);
#endif
  constexpr size_t kBytes = size_t{1} << 30;
  auto* buffer = static_cast<float*>(std::aligned_alloc(64, kBytes));
  const size_t floats = kBytes / sizeof(float);
  OnThreads(threads, [&](int t) {  // touch every page first
    std::fill(buffer + floats / threads * t, buffer + floats / threads * (t + 1), 1.0f);
  });
  double best = 1e30;
  for (int repeat = 0; repeat < 5; ++repeat) {
    best = std::min(best, OnThreads(threads, [&](int t) {
                      sink = sink + SumBytes(buffer + floats / threads * t, floats / threads);
                    }));
  }
  std::printf("read_bandwidth_gbs %.1f\n", kBytes / best / 1e9);
  std::free(buffer);
  return 0;
#else
  std::fprintf(stderr, "tandem-roofline measures AVX-512 or AVX2 machines only\n");
  return 1;
#endif
}
