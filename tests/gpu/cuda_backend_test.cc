// Every operation of the CUDA backend against the CPU backend on fresh random
// inputs, by normalised error (||gpu - cpu|| / ||cpu||) under a tolerance
// stated per operation. The CPU backend is the reference: it was checked
// against float64 references (kernels_test) and the real model against
// Hugging Face transformers (tests/reference).
//
// Tolerances: products and embeddings round weights (and, for products,
// activations) to bf16, whose relative step is 2^-8, so their error is a few
// 1e-3; float32 elementwise kernels differ only in the order of float
// operations (1e-5); attention reads the same half-float KV on both sides
// (1e-3 covers fp16 rounding of a k whose rotation differed in its last bit).
//
// Skips, saying why, where there is no CUDA device or module.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "engine/kernels/cpu/cpu_backend.h"
#include "tests/gpu/gpu_test_support.h"
#include "tests/unit/random_weights.h"

namespace tandem::kernels {
namespace {

using testing::CudaBackendOrWhyNot;
using testing::NormalisedError;

constexpr double kBf16ProductTolerance = 1e-2;
constexpr double kBf16EmbedTolerance = 4e-3;
constexpr double kFloatTolerance = 1e-5;
constexpr double kAttentionTolerance = 3e-3;

// A matrix that lives on both backends.
struct Both {
  Matrix cpu;
  Matrix gpu;
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Backend>> gpu = CudaBackendOrWhyNot();
    if (!gpu.ok()) GTEST_SKIP() << "no CUDA backend here: " << gpu.status();
    gpu_ = *std::move(gpu);
    cpu_ = std::make_unique<cpu::CpuBackend>(2, cpu::MatMulMode::kF32);
    seed_ = std::random_device{}();
    rng_.seed(seed_);
  }

  std::vector<float> Random(int64_t rows, int64_t cols, float stddev = 1.0f) {
    std::normal_distribution<float> n(0.0f, stddev);
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& x : v) x = n(rng_);
    return v;
  }

  Matrix AllocateOn(Backend& backend, int64_t rows, int64_t cols) {
    absl::StatusOr<std::unique_ptr<DeviceBuffer>> buffer =
        backend.Allocate(static_cast<size_t>(rows * cols) * sizeof(float));
    EXPECT_TRUE(buffer.ok()) << buffer.status();
    Matrix m{static_cast<float*>((*buffer)->data()), rows, cols};
    buffers_.push_back(*std::move(buffer));
    return m;
  }

  // A [rows][cols] matrix holding `host` on both backends.
  Both Make(int64_t rows, int64_t cols, const std::vector<float>& host) {
    Both m{AllocateOn(*cpu_, rows, cols), AllocateOn(*gpu_, rows, cols)};
    cpu_->CopyFromHost(host.data(), m.cpu);
    gpu_->CopyFromHost(host.data(), m.gpu);
    return m;
  }
  Both Make(int64_t rows, int64_t cols) {
    return Make(rows, cols, std::vector<float>(static_cast<size_t>(rows * cols), 0.0f));
  }

  static std::vector<float> Read(Backend& backend, const Matrix& m) {
    std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
    backend.CopyToHost(m, out.data());
    return out;
  }
  double Error(const Both& m) { return NormalisedError(Read(*gpu_, m.gpu), Read(*cpu_, m.cpu)); }

  // The same host weight on both backends.
  std::pair<Weight, Weight> UploadBoth(DType type, int64_t rows, int64_t cols, const void* data) {
    absl::StatusOr<Weight> c = cpu_->UploadWeight(type, rows, cols, data);
    absl::StatusOr<Weight> g = gpu_->UploadWeight(type, rows, cols, data);
    EXPECT_TRUE(c.ok() && g.ok()) << c.status() << " " << g.status();
    return {*c, *g};
  }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers_;
  std::vector<std::vector<uint8_t>> host_weights_;  // outlive the uploads
  std::vector<std::vector<float>> host_floats_;     // likewise
  unsigned seed_ = 0;
  std::mt19937 rng_;
};

TEST_F(CudaOpsTest, EmbedEveryWeightType) {
  const int64_t vocab = 300, dim = 576;
  const std::vector<int32_t> ids = {0, 299, 17, 17, 123, 5, 250};
  for (DType type : kAllTypes) {
    host_weights_.push_back(RandomWeights(type, vocab, dim, rng_));
    auto [wc, wg] = UploadBoth(type, vocab, dim, host_weights_.back().data());
    Both out = Make(static_cast<int64_t>(ids.size()), dim);
    cpu_->Embed(wc, ids, out.cpu);
    gpu_->Embed(wg, ids, out.gpu);
    // Float32 tables stay float32 on the device: exact.
    const double tolerance = type == DType::kF32 ? 0.0 : kBf16EmbedTolerance;
    EXPECT_LE(Error(out), tolerance) << Info(type).name << " seed " << seed_;
  }
}

TEST_F(CudaOpsTest, MatMulEveryWeightTypeWithBiasAndSharedInput) {
  const int64_t rows = 7, k = 512;
  const Both x = Make(rows, k, Random(rows, k));
  for (DType type : kAllTypes) {
    const int64_t outs_rows[] = {96, 32, 64};
    std::vector<std::pair<Weight, Weight>> w;
    for (int64_t n : outs_rows) {
      host_weights_.push_back(RandomWeights(type, n, k, rng_));
      w.push_back(UploadBoth(type, n, k, host_weights_.back().data()));
    }
    // Host data outlives its uploads (UploadWeight's contract).
    host_floats_.push_back(Random(1, 96));
    auto [bias_c, bias_g] = UploadBoth(DType::kF32, 1, 96, host_floats_.back().data());
    const Both out0 = Make(rows, 96), out1 = Make(rows, 32), out2 = Make(rows, 64);
    const Weight* wc[] = {&w[0].first, &w[1].first, &w[2].first};
    const Weight* wg[] = {&w[0].second, &w[1].second, &w[2].second};
    const Weight* bc[] = {&bias_c, nullptr, nullptr};
    const Weight* bg[] = {&bias_g, nullptr, nullptr};
    const Matrix oc[] = {out0.cpu, out1.cpu, out2.cpu};
    const Matrix og[] = {out0.gpu, out1.gpu, out2.gpu};
    cpu_->MatMul(x.cpu, wc, bc, oc);
    gpu_->MatMul(x.gpu, wg, bg, og);
    for (const Both* out : {&out0, &out1, &out2}) {
      EXPECT_LE(Error(*out), kBf16ProductTolerance) << Info(type).name << " seed " << seed_;
    }
  }
}

TEST_F(CudaOpsTest, MatMulAtModelShapes) {
  // An 8B model's projection at a decode batch and a prefill chunk.
  for (int64_t rows : {1, 64, 333}) {
    const int64_t k = 4096, n = 1024;
    host_weights_.push_back(RandomWeights(DType::kQ4_0, n, k, rng_));
    auto [wc, wg] = UploadBoth(DType::kQ4_0, n, k, host_weights_.back().data());
    const Both x = Make(rows, k, Random(rows, k));
    const Both out = Make(rows, n);
    const Weight* pc[] = {&wc};
    const Weight* pg[] = {&wg};
    const Matrix oc[] = {out.cpu};
    const Matrix og[] = {out.gpu};
    cpu_->MatMul(x.cpu, pc, {}, oc);
    gpu_->MatMul(x.gpu, pg, {}, og);
    EXPECT_LE(Error(out), kBf16ProductTolerance) << rows << " rows, seed " << seed_;
  }
}

// Up to 8 rows go through our few-row kernel (skinny_matmul.h), every
// weight in one launch; 9 rows, a width that is not a multiple of 8 or five
// weights go to cuBLAS. Widths: 576 (72 chunks of 8: only the kernel's
// remainder loop), 2112 (264 chunks: two unrolled passes, then a tail that
// only lanes 0-7 take), 4100 (falls back). Row counts that are not
// multiples of 8 end a launch inside a block and put a weight's first row
// mid-block; the bias is large enough that dropping it fails the check.
TEST_F(CudaOpsTest, MatMulOfFewRowsOnBothSidesOfTheKernelsLimits) {
  for (int64_t k : {576, 2112, 4100}) {
    const std::vector<int64_t> outs_rows = {61, 8, 24, 203, 16};
    const DType type = k % 32 == 0 ? DType::kQ8_0 : DType::kF16;  // Q8_0: 32-wide blocks
    std::vector<std::pair<Weight, Weight>> w;
    for (int64_t n : outs_rows) {
      host_weights_.push_back(RandomWeights(type, n, k, rng_));
      w.push_back(UploadBoth(type, n, k, host_weights_.back().data()));
    }
    host_floats_.push_back(Random(1, 203, 50.0f));
    auto [bias_c, bias_g] = UploadBoth(DType::kF32, 1, 203, host_floats_.back().data());
    for (size_t weights : {size_t{4}, size_t{5}}) {
      for (int64_t rows = 1; rows <= 9; ++rows) {
        const Both x = Make(rows, k, Random(rows, k));
        std::vector<Both> outs;
        std::vector<const Weight*> wc, wg, bc, bg;
        std::vector<Matrix> oc, og;
        for (size_t i = 0; i < weights; ++i) {
          outs.push_back(Make(rows, outs_rows[i]));
          wc.push_back(&w[i].first);
          wg.push_back(&w[i].second);
          bc.push_back(i == 3 ? &bias_c : nullptr);
          bg.push_back(i == 3 ? &bias_g : nullptr);
        }
        for (const Both& out : outs) {
          oc.push_back(out.cpu);
          og.push_back(out.gpu);
        }
        cpu_->MatMul(x.cpu, wc, bc, oc);
        gpu_->MatMul(x.gpu, wg, bg, og);
        for (size_t i = 0; i < weights; ++i) {
          EXPECT_LE(Error(outs[i]), kBf16ProductTolerance)
              << rows << " rows, k " << k << ", weight " << i << " of " << weights << ", seed "
              << seed_;
        }
      }
    }
  }
}

// A row's product does not depend on the rows beside it up to the kernel's
// limit: each output's sum runs in one fixed order (skinny_matmul.h).
TEST_F(CudaOpsTest, AFewRowProductGivesEachRowTheBitsItHasAlone) {
  const int64_t k = 4096, n = 1536;
  host_weights_.push_back(RandomWeights(DType::kQ4_0, n, k, rng_));
  const Weight weight = UploadBoth(DType::kQ4_0, n, k, host_weights_.back().data()).second;
  const std::vector<float> rows8 = Random(8, k);
  const Both x8 = Make(8, k, rows8);
  const Both out8 = Make(8, n);
  const Weight* pg[] = {&weight};
  const Matrix og8[] = {out8.gpu};
  gpu_->MatMul(x8.gpu, pg, {}, og8);
  const std::vector<float> together = Read(*gpu_, out8.gpu);
  for (int64_t r : {0, 3, 7}) {
    const Both x1 =
        Make(1, k, std::vector<float>(rows8.begin() + r * k, rows8.begin() + (r + 1) * k));
    const Both out1 = Make(1, n);
    const Matrix og1[] = {out1.gpu};
    gpu_->MatMul(x1.gpu, pg, {}, og1);
    const std::vector<float> alone = Read(*gpu_, out1.gpu);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), together.begin() + r * n))
        << "row " << r << ", seed " << seed_;
  }
}

TEST_F(CudaOpsTest, NormsElementwiseAndGather) {
  const int64_t rows = 19, cols = 4096;
  const std::vector<float> weight_host = Random(1, cols);
  auto [wc, wg] = UploadBoth(DType::kF32, 1, cols, weight_host.data());
  const std::vector<float> a_host = Random(rows, cols), b_host = Random(rows, cols);

  Both out = Make(rows, cols);
  Both x = Make(rows, cols, a_host);
  cpu_->RmsNorm(x.cpu, wc, 1e-5f, out.cpu);
  gpu_->RmsNorm(x.gpu, wg, 1e-5f, out.gpu);
  EXPECT_LE(Error(out), kFloatTolerance) << "RmsNorm, seed " << seed_;

  // In place (out aliases x).
  cpu_->RmsNorm(x.cpu, wc, 1e-5f, x.cpu);
  gpu_->RmsNorm(x.gpu, wg, 1e-5f, x.gpu);
  EXPECT_LE(Error(x), kFloatTolerance) << "RmsNorm in place, seed " << seed_;

  // AddRmsNorm with out aliasing the added matrix, as the model calls it.
  Both acc = Make(rows, cols, a_host);
  Both h = Make(rows, cols, b_host);
  cpu_->AddRmsNorm(acc.cpu, h.cpu, wc, 1e-5f, h.cpu);
  gpu_->AddRmsNorm(acc.gpu, h.gpu, wg, 1e-5f, h.gpu);
  EXPECT_LE(Error(acc), kFloatTolerance) << "AddRmsNorm sum, seed " << seed_;
  EXPECT_LE(Error(h), kFloatTolerance) << "AddRmsNorm norm, seed " << seed_;

  Both gate = Make(rows, cols, a_host), up = Make(rows, cols, b_host), silu = Make(rows, cols);
  cpu_->SiluMul(gate.cpu, up.cpu, silu.cpu);
  gpu_->SiluMul(gate.gpu, up.gpu, silu.gpu);
  EXPECT_LE(Error(silu), kFloatTolerance) << "SiluMul, seed " << seed_;
  Both gelu = Make(rows, cols);
  cpu_->GeluMul(gate.cpu, up.cpu, gelu.cpu);
  gpu_->GeluMul(gate.gpu, up.gpu, gelu.gpu);
  EXPECT_LE(Error(gelu), kFloatTolerance) << "GeluMul, seed " << seed_;
  cpu_->Softcap(gelu.cpu, 0.5f);
  gpu_->Softcap(gelu.gpu, 0.5f);
  EXPECT_LE(Error(gelu), kFloatTolerance) << "Softcap, seed " << seed_;
  cpu_->Scale(gelu.cpu, 3.0f);
  gpu_->Scale(gelu.gpu, 3.0f);
  EXPECT_LE(Error(gelu), kFloatTolerance) << "Scale, seed " << seed_;

  cpu_->Add(gate.cpu, up.cpu);
  gpu_->Add(gate.gpu, up.gpu);
  EXPECT_LE(Error(gate), kFloatTolerance) << "Add, seed " << seed_;

  const std::vector<int32_t> targets = {3, 0, 11};
  const std::vector<float> scatter_weights = {0.5f, -2.0f, 1.25f};
  Both experts_out = Make(3, cols, a_host);
  cpu_->ScatterAddRows(gate.cpu, targets, scatter_weights, experts_out.cpu);
  gpu_->ScatterAddRows(gate.gpu, targets, scatter_weights, experts_out.gpu);
  EXPECT_LE(Error(gate), kFloatTolerance) << "ScatterAddRows, seed " << seed_;

  const std::vector<int32_t> rows_wanted = {18, 0, 7, 7};
  Both gathered = Make(4, cols);
  cpu_->GatherRows(up.cpu, rows_wanted, gathered.cpu);
  gpu_->GatherRows(up.gpu, rows_wanted, gathered.gpu);
  EXPECT_EQ(Error(gathered), 0.0) << "GatherRows copies exactly";
}

// The rotary table the model builds: (cos, sin) of p * theta_i.
std::vector<float> RopeTable(int positions, int rotary_dims) {
  std::vector<float> table(static_cast<size_t>(positions * rotary_dims));
  for (int p = 0; p < positions; ++p) {
    for (int i = 0; i < rotary_dims / 2; ++i) {
      const double angle = p * std::pow(10000.0, -2.0 * i / rotary_dims);
      table[static_cast<size_t>(p * rotary_dims + 2 * i)] = static_cast<float>(std::cos(angle));
      table[static_cast<size_t>(p * rotary_dims + 2 * i + 1)] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

struct AttentionCase {
  int heads, kv_heads, head_dim;
  int window = 0;        // AttentionShape::window
  float softcap = 0.0f;  // AttentionShape::softcap
};

class CudaAttentionTest : public CudaOpsTest,
                          public ::testing::WithParamInterface<AttentionCase> {};

// Four sequences in one ragged batch, as a mixed step has them: a decode row
// after 700 tokens (the per-row kernel, keys split), a 37-token prompt from
// position 0 (one query tile), a 5-token chunk at 300 (per-row kernel) and a
// 100-token chunk at 150 (two query tiles over four key tiles); each on its
// own shuffled blocks. K/V go in through
// RopeWriteKv (fused on the GPU, the composed default on the CPU); then
// attention; then copy-on-write copies of the first sequence's blocks must
// give the same attention; and a second (latency-lane) backend sharing the
// KV reads the same pages.
TEST_P(CudaAttentionTest, PagedAttentionAcrossARaggedBatch) {
  const AttentionCase c = GetParam();
  const int block_size = 16, blocks = 160, layers = 2, layer = 1;
  const KvCacheShape shape{layers, blocks, block_size, c.kv_heads, c.head_dim};
  ASSERT_TRUE(cpu_->CreateKvCache(shape).ok());
  ASSERT_TRUE(gpu_->CreateKvCache(shape).ok());
  const int rotary = c.head_dim;
  const std::vector<float> table_host = RopeTable(1024, rotary);
  auto [table_c, table_g] = UploadBoth(DType::kF32, 1024, rotary, table_host.data());
  RopeSpec rope_c{table_c, rotary, true}, rope_g{table_g, rotary, true};

  std::vector<int32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng_);
  struct Seq {
    int first_position, rows;
    std::vector<int32_t> table;
  };
  std::vector<Seq> seqs = {{700, 1, {}}, {0, 37, {}}, {300, 5, {}}, {150, 100, {}}};
  size_t next = 0;
  for (Seq& s : seqs) {
    const int needed = (s.first_position + s.rows + block_size - 1) / block_size;
    s.table.assign(ids.begin() + static_cast<std::ptrdiff_t>(next),
                   ids.begin() + static_cast<std::ptrdiff_t>(next + needed));
    next += static_cast<size_t>(needed);
  }
  AttentionShape ashape{c.heads, c.kv_heads, c.head_dim,
                        1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  ashape.window = c.window;
  ashape.softcap = c.softcap;
  const int64_t q_width = int64_t{c.heads} * c.head_dim,
                kv_width = int64_t{c.kv_heads} * c.head_dim;

  // Every position of every sequence goes through RopeWriteKv once (its
  // history, then the rows attended now).
  for (const Seq& s : seqs) {
    const int64_t n = s.first_position + s.rows;
    std::vector<int32_t> positions(static_cast<size_t>(n)), slots(static_cast<size_t>(n));
    for (int64_t p = 0; p < n; ++p) {
      positions[static_cast<size_t>(p)] = static_cast<int32_t>(p);
      slots[static_cast<size_t>(p)] = s.table[static_cast<size_t>(p / block_size)] * block_size +
                                      static_cast<int32_t>(p % block_size);
    }
    Both q = Make(n, q_width, Random(n, q_width)), k = Make(n, kv_width, Random(n, kv_width)),
         v = Make(n, kv_width, Random(n, kv_width));
    cpu_->RopeWriteKv(layer, q.cpu, k.cpu, v.cpu, ashape, positions, slots, rope_c);
    gpu_->RopeWriteKv(layer, q.gpu, k.gpu, v.gpu, ashape, positions, slots, rope_g);
    EXPECT_LE(Error(q), kFloatTolerance) << "rotated q, seed " << seed_;
    EXPECT_LE(Error(k), kFloatTolerance) << "rotated k, seed " << seed_;
  }

  std::vector<AttentionSpan> spans;
  int32_t rows = 0;
  for (const Seq& s : seqs) {
    spans.push_back({rows, s.rows, s.first_position, s.table});
    rows += s.rows;
  }
  const Both q = Make(rows, q_width, Random(rows, q_width));
  const Both out = Make(rows, q_width);
  cpu_->Attention(layer, q.cpu, ashape, spans, out.cpu);
  gpu_->Attention(layer, q.gpu, ashape, spans, out.gpu);
  EXPECT_LE(Error(out), kAttentionTolerance) << "attention, seed " << seed_;
  const std::vector<float> gpu_out = Read(*gpu_, out.gpu);

  // The decode row alone: few rows and a long context split the keys over
  // blocks that a second kernel merges.
  {
    const AttentionSpan alone[] = {{0, 1, seqs[0].first_position, seqs[0].table}};
    const Both q1 = Make(1, q_width, Random(1, q_width));
    const Both out1 = Make(1, q_width);
    cpu_->Attention(layer, q1.cpu, ashape, alone, out1.cpu);
    gpu_->Attention(layer, q1.gpu, ashape, alone, out1.gpu);
    EXPECT_LE(Error(out1), kAttentionTolerance) << "split keys, seed " << seed_;
  }

  // Copy-on-write: the first sequence's blocks copied to unused ones read
  // the same on the GPU, bit for bit.
  std::vector<std::pair<int32_t, int32_t>> copies;
  std::vector<int32_t> copied_table;
  for (int32_t b : seqs[0].table) {
    copies.emplace_back(b, ids[next]);
    copied_table.push_back(ids[next++]);
  }
  gpu_->CopyKvBlocks(copies);
  spans[0].block_table = copied_table;
  const Both out_copy = Make(rows, q_width);
  gpu_->Attention(layer, q.gpu, ashape, spans, out_copy.gpu);
  EXPECT_EQ(Read(*gpu_, out_copy.gpu), gpu_out) << "attention over copied blocks";

  // The latency lane's backend shares the pages.
  absl::StatusOr<std::unique_ptr<Backend>> decode = CudaBackendOrWhyNot(LanePriority::kLatency);
  ASSERT_TRUE(decode.ok()) << decode.status();
  ASSERT_TRUE((*decode)->ShareKvCache(*gpu_).ok());
  absl::StatusOr<std::unique_ptr<DeviceBuffer>> lane_out =
      (*decode)->Allocate(static_cast<size_t>(rows * q_width) * sizeof(float));
  ASSERT_TRUE(lane_out.ok());
  const Matrix lane_matrix{static_cast<float*>((*lane_out)->data()), rows, q_width};
  (*decode)->Attention(layer, q.gpu, ashape, spans, lane_matrix);
  EXPECT_EQ(Read(**decode, lane_matrix), gpu_out) << "the other lane's backend";
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaAttentionTest,
    ::testing::Values(AttentionCase{9, 3, 64},    // SmolLM2-135M
                      AttentionCase{32, 8, 128},  // Llama 3 8B
                      AttentionCase{28, 4, 128},  // Qwen2.5 7B
                      // Gemma 2's sliding layers (window shortened
                      // below the chunks' lengths) with soft-capping,
                      // and Gemma 3 1B's head size (per-row kernel).
                      AttentionCase{8, 4, 128, 100, 2.0f}, AttentionCase{4, 1, 256, 90, 0.0f}),
    [](const ::testing::TestParamInfo<AttentionCase>& info) {
      return "heads" + std::to_string(info.param.heads) + "_kv" +
             std::to_string(info.param.kv_heads) + "_dim" + std::to_string(info.param.head_dim) +
             (info.param.window > 0 ? "_window" + std::to_string(info.param.window) : "") +
             (info.param.softcap > 0 ? "_softcap" : "");
    });

TEST_F(CudaOpsTest, RopeBothPairings) {
  const int64_t rows = 11;
  const int heads = 4, head_dim = 64;
  const std::vector<float> table_host = RopeTable(512, head_dim);
  auto [table_c, table_g] = UploadBoth(DType::kF32, 512, head_dim, table_host.data());
  std::vector<int32_t> positions(rows);
  std::uniform_int_distribution<int32_t> pick(0, 511);
  for (int32_t& p : positions) p = pick(rng_);
  for (bool neox : {false, true}) {
    Both x = Make(rows, heads * head_dim, Random(rows, heads * head_dim));
    cpu_->Rope(x.cpu, heads, head_dim, positions, {table_c, head_dim, neox});
    gpu_->Rope(x.gpu, heads, head_dim, positions, {table_g, head_dim, neox});
    EXPECT_LE(Error(x), kFloatTolerance) << "neox " << neox << ", seed " << seed_;
  }
}

TEST_F(CudaOpsTest, ArgMaxRowsPicksTheLowestIndexAmongEqualMaxima) {
  const int64_t rows = 37, cols = 49152;
  std::vector<float> host = Random(rows, cols);
  // Row r has its maximum twice (at r and at r + 1000): the lower index wins.
  for (int64_t r = 0; r < rows; ++r) {
    host[static_cast<size_t>(r * cols + r)] = 100.0f;
    host[static_cast<size_t>(r * cols + r + 1000)] = 100.0f;
  }
  host[static_cast<size_t>(5 * cols + 7)] = NAN;  // never wins
  const Both x = Make(rows, cols, host);
  std::vector<int32_t> gpu_tokens(rows), cpu_tokens(rows);
  gpu_->ArgMaxRows(x.gpu, gpu_tokens);
  cpu_->ArgMaxRows(x.cpu, cpu_tokens);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(gpu_tokens[static_cast<size_t>(r)], r);
  EXPECT_EQ(gpu_tokens, cpu_tokens);
}

// Sampling is integer arithmetic after the weights (sample_row.h), so the
// device must draw exactly the host's token from the same logits, for every
// kind of draw.
TEST_F(CudaOpsTest, SampleRowsDrawsTheHostTokenExactly) {
  const int64_t cols = 151936;  // Qwen2.5's vocabulary
  std::vector<RowDraw> draws;
  for (float temperature : {0.0f, 0.3f, 1.0f, 1.7f}) {
    for (int32_t top_k : {0, 1, 2, 40, 256, 5000}) {
      for (float top_p : {1.0f, 0.95f, 0.5f, 1e-6f}) {
        for (double u : {0.0, 0.37, 1.0 - 0x1p-53}) {
          RowDraw d;
          d.temperature = temperature;
          d.top_k = top_k;
          d.top_p = top_p;
          d.u = u;
          draws.push_back(d);
        }
      }
    }
  }
  const auto rows = static_cast<int64_t>(draws.size());
  std::vector<float> host = Random(rows, cols);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  for (int64_t r = 0; r < rows; ++r) {
    float* row = host.data() + r * cols;
    // Spread logits (many weights round to 0), ties straddling the k-th
    // place, a shared maximum, a negative zero.
    const float spread = r % 3 == 0 ? 30.0f : 3.0f;
    for (int64_t c = 0; c < cols; ++c) row[c] *= spread;
    for (int64_t i = 0; i < 300; ++i) row[7 * i + r % 7] = 2.5f * spread;
    row[cols - 1] = 4.0f * spread;
    row[3] = 4.0f * spread;
    row[11] = -0.0f;
    if (r % 5 == 4) draws[static_cast<size_t>(r)].u = uniform(rng_);
  }
  const Both x = Make(rows, cols, host);
  std::vector<int32_t> gpu_tokens(static_cast<size_t>(rows)), cpu_tokens(gpu_tokens.size());
  gpu_->SampleRows(x.gpu, draws, gpu_tokens);
  cpu_->SampleRows(x.cpu, draws, cpu_tokens);
  for (int64_t r = 0; r < rows; ++r) {
    const RowDraw& d = draws[static_cast<size_t>(r)];
    EXPECT_EQ(gpu_tokens[static_cast<size_t>(r)], cpu_tokens[static_cast<size_t>(r)])
        << "row " << r << ": temperature " << d.temperature << ", top_k " << d.top_k << ", top_p "
        << d.top_p << ", u " << d.u << ", seed " << seed_;
  }
  // With shares (what verifying a draft model's sampled drafts copies): the
  // same tokens, and each asked-for token's share exactly the host's, for
  // the sampled token (inside the nucleus), the top token, one far down the
  // ranks (often outside it) and none (-1).
  std::vector<int32_t> share_tokens(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t choices[] = {cpu_tokens[static_cast<size_t>(r)], 3, 100000, -1};
    share_tokens[static_cast<size_t>(r)] = choices[r % 4];
  }
  std::vector<NucleusShare> gpu_shares(static_cast<size_t>(rows)), cpu_shares(gpu_shares.size());
  std::vector<int32_t> gpu_shared_tokens(gpu_tokens.size()), cpu_shared_tokens(gpu_tokens.size());
  gpu_->SampleRowsWithShares(x.gpu, draws, gpu_shared_tokens, share_tokens, gpu_shares);
  cpu_->SampleRowsWithShares(x.cpu, draws, cpu_shared_tokens, share_tokens, cpu_shares);
  EXPECT_EQ(gpu_shared_tokens, cpu_tokens);
  EXPECT_EQ(cpu_shared_tokens, cpu_tokens);
  for (int64_t r = 0; r < rows; ++r) {
    const auto i = static_cast<size_t>(r);
    EXPECT_EQ(gpu_shares[i].weight, cpu_shares[i].weight) << "row " << r << ", seed " << seed_;
    EXPECT_EQ(gpu_shares[i].mass, cpu_shares[i].mass) << "row " << r << ", seed " << seed_;
  }
}

// Logprobs: the alternatives' ids exactly the host's (rank order, ties by
// lower id), their values and the sampled token's within float rounding of
// a double-precision sum in another order.
TEST_F(CudaOpsTest, LogprobRowsGiveTheHostsAlternativesAndValues) {
  const int64_t rows = 7, cols = 49152;
  std::vector<float> host = Random(rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < 30; ++i) host[static_cast<size_t>(r * cols + 11 * i + r)] = 3.0f;
  }
  const Both x = Make(rows, cols, host);
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(cols) - 1);
  for (int32_t& t : tokens) t = pick(rng_);
  for (int top : {0, 1, 5, 20, 32}) {
    const auto n = static_cast<size_t>(rows * top);
    std::vector<float> gpu_token(static_cast<size_t>(rows)), cpu_token(gpu_token.size());
    std::vector<int32_t> gpu_ids(n), cpu_ids(n);
    std::vector<float> gpu_values(n), cpu_values(n);
    gpu_->LogprobRows(x.gpu, tokens, top, gpu_token, gpu_ids, gpu_values);
    cpu_->LogprobRows(x.cpu, tokens, top, cpu_token, cpu_ids, cpu_values);
    EXPECT_EQ(gpu_ids, cpu_ids) << "top " << top << ", seed " << seed_;
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(gpu_values[i], cpu_values[i], 1e-5) << i;
    for (size_t r = 0; r < gpu_token.size(); ++r)
      ASSERT_NEAR(gpu_token[r], cpu_token[r], 1e-5) << r;
  }
}

TEST_F(CudaOpsTest, UnsupportedHeadDimensionIsRefusedAtKvCreation) {
  const absl::Status s = gpu_->CreateKvCache({1, 4, 16, 2, 80});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
}

}  // namespace
}  // namespace tandem::kernels
