// The model's recorded decode steps (Backend::RunStep, CUDA graphs on a GPU),
// checked on the CPU: a backend that claims recorded steps but runs every
// operation on the CPU backend, and checks RunStep's contract on the way:
// every step of a key issues the same operations on inputs of the same sizes,
// nothing inside waits, and padding rows store no KV. The model's logits
// through it must be bitwise those of the plain CPU backend (the CPU kernels
// are batch-invariant, so padding rows change nothing for the real ones).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/strings.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/model/llama_model.h"
#include "tests/integration/test_model.h"

namespace tandem {
namespace {

using kernels::AttentionShape;
using kernels::AttentionSpan;
using kernels::Backend;
using kernels::DType;
using kernels::Matrix;
using kernels::RopeSpec;
using kernels::Weight;

// Forwards every operation to a CPU backend; inside RunStep it logs each
// operation with its sizes, and compares the log with the key's first one.
class RecordingCheckBackend final : public Backend {
 public:
  explicit RecordingCheckBackend(int threads) : cpu_(threads) {}

  int steps_run() const { return steps_run_; }
  size_t keys() const { return logs_.size(); }

  std::string name() const override { return "recording check over " + cpu_.name(); }
  std::string arithmetic() const override { return cpu_.arithmetic(); }
  absl::StatusOr<std::unique_ptr<kernels::DeviceBuffer>> Allocate(size_t bytes) override {
    return cpu_.Allocate(bytes);
  }
  absl::StatusOr<Weight> UploadWeight(DType dtype, int64_t rows, int64_t cols,
                                      const void* host_data) override {
    return cpu_.UploadWeight(dtype, rows, cols, host_data);
  }
  absl::Status CreateKvCache(const kernels::KvCacheShape& shape) override {
    return cpu_.CreateKvCache(shape);
  }
  absl::Status ShareKvCache(const Backend& other) override { return cpu_.ShareKvCache(other); }
  const kernels::KvCacheShape& kv_cache_shape() const override { return cpu_.kv_cache_shape(); }
  kernels::KvStorage kv_storage() const override { return cpu_.kv_storage(); }
  void CopyToHost(const Matrix& src, float* dst) override {
    EXPECT_FALSE(in_step_) << "CopyToHost waits: not allowed inside a recorded step";
    cpu_.CopyToHost(src, dst);
  }
  void CopyFromHost(const float* src, Matrix dst) override { cpu_.CopyFromHost(src, dst); }

  void Embed(const Weight& table, std::span<const int32_t> ids, Matrix out) override {
    Log("Embed", ids.size(), out);
    cpu_.Embed(table, ids, out);
  }
  void MatMul(const Matrix& x, std::span<const Weight* const> weights,
              std::span<const Weight* const> biases, std::span<const Matrix> outs) override {
    Log("MatMul", weights.size(), x);
    cpu_.MatMul(x, weights, biases, outs);
  }
  void RmsNorm(const Matrix& x, const Weight& weight, float eps, Matrix out) override {
    Log("RmsNorm", 0, x);
    cpu_.RmsNorm(x, weight, eps, out);
  }
  void Rope(Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
            const RopeSpec& rope) override {
    Log("Rope", positions.size(), x);
    cpu_.Rope(x, heads, head_dim, positions, rope);
  }
  void CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> copies) override {
    EXPECT_FALSE(in_step_);
    cpu_.CopyKvBlocks(copies);
  }
  void WriteKv(int layer, const Matrix& k, const Matrix& v,
               std::span<const int32_t> slots) override {
    Log("WriteKv", slots.size(), k);
    // Padding rows (slot -1) come last and store nothing.
    size_t real = 0;
    while (real < slots.size() && slots[real] >= 0) ++real;
    for (size_t i = real; i < slots.size(); ++i) EXPECT_EQ(slots[i], -1) << "row " << i;
    cpu_.WriteKv(layer, k.FirstRows(static_cast<int64_t>(real)),
                 v.FirstRows(static_cast<int64_t>(real)), slots.first(real));
  }
  void Attention(int layer, const Matrix& q, const AttentionShape& shape,
                 std::span<const AttentionSpan> spans, Matrix out) override {
    Log("Attention", spans.size(), q);
    if (in_step_) {
      for (const AttentionSpan& span : spans) {
        EXPECT_LE(span.first_position + span.rows, step_.max_keys);
        EXPECT_LE(static_cast<int32_t>(span.block_table.size()), step_.max_blocks_per_row);
      }
    }
    cpu_.Attention(layer, q, shape, spans, out);
  }
  void SiluMul(const Matrix& gate, const Matrix& up, Matrix out) override {
    Log("SiluMul", 0, gate);
    cpu_.SiluMul(gate, up, out);
  }
  void GeluMul(const Matrix& gate, const Matrix& up, Matrix out) override {
    Log("GeluMul", 0, gate);
    cpu_.GeluMul(gate, up, out);
  }
  void Scale(Matrix x, float factor) override {
    Log("Scale", 0, x);
    cpu_.Scale(x, factor);
  }
  void Softcap(Matrix x, float cap) override {
    Log("Softcap", 0, x);
    cpu_.Softcap(x, cap);
  }
  void Add(Matrix acc, const Matrix& x) override {
    Log("Add", 0, acc);
    cpu_.Add(acc, x);
  }
  void GatherRows(const Matrix& x, std::span<const int32_t> rows, Matrix out) override {
    Log("GatherRows", rows.size(), x);
    cpu_.GatherRows(x, rows, out);
  }
  void ScatterAddRows(Matrix acc, std::span<const int32_t> rows, std::span<const float> weights,
                      const Matrix& x) override {
    Log("ScatterAddRows", rows.size(), x);
    cpu_.ScatterAddRows(acc, rows, weights, x);
  }

  bool SupportsStepGraphs() const override { return true; }
  void RunStep(const StepGraphSpec& spec, const std::function<void()>& ops) override {
    in_step_ = true;
    step_ = spec;
    log_.clear();
    ops();
    in_step_ = false;
    ++steps_run_;
    EXPECT_NE(spec.owner, 0);
    auto [it, first] = logs_.emplace(std::pair(spec.owner, spec.key), log_);
    if (!first) {
      EXPECT_EQ(log_, it->second) << "key " << spec.key
                                  << " issued other operations or sizes than its first step";
    }
  }

 private:
  void Log(const char* op, size_t count, const Matrix& m) {
    if (in_step_) log_.push_back(StrCat(op, " ", count, " ", m.rows, "x", m.cols));
  }

  kernels::cpu::CpuBackend cpu_;
  bool in_step_ = false;
  StepGraphSpec step_;
  int steps_run_ = 0;
  std::vector<std::string> log_;
  std::map<std::pair<int64_t, int64_t>, std::vector<std::string>> logs_;
};

TEST(StepGraphTest, PaddedRecordedDecodeStepsGiveTheSameLogits) {
  auto file = model::GgufFile::Open(testing::TestModelPath());
  ASSERT_TRUE(file.ok()) << file.status();
  std::shared_ptr<const model::GgufFile> shared(*std::move(file));
  constexpr int kBlockSize = 16, kBlocksPerSequence = 4, kSequences = 5;
  kernels::cpu::CpuBackend plain_backend(2);
  RecordingCheckBackend graph_backend(2);
  auto plain = model::LlamaModel::Create(shared, &plain_backend, kSequences * kBlocksPerSequence,
                                         kBlockSize);
  auto graphed = model::LlamaModel::Create(shared, &graph_backend, kSequences * kBlocksPerSequence,
                                           kBlockSize);
  ASSERT_TRUE(plain.ok() && graphed.ok());

  std::vector<std::vector<int32_t>> tables(kSequences), tokens(kSequences);
  for (int s = 0; s < kSequences; ++s) {
    for (int b = 0; b < kBlocksPerSequence; ++b) tables[s].push_back(s * kBlocksPerSequence + b);
    for (int i = 0; i < 5 + 3 * s; ++i) tokens[s].push_back(300 + 97 * s + 13 * i);
  }
  std::vector<int32_t> length(kSequences);
  // Prompts (not decode steps: issued as usual), then decode steps of 3
  // sequences (padded to 4), then of all 5 (padded to 8).
  std::vector<model::SequenceInput> inputs;
  for (int s = 0; s < kSequences; ++s) {
    inputs.push_back({tokens[s], 0, tables[s], 1});
    length[s] = static_cast<int32_t>(tokens[s].size());
  }
  std::vector<float> a, b;
  ASSERT_TRUE((*plain)->Forward(inputs, &a).ok());
  ASSERT_TRUE((*graphed)->Forward(inputs, &b).ok());
  ASSERT_EQ(a, b);
  EXPECT_EQ(graph_backend.steps_run(), 0) << "a prompt is not a recorded step";
  const int64_t vocab = (*plain)->config().vocab;
  int steps = 0;
  for (int batch : {3, 3, 3, 5, 5, 5}) {
    inputs.clear();
    for (int s = 0; s < batch; ++s) {
      // Greedy on the shared logits row of this sequence.
      const float* row = a.data() + static_cast<int64_t>(s) * vocab;
      tokens[s] = {static_cast<int32_t>(std::max_element(row, row + vocab) - row)};
      inputs.push_back({tokens[s], length[s]++, tables[s], 1});
    }
    ASSERT_TRUE((*plain)->Forward(inputs, &a).ok());
    ASSERT_TRUE((*graphed)->Forward(inputs, &b).ok());
    ++steps;
    ASSERT_EQ(a.size(), static_cast<size_t>(batch * vocab)) << "only the real rows come back";
    ASSERT_EQ(a, b) << "step " << steps << " (batch " << batch << ")";
  }
  EXPECT_EQ(graph_backend.steps_run(), steps);
  EXPECT_EQ(graph_backend.keys(), 2u) << "batches 3 and 5 pad to 4 and 8";

  // Off, no step is recorded.
  (*graphed)->set_step_graphs(false);
  inputs = {{tokens[0], length[0]++, tables[0], 1}};
  ASSERT_TRUE((*graphed)->Forward(inputs, &b).ok());
  EXPECT_EQ(graph_backend.steps_run(), steps);
}

TEST(StepGraphTest, BatchSizesPadToAFewRecordedSizes) {
  using model::LlamaModel;
  EXPECT_EQ(LlamaModel::StepGraphBatch(1), 1);
  EXPECT_EQ(LlamaModel::StepGraphBatch(3), 4);
  EXPECT_EQ(LlamaModel::StepGraphBatch(5), 8);
  EXPECT_EQ(LlamaModel::StepGraphBatch(17), 32);
  EXPECT_EQ(LlamaModel::StepGraphBatch(33), 48);
  EXPECT_EQ(LlamaModel::StepGraphBatch(65), 96);
  EXPECT_EQ(LlamaModel::StepGraphBatch(129), 160);
  EXPECT_EQ(LlamaModel::StepGraphBatch(256), 256);
}

}  // namespace
}  // namespace tandem
