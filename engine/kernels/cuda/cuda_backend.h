// The CUDA backend: the Backend interface on one NVIDIA GPU.
//
// - Weights: decoded at upload to bf16 in device memory (quantized GGUF
//   types through cpu/to_bf16.h); float32 vectors (norms, biases) and the
//   rotary table stay float32. One device copy per host tensor per process,
//   shared by every backend that uploads it (the two lanes of a daemon).
// - Matrix products: cuBLAS, bf16 inputs (activations rounded to bf16 on the
//   device), float32 accumulation and output.
// - KV pages: IEEE half in device memory, in exactly the CPU backend's layout
//   (backend.h's KvStorage), so block ids, block bytes and KV transfers are
//   the same on both devices.
// - Our kernels (kernels.h) for everything else; the fused AddRmsNorm and
//   RopeWriteKv are single kernels here.
// - Lanes: each backend issues on its own stream; the latency lane's
//   (decode) has the device's highest priority, so its kernels are scheduled
//   ahead of a running prefill's as SMs free up. Where the driver has green
//   contexts, the throughput lane (prefill) also has a stream on an SM
//   partition that leaves --cuda_decode_sms SMs out, and issues there while
//   the decode lane is busy (lane_partition.h); it widens to the whole device
//   when decode is idle. It stays at most two matrix products or attention
//   calls ahead of the device, so a switch takes effect within about one
//   kernel.
// - Recorded steps (RunStep): the first step of a key runs as usual (and
//   sizes every buffer), the second is captured into a CUDA graph, later
//   ones replay it: the step's operations only stage their host inputs
//   (UploadArena) and one graph launch runs them. A recording is void once a
//   buffer it uses moved (scratch or arena growth).
//
// Operations are asynchronous; CopyToHost waits for the stream. A CUDA error
// inside an operation ends the process (cuda_check.h).
#ifndef TANDEM_ENGINE_KERNELS_CUDA_CUDA_BACKEND_H_
#define TANDEM_ENGINE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/kernels/backend.h"
#include "engine/kernels/cuda/green_partition.h"
#include "engine/kernels/cuda/lane_partition.h"
#include "engine/kernels/cuda/upload_arena.h"

namespace tandem::kernels::cuda {

class CudaBackend final : public Backend {
 public:
  // Creates a backend on `device` for `lane`; `decode_sms` is
  // --cuda_decode_sms (DecodeReservedSms: -1 auto, 0 no SM partition).
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device, LanePriority lane,
                                                             int decode_sms = -1);
  ~CudaBackend() override;

  std::string name() const override { return name_; }
  std::string arithmetic() const override { return arithmetic_; }
  void BindCallingThread() override;
  // The latency lane marks the device's decode lane busy (lane_partition.h).
  absl::Duration BeginStep() override;
  absl::Duration EndStep() override;

  absl::StatusOr<std::unique_ptr<DeviceBuffer>> Allocate(size_t bytes) override;
  // cudaMemGetInfo's free bytes on the backend's device.
  absl::StatusOr<int64_t> FreeMemoryBytes() const override;
  bool MemoryIsHost() const override { return false; }
  // bf16 for matrices; float32 vectors stay float32 (a float32 matrix has
  // both). Both lanes' backends hold the same device copies of a weight
  // (SharedDeviceCopy), so the model's weights take this once per process.
  int64_t WeightBytes(DType dtype, int64_t rows, int64_t cols) const override;
  absl::StatusOr<Weight> UploadWeight(DType dtype, int64_t rows, int64_t cols,
                                      const void* host_data) override;
  absl::Status CreateKvCache(const KvCacheShape& shape) override;
  absl::Status ShareKvCache(const Backend& other) override;
  const KvCacheShape& kv_cache_shape() const override { return kv_shape_; }
  KvStorage kv_storage() const override;
  void CopyToHost(const Matrix& src, float* dst) override;
  void CopyFromHost(const float* src, Matrix dst) override;

  void Embed(const Weight& table, std::span<const int32_t> ids, Matrix out) override;
  void MatMul(const Matrix& x, std::span<const Weight* const> weights,
              std::span<const Weight* const> biases, std::span<const Matrix> outs) override;
  void RmsNorm(const Matrix& x, const Weight& weight, float eps, Matrix out) override;
  void Rope(Matrix x, int heads, int head_dim, std::span<const int32_t> positions,
            const RopeSpec& rope) override;
  void CopyKvBlocks(std::span<const std::pair<int32_t, int32_t>> copies) override;
  void WriteKv(int layer, const Matrix& k, const Matrix& v,
               std::span<const int32_t> slots) override;
  void Attention(int layer, const Matrix& q, const AttentionShape& shape,
                 std::span<const AttentionSpan> spans, Matrix out) override;
  void SiluMul(const Matrix& gate, const Matrix& up, Matrix out) override;
  void GeluMul(const Matrix& gate, const Matrix& up, Matrix out) override;
  void Scale(Matrix x, float factor) override;
  void Softcap(Matrix x, float cap) override;
  void Add(Matrix acc, const Matrix& x) override;
  void GatherRows(const Matrix& x, std::span<const int32_t> rows, Matrix out) override;
  void ScatterAddRows(Matrix acc, std::span<const int32_t> rows, std::span<const float> weights,
                      const Matrix& x) override;
  void AddRmsNorm(Matrix acc, const Matrix& x, const Weight& weight, float eps,
                  Matrix out) override;
  void RopeWriteKv(int layer, Matrix q, Matrix k, const Matrix& v, const AttentionShape& shape,
                   std::span<const int32_t> positions, std::span<const int32_t> slots,
                   const RopeSpec& rope) override;

  void ArgMaxRows(const Matrix& x, std::span<int32_t> out) override;
  void SampleRows(const Matrix& x, std::span<const RowDraw> draws,
                  std::span<int32_t> tokens) override;
  void SampleRowsWithShares(const Matrix& x, std::span<const RowDraw> draws,
                            std::span<int32_t> tokens, std::span<const int32_t> share_tokens,
                            std::span<NucleusShare> shares) override;
  void LogprobRows(const Matrix& x, std::span<const int32_t> tokens, int top,
                   std::span<float> token_logprobs, std::span<int32_t> top_ids,
                   std::span<float> top_logprobs) override;
  bool SupportsStepGraphs() const override { return true; }
  void RunStep(const StepGraphSpec& spec, const std::function<void()>& ops) override;

 private:
  // How operations run: issued one by one (eagerly, or into a recording),
  // or only staging their inputs for a replay. `in_step_` also sizes the
  // attention inputs for the step's spec rather than for its data.
  enum class Mode : uint8_t { kIssue, kRecord, kReplay };
  struct Recording {
    cudaGraphExec_t exec = nullptr;
    int64_t scratch_generation = 0;
    int64_t arena_generation = 0;
  };
  using RecordingKey = std::pair<int64_t, int64_t>;  // StepGraphSpec's owner, key
  bool Replaying() const { return mode_ == Mode::kReplay; }
  // Records ops() as the graph of `key` and launches it; false (nothing
  // kept, ops() issued eagerly instead) if the capture fails.
  bool RecordAndLaunch(const RecordingKey& key, const std::function<void()>& ops);

  CudaBackend(int device, LanePriority lane, int decode_sms)
      : device_(device), lane_(lane), decode_sms_flag_(decode_sms) {}
  absl::Status Init();
  // The throughput lane, before a matrix product or an attention call of an
  // eager step: keeps the host at most two such calls ahead of the device,
  // and issues into the narrowed partition while the decode lane is busy,
  // into the whole device otherwise.
  void FollowDecodeLane();
  // SampleRows(), with shares where share_tokens is not empty.
  void SampleOnDevice(const Matrix& x, std::span<const RowDraw> draws, std::span<int32_t> tokens,
                      std::span<const int32_t> share_tokens, std::span<NucleusShare> shares);
  // Issues from now on into `next`, after everything issued so far.
  void UseStream(cudaStream_t next);
  // Whether work is issued into the narrowed partition (its green context's
  // stream) now, rather than into the whole device.
  bool OnPartition() const { return narrowed_ != nullptr && stream_ == narrowed_->stream(); }
  // Records `event` after everything issued so far into stream_ (on the
  // partition through its green context: GreenPartition::RecordEvent).
  void RecordEvent(cudaEvent_t event, const char* what);
  // Device scratch of at least `bytes`, grown (after a wait) when needed.
  void* Scratch(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes);
  // Scratch for outputs read back outside recorded steps (token ids,
  // sampling scratch): its growth leaves recordings valid.
  void* OutputScratch(std::unique_ptr<DeviceBuffer>& buffer, size_t bytes);
  uint16_t* KPool(int layer) const;
  uint16_t* VPool(int layer) const;

  const int device_;
  const LanePriority lane_;
  const int decode_sms_flag_;
  std::string name_;
  std::string arithmetic_;
  int multiprocessors_ = 0;
  cudaStream_t stream_ = nullptr;      // where operations are issued now
  cudaStream_t own_stream_ = nullptr;  // the lane's stream on the whole device
  // The throughput lane's stream on an SM partition, while decode is busy
  // (null: no partition, by the flag or because the driver has none).
  std::unique_ptr<GreenPartition> narrowed_;
  std::shared_ptr<LatencyLaneActivity> decode_activity_;  // null without a partition
  cudaEvent_t switch_event_ = nullptr;                    // orders a stream switch
  cudaEvent_t ahead_event_ = nullptr;                     // FollowDecodeLane's bound
  bool ahead_recorded_ = false;
  cublasHandle_t cublas_ = nullptr;
  UploadArena uploads_;
  std::unique_ptr<DeviceBuffer> bf16_activations_;   // MatMul's rounded input
  std::unique_ptr<DeviceBuffer> attention_partial_;  // split-key states
  std::unique_ptr<DeviceBuffer> cublas_workspace_;   // fixed, so cuBLAS can be captured
  std::unique_ptr<DeviceBuffer> argmax_tokens_;      // ArgMaxRows' and SampleRows' output
  std::unique_ptr<DeviceBuffer> sampling_weights_;   // SampleRows' scratch: 8 bytes a logit
  std::unique_ptr<DeviceBuffer> nucleus_shares_;     // SampleRowsWithShares' shares
  std::unique_ptr<DeviceBuffer> logprobs_;           // LogprobRows' outputs
  int64_t scratch_generation_ = 0;                   // bumped when a scratch buffer moves
  Mode mode_ = Mode::kIssue;
  bool in_step_ = false;
  StepGraphSpec step_;
  std::set<RecordingKey> warmed_up_;  // keys whose first step ran
  std::map<RecordingKey, Recording> recordings_;
  std::map<int64_t, int64_t> owner_generations_;  // StepGraphSpec's, per owner
  // The attention inputs of the step being issued: the same spans for every
  // layer, packed and uploaded once per upload epoch.
  // Same spans: every field and every table entry equal.
  struct AttentionInputsKey {
    std::vector<AttentionSpan> spans;
    std::vector<int32_t> tables;  // the spans' tables, by content
    int64_t rows = 0;
    int64_t epoch = -1;
    bool Matches(std::span<const AttentionSpan> other, int64_t other_rows,
                 int64_t other_epoch) const;
    void Set(std::span<const AttentionSpan> new_spans, int64_t new_rows, int64_t new_epoch);
  };
  struct AttentionInputs {
    AttentionInputsKey key;
    const int32_t* words = nullptr;  // device copy
    int32_t max_keys = 0;
    int64_t untiled_rows = 0;
    int32_t tile_offset = 0;
    int32_t tiles = 0;
  };
  AttentionInputs attention_inputs_;
  bool graphs_failed_ = false;  // a capture failed: steps run eagerly from then on
  // Device copies of uploaded weights, shared process-wide (see above).
  std::vector<std::shared_ptr<DeviceBuffer>> weights_;
  KvCacheShape kv_shape_;
  std::shared_ptr<DeviceBuffer> kv_storage_;  // shared by the backends of one daemon
};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_ENGINE_KERNELS_CUDA_CUDA_BACKEND_H_
