// The Llama-family transformer (Llama 2/3, SmolLM2, Qwen2-style GQA with
// optional Q/K/V biases, Qwen3's Q/K norms, Phi-3's fused tensors, Gemma 2/3's
// GELU, post-norms, soft-capping and sliding-window layers, Qwen3-MoE's and
// OLMoE's experts): weights bound to a backend, and the forward pass over a
// ragged batch of sequences whose KV lives in the backend's paged cache.
//
// Experts are routed on the host (the router's logits are read back once a
// layer, Backend::HostRows), then each chosen expert multiplies the rows of
// its tokens, gathered, and adds them back weighted: so a mixture-of-experts
// model runs no recorded steps (which experts run depends on the data).
//
// Thread safety: Forward() is called by one thread at a time (the owning
// worker). The model keeps the GgufFile alive: weights point into its mapping.
#ifndef TANDEM_ENGINE_MODEL_LLAMA_MODEL_H_
#define TANDEM_ENGINE_MODEL_LLAMA_MODEL_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kernels/backend.h"
#include "engine/model/gguf_file.h"
#include "engine/model/model_config.h"
#include "engine/model/moe_routing.h"

namespace tandem::model {

// One sequence's part of a forward pass: `tokens` at positions
// first_position.. (earlier positions are already in the KV cache, in the
// blocks of `block_table`, which also has room for these tokens). Logits are
// produced for the last `logits` tokens (0: none; 1: the next-token logits).
struct SequenceInput {
  std::span<const int32_t> tokens;
  int32_t first_position = 0;
  std::span<const int32_t> block_table;
  int32_t logits = 0;
};

class LlamaModel {
 public:
  // Binds the file's weights to `backend` and creates the backend's KV cache
  // with `kv_blocks` blocks of `block_size` tokens.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(std::shared_ptr<const GgufFile> file,
                                                            kernels::Backend* backend,
                                                            int kv_blocks, int block_size,
                                                            const ModelOverrides& overrides = {});

  // The bytes of `backend`'s memory that Create() on `file` takes for its
  // weights: Backend::WeightBytes of every upload it makes, the rotary table
  // included and a tensor bound twice (tied embeddings) counted once; not
  // the KV cache or activations. Sizes the KV cache from free memory before
  // anything is loaded.
  static absl::StatusOr<int64_t> WeightBytes(const GgufFile& file, const kernels::Backend& backend,
                                             const ModelOverrides& overrides = {});

  // The same weights bound to `backend`, using `other`'s KV cache (its
  // backend's storage): a second worker on the same device. `other` must
  // outlive the new model's use of the cache.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> CreateSharingKv(const LlamaModel& other,
                                                                     kernels::Backend* backend);
  // The same weights bound to `backend` with a KV cache of its own of
  // `kv_blocks` blocks (other's block size): a second worker whose pages
  // move between the two.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> CreateLike(const LlamaModel& other,
                                                                kernels::Backend* backend,
                                                                int kv_blocks);

  const ModelConfig& config() const { return config_; }
  int block_size() const { return block_size_; }
  int kv_blocks() const { return kv_blocks_; }
  // Gives back the pages of `blocks` in the sliding-window layers
  // (Backend::ReleaseKvBlockPages); nothing when the model has none. Safe
  // while a step runs. REQUIRES: no position still to come reads those
  // blocks in those layers (kvcache::KvCacheManager::EnableSlidingRelease).
  void ReleaseSlidingKvPages(std::span<const int32_t> blocks);

  // Runs the sequences as one batch. Writes, for each sequence in order, its
  // `logits` rows of config().vocab floats to `logits_out` (host memory).
  // Validates positions, token ids and block tables first; an invalid input is
  // an InvalidArgument error and nothing is computed.
  //
  // `layers` > 0 runs only the first `layers` layers, then the output norm
  // and head: the layer-skip self-draft of speculative decoding. It writes
  // only those layers' KV, which are exactly what the full model writes for
  // the same tokens, so the draft shares the model's KV cache.
  absl::Status Forward(std::span<const SequenceInput> sequences, std::vector<float>* logits_out,
                       int layers = 0);
  // Forward() that writes, instead of each logits row, its greedy token (the
  // largest logit, the lowest id among equal ones), picked where the logits
  // are (Backend::ArgMaxRows): a GPU copies token ids, not logits.
  absl::Status ForwardGreedy(std::span<const SequenceInput> sequences,
                             std::vector<int32_t>* tokens_out, int layers = 0);
  // Forward() that writes, instead of each logits row, the token drawn from
  // it with draws[row] (Backend::SampleRows: exactly kernels::SampleRow), so
  // a GPU copies token ids, not logits. With `logprobs`, also each sampled
  // token's log-probability and its row's logprobs->top most likely tokens
  // (Backend::LogprobRows). REQUIRES one draw per logits row,
  // 0 <= logprobs->top <= Backend::kMaxLogprobs.
  struct SampledLogprobs {
    int top = 0;                      // set by the caller
    std::vector<float> token;         // [rows]
    std::vector<int32_t> top_ids;     // [rows][top]
    std::vector<float> top_logprobs;  // [rows][top]
  };
  // With `shares`, also each row's share of its drawn distribution for one
  // token (Backend::SampleRowsWithShares): what verifying a draft sampled
  // from a distribution needs of the target's row at each drafted token.
  struct RowShares {
    std::vector<int32_t> tokens;               // set by the caller, one a row; -1: none
    std::vector<kernels::NucleusShare> share;  // [rows]
  };
  absl::Status ForwardSample(std::span<const SequenceInput> sequences,
                             std::span<const kernels::RowDraw> draws,
                             std::vector<int32_t>* tokens_out, SampledLogprobs* logprobs = nullptr,
                             RowShares* shares = nullptr, int layers = 0);
  // Rows `rows` (any order, repeats allowed) of the logits the last forward
  // pass picked tokens from, if it was ForwardGreedy() or ForwardSample(),
  // one after another in `out` (rows.size() x config().vocab floats, host
  // memory): valid until the next forward pass, so a caller that picks on
  // the device copies only the rows it needs whole (a device gathers them
  // and copies once). InvalidArgument for a row it did not compute.
  absl::Status LastLogitsRows(std::span<const int32_t> rows, std::vector<float>* out);
  // Forward passes run so far (of any kind): tells a caller holding a row
  // number for LastLogitsRows() whether another pass came in between.
  int64_t forward_passes() const { return forward_passes_; }

  // Copies KV blocks (every layer), pair by pair: copy-on-write of blocks
  // shared by forked sequences. InvalidArgument for a block id out of range.
  absl::Status CopyBlocks(std::span<const std::pair<int32_t, int32_t>> copies);

  // Decode steps (one token and one logit row per sequence, at most
  // kMaxStepGraphBatch sequences) as recorded steps of the backend
  // (Backend::RunStep: CUDA graphs), where the backend has them. The batch is
  // padded to the next of a few sizes (StepGraphBatch) with rows that attend
  // nothing and store no KV, so a handful of recordings serve every batch.
  // On by default; off, every step issues its operations.
  void set_step_graphs(bool enabled) { step_graphs_ = enabled; }
  static constexpr int64_t kMaxStepGraphBatch = 256;
  // The recorded batch size that serves `rows` rows (rows <= kMaxStepGraphBatch).
  static int64_t StepGraphBatch(int64_t rows);

 private:
  struct Layer {
    kernels::Weight attn_norm, wq, wk, wv, wo, ffn_norm, gate, up, down;
    kernels::Weight bq, bk, bv;                     // rows == 0 when absent
    kernels::Weight q_norm, k_norm;                 // ModelConfig::qk_norm only
    kernels::Weight attn_post_norm, ffn_post_norm;  // ModelConfig::post_norms only
    // ModelConfig::IsMoe() only: the router ([experts][embedding]) and each
    // expert's gate, up and down (gate and up stay unset).
    kernels::Weight router;
    std::vector<kernels::Weight> expert_gate, expert_up, expert_down;
  };
  // The rotary tables (host copies): one for every layer, or a second for
  // sliding-window layers that rotate differently (Gemma 3).
  struct RopeTables {
    std::shared_ptr<const std::vector<float>> global, sliding;
  };

  LlamaModel() = default;
  // `rope_tables`: another model's (same file and overrides), or empty to build them.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Bind(std::shared_ptr<const GgufFile> file,
                                                          kernels::Backend* backend,
                                                          const ModelOverrides& overrides,
                                                          RopeTables rope_tables = {});
  absl::Status BindRopeTables();
  absl::Status CreateKvCache(int kv_blocks, int block_size);
  absl::Status BindWeights();
  absl::Status EnsureCapacity(int64_t tokens, int64_t logit_rows);
  // Forward()'s body: computes the logits rows into logits_ and returns how
  // many there are.
  absl::StatusOr<int64_t> ComputeLogits(std::span<const SequenceInput> sequences, int layers);
  // Issues the forward pass's operations for a flattened batch, up to the
  // logits in logits_ (no wait).
  void IssueForward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                    std::span<const int32_t> slots, std::span<const kernels::AttentionSpan> spans,
                    std::span<const int32_t> logit_rows, int run_layers);
  // The experts' feed-forward of layer `l` on its normed input `in`, into `out`.
  void IssueExperts(const Layer& l, const kernels::Matrix& in, kernels::Matrix out);

  std::shared_ptr<const GgufFile> file_;
  kernels::Backend* backend_ = nullptr;
  ModelOverrides overrides_;
  ModelConfig config_;
  int block_size_ = 0;
  int kv_blocks_ = 0;

  kernels::Weight token_embedding_, output_norm_, output_;
  std::vector<Layer> layers_;
  // Shared by the models bound from one another (CreateSharingKv,
  // CreateLike), so a backend that copies weights once per host address
  // (the GPU's) keeps one device copy of it.
  RopeTables rope_tables_host_;
  kernels::RopeSpec rope_, rope_sliding_;

  bool step_graphs_ = true;
  // Identifies this model's recorded steps on its backend (process-unique:
  // a model made later at the same address is another owner).
  const int64_t step_owner_ = NextStepOwner();
  static int64_t NextStepOwner();
  // Activation buffers, grown on demand; a recorded step is valid only for
  // the buffers it was recorded with (their generation is in its key).
  int64_t buffers_generation_ = 0;
  int64_t capacity_tokens_ = 0;
  int64_t capacity_logit_rows_ = 0;
  std::vector<std::unique_ptr<kernels::DeviceBuffer>> buffers_;
  kernels::Matrix x_, h_, q_, k_, v_, attn_, gate_, up_, selected_, logits_;
  // Mixture of experts: router logits, an expert's gathered input rows and
  // its output rows, and the weighted sum of the experts' outputs.
  kernels::Matrix router_logits_, expert_in_, expert_out_, moe_out_;
  std::vector<float> router_host_, zeros_;
  ExpertAssignment assignment_;
  int64_t picked_rows_ = 0;  // rows of logits_ the last ForwardGreedy/Sample picked from
  std::unique_ptr<kernels::DeviceBuffer> gathered_;  // LastLogitsRows' rows on the device
  int64_t forward_passes_ = 0;
};

}  // namespace tandem::model

#endif  // TANDEM_ENGINE_MODEL_LLAMA_MODEL_H_
