#include "server/serving_model.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include "common/check.h"
#include "common/median.h"
#include "common/strings.h"
#include "engine/kernels/backend_factory.h"
#include "engine/model/llama_model.h"
#include "engine/model/random_model.h"
#include "server/kv_memory_plan.h"

namespace tandem::server {
namespace {

// --cuda_decode_sms, where there is a decode lane to leave SMs free for:
// without a decode worker no partition is made (and the prefill lane's
// run-ahead bound, which only a partition needs, is not paid).
int CudaDecodeSms(const ServingModelOptions& options) {
  return options.decode_worker ? options.cuda_decode_sms : 0;
}

}  // namespace

v1::ModelInfo ServingModel::Info() const {
  v1::ModelInfo info;
  info.set_name(config_.name);
  info.set_architecture(config_.architecture);
  info.set_context_length(context_length_);
  info.set_vocab_size(config_.vocab);
  info.set_chat_template(std::string(chat_template_->family_name()));
  info.set_dtype(dtype_);
  for (const std::string& b : backends_) info.add_backends(b);
  info.set_kv_block_size(block_size_);
  info.set_kv_blocks(kv_blocks_);
  return info;
}

namespace {

// Milliseconds of one forward pass of `inputs`, with tokens picked where the
// logits are, as the workers' steps and drafting rounds do (a GPU copies
// token ids, not rows).
absl::StatusOr<double> TimeOnce(model::LlamaModel& model,
                                std::span<const model::SequenceInput> inputs, int layers) {
  std::vector<int32_t> tokens;
  const absl::Time start = absl::Now();
  if (absl::Status s = model.ForwardGreedy(inputs, &tokens, layers); !s.ok()) return s;
  return absl::ToDoubleMilliseconds(absl::Now() - start);
}

// Median milliseconds of `rounds` forward passes of `inputs`, after one that
// warms up.
absl::StatusOr<double> TimeForward(model::LlamaModel& model,
                                   std::span<const model::SequenceInput> inputs, int layers,
                                   int rounds) {
  std::vector<double> ms;
  for (int run = 0; run <= rounds; ++run) {
    absl::StatusOr<double> t = TimeOnce(model, inputs, layers);
    if (!t.ok()) return t.status();
    if (run > 0) ms.push_back(*t);
  }
  return Median(std::move(ms));
}

// Measures, on `model`, where the scheduler's step-time model starts and the
// backend's row curve (scheduler/step_time_model.h): a step of one sequence
// at each of kWidths rows at the start of a sequence, and the 1-row and
// kSharedWidth-row steps after `context` tokens (what reading the KV costs
// its first row and its others), each the median of `rounds` runs (of the
// first 3 where the rounds pass 1 s: a large model, a sanitizer build)
// taken in rounds over all of them (a slow moment of a shared machine then
// moves one run of each, not every run of one, which would bend the curve); with a self-draft or a
// draft model, draft passes over 1 and 8 sequences. It writes KV only into blocks no sequence holds
// yet (the daemon has not started). The long context's KV is one computed block copied into the
// others: real, distinct memory (pages never written would all read the one shared zero page, from
// cache, and hide the cost of reading the KV).
absl::StatusOr<StepCosts> MeasureStepCosts(model::LlamaModel& model, model::LlamaModel* draft_model,
                                           int draft_layers, int rounds) {
  // Up to 32 rows: a verification drafts at most 32 by default, and the
  // widths past it cost most of the measurement (steps past the widest
  // are fitted as linear). Both sides of each step of the CPU kernels: 2/3
  // (four panels at a time to two), 4/5 (q8's tiles of 4), 8/9 and 16/17
  // (tiles of 8).
  constexpr std::array<int, 12> kWidths = {1, 2, 3, 4, 5, 6, 8, 9, 12, 16, 17, 32};
  constexpr int kSharedWidth = 8;
  const int widest = kWidths.back();
  const int block_size = model.block_size();
  // The long context stays inside the KV cache and the model's context.
  const int context = std::min({1024, (model.kv_blocks() - 1) * block_size - kSharedWidth,
                                model.config().context_length - kSharedWidth});
  if (context < block_size || model.config().context_length < widest) {
    return absl::InvalidArgumentError(
        StrCat("a context of ", model.config().context_length, " tokens and ", model.kv_blocks(),
               " KV blocks are too few to serve from (at least ",
               std::max(block_size + kSharedWidth, widest), " tokens and 2 blocks)"));
  }
  std::vector<int32_t> table((std::max(context + kSharedWidth, widest) + block_size - 1) /
                             block_size);
  if (static_cast<int64_t>(table.size()) > model.kv_blocks()) {
    return absl::InvalidArgumentError(StrCat(model.kv_blocks(), " KV blocks of ", block_size,
                                             " tokens are too few to serve from (at least ",
                                             table.size(), ")"));
  }
  for (size_t b = 0; b < table.size(); ++b) table[b] = static_cast<int32_t>(b);
  const std::vector<int32_t> tokens(static_cast<size_t>(widest), 0);
  {
    const std::vector<int32_t> block_tokens(static_cast<size_t>(block_size), 0);
    const model::SequenceInput fill{block_tokens, 0, table, 0};
    std::vector<float> unused;
    if (absl::Status s = model.Forward({&fill, 1}, &unused); !s.ok()) return s;
    std::vector<std::pair<int32_t, int32_t>> copies;
    for (size_t b = 1; b < table.size(); ++b) copies.emplace_back(table[0], table[b]);
    if (absl::Status s = model.CopyBlocks(copies); !s.ok()) return s;
  }
  // The steps timed: each width at position 0, then 1 and kSharedWidth rows
  // after `context`.
  std::vector<std::pair<int, int32_t>> steps;  // (rows, position)
  for (int width : kWidths) steps.emplace_back(width, 0);
  steps.emplace_back(1, context);
  steps.emplace_back(kSharedWidth, context);
  std::vector<std::vector<double>> runs(steps.size());
  // Round 0 warms up: the widest step (every weight page and the largest
  // scratch), the 1-row one (on CUDA its first run is eager and its second
  // records a graph) and the two at `context` (the KV pages), a third of a
  // round's rows (a whole round was most of a test daemon's start). Past
  // kMeasureSeconds (a large model, a sanitizer build) it stops after
  // kLeastRounds timed rounds: start-up stays short (the default model
  // takes about 0.7 s for 5 rounds).
  constexpr int kLeastRounds = 3;
  constexpr double kMeasureSeconds = 1.0;
  const absl::Time start = absl::Now();
  for (int round = 0; round <= rounds; ++round) {
    if (round > kLeastRounds && absl::ToDoubleSeconds(absl::Now() - start) > kMeasureSeconds) break;
    for (size_t i = 0; i < steps.size(); ++i) {
      const auto [width, position] = steps[i];
      if (round == 0 && width != widest && width != 1 && position == 0) continue;
      const model::SequenceInput in{std::span<const int32_t>(tokens).first(width), position, table,
                                    width};
      absl::StatusOr<double> ms = TimeOnce(model, {&in, 1}, 0);
      if (!ms.ok()) return ms.status();
      if (round > 0) runs[i].push_back(*ms);
    }
  }
  std::vector<scheduler::RowCurve::Timing> timings;
  for (size_t i = 0; i < kWidths.size(); ++i) timings.push_back({kWidths[i], Median(runs[i])});
  const double c1 = Median(runs[kWidths.size()]);
  const double c8 = Median(runs[kWidths.size() + 1]);
  const double t1 = timings.front().ms;
  const double t8 = std::find_if(timings.begin(), timings.end(), [&](const auto& t) {
                      return t.rows == kSharedWidth;
                    })->ms;
  StepCosts costs;
  costs.rows = scheduler::RowCurve(timings);
  // Scaled as the curve is: R(1) = 1, R(widest) = widest.
  scheduler::StepTimeCoefficients& c = costs.linear;
  c.per_token = std::max(0.0, (timings.back().ms - t1) / (widest - 1));
  c.fixed = std::max(t1 - c.per_token, 0.01 * t1);
  // The first row's reads: `context` positions more than at position 0;
  // the other rows' reads: (kSharedWidth - 1) * context more.
  c.per_kilo_read = std::max(0.0, 1000.0 * (c1 - t1) / context);
  c.per_kilo_shared_read =
      std::max(0.0, 1000.0 * ((c8 - c1) - (t8 - t1)) / ((kSharedWidth - 1.0) * context));
  if (draft_layers > 0 || draft_model != nullptr) {
    model::LlamaModel& drafter = draft_model != nullptr ? *draft_model : model;
    const int layers = draft_model != nullptr ? 0 : draft_layers;
    const model::SequenceInput one{std::span<const int32_t>(tokens).first(1), 0, table, 1};
    const std::vector<model::SequenceInput> eight(8, one);
    absl::StatusOr<double> d1 = TimeForward(drafter, {&one, 1}, layers, rounds);
    if (!d1.ok()) return d1.status();
    absl::StatusOr<double> d8 = TimeForward(drafter, eight, layers, rounds);
    if (!d8.ok()) return d8.status();
    costs.draft.per_token = std::max(0.0, (*d8 - *d1) / 7);
    costs.draft.fixed = std::max(0.0, *d1 - costs.draft.per_token);
    // Reading the KV scales with its size per token.
    const model::ModelConfig& t = model.config();
    const model::ModelConfig& d = drafter.config();
    const double kv_share = draft_model != nullptr
                                ? static_cast<double>(d.layers * d.kv_heads * d.head_dim) /
                                      static_cast<double>(t.layers * t.kv_heads * t.head_dim)
                                : static_cast<double>(draft_layers) / static_cast<double>(t.layers);
    costs.draft.per_context = c.per_kilo_read / 1000.0 * kv_share;
  }
  return costs;
}

}  // namespace

void ServingModel::ReleaseKvPages() {
  prefill_->ReleaseKvPages();
  if (decode_ != nullptr) decode_->ReleaseKvPages();
}

void ServingModel::ReleaseSlidingKvPages(std::span<const int32_t> blocks) {
  TANDEM_CHECK(decode_kv_blocks_ == 0, "sliding pages are given back only from one shared storage");
  prefill_->mutable_model()->ReleaseSlidingKvPages(blocks);
}

absl::StatusOr<scheduler::DisaggregationCosts> ServingModel::MeasureDisaggregationCosts(
    int chunk_tokens) {
  model::LlamaModel& model = *prefill_->mutable_model();
  const int block_size = model.block_size();
  // The chunk's sequence in blocks from 0, the decoding sequence (at a
  // modest context) in the blocks after them. The daemon has not started:
  // no block holds anything yet.
  constexpr int kDecodeContext = 256;
  const int chunk_blocks = (chunk_tokens + block_size - 1) / block_size;
  const int decode_blocks = kDecodeContext / block_size + 1;
  if (chunk_blocks + decode_blocks > model.kv_blocks()) {
    return absl::FailedPreconditionError("the KV cache is too small to measure the costs");
  }
  std::vector<int32_t> chunk_table(static_cast<size_t>(chunk_blocks));
  std::vector<int32_t> decode_table(static_cast<size_t>(decode_blocks));
  for (int b = 0; b < chunk_blocks; ++b) chunk_table[static_cast<size_t>(b)] = b;
  for (int b = 0; b < decode_blocks; ++b) decode_table[static_cast<size_t>(b)] = chunk_blocks + b;
  // Real text-like tokens (distinct ids) rather than one repeated id.
  std::vector<int32_t> chunk(static_cast<size_t>(chunk_tokens));
  for (int i = 0; i < chunk_tokens; ++i) chunk[static_cast<size_t>(i)] = 1000 + i;
  const std::vector<int32_t> one = {42};
  const model::SequenceInput chunk_in{chunk, 0, chunk_table, 1};
  const model::SequenceInput decode_in{one, kDecodeContext, decode_table, 1};
  const std::vector<model::SequenceInput> mixed = {chunk_in, decode_in};
  absl::StatusOr<double> decode_pass = TimeForward(model, {&decode_in, 1}, 0, measure_rounds_);
  if (!decode_pass.ok()) return decode_pass.status();
  absl::StatusOr<double> chunk_step = TimeForward(model, {&chunk_in, 1}, 0, measure_rounds_);
  if (!chunk_step.ok()) return chunk_step.status();
  absl::StatusOr<double> chunk_with_decode = TimeForward(model, mixed, 0, measure_rounds_);
  if (!chunk_with_decode.ok()) return chunk_with_decode.status();
  return scheduler::DisaggregationCosts{*decode_pass, *chunk_step, *chunk_with_decode};
}

absl::Status CheckMeasureRounds(int rounds) {
  if (rounds >= 1 && rounds <= kMaxMeasureRounds) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("--startup_measure_rounds=", rounds, ": must be in [1, ", kMaxMeasureRounds, "]"));
}

absl::Status CheckSuffixLengthFactor(double factor) {
  if (factor >= 0 && std::isfinite(factor)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      StrCat("--spec_suffix_length_factor=", factor, ": must be a finite number >= 0"));
}

absl::StatusOr<std::unique_ptr<ServingModel>> ServingModel::Load(
    const ServingModelOptions& options) {
  std::unique_ptr<ServingModel> m(new ServingModel());
  for (const absl::Status& check : {CheckMeasureRounds(options.measure_rounds),
                                    CheckSuffixLengthFactor(options.suffix_length_factor)}) {
    if (!check.ok()) return check;
  }
  m->measure_rounds_ = options.measure_rounds;
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file = model::OpenModel(options.model_path);
  if (!file.ok()) return file.status();
  m->file_ = std::shared_ptr<const model::GgufFile>(*std::move(file));

  absl::StatusOr<model::ModelConfig> config = model::ReadModelConfig(*m->file_);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        StrCat("model '", options.model_path, "': ", config.status().message()));
  }
  m->config_ = *config;
  // The storage type of the largest matrices (the feed-forward weights).
  if (const model::GgufTensor* t = m->file_->FindTensor("blk.0.ffn_up.weight"); t != nullptr) {
    m->dtype_ = std::string(kernels::Info(t->dtype).name);
  }
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
      tokenizer::BpeTokenizer::FromGguf(*m->file_);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(), StrCat("model '", options.model_path,
                                                    "': tokenizer: ", tok.status().message()));
  }
  m->tokenizer_ = *std::move(tok);
  if (m->tokenizer_->vocab_size() != m->config_.vocab) {
    return absl::InvalidArgumentError(StrCat("model '", options.model_path, "': the tokenizer has ",
                                             m->tokenizer_->vocab_size(),
                                             " tokens but the embedding has ", m->config_.vocab));
  }
  std::optional<std::string_view> template_text;
  if (absl::StatusOr<std::string_view> t = m->file_->GetString("tokenizer.chat_template"); t.ok()) {
    template_text = *t;
  }
  absl::StatusOr<tokenizer::ChatTemplate> chat =
      tokenizer::ChatTemplate::Create(template_text, options.chat_template, m->tokenizer_.get());
  if (!chat.ok()) {
    return absl::Status(chat.status().code(),
                        StrCat("model '", options.model_path, "': ", chat.status().message()));
  }
  m->chat_template_ = std::make_unique<tokenizer::ChatTemplate>(*std::move(chat));
  // A structured answer ends with the end-of-turn token, as free text does.
  std::vector<tokenizer::TokenId> end_tokens;
  for (const auto& id : {m->tokenizer_->special().eos, m->tokenizer_->special().eot}) {
    if (id.has_value()) end_tokens.push_back(*id);
  }
  m->grammar_ = grammar::GrammarVocabulary::Create(*m->tokenizer_, end_tokens);

  m->block_size_ = options.block_size;
  m->context_length_ = options.context_length > 0
                           ? std::min(options.context_length, m->config_.context_length)
                           : m->config_.context_length;
  kernels::KvCacheShape shape;
  shape.layers = m->config_.layers;
  shape.block_size = options.block_size;
  shape.kv_heads = m->config_.kv_heads;
  shape.head_dim = m->config_.head_dim;
  // One compute pool for both workers (the decode worker's steps go first),
  // or, with a reservation, a pool of the decode worker's own on its own CPUs.
  const std::vector<int> cpus = kernels::cpu::AllowedCpus();
  const int threads =
      options.threads > 0 ? options.threads : std::max(1, static_cast<int>(cpus.size()));
  const int reserved = options.decode_worker ? options.decode_reserved_threads : 0;
  if (reserved < 0 || reserved >= threads) {
    return absl::InvalidArgumentError(
        StrCat("--decode_reserved_threads=", options.decode_reserved_threads,
               ": must be 0 (one shared pool) or leave the prefill worker at least one of the ",
               threads, " threads (--threads)"));
  }
  auto cpus_for = [&](int first, int count) {
    std::vector<int> out;
    if (!options.pin_threads || cpus.empty()) return out;
    for (int i = 0; i < count; ++i)
      out.push_back(cpus[static_cast<size_t>(first + i) % cpus.size()]);
    return out;
  };
  // Only the CPU backend computes on them: on a GPU no pool (and no idle,
  // pinned threads) is made.
  const bool on_cpu = options.device == kernels::Device::kCpu;
  if (on_cpu && options.pin_threads && threads > static_cast<int>(cpus.size())) {
    m->warnings_.push_back(StrCat(threads, " compute threads share ", cpus.size(),
                                  " CPUs: threads will compete for cores"));
  }
  std::shared_ptr<kernels::cpu::ComputePool> prefill_pool, decode_pool;
  if (on_cpu) {
    prefill_pool = std::make_shared<kernels::cpu::ComputePool>(
        threads - reserved, cpus_for(0, threads - reserved), /*pin_callers=*/reserved > 0);
    decode_pool = reserved > 0 ? std::make_shared<kernels::cpu::ComputePool>(
                                     reserved, cpus_for(threads - reserved, reserved),
                                     /*pin_callers=*/true)
                               : prefill_pool;
  }
  absl::StatusOr<std::unique_ptr<kernels::Backend>> prefill_backend =
      kernels::CreateBackend({options.device, prefill_pool, kernels::LanePriority::kThroughput,
                              options.matmul_mode, CudaDecodeSms(options)});
  if (!prefill_backend.ok()) return prefill_backend.status();
  m->backend_name_ = (*prefill_backend)->name();
  m->backends_.push_back(StrCat("prefill: ", (*prefill_backend)->name()));
  // A separate draft model: opened now, as its weights and pages (as many
  // blocks as the model's) come out of the same memory.
  std::shared_ptr<const model::GgufFile> draft_file;
  if (!options.draft_model_path.empty()) {
    absl::StatusOr<std::unique_ptr<model::GgufFile>> opened =
        model::GgufFile::Open(options.draft_model_path);
    if (!opened.ok()) return opened.status();
    draft_file = *std::move(opened);
  }
  // The KV cache's size: --kv_cache_bytes, or a fraction of the memory the
  // backend has free, less what the weights will take of it.
  int64_t kv_cache_bytes = options.kv_cache_bytes;
  std::string sized_by = StrCat("--kv_cache_bytes=", kv_cache_bytes);
  if (options.kv_cache_memory_fraction > 0) {
    absl::StatusOr<int64_t> free = (*prefill_backend)->FreeMemoryBytes();
    if (!free.ok()) {
      return absl::Status(free.status().code(),
                          StrCat("--kv_cache_memory_fraction: ", free.status().message()));
    }
    absl::StatusOr<KvMemoryPlan> plan =
        PlanKvMemory(*m->file_, shape, draft_file.get(), **prefill_backend,
                     options.decode_kv_cache_bytes, options.speculation_cache_bytes);
    if (!plan.ok()) return plan.status();
    kv_cache_bytes = KvBlocksFromFreeMemory(options.kv_cache_memory_fraction, *free, *plan) *
                     static_cast<int64_t>(shape.BytesPerBlock());
    sized_by =
        StrCat("--kv_cache_memory_fraction=", options.kv_cache_memory_fraction, " (",
               kv_cache_bytes, " bytes of ", *free, " free, less ", plan->fixed_bytes,
               " for the weights", options.decode_kv_cache_bytes > 0 ? " and the decode KV" : "",
               options.speculation_cache_bytes > 0 && (*prefill_backend)->MemoryIsHost()
                   ? " and the suffix cache"
                   : "",
               draft_file != nullptr ? ", with the draft model's pages" : "", ")");
  }
  // Block ids are 32-bit: more blocks than that is a flag error, not a
  // wrapped-around count.
  const int64_t blocks = kv_cache_bytes / static_cast<int64_t>(shape.BytesPerBlock());
  if (blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        StrCat(sized_by, " is ", blocks, " blocks of ", shape.BytesPerBlock(), " bytes; at most ",
               std::numeric_limits<int32_t>::max(), " are addressable"));
  }
  m->kv_blocks_ = static_cast<int>(blocks);
  const int min_blocks = (m->context_length_ + options.block_size - 1) / options.block_size;
  if (m->kv_blocks_ < min_blocks) {
    return absl::InvalidArgumentError(StrCat(
        sized_by, " holds ", m->kv_blocks_, " blocks; one full-context sequence needs ", min_blocks,
        " (", static_cast<int64_t>(min_blocks) * static_cast<int64_t>(shape.BytesPerBlock()),
        " bytes); raise it or lower --context_length"));
  }

  absl::StatusOr<std::unique_ptr<model::LlamaModel>> prefill_model = model::LlamaModel::Create(
      m->file_, prefill_backend->get(), m->kv_blocks_, options.block_size);
  if (!prefill_model.ok()) {
    if (prefill_model.status().code() == absl::StatusCode::kResourceExhausted) {
      // The KV storage could not be allocated: say which flag sized it.
      return absl::ResourceExhaustedError(StrCat(sized_by, " (", m->kv_blocks_,
                                                 " blocks): ", prefill_model.status().message(),
                                                 "; lower it or use --kv_cache_memory_fraction"));
    }
    return prefill_model.status();
  }
  (*prefill_model)->set_step_graphs(options.step_graphs);
  // The model that runs most decode steps (the decode worker's, if any).
  model::LlamaModel* decoding_model = prefill_model->get();
  if (options.decode_worker) {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> made =
        kernels::CreateBackend({options.device, decode_pool, kernels::LanePriority::kLatency,
                                options.matmul_mode, CudaDecodeSms(options)});
    if (!made.ok()) return made.status();
    std::unique_ptr<kernels::Backend> decode_backend = *std::move(made);
    m->backend_name_ += reserved > 0 ? StrCat(" + decode ", decode_backend->name(), " reserved")
                                     : std::string(" shared with decode (decode first)");
    m->backends_.push_back(StrCat("decode: ", decode_backend->name(),
                                  reserved > 0 ? " reserved" : " shared, decode first"));
    absl::StatusOr<std::unique_ptr<model::LlamaModel>> decode_model;
    if (options.decode_kv_cache_bytes > 0) {
      // Storage of its own: handoffs move the pages (server/lane_kv_mover.h).
      const int64_t decode_blocks =
          options.decode_kv_cache_bytes / static_cast<int64_t>(shape.BytesPerBlock());
      if (decode_blocks < min_blocks || decode_blocks > std::numeric_limits<int32_t>::max()) {
        return absl::InvalidArgumentError(
            StrCat("--decode_kv_cache_bytes=", options.decode_kv_cache_bytes, " holds ",
                   decode_blocks, " blocks; it needs ", min_blocks,
                   " (one full-context sequence) to ", std::numeric_limits<int32_t>::max()));
      }
      if (!options.draft_model_path.empty()) {
        return absl::InvalidArgumentError(
            "--draft_model with --decode_kv_cache_bytes: a separate draft model's KV does not "
            "move with a handoff; use --draft_layers or --speculative=ngram");
      }
      m->decode_kv_blocks_ = static_cast<int>(decode_blocks);
      decode_model = model::LlamaModel::CreateLike(**prefill_model, decode_backend.get(),
                                                   m->decode_kv_blocks_);
      m->backends_.back() += StrCat(", own KV storage (", m->decode_kv_blocks_, " blocks)");
    } else {
      decode_model = model::LlamaModel::CreateSharingKv(**prefill_model, decode_backend.get());
    }
    if (!decode_model.ok()) return decode_model.status();
    (*decode_model)->set_step_graphs(options.step_graphs);
    decoding_model = decode_model->get();
    m->decode_ =
        std::make_unique<decode::DecodeWorker>(std::move(decode_backend), *std::move(decode_model));
  }
  if (options.draft_layers < 0 || options.draft_layers >= m->config_.layers) {
    return absl::InvalidArgumentError(StrCat("--draft_layers=", options.draft_layers,
                                             ": the self-draft needs 1..", m->config_.layers - 1,
                                             " of the model's ", m->config_.layers, " layers"));
  }
  if (options.ngram_min < 1 || options.ngram_max < options.ngram_min) {
    return absl::InvalidArgumentError(StrCat("--ngram_min=", options.ngram_min,
                                             " --ngram_max=", options.ngram_max,
                                             ": need 1 <= ngram_min <= ngram_max"));
  }
  m->prefill_ = std::make_unique<prefill::PrefillWorker>(*std::move(prefill_backend),
                                                         *std::move(prefill_model));
  if (options.speculation_cache_bytes > 0) {
    m->suffix_cache_ = std::make_shared<speculative::SuffixCache>(options.speculation_cache_bytes);
  }
  for (worker::ModelWorker* worker : {static_cast<worker::ModelWorker*>(m->prefill_.get()),
                                      static_cast<worker::ModelWorker*>(m->decode_.get())}) {
    if (worker == nullptr) continue;
    worker->EnableNgramProposer(options.ngram_min, options.ngram_max);
    // Any one-token match may start a copy: the longest is taken, and the
    // scheduler stops a sequence drafting while its drafts fail.
    speculative::SuffixDraftOptions suffix;
    suffix.min_match = 1;
    suffix.length_factor = options.suffix_length_factor;
    worker->EnableSuffixProposer(suffix, m->suffix_cache_);
    if (options.draft_layers > 0) worker->EnableSelfDraftProposer(options.draft_layers);
  }
  model::LlamaModel* decoding_draft = nullptr;
  if (!options.draft_model_path.empty()) {
    if (options.draft_layers > 0) {
      return absl::InvalidArgumentError(
          "--draft_model and --draft_layers each name a draft model: set one");
    }
    absl::Status s = m->LoadDraftModel(options, draft_file, prefill_pool, decode_pool);
    if (!s.ok()) return s;
    decoding_draft = (m->decode_ != nullptr ? m->decode_.get()
                                            : static_cast<worker::ModelWorker*>(m->prefill_.get()))
                         ->draft_model();
  }
  // The step-time model comes from the worker that runs most decode steps.
  absl::StatusOr<StepCosts> costs =
      MeasureStepCosts(*decoding_model, decoding_draft, options.draft_layers, m->measure_rounds_);
  if (!costs.ok()) return costs.status();
  m->step_costs_ = *costs;
  return m;
}

absl::Status ServingModel::LoadDraftModel(
    const ServingModelOptions& options, std::shared_ptr<const model::GgufFile> file,
    const std::shared_ptr<kernels::cpu::ComputePool>& prefill_pool,
    const std::shared_ptr<kernels::cpu::ComputePool>& decode_pool) {
  const std::string& path = options.draft_model_path;
  absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
      tokenizer::BpeTokenizer::FromGguf(*file);
  if (!tok.ok()) {
    return absl::Status(tok.status().code(),
                        StrCat("draft model '", path, "': tokenizer: ", tok.status().message()));
  }
  // Drafted token ids must mean the same text to both models.
  const tokenizer::BpeTokenizer& mine = *tokenizer_;
  if ((*tok)->vocab_size() != mine.vocab_size()) {
    return absl::InvalidArgumentError(StrCat("draft model '", path, "' has ", (*tok)->vocab_size(),
                                             " tokens; the model has ", mine.vocab_size(),
                                             ": a draft model needs the same vocabulary"));
  }
  for (int id = 0; id < mine.vocab_size(); ++id) {
    if ((*tok)->TokenBytes(id) != mine.TokenBytes(id)) {
      return absl::InvalidArgumentError(StrCat("draft model '", path, "': token ", id,
                                               " differs from the model's: a draft model needs "
                                               "the same vocabulary"));
    }
  }
  absl::StatusOr<std::unique_ptr<kernels::Backend>> prefill_backend =
      kernels::CreateBackend({options.device, prefill_pool, kernels::LanePriority::kThroughput,
                              options.matmul_mode, CudaDecodeSms(options)});
  if (!prefill_backend.ok()) return prefill_backend.status();
  absl::StatusOr<std::unique_ptr<model::LlamaModel>> prefill_draft =
      model::LlamaModel::Create(file, prefill_backend->get(), kv_blocks_, block_size_);
  if (!prefill_draft.ok()) {
    return absl::Status(prefill_draft.status().code(),
                        StrCat("draft model '", path, "': ", prefill_draft.status().message()));
  }
  if (decode_ != nullptr) {
    absl::StatusOr<std::unique_ptr<kernels::Backend>> made =
        kernels::CreateBackend({options.device, decode_pool, kernels::LanePriority::kLatency,
                                options.matmul_mode, CudaDecodeSms(options)});
    if (!made.ok()) return made.status();
    std::unique_ptr<kernels::Backend> decode_backend = *std::move(made);
    absl::StatusOr<std::unique_ptr<model::LlamaModel>> decode_draft =
        model::LlamaModel::CreateSharingKv(**prefill_draft, decode_backend.get());
    if (!decode_draft.ok()) return decode_draft.status();
    (*decode_draft)->set_step_graphs(options.step_graphs);
    decode_->EnableDraftModel(std::move(decode_backend), *std::move(decode_draft));
  }
  (*prefill_draft)->set_step_graphs(options.step_graphs);
  prefill_->EnableDraftModel(*std::move(prefill_backend), *std::move(prefill_draft));
  return absl::OkStatus();
}

}  // namespace tandem::server
