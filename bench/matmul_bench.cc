// tandem-matmul-bench: what the CPU matrix products of one forward pass cost
// for R activation rows (R = 1: a decode token; R > 1: the token and R - 1
// drafted tokens being verified, or a prompt chunk), through CpuBackend's
// MatMul as the model calls it: per layer the fused q/k/v and gate/up
// products, o and down, and (--lm_head) the output projection, which a
// verification runs for every row. Random Q4_1 layer weights and a Q8_0
// output projection, SmolLM2-135M's shapes by default. Prints per R the
// median time of --repeats passes, its ratio to R = 1, and the rate in
// GFLOP/s (2 * rows * weights), to compare with tandem-roofline's bounds
// (bf16_dot_gflops for --cpu_matmul=bf16, fp32_fma_gflops for f32).
//
//   build/bin/tandem-matmul-bench && build/bin/tandem-roofline
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "bench/row_cost.h"
#include "common/strings.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/kernels/cpu/matmul.h"
#include "engine/kernels/dtype.h"
#include "engine/kernels/half.h"

ABSL_FLAG(std::vector<std::string>, rows,
          std::vector<std::string>({"1", "2", "3", "4", "5", "8", "9", "16", "17", "32", "64",
                                    "65"}),
          "activation rows per pass (the defaults: both sides of each kernel switch)");
ABSL_FLAG(int, hidden, 576, "model width (SmolLM2-135M: 576)");
ABSL_FLAG(int, kv_width, 192, "K and V projection width (SmolLM2-135M: 3 KV heads of 64)");
ABSL_FLAG(int, ffn, 1536, "feed-forward width (SmolLM2-135M: 1536)");
ABSL_FLAG(int, vocab, 49152, "output projection rows (SmolLM2-135M: 49152)");
ABSL_FLAG(int, layers, 30, "layers per pass");
ABSL_FLAG(bool, lm_head, true, "include the output projection (a verification needs every row's)");
ABSL_FLAG(std::string, layer_type, "Q4_1",
          "layer weights' type: Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, Q5_1 or IQ4_XS (the output "
          "projection stays Q8_0)");
ABSL_FLAG(std::string, cpu_matmul, "auto", "CPU matmul mode: auto, f32, bf16 or q8");
ABSL_FLAG(int, threads, 2, "compute threads");
ABSL_FLAG(int, repeats, 11, "timed passes per row count (the median is printed)");

namespace tandem::kernels::cpu {
namespace {

// Random blocks of `Block` with small finite half scales (and minimums).
template <typename Block>
std::vector<Block> RandomBlocks(int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<Block> blocks(static_cast<size_t>(rows * cols / Block::kElements));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.02f);
  for (Block& b : blocks) {
    auto* bytes = reinterpret_cast<uint8_t*>(&b);
    for (size_t i = 0; i < sizeof(Block); ++i) bytes[i] = static_cast<uint8_t>(byte(rng));
    b.d = FloatToHalf(scale(rng));
    if constexpr (requires { b.m; }) b.m = FloatToHalf(-scale(rng));
    if constexpr (requires { b.dmin; }) b.dmin = FloatToHalf(scale(rng));
  }
  return blocks;
}

struct HostWeight {
  DType dtype;
  int64_t rows, cols;
  std::vector<uint8_t> bytes;
};

template <typename Block>
HostWeight MakeWeight(DType dtype, int64_t rows, int64_t cols, std::mt19937& rng) {
  std::vector<Block> blocks = RandomBlocks<Block>(rows, cols, rng);
  HostWeight w{dtype, rows, cols, std::vector<uint8_t>(blocks.size() * sizeof(Block))};
  std::memcpy(w.bytes.data(), blocks.data(), w.bytes.size());
  return w;
}

// A random weight of a layer type named by --layer_type.
absl::StatusOr<HostWeight> MakeLayerWeight(std::string_view type, int64_t rows, int64_t cols,
                                           std::mt19937& rng) {
  if (type == "Q4_0") return MakeWeight<BlockQ4_0>(DType::kQ4_0, rows, cols, rng);
  if (type == "Q4_1") return MakeWeight<BlockQ4_1>(DType::kQ4_1, rows, cols, rng);
  if (type == "Q8_0") return MakeWeight<BlockQ8_0>(DType::kQ8_0, rows, cols, rng);
  if (type == "Q4_K") return MakeWeight<BlockQ4_K>(DType::kQ4_K, rows, cols, rng);
  if (type == "Q5_K") return MakeWeight<BlockQ5_K>(DType::kQ5_K, rows, cols, rng);
  if (type == "Q6_K") return MakeWeight<BlockQ6_K>(DType::kQ6_K, rows, cols, rng);
  if (type == "Q5_1") return MakeWeight<BlockQ5_1>(DType::kQ5_1, rows, cols, rng);
  if (type == "IQ4_XS") return MakeWeight<BlockIQ4_XS>(DType::kIQ4_XS, rows, cols, rng);
  return absl::InvalidArgumentError(tandem::StrCat("unknown --layer_type '", type, "'"));
}

int Main() {
  auto mode = ParseMatMulMode(absl::GetFlag(FLAGS_cpu_matmul));
  if (!mode.ok()) {
    std::fprintf(stderr, "%s\n", std::string(mode.status().message()).c_str());
    return 2;
  }
  CpuBackend backend(absl::GetFlag(FLAGS_threads), *mode);
  const int64_t hidden = absl::GetFlag(FLAGS_hidden), kv = absl::GetFlag(FLAGS_kv_width),
                ffn = absl::GetFlag(FLAGS_ffn), vocab = absl::GetFlag(FLAGS_vocab);
  std::mt19937 rng(11);
  // Every layer has weights of its own, as the model's do: a pass over one
  // layer's weights repeated would be served from the caches (SmolLM2's
  // layer is 2.2 MB in Q4_1) and time the kernels' arithmetic, not a decode
  // step's reads from memory.
  const std::string layer_type = absl::GetFlag(FLAGS_layer_type);
  std::vector<HostWeight> host;
  const int64_t shapes[][2] = {
      {hidden, hidden}, {kv, hidden},  {kv, hidden}, {hidden, hidden},
      {ffn, hidden},    {ffn, hidden}, {hidden, ffn}};  // q k v o gate up down
  const int layers = absl::GetFlag(FLAGS_layers);
  for (int l = 0; l < layers; ++l) {
    for (const auto& [rows, cols] : shapes) {
      absl::StatusOr<HostWeight> weight = MakeLayerWeight(layer_type, rows, cols, rng);
      if (!weight.ok()) {
        std::fprintf(stderr, "%s\n", std::string(weight.status().message()).c_str());
        return 2;
      }
      host.push_back(*std::move(weight));
    }
  }
  host.push_back(MakeWeight<BlockQ8_0>(DType::kQ8_0, vocab, hidden, rng));  // the output
  std::vector<Weight> w;
  for (const HostWeight& h : host) {
    auto uploaded = backend.UploadWeight(h.dtype, h.rows, h.cols, h.bytes.data());
    if (!uploaded.ok()) {
      std::fprintf(stderr, "%s\n", std::string(uploaded.status().message()).c_str());
      return 1;
    }
    w.push_back(*uploaded);
  }
  const bool lm_head = absl::GetFlag(FLAGS_lm_head);
  const double weights_per_row =
      static_cast<double>(layers) *
          static_cast<double>(2 * hidden * hidden + 2 * kv * hidden + 3 * ffn * hidden) +
      (lm_head ? static_cast<double>(vocab * hidden) : 0.0);
  std::printf("%s, %d %s layers (%lld/%lld/%lld wide)%s\n", backend.name().c_str(), layers,
              layer_type.c_str(), static_cast<long long>(hidden), static_cast<long long>(kv),
              static_cast<long long>(ffn), lm_head ? " and the output projection" : "");
  std::printf("%5s %10s %9s %14s %9s\n", "rows", "pass ms", "vs 1 row", "ms/extra row", "GFLOP/s");
  std::normal_distribution<float> normal(0.0f, 1.0f);
  double one_row = 0;
  for (const std::string& text : absl::GetFlag(FLAGS_rows)) {
    const int64_t rows = std::stoll(text);
    std::vector<float> x(static_cast<size_t>(rows * ffn)), a(static_cast<size_t>(rows * hidden)),
        b(static_cast<size_t>(rows * kv)), c(static_cast<size_t>(rows * kv)),
        g(static_cast<size_t>(rows * ffn)), u(static_cast<size_t>(rows * ffn)),
        logits(static_cast<size_t>(rows * vocab));
    for (float& v : x) v = normal(rng);
    const Matrix xh{x.data(), rows, hidden}, xf{x.data(), rows, ffn};
    const Matrix qkv_out[] = {{a.data(), rows, hidden}, {b.data(), rows, kv}, {c.data(), rows, kv}};
    const Matrix ffn_out[] = {{g.data(), rows, ffn}, {u.data(), rows, ffn}};
    const Matrix hidden_out[] = {{a.data(), rows, hidden}};
    const Matrix logits_out[] = {{logits.data(), rows, vocab}};
    const Weight* output[] = {&w.back()};
    const Weight* none3[] = {nullptr, nullptr, nullptr};
    auto pass = [&] {
      for (int l = 0; l < layers; ++l) {
        const Weight* layer = &w[static_cast<size_t>(l) * std::size(shapes)];
        const Weight* qkv[] = {&layer[0], &layer[1], &layer[2]};
        const Weight* o[] = {&layer[3]};
        const Weight* gate_up[] = {&layer[4], &layer[5]};
        const Weight* down[] = {&layer[6]};
        backend.MatMul(xh, qkv, none3, qkv_out);
        backend.MatMul(xh, o, std::span(none3, 1), hidden_out);
        backend.MatMul(xh, gate_up, std::span(none3, 2), ffn_out);
        backend.MatMul(xf, down, std::span(none3, 1), hidden_out);
      }
      if (lm_head) backend.MatMul(xh, output, std::span(none3, 1), logits_out);
    };
    pass();  // warm-up (scratch growth)
    const double median = bench::MedianMs(absl::GetFlag(FLAGS_repeats), pass);
    if (rows == 1) one_row = median;
    bench::PrintRowCost(rows, median, one_row);
    std::printf(" %9.1f\n", 2.0 * static_cast<double>(rows) * weights_per_row / (median * 1e6));
  }
  return 0;
}

}  // namespace
}  // namespace tandem::kernels::cpu

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tandem::kernels::cpu::Main();
}
