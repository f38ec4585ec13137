// The compute backend interface: the only code that knows which device runs.
//
// The transformer forward pass (engine/model) is written once against this
// interface. A backend owns device memory (activation buffers, the paged KV
// storage) and runs the operations below on float32 activations stored as
// row-major matrices, one row per token.
//
// Determinism contract (the CPU backend): each output element is computed
// with a reduction order that depends only on that element's own inputs, never
// on how many rows the batch has, which other rows are present, how the prompt
// is chunked, or how many threads run. So a token's activations are bitwise
// the same alone, batched or chunked. The CUDA backend is deterministic run to
// run for one batch shape, but its matrix products (cuBLAS) may pick another
// reduction order for another number of rows: its results agree with the
// CPU's within bf16 rounding, not bitwise (docs/cuda.md).
//
// Thread safety: a backend instance is used by one thread at a time (its
// worker); it may use its own threads internally. Operations may run
// asynchronously; CopyToHost() waits for everything issued before it.
#ifndef TANDEM_ENGINE_KERNELS_BACKEND_H_
#define TANDEM_ENGINE_KERNELS_BACKEND_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "engine/kernels/dtype.h"
#include "engine/kernels/sample_row.h"

namespace tandem::kernels {

// A row-major float32 matrix in backend memory. A view: it does not own.
struct Matrix {
  float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;

  float* Row(int64_t r) const { return data + r * cols; }
  Matrix FirstRows(int64_t count) const { return {data, count, cols}; }
};

// A weight matrix in its storage type: `rows` output features, each a
// contiguous row of `cols` input features. Vectors (norm weights, biases) are
// F32 weights with one row.
struct Weight {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;  // backend memory
  // The backend's own copy laid out for matrix products, if it made one at
  // upload (the CPU backend's packed panels); `data` stays valid for the
  // other uses (an embedding table tied to the output projection).
  const void* packed = nullptr;
};

// Memory owned by a backend; freed when the last owner lets go.
class DeviceBuffer {
 public:
  DeviceBuffer(void* data, size_t bytes, std::function<void(void*)> release)
      : data_(data), bytes_(bytes), release_(std::move(release)) {}
  ~DeviceBuffer() {
    if (release_) release_(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
  std::function<void(void*)> release_;
};

// The paged KV storage: for each layer, K and V pools of `blocks` blocks,
// each holding `block_size` token slots of [kv_heads][head_dim] 16-bit
// floats: halves, or bfloat16 where the backend's arithmetic says so (the CPU
// bf16 mode). Slot s of the pool is token (s % block_size) of block (s / block_size).
struct KvCacheShape {
  int layers = 0;
  int blocks = 0;
  int block_size = 0;
  int kv_heads = 0;
  int head_dim = 0;

  size_t BytesPerBlock() const {
    return size_t{2} * layers * block_size * kv_heads * head_dim * sizeof(uint16_t);
  }
};

// The paged KV storage as one block of backend memory: [layer][K, V][block]
// [slot][kv head][head dim] 16-bit floats, so block b of layer l's K pool
// starts at ((2 * l) * blocks + b) * (BytesPerBlock() / (2 * layers)) bytes
// and its V pool one pool later. What a KV-transfer agent registers.
struct KvStorage {
  void* data = nullptr;  // null before CreateKvCache
  size_t bytes = 0;
  bool device = false;  // device memory (a GPU's), not host memory
};

// Rotary embedding of the first `rotary_dims` dimensions of each head.
// `table` holds, for each position p < max_positions and each pair i <
// rotary_dims/2, the pair (cos, sin) of p * theta_i, as one F32 weight row per
// position. `neox` selects the pairing: (i, i + rotary_dims/2) when true,
// (2i, 2i+1) otherwise (the layout GGUF uses for Llama, whose Q/K weights the
// converter permuted).
struct RopeSpec {
  // [position][rotary_dims / 2][cos, sin] float32, uploaded as one row
  // (a table, not a product operand: backends make no product copy of it).
  Weight table;
  int rotary_dims = 0;
  bool neox = false;
};

// One sequence's part of a ragged batch: rows [first_row, first_row + rows) of
// the batch are its tokens at positions first_position.. in order. Each query
// attends to the keys at positions 0..its own position, read from the blocks
// in `block_table` (host memory), which must already hold them.
struct AttentionSpan {
  int32_t first_row = 0;
  int32_t rows = 0;
  int32_t first_position = 0;
  std::span<const int32_t> block_table;
};

struct AttentionShape {
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
  // A sliding window (Gemma's local layers): a query at position p sees only
  // the keys at positions > p - window. 0: every earlier key.
  int window = 0;
  // Soft-capping of the scaled scores (Gemma 2): s -> softcap * tanh(s /
  // softcap) before the softmax. 0: none.
  float softcap = 0.0f;
};

// Which lane of work a backend computes for, when two lanes (workers) share
// one device's compute. The latency lane (decode) goes first: a step of it
// takes the compute from the throughput lane (prefill) within a small bound
// and gives it back when it ends; otherwise the throughput lane uses all of
// it. The CPU backend maps this to one thread pool with preemption between
// small tasks (cpu/compute_pool.h); a GPU backend maps it to stream
// priorities or resizable SM partitions.
enum class LanePriority : uint8_t { kLatency, kThroughput };

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  // What decides how this backend's results round, e.g.
  // "cpu-avx512/bf16/r1" (instruction set, --cpu_matmul mode and the
  // kernels' revision, bumped whenever one's rounding changes; not the
  // thread count, which changes no bit): two backends that report the same
  // string compute the same bits from the same inputs, and daemons that
  // hand requests to each other must (server/peer_service.cc), or a
  // request's tokens would depend on where it ran.
  virtual std::string arithmetic() const = 0;

  // Binds the calling thread (the one that will run this backend's
  // operations) to the backend's CPUs or device. Default: nothing to do.
  virtual void BindCallingThread() {}

  // Brackets one worker step; every BeginStep() is followed by one
  // EndStep() on the same thread. On compute shared by two lanes:
  // BeginStep() on the latency lane takes the compute from the throughput
  // lane and returns how long that took (the start delay); EndStep() on the
  // throughput lane returns how long, during the step, the latency lane held
  // the compute (time the step yielded). Zero where nothing is shared.
  virtual absl::Duration BeginStep() { return absl::ZeroDuration(); }
  virtual absl::Duration EndStep() { return absl::ZeroDuration(); }

  // --- memory ---------------------------------------------------------------
  virtual absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) = 0;
  // Makes a host weight usable by this backend. The backend may keep pointing
  // at `host_data` instead of copying it. REQUIRES: host_data outlives every
  // use of the returned weight.
  virtual absl::StatusOr<Weight> UploadWeight(DType dtype, int64_t rows, int64_t cols,
                                              const void* host_data) = 0;
  // Allocates the paged KV storage (replacing any previous one).
  virtual absl::Status CreateKvCache(const KvCacheShape& shape) = 0;
  // Bytes free now in the memory this backend keeps weights and KV pages in
  // (--kv_cache_memory_fraction sizes the KV cache from it, less
  // WeightBytes() of the weights not uploaded yet). The default cannot tell.
  virtual absl::StatusOr<int64_t> FreeMemoryBytes() const {
    return absl::UnimplementedError(name() + " cannot tell how much memory is free");
  }
  // Whether that memory is the host's (so what the daemon keeps on the host
  // beside the model, such as the suffix cache, comes out of it too).
  virtual bool MemoryIsHost() const { return true; }
  // Bytes of that memory UploadWeight(dtype, rows, cols, ...) will take.
  virtual int64_t WeightBytes(DType /*dtype*/, int64_t /*rows*/, int64_t /*cols*/) const {
    return 0;
  }
  // Gives the KV storage's memory back to the system where the device can
  // (its contents read as zeros after): start-up's measurements write pages
  // that no request will read. REQUIRES: no block holds data anything will
  // read, and no one else (a KV transport) has registered the storage.
  virtual void ReleaseKvPages() {}
  // Gives back the memory of blocks `blocks` in layers `layers`, their K and
  // V, where the device can (a page only when it lies wholly inside those
  // blocks' part of a pool): afterwards those parts read as zeros, or keep
  // their bytes, until written. For sliding-window layers' blocks that no
  // position will read again (kvcache::KvCacheManager::EnableSlidingRelease).
  // May run while a step runs. REQUIRES: nothing reads those blocks in those
  // layers until they are written again, and no KV transport has registered
  // the storage (it could go on reading the old pages).
  virtual void ReleaseKvBlockPages(std::span<const int32_t> /*blocks*/,
                                   std::span<const int> /*layers*/) {}
  // Uses the KV storage of `other` (a backend on the same device), so that
  // two workers read and write one paged cache: a handoff between them moves
  // a block table, not bytes.
  virtual absl::Status ShareKvCache(const Backend& other) = 0;
  virtual const KvCacheShape& kv_cache_shape() const = 0;
  virtual KvStorage kv_storage() const = 0;
  virtual void CopyToHost(const Matrix& src, float* dst) = 0;
  virtual void CopyFromHost(const float* src, Matrix dst) = 0;

  // --- operations (all shapes are REQUIREd to agree) -------------------------
  // out[i] = dequantized row ids[i] of `table`.
  virtual void Embed(const Weight& table, std::span<const int32_t> ids, Matrix out) = 0;
  // outs[w][r][n] = sum_k x[r][k] * weights[w][n][k] (+ biases[w][n] when the
  // bias is non-null). Several weights sharing one input run as one call.
  virtual void MatMul(const Matrix& x, std::span<const Weight* const> weights,
                      std::span<const Weight* const> biases, std::span<const Matrix> outs) = 0;
  // out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight. out may alias x.
  virtual void RmsNorm(const Matrix& x, const Weight& weight, float eps, Matrix out) = 0;
  // Rotates, in place, each of the `heads` heads of every row of x by the
  // position of that row.
  virtual void Rope(Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
                    const RopeSpec& rope) = 0;
  // Copies every layer's K and V of block `from` into block `to`, pair by
  // pair in order (copy-on-write of shared blocks).
  virtual void CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> copies) = 0;
  // Stores row r of k and v into KV slot slots[r] of `layer`. A slot of -1
  // stores nothing: rows that only pad a recorded step (RunStep) have one,
  // and only backends that support recorded steps get them.
  virtual void WriteKv(int layer, const Matrix& k, const Matrix& v,
                       std::span<const int32_t> slots) = 0;
  // Causal grouped-query attention of q (rows: tokens, cols: heads*head_dim)
  // over the paged KV of `layer`.
  virtual void Attention(int layer, const Matrix& q, const AttentionShape& shape,
                         std::span<const AttentionSpan> spans, Matrix out) = 0;
  // out = silu(gate) * up, elementwise.
  virtual void SiluMul(const Matrix& gate, const Matrix& up, Matrix out) = 0;
  // out = gelu(gate) * up, elementwise, with GELU's tanh approximation
  // (PyTorch's approximate="tanh", which Gemma uses):
  // gelu(x) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3).
  virtual void GeluMul(const Matrix& gate, const Matrix& up, Matrix out) = 0;
  // x *= factor, elementwise (Gemma's embedding scale).
  virtual void Scale(Matrix x, float factor) = 0;
  // x = cap * tanh(x / cap), elementwise (Gemma 2's final logits).
  virtual void Softcap(Matrix x, float cap) = 0;
  // acc += x, elementwise.
  virtual void Add(Matrix acc, const Matrix& x) = 0;
  // out[i] = x[rows[i]].
  virtual void GatherRows(const Matrix& x, std::span<const int32_t> rows, Matrix out) = 0;
  // acc[rows[i]] += weights[i] * x[i] (a product, then a sum, per element):
  // an expert's outputs added into its tokens' rows. REQUIRES distinct rows.
  virtual void ScatterAddRows(Matrix acc, std::span<const int32_t> rows,
                              std::span<const float> weights, const Matrix& x) = 0;

  // --- tokens picked on the device ---------------------------------------------
  // The defaults below read x through HostRows(): a copy in `scratch` (after
  // waiting, like CopyToHost), or x itself where it is host memory.
  virtual const float* HostRows(const Matrix& x, std::vector<float>& scratch) {
    scratch.resize(static_cast<size_t>(x.rows * x.cols));
    CopyToHost(x, scratch.data());
    return scratch.data();
  }

  // NaN logits are not supported by the token pickers below: a GPU never
  // picks a NaN, the host rule picks index 0 when row[0] is one.
  //
  // out[r] = the index of row r's largest value, the lowest index among equal
  // ones (the sampler's greedy rule), so greedy decoding copies token ids,
  // not logits, to the host. Waits, like CopyToHost. The default copies the
  // rows to the host and picks there.
  virtual void ArgMaxRows(const Matrix& x, std::span<int32_t> out) {
    std::vector<float> scratch;
    const float* host = HostRows(x, scratch);
    for (int64_t r = 0; r < x.rows; ++r) {
      out[static_cast<size_t>(r)] =
          ArgMax(std::span<const float>(host + r * x.cols, static_cast<size_t>(x.cols)));
    }
  }

  // tokens[r] = SampleRow(row r, draws[r]) (sample_row.h) bit for bit: every
  // backend draws the same token from the same logits, so sampling copies
  // token ids, not rows of the vocabulary, and a seeded request's tokens do
  // not depend on the device that drew them. Waits, like CopyToHost.
  // REQUIRES x.cols <= kMaxVocabulary. The default samples on the host.
  virtual void SampleRows(const Matrix& x, std::span<const RowDraw> draws,
                          std::span<int32_t> tokens) {
    std::vector<float> scratch;
    const float* host = HostRows(x, scratch);
    for (int64_t r = 0; r < x.rows; ++r) {
      tokens[static_cast<size_t>(r)] =
          SampleRow(std::span<const float>(host + r * x.cols, static_cast<size_t>(x.cols)),
                    draws[static_cast<size_t>(r)]);
    }
  }

  // SampleRows(), also giving for each row r with share_tokens[r] >= 0 that
  // token's NucleusShare under draws[r] (SampleRowWithShare, sample_row.h;
  // rows with -1 get {0, 1}), so verifying drafts sampled from a
  // distribution copies 16 bytes a drafted token, not rows of the
  // vocabulary. Waits, like CopyToHost. REQUIRES share_tokens and shares of
  // x.rows entries, share_tokens[r] < x.cols. The default samples on the host.
  virtual void SampleRowsWithShares(const Matrix& x, std::span<const RowDraw> draws,
                                    std::span<int32_t> tokens,
                                    std::span<const int32_t> share_tokens,
                                    std::span<NucleusShare> shares) {
    std::vector<float> scratch;
    const float* host = HostRows(x, scratch);
    for (int64_t r = 0; r < x.rows; ++r) {
      const auto i = static_cast<size_t>(r);
      const std::span<const float> row(host + r * x.cols, static_cast<size_t>(x.cols));
      if (share_tokens[i] < 0) {
        tokens[i] = SampleRow(row, draws[i]);
        shares[i] = NucleusShare{};
      } else {
        tokens[i] = SampleRowWithShare(row, draws[i], share_tokens[i], &shares[i]);
      }
    }
  }

  // For each row r of x: the log-probability of tokens[r] under the row's
  // log-softmax, and the row's `top` most likely tokens (rank order: larger
  // logit, then lower id) with theirs, as LogprobsOf (sample_row.h) gives
  // them: token_logprobs is [rows], top_ids and top_logprobs [rows][top].
  // The ids are exact; the values agree with LogprobsOf's to float rounding
  // (a device may sum in another order). Waits, like CopyToHost.
  // REQUIRES 0 <= top <= min(x.cols, kMaxLogprobs).
  static constexpr int kMaxLogprobs = 32;
  virtual void LogprobRows(const Matrix& x, std::span<const int32_t> tokens, int top,
                           std::span<float> token_logprobs, std::span<int32_t> top_ids,
                           std::span<float> top_logprobs) {
    std::vector<float> scratch;
    const float* host = HostRows(x, scratch);
    const auto k = static_cast<size_t>(top);
    for (int64_t r = 0; r < x.rows; ++r) {
      const auto row = static_cast<size_t>(r);
      const RowLogprobs logprobs = LogprobsOf(
          std::span<const float>(host + r * x.cols, static_cast<size_t>(x.cols)), tokens[row], top);
      token_logprobs[row] = logprobs.token;
      for (size_t i = 0; i < k; ++i) {
        top_ids[row * k + i] = logprobs.top[i].first;
        top_logprobs[row * k + i] = logprobs.top[i].second;
      }
    }
  }

  // --- recorded steps (CUDA graphs) --------------------------------------------
  // A backend that can record a sequence of its operations once and replay
  // it (cheaper than issuing each operation) says so here. The caller then
  // runs a step's operations inside RunStep(spec, ops): the first time a key
  // is seen ops() runs as usual; later the backend may record it and, from
  // then on, replay the recording instead of issuing the operations. ops()
  // is still called on every step (the backend takes the step's host inputs
  // from it), so it must issue exactly the same operations with inputs of
  // exactly the same sizes whenever the key is the same; only the inputs'
  // values may change. Nothing inside ops() may wait (no CopyToHost).
  struct StepGraphSpec {
    int64_t owner = 0;  // who issues the steps (unique in the process)
    int64_t key = 0;    // which step, for that owner
    // The owner's buffers: when it changes, the backend drops what it
    // recorded for the owner's older buffers (they moved or were freed).
    int64_t generation = 0;
    int32_t max_keys = 0;            // no attention row attends more keys
    int32_t max_blocks_per_row = 0;  // no span's block table is longer
  };
  virtual bool SupportsStepGraphs() const { return false; }
  virtual void RunStep(const StepGraphSpec& spec, const std::function<void()>& ops) { ops(); }

  // --- fused operations -------------------------------------------------------
  // Each is defined as the sequence of operations its default runs; a backend
  // overrides it to do the same in one pass (fewer launches and memory reads
  // on a GPU). The CPU backend keeps the defaults.
  //
  // acc += x, then out = RmsNorm(acc). out may alias x.
  virtual void AddRmsNorm(Matrix acc, const Matrix& x, const Weight& weight, float eps,
                          Matrix out) {
    Add(acc, x);
    RmsNorm(acc, weight, eps, out);
  }
  // Rotates q's and k's heads by their rows' positions, then stores k and v
  // into `layer`'s KV slots (Rope, Rope, WriteKv).
  virtual void RopeWriteKv(int layer, Matrix q, Matrix k, const Matrix& v,
                           const AttentionShape& shape, std::span<const int32_t> positions,
                           std::span<const int32_t> slots, const RopeSpec& rope) {
    Rope(q, shape.heads, shape.head_dim, positions, rope);
    Rope(k, shape.kv_heads, shape.head_dim, positions, rope);
    WriteKv(layer, k, v, slots);
  }
};

}  // namespace tandem::kernels

#endif  // TANDEM_ENGINE_KERNELS_BACKEND_H_
