// Everything the daemon serves with: the model file, its tokenizer and chat
// template, and the worker that runs it on a backend.
#ifndef TANDEM_SERVER_SERVING_MODEL_H_
#define TANDEM_SERVER_SERVING_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/decode/decode_worker.h"
#include "engine/grammar/token_grammar.h"
#include "engine/kernels/backend_factory.h"
#include "engine/kernels/cpu/compute_pool.h"
#include "engine/kernels/cpu/matmul.h"
#include "engine/model/gguf_file.h"
#include "engine/model/model_config.h"
#include "engine/prefill/prefill_worker.h"
#include "engine/speculative/suffix_cache.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "scheduler/disaggregation_policy.h"
#include "scheduler/speculation_policy.h"
#include "tandem/v1/generate.pb.h"

namespace tandem::server {

struct ServingModelOptions {
  std::string model_path;
  std::string chat_template;  // empty: detect from the model
  // CPU threads that compute, shared by both workers (0: one per CPU the
  // process may use). The decode worker's steps go first (compute_pool.h).
  int threads = 0;
  // Threads of `threads` set aside for the decode worker alone (hard
  // isolation: two pools on separate CPUs); 0: one shared pool.
  int decode_reserved_threads = 0;
  bool decode_worker = true;  // false: everything colocated on the prefill worker
  bool pin_threads = true;    // pin compute threads to CPUs
  kernels::Device device = kernels::Device::kCpu;  // what --device chose
  // Decode steps as recorded steps (CUDA graphs) where the device has them.
  bool step_graphs = true;
  // CUDA: SMs a prefill leaves free while decode runs (-1: auto, 0: none).
  int cuda_decode_sms = -1;
  kernels::cpu::MatMulMode matmul_mode = kernels::cpu::MatMulMode::kF32;
  // Why --cpu_matmul=auto chose matmul_mode (logged at start-up); empty when
  // the flag named the mode.
  std::string matmul_mode_reason;
  int64_t kv_cache_bytes = int64_t{512} << 20;
  // In (0, 1): size the KV cache to this fraction of the memory the backend
  // has free at start-up (host MemAvailable, or the GPU's free memory) less
  // what the weights will take of it, instead of kv_cache_bytes.
  double kv_cache_memory_fraction = 0;
  // > 0: the decode worker keeps its KV in storage of its own of this size
  // (separate from the prefill worker's), and handoffs move pages between
  // them; 0: both workers share one KV cache.
  int64_t decode_kv_cache_bytes = 0;
  int block_size = 16;
  int context_length = 0;  // 0: the model's
  // Speculative decoding proposers the workers offer (the scheduler decides
  // who uses them): n-gram matches of ngram_min..ngram_max tokens, suffix
  // matching (always offered), and a layer-skip self-draft of the first
  // draft_layers layers (0: none).
  int ngram_min = 1;
  int ngram_max = 3;
  int draft_layers = 0;
  // Suffix drafting: drafts of at most suffix_length_factor x the tokens a
  // copy agrees with (0: no such bound), and a cache of recent requests'
  // text of this many bytes to copy from across requests (0: none;
  // suffix_cache() feeds it).
  double suffix_length_factor = 0;
  int64_t speculation_cache_bytes = 0;
  // A separate draft model file (same vocabulary); empty: none. Its KV uses
  // the same block ids as the target's, in storage of its own (extra memory:
  // kv_blocks x its bytes per block).
  std::string draft_model_path;
  // Timed rounds of each start-up measurement (MeasureStepCosts,
  // MeasureDisaggregationCosts; each figure is their median), after a warm-up
  // (of every step, or of MeasureStepCosts' widest, 1-row and long-context
  // ones). Fewer start faster with noisier figures: the tests take 1.
  int measure_rounds = 5;
};

// The checks of the options ServingModel::Load takes that need no model,
// one per field, so that the daemon's flag reading (exit 2, the flag named)
// and Load (for benchmarks and tests) apply the same bounds:
// INVALID_ARGUMENT naming the flag the value comes from.
inline constexpr int kMaxMeasureRounds = 50;
absl::Status CheckMeasureRounds(int rounds);          // --startup_measure_rounds
absl::Status CheckSuffixLengthFactor(double factor);  // --spec_suffix_length_factor

// What the daemon measures of its step times at start-up
// (MeasureStepCosts in serving_model.cc), in ms.
struct StepCosts {
  // Where the scheduler's step-time model starts when the `auto` threshold's
  // timings are not taken (scheduler/step_time_model.h).
  scheduler::StepTimeCoefficients linear;
  scheduler::RowCurve rows;         // the backend's row curve, which the model keeps
  scheduler::DraftModelCost draft;  // a self-draft's or draft model's rounds
};

class ServingModel {
 public:
  // Loads and checks everything; errors name the file and what is wrong.
  static absl::StatusOr<std::unique_ptr<ServingModel>> Load(const ServingModelOptions& options);

  const model::ModelConfig& config() const { return config_; }
  const tokenizer::BpeTokenizer& tokenizer() const { return *tokenizer_; }
  const tokenizer::ChatTemplate& chat_template() const { return *chat_template_; }
  // Structured output's grammars, compiled against this model's vocabulary.
  const grammar::GrammarVocabulary& grammar() const { return *grammar_; }
  int context_length() const { return context_length_; }
  int kv_blocks() const { return kv_blocks_; }
  // Blocks of the decode worker's own KV storage; 0 when it shares the
  // prefill worker's.
  int decode_kv_blocks() const { return decode_kv_blocks_; }
  int block_size() const { return block_size_; }
  std::string backend_name() const { return backend_name_; }
  // What GetModelInfo reports (without the disaggregation threshold).
  v1::ModelInfo Info() const;
  // Start-up warnings for the log (e.g. more worker threads than CPUs).
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Step times measured at load on the worker that decodes.
  const StepCosts& step_costs() const { return step_costs_; }
  // Times, on all the compute, what the `auto` disaggregation threshold is
  // set from (scheduler/disaggregation_policy.h), with prompt chunks of
  // `chunk_tokens`. Before the scheduler starts only: it writes KV blocks.
  absl::StatusOr<scheduler::DisaggregationCosts> MeasureDisaggregationCosts(int chunk_tokens);
  // Gives back the KV pages start-up's measurements wrote (Backend::
  // ReleaseKvPages), a separate draft model's included: call once they are
  // done, before anything serves.
  void ReleaseKvPages();
  // Gives back the sliding-window layers' pages of `blocks` in the storage
  // both workers share (model::LlamaModel::ReleaseSlidingKvPages). REQUIRES
  // decode_kv_blocks() == 0. Safe while a step runs.
  void ReleaseSlidingKvPages(std::span<const int32_t> blocks);
  // The backend that owns the paged KV storage (both workers use it).
  const kernels::Backend& kv_backend() const { return prefill_->backend(); }
  // The decode worker's backend (its own KV storage when decode_kv_blocks()
  // > 0), or null without a decode worker.
  const kernels::Backend* decode_backend() const {
    return decode_ != nullptr ? &decode_->backend() : nullptr;
  }
  step::Worker* prefill_worker() { return prefill_.get(); }
  step::Worker* decode_worker() { return decode_.get(); }  // null when there is none
  // Recent requests' text that suffix drafting copies from (shared by the
  // workers; the scheduler adds each finished request's), or null when
  // options.speculation_cache_bytes is 0.
  const std::shared_ptr<speculative::SuffixCache>& suffix_cache() const { return suffix_cache_; }
  // What SchedulerOptions::on_finished_text takes to feed suffix_cache()
  // (null without one).
  std::function<void(std::string_view, std::span<const step::TokenId>)> SuffixCacheFeed() const {
    if (suffix_cache_ == nullptr) return nullptr;
    return [cache = suffix_cache_](std::string_view salt, std::span<const step::TokenId> tokens) {
      cache->Add(salt, tokens);
    };
  }

 private:
  ServingModel() = default;
  // Binds the draft model (options.draft_model_path, opened as `file`) for
  // both workers (after they exist).
  absl::Status LoadDraftModel(const ServingModelOptions& options,
                              std::shared_ptr<const model::GgufFile> file,
                              const std::shared_ptr<kernels::cpu::ComputePool>& prefill_pool,
                              const std::shared_ptr<kernels::cpu::ComputePool>& decode_pool);

  std::shared_ptr<const model::GgufFile> file_;
  model::ModelConfig config_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template_;
  std::unique_ptr<grammar::GrammarVocabulary> grammar_;
  std::unique_ptr<prefill::PrefillWorker> prefill_;
  std::unique_ptr<decode::DecodeWorker> decode_;
  std::string backend_name_;
  std::vector<std::string> backends_;  // one per worker
  std::string dtype_;
  std::vector<std::string> warnings_;
  StepCosts step_costs_;
  int measure_rounds_ = 5;  // ServingModelOptions::measure_rounds
  std::shared_ptr<speculative::SuffixCache> suffix_cache_;
  int context_length_ = 0;
  int kv_blocks_ = 0;
  int decode_kv_blocks_ = 0;
  int block_size_ = 0;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_SERVING_MODEL_H_
