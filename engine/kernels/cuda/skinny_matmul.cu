// The few-row matrix product (skinny_matmul.h).
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "engine/kernels/cuda/skinny_matmul.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;  // one output row per warp
constexpr int kUnroll = 4;             // 16-byte weight loads in flight per lane

// The launch's arguments: SkinnyMatMulArgs plus where each weight's rows
// start in the launch's row range.
struct KernelArgs {
  SkinnyMatMulArgs a;
  int64_t first[SkinnyMatMulArgs::kMaxWeights] = {};
};

// The 8 bf16 values of a 16-byte load as floats (element 0 at the lowest
// address: the low half of the first word).
__device__ __forceinline__ void Unpack(const uint4& v, float (&f)[8]) {
  const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(words[i] << 16);
    f[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

// acc[t] += the 8 products of weight chunk `w` with chunk `c` of row t of x.
template <int kRows>
__device__ __forceinline__ void Accumulate(const uint4& w, const uint4* x, int64_t x_chunks,
                                           int64_t c, float (&acc)[kRows]) {
  float wf[8];
  Unpack(w, wf);
#pragma unroll
  for (int t = 0; t < kRows; ++t) {
    float xf[8];
    Unpack(__ldg(x + t * x_chunks + c), xf);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[t] = fmaf(wf[e], xf[e], acc[t]);
  }
}

template <int kRows>
__global__ void __launch_bounds__(kThreads)
    SkinnyMatMulKernel(const __grid_constant__ KernelArgs k, int64_t total_rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (row >= total_rows) return;  // the whole warp: one row per warp
  // Which weight the row belongs to (unrolled: constant indices keep the
  // arguments in parameter memory).
  const uint16_t* w = k.a.w[0];
  float* out = k.a.out[0];
  int64_t ld = k.a.ld[0];
  const float* bias = k.a.bias[0];
  int64_t first = 0;
#pragma unroll
  for (int i = 1; i < SkinnyMatMulArgs::kMaxWeights; ++i) {
    if (i < k.a.weights && row >= k.first[i]) {
      w = k.a.w[i];
      out = k.a.out[i];
      ld = k.a.ld[i];
      bias = k.a.bias[i];
      first = k.first[i];
    }
  }
  const int64_t r = row - first;
  const int64_t chunks = k.a.k / 8;
  const auto* weight_row = reinterpret_cast<const uint4*>(w + r * k.a.k);
  const auto* x = reinterpret_cast<const uint4*>(k.a.x);

  float acc[kRows];
#pragma unroll
  for (int t = 0; t < kRows; ++t) acc[t] = 0.0f;
  // Lane `lane` takes chunks lane, lane + 32, ... in increasing order; the
  // unrolled loop issues kUnroll of its loads before using them. Weights are
  // read once: evict-first loads (__ldcs) keep them from displacing x.
  int64_t c = lane;
  for (; c + 32 * (kUnroll - 1) < chunks; c += 32 * kUnroll) {
    uint4 loaded[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) loaded[u] = __ldcs(weight_row + c + 32 * u);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) Accumulate<kRows>(loaded[u], x, chunks, c + 32 * u, acc);
  }
  for (; c < chunks; c += 32) Accumulate<kRows>(__ldcs(weight_row + c), x, chunks, c, acc);

#pragma unroll
  for (int t = 0; t < kRows; ++t) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], offset);
    }
  }
  if (lane == 0) {
    const float b = bias != nullptr ? bias[r] : 0.0f;
#pragma unroll
    for (int t = 0; t < kRows; ++t) out[t * ld + r] = acc[t] + b;
  }
}

template <int kRows>
void Launch(const KernelArgs& k, int64_t total_rows, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((total_rows + kWarps - 1) / kWarps);
  SkinnyMatMulKernel<kRows><<<blocks, kThreads, 0, stream>>>(k, total_rows);
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool SkinnyMatMulFits(const SkinnyMatMulArgs& args) {
  if (args.rows < 1 || args.rows > SkinnyMatMulArgs::kMaxRows) return false;
  if (args.weights < 1 || args.weights > SkinnyMatMulArgs::kMaxWeights) return false;
  if (args.k <= 0 || args.k % 8 != 0 || !Aligned16(args.x)) return false;
  for (int i = 0; i < args.weights; ++i) {
    if (args.w[i] == nullptr || args.n[i] <= 0 || !Aligned16(args.w[i])) return false;
  }
  return true;
}

void LaunchSkinnyMatMul(const SkinnyMatMulArgs& args, cudaStream_t stream) {
  KernelArgs k;
  k.a = args;
  int64_t total = 0;
  for (int i = 0; i < args.weights; ++i) {
    k.first[i] = total;
    total += args.n[i];
  }
  switch (args.rows) {
    case 1:
      return Launch<1>(k, total, stream);
    case 2:
      return Launch<2>(k, total, stream);
    case 3:
      return Launch<3>(k, total, stream);
    case 4:
      return Launch<4>(k, total, stream);
    case 5:
      return Launch<5>(k, total, stream);
    case 6:
      return Launch<6>(k, total, stream);
    case 7:
      return Launch<7>(k, total, stream);
    case 8:
      return Launch<8>(k, total, stream);
    default:
      std::fprintf(stderr, "LaunchSkinnyMatMul: %d rows (SkinnyMatMulFits was not checked)\n",
                   args.rows);
      std::abort();
  }
}

}  // namespace tandem::kernels::cuda
