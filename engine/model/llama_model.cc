#include "engine/model/llama_model.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "absl/status/status.h"
#include "common/strings.h"

namespace tandem::model {
namespace {

using kernels::DType;
using kernels::Matrix;
using kernels::Weight;

int64_t RopeTableElements(const ModelConfig& config) {
  return int64_t{config.context_length} * (config.rotary_dims / 2) * 2;
}

// Whether sliding-window layers need a rotary table of their own.
bool HasSlidingRopeTable(const ModelConfig& config) {
  return config.HasSlidingLayers() && (config.rope_base_sliding != config.rope_base ||
                                       config.rope_scale_sliding != config.rope_scale);
}

// Host-side cos/sin table: [position][pair] -> (cos, sin) of position * theta_i,
// theta_i = base^(-2i/rotary_dims) / factor_i / scale, computed in double
// precision.
std::vector<float> BuildRopeTable(const ModelConfig& config, float base, float scale,
                                  const std::vector<float>& factors) {
  const int pairs = config.rotary_dims / 2;
  std::vector<float> table(static_cast<size_t>(RopeTableElements(config)));
  for (int i = 0; i < pairs; ++i) {
    double theta =
        std::pow(static_cast<double>(base), -2.0 * i / static_cast<double>(config.rotary_dims)) /
        static_cast<double>(scale);
    if (!factors.empty()) theta /= factors[static_cast<size_t>(i)];
    for (int p = 0; p < config.context_length; ++p) {
      const double angle = p * theta;
      const size_t at = (static_cast<size_t>(p) * pairs + i) * 2;
      table[at] = static_cast<float>(std::cos(angle));
      table[at + 1] = static_cast<float>(std::sin(angle));
    }
  }
  return table;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Bind(std::shared_ptr<const GgufFile> file,
                                                             kernels::Backend* backend,
                                                             const ModelOverrides& overrides,
                                                             RopeTables rope_tables) {
  absl::StatusOr<ModelConfig> config = ReadModelConfig(*file, overrides);
  if (!config.ok()) return config.status();
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->file_ = std::move(file);
  model->backend_ = backend;
  model->overrides_ = overrides;
  model->config_ = *std::move(config);
  model->rope_tables_host_ = std::move(rope_tables);
  if (absl::Status s = model->BindWeights(); !s.ok()) {
    return absl::Status(s.code(), StrCat("model '", model->file_->path(), "': ", s.message()));
  }
  return model;
}

absl::StatusOr<int64_t> LlamaModel::WeightBytes(const GgufFile& file,
                                                const kernels::Backend& backend,
                                                const ModelOverrides& overrides) {
  absl::StatusOr<ModelConfig> config = ReadModelConfig(file, overrides);
  if (!config.ok()) return config.status();
  // BindWeights uploads each of these tensors once (rope_freqs is read on
  // the host), then each rotary table as one float32 row.
  // Experts' tensors are uploaded one weight an expert.
  int64_t bytes = 0;
  for (const GgufTensor& t : file.tensors()) {
    const bool bound = t.name.starts_with("blk.") || t.name == "token_embd.weight" ||
                       t.name == "output_norm.weight" || t.name == "output.weight";
    if (!bound) continue;
    const int64_t cols = t.dims.empty() ? 0 : t.dims[0];
    if (t.name.ends_with("_exps.weight") && config->experts > 0) {
      bytes += config->experts * backend.WeightBytes(t.dtype, t.Rows() / config->experts, cols);
    } else {
      bytes += backend.WeightBytes(t.dtype, t.Rows(), cols);
    }
  }
  const int tables = HasSlidingRopeTable(*config) ? 2 : 1;
  return bytes + tables * backend.WeightBytes(DType::kF32, 1, RopeTableElements(*config));
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(std::shared_ptr<const GgufFile> file,
                                                               kernels::Backend* backend,
                                                               int kv_blocks, int block_size,
                                                               const ModelOverrides& overrides) {
  if (kv_blocks < 1 || block_size < 1) {
    return absl::InvalidArgumentError(StrCat("the KV cache needs at least one block (got ",
                                             kv_blocks, " blocks of ", block_size, ")"));
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> model = Bind(std::move(file), backend, overrides);
  if (!model.ok()) return model.status();
  if (absl::Status s = (*model)->CreateKvCache(kv_blocks, block_size); !s.ok()) return s;
  return model;
}

absl::Status LlamaModel::CreateKvCache(int kv_blocks, int block_size) {
  block_size_ = block_size;
  kv_blocks_ = kv_blocks;
  kernels::KvCacheShape shape;
  shape.layers = config_.layers;
  shape.blocks = kv_blocks;
  shape.block_size = block_size;
  shape.kv_heads = config_.kv_heads;
  shape.head_dim = config_.head_dim;
  return backend_->CreateKvCache(shape);
}

void LlamaModel::ReleaseSlidingKvPages(std::span<const int32_t> blocks) {
  if (!config_.HasSlidingLayers()) return;
  std::vector<int> layers;
  for (int i = 0; i < config_.layers; ++i) {
    if (config_.sliding_layers[static_cast<size_t>(i)]) layers.push_back(i);
  }
  backend_->ReleaseKvBlockPages(blocks, layers);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::CreateLike(const LlamaModel& other,
                                                                   kernels::Backend* backend,
                                                                   int kv_blocks) {
  if (kv_blocks < 1) {
    return absl::InvalidArgumentError(
        StrCat("the KV cache needs at least one block (got ", kv_blocks, ")"));
  }
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      Bind(other.file_, backend, other.overrides_, other.rope_tables_host_);
  if (!model.ok()) return model.status();
  if (absl::Status s = (*model)->CreateKvCache(kv_blocks, other.block_size_); !s.ok()) return s;
  return model;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::CreateSharingKv(const LlamaModel& other,
                                                                        kernels::Backend* backend) {
  absl::StatusOr<std::unique_ptr<LlamaModel>> model =
      Bind(other.file_, backend, other.overrides_, other.rope_tables_host_);
  if (!model.ok()) return model.status();
  (*model)->block_size_ = other.block_size_;
  (*model)->kv_blocks_ = other.kv_blocks_;
  if (absl::Status s = backend->ShareKvCache(*other.backend_); !s.ok()) return s;
  return model;
}

absl::Status LlamaModel::BindWeights() {
  const ModelConfig& c = config_;
  // A weight made of a range of a tensor's rows.
  struct Part {
    int64_t rows;
    Weight* out;
  };
  // Finds a tensor, checks its shape ([rows][cols]; rows == 1 for vectors) and
  // hands it to the backend as one weight per part, in row order: a fused
  // tensor (Phi-3's attn_qkv and gate-and-up ffn_up) has several parts.
  auto bind_parts = [&](const std::string& name, std::span<const Part> parts,
                        int64_t cols) -> absl::Status {
    int64_t rows = 0;
    for (const Part& part : parts) rows += part.rows;
    const GgufTensor* t = file_->FindTensor(name);
    if (t == nullptr) return absl::InvalidArgumentError(StrCat("tensor '", name, "' is missing"));
    const int64_t t_cols = t->dims[0];
    const int64_t t_rows = t->Rows();
    if (t_cols != cols || t_rows != rows) {
      return absl::InvalidArgumentError(StrCat("tensor '", name, "' has shape [", t_rows, ", ",
                                               t_cols, "], expected [", rows, ", ", cols, "]"));
    }
    if (rows == 1 && t->dtype != DType::kF32) {
      return absl::InvalidArgumentError(StrCat("tensor '", name, "' is ",
                                               kernels::Info(t->dtype).name,
                                               "; vectors (norms, biases) must be F32"));
    }
    const auto* data = static_cast<const uint8_t*>(t->data);
    bool packed = true;
    for (const Part& part : parts) {
      absl::StatusOr<Weight> w = backend_->UploadWeight(t->dtype, part.rows, cols, data);
      if (!w.ok()) return w.status();
      packed = packed && w->packed != nullptr;
      *part.out = *w;
      data += static_cast<size_t>(part.rows) * kernels::RowBytes(t->dtype, cols);
    }
    // The backend multiplies by its own copy: the file's pages need not stay
    // resident beside it (about the model's size in RSS).
    if (packed) file_->ReleasePages(*t);
    return absl::OkStatus();
  };
  auto bind = [&](const std::string& name, int64_t rows, int64_t cols,
                  Weight* out) -> absl::Status {
    const Part whole[] = {{rows, out}};
    return bind_parts(name, whole, cols);
  };
  const int64_t q_width = int64_t{c.heads} * c.head_dim;
  const int64_t kv_width = int64_t{c.kv_heads} * c.head_dim;

  if (auto s = bind("token_embd.weight", c.vocab, c.embedding, &token_embedding_); !s.ok())
    return s;
  if (auto s = bind("output_norm.weight", 1, c.embedding, &output_norm_); !s.ok()) return s;
  if (file_->FindTensor("output.weight") != nullptr) {
    if (auto s = bind("output.weight", c.vocab, c.embedding, &output_); !s.ok()) return s;
  } else {
    output_ = token_embedding_;  // tied embeddings
  }
  layers_.resize(static_cast<size_t>(c.layers));
  for (int i = 0; i < c.layers; ++i) {
    Layer& l = layers_[static_cast<size_t>(i)];
    const std::string p = StrCat("blk.", i, ".");
    const std::pair<std::string, std::tuple<int64_t, int64_t, Weight*>> required[] = {
        {"attn_norm.weight", {1, c.embedding, &l.attn_norm}},
        {"attn_output.weight", {c.embedding, q_width, &l.wo}},
        {"ffn_norm.weight", {1, c.embedding, &l.ffn_norm}},
    };
    for (const auto& [name, shape] : required) {
      auto [rows, cols, out] = shape;
      if (auto s = bind(p + name, rows, cols, out); !s.ok()) return s;
    }
    if (!c.IsMoe()) {
      if (auto s = bind(p + "ffn_down.weight", c.embedding, c.ffn, &l.down); !s.ok()) return s;
    }
    // Q, K and V: one fused tensor (rows Q, then K, then V) or three.
    if (file_->FindTensor(p + "attn_qkv.weight") != nullptr) {
      const Part qkv[] = {{q_width, &l.wq}, {kv_width, &l.wk}, {kv_width, &l.wv}};
      if (auto s = bind_parts(p + "attn_qkv.weight", qkv, c.embedding); !s.ok()) return s;
    } else {
      for (auto [name, rows, out] : {std::tuple{"attn_q.weight", q_width, &l.wq},
                                     std::tuple{"attn_k.weight", kv_width, &l.wk},
                                     std::tuple{"attn_v.weight", kv_width, &l.wv}}) {
        if (auto s = bind(p + name, rows, c.embedding, out); !s.ok()) return s;
      }
    }
    // Experts: the router, then each 3-D tensor of experts as one weight an
    // expert (a range of its rows). Otherwise gate and up: ffn_up alone
    // holding both (gate rows first, as SwiGLU takes the first half through
    // SiLU), or two tensors.
    if (c.IsMoe()) {
      if (auto s = bind(p + "ffn_gate_inp.weight", c.experts, c.embedding, &l.router); !s.ok()) {
        return s;
      }
      for (auto [name, weights, rows, cols] :
           {std::tuple{"ffn_gate_exps.weight", &l.expert_gate, c.expert_ffn, c.embedding},
            std::tuple{"ffn_up_exps.weight", &l.expert_up, c.expert_ffn, c.embedding},
            std::tuple{"ffn_down_exps.weight", &l.expert_down, c.embedding, c.expert_ffn}}) {
        weights->resize(static_cast<size_t>(c.experts));
        std::vector<Part> parts;
        for (Weight& w : *weights) parts.push_back({rows, &w});
        if (auto s = bind_parts(p + name, parts, cols); !s.ok()) return s;
      }
    } else if (file_->FindTensor(p + "ffn_gate.weight") == nullptr) {
      const Part gate_up[] = {{c.ffn, &l.gate}, {c.ffn, &l.up}};
      if (auto s = bind_parts(p + "ffn_up.weight", gate_up, c.embedding); !s.ok()) return s;
    } else {
      if (auto s = bind(p + "ffn_gate.weight", c.ffn, c.embedding, &l.gate); !s.ok()) return s;
      if (auto s = bind(p + "ffn_up.weight", c.ffn, c.embedding, &l.up); !s.ok()) return s;
    }
    const std::pair<std::string, std::pair<int64_t, Weight*>> biases[] = {
        {"attn_q.bias", {q_width, &l.bq}},
        {"attn_k.bias", {kv_width, &l.bk}},
        {"attn_v.bias", {kv_width, &l.bv}},
    };
    for (const auto& [name, shape] : biases) {
      if (file_->FindTensor(p + name) == nullptr) continue;
      if (auto s = bind(p + name, 1, shape.first, shape.second); !s.ok()) return s;
    }
    if (c.qk_norm) {
      const int64_t q_norm = c.qk_norm_whole ? q_width : c.head_dim;
      const int64_t k_norm = c.qk_norm_whole ? kv_width : c.head_dim;
      if (auto s = bind(p + "attn_q_norm.weight", 1, q_norm, &l.q_norm); !s.ok()) return s;
      if (auto s = bind(p + "attn_k_norm.weight", 1, k_norm, &l.k_norm); !s.ok()) return s;
    }
    if (c.post_norms) {
      if (auto s = bind(p + "post_attention_norm.weight", 1, c.embedding, &l.attn_post_norm);
          !s.ok()) {
        return s;
      }
      if (auto s = bind(p + "post_ffw_norm.weight", 1, c.embedding, &l.ffn_post_norm); !s.ok()) {
        return s;
      }
    }
  }
  // Every weight the integer kernels use must have rows of whole blocks of 32.
  for (const Layer& l : layers_) {
    std::vector<const Weight*> products = {&l.wq, &l.wk, &l.wv, &l.wo};
    if (c.IsMoe()) {
      for (const std::vector<Weight>* experts : {&l.expert_gate, &l.expert_up, &l.expert_down}) {
        for (const Weight& w : *experts) products.push_back(&w);
      }
    } else {
      products.insert(products.end(), {&l.gate, &l.up, &l.down});
    }
    for (const Weight* w : products) {
      if (w->cols % 32 != 0) {
        return absl::InvalidArgumentError(
            StrCat("weight rows of ", w->cols, " elements are not a multiple of 32"));
      }
    }
  }

  return BindRopeTables();
}

absl::Status LlamaModel::BindRopeTables() {
  const ModelConfig& c = config_;
  std::vector<float> factors;
  if (const GgufTensor* t = file_->FindTensor("rope_freqs.weight"); t != nullptr) {
    if (t->dtype != DType::kF32 || t->Elements() != c.rotary_dims / 2) {
      return absl::InvalidArgumentError(
          StrCat("tensor 'rope_freqs.weight' must be F32 with ", c.rotary_dims / 2, " elements"));
    }
    const auto* f = reinterpret_cast<const float*>(t->data);
    factors.assign(f, f + c.rotary_dims / 2);
  }
  RopeTables& host = rope_tables_host_;
  if (host.global == nullptr) {
    host.global = std::make_shared<const std::vector<float>>(
        BuildRopeTable(c, c.rope_base, c.rope_scale, factors));
    if (HasSlidingRopeTable(c)) {
      host.sliding = std::make_shared<const std::vector<float>>(
          BuildRopeTable(c, c.rope_base_sliding, c.rope_scale_sliding, factors));
    }
  }
  // One row (RopeSpec): a float32 matrix would also get a bf16 copy for
  // products on the GPU, unused here and ~33 MB at a 131k context.
  auto upload = [&](const std::vector<float>& table, kernels::RopeSpec* spec) -> absl::Status {
    absl::StatusOr<Weight> weight =
        backend_->UploadWeight(DType::kF32, 1, static_cast<int64_t>(table.size()), table.data());
    if (!weight.ok()) return weight.status();
    spec->table = *weight;
    spec->rotary_dims = c.rotary_dims;
    spec->neox = c.rope_neox;
    return absl::OkStatus();
  };
  if (absl::Status s = upload(*host.global, &rope_); !s.ok()) return s;
  rope_sliding_ = rope_;
  return host.sliding == nullptr ? absl::OkStatus() : upload(*host.sliding, &rope_sliding_);
}

absl::Status LlamaModel::EnsureCapacity(int64_t tokens, int64_t logit_rows) {
  if (tokens <= capacity_tokens_ && logit_rows <= capacity_logit_rows_) return absl::OkStatus();
  tokens = std::max(tokens, capacity_tokens_);
  logit_rows = std::max(logit_rows, capacity_logit_rows_);
  const ModelConfig& c = config_;
  buffers_.clear();
  auto make = [&](int64_t rows, int64_t cols, Matrix* m) -> absl::Status {
    absl::StatusOr<std::unique_ptr<kernels::DeviceBuffer>> buffer =
        backend_->Allocate(static_cast<size_t>(rows * cols) * sizeof(float));
    if (!buffer.ok()) return buffer.status();
    *m = Matrix{static_cast<float*>((*buffer)->data()), rows, cols};
    buffers_.push_back(*std::move(buffer));
    return absl::OkStatus();
  };
  const int64_t q_width = int64_t{c.heads} * c.head_dim;
  const int64_t kv_width = int64_t{c.kv_heads} * c.head_dim;
  const int64_t ffn = c.IsMoe() ? c.expert_ffn : c.ffn;
  // Mixture-of-experts buffers: none for a dense model.
  const int64_t moe_tokens = c.IsMoe() ? tokens : 0;
  for (auto [rows, cols, m] :
       {std::tuple{tokens, int64_t{c.embedding}, &x_},
        std::tuple{tokens, int64_t{c.embedding}, &h_}, std::tuple{tokens, q_width, &q_},
        std::tuple{tokens, kv_width, &k_}, std::tuple{tokens, kv_width, &v_},
        std::tuple{tokens, q_width, &attn_}, std::tuple{tokens, ffn, &gate_},
        std::tuple{tokens, ffn, &up_}, std::tuple{logit_rows, int64_t{c.embedding}, &selected_},
        std::tuple{logit_rows, int64_t{c.vocab}, &logits_},
        std::tuple{moe_tokens, int64_t{c.experts}, &router_logits_},
        std::tuple{moe_tokens, int64_t{c.embedding}, &expert_in_},
        std::tuple{moe_tokens, int64_t{c.embedding}, &expert_out_},
        std::tuple{moe_tokens, int64_t{c.embedding}, &moe_out_}}) {
    if (absl::Status s = make(rows, cols, m); !s.ok()) return s;
  }
  capacity_tokens_ = tokens;
  capacity_logit_rows_ = logit_rows;
  ++buffers_generation_;
  return absl::OkStatus();
}

absl::Status LlamaModel::CopyBlocks(std::span<const std::pair<int32_t, int32_t>> copies) {
  for (const auto& [from, to] : copies) {
    if (from < 0 || from >= kv_blocks_ || to < 0 || to >= kv_blocks_) {
      return absl::InvalidArgumentError(
          StrCat("KV block copy ", from, " -> ", to, " is outside 0..", kv_blocks_ - 1));
    }
  }
  backend_->CopyKvBlocks(copies);
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(std::span<const SequenceInput> sequences,
                                 std::vector<float>* logits_out, int layers) {
  absl::StatusOr<int64_t> rows = ComputeLogits(sequences, layers);
  if (!rows.ok()) return rows.status();
  logits_out->resize(static_cast<size_t>(*rows * config_.vocab));
  if (*rows > 0) backend_->CopyToHost(logits_.FirstRows(*rows), logits_out->data());
  return absl::OkStatus();
}

absl::Status LlamaModel::ForwardGreedy(std::span<const SequenceInput> sequences,
                                       std::vector<int32_t>* tokens_out, int layers) {
  absl::StatusOr<int64_t> rows = ComputeLogits(sequences, layers);
  if (!rows.ok()) return rows.status();
  tokens_out->resize(static_cast<size_t>(*rows));
  picked_rows_ = *rows;
  if (*rows > 0) backend_->ArgMaxRows(logits_.FirstRows(*rows), *tokens_out);
  return absl::OkStatus();
}

absl::Status LlamaModel::ForwardSample(std::span<const SequenceInput> sequences,
                                       std::span<const kernels::RowDraw> draws,
                                       std::vector<int32_t>* tokens_out, SampledLogprobs* logprobs,
                                       RowShares* shares, int layers) {
  picked_rows_ = 0;  // also after a refused call: the last pass's rows are not this one's
  int64_t logit_rows = 0;
  for (const SequenceInput& s : sequences) logit_rows += s.logits;
  if (static_cast<int64_t>(draws.size()) != logit_rows) {
    return absl::InvalidArgumentError(
        StrCat(draws.size(), " draws for ", logit_rows, " rows of logits"));
  }
  if (shares != nullptr && static_cast<int64_t>(shares->tokens.size()) != logit_rows) {
    return absl::InvalidArgumentError(
        StrCat(shares->tokens.size(), " share tokens for ", logit_rows, " rows of logits"));
  }
  if (shares != nullptr) {
    for (int32_t t : shares->tokens) {
      if (t < -1 || t >= config_.vocab) {
        return absl::InvalidArgumentError(
            StrCat("share token ", t, " is outside the vocabulary of ", config_.vocab));
      }
    }
  }
  const int top = logprobs == nullptr ? 0 : logprobs->top;
  if (top < 0 || top > std::min<int>(kernels::Backend::kMaxLogprobs, config_.vocab)) {
    return absl::InvalidArgumentError(StrCat(top, " most likely tokens asked for"));
  }
  absl::StatusOr<int64_t> rows = ComputeLogits(sequences, layers);
  if (!rows.ok()) return rows.status();
  const auto n = static_cast<size_t>(*rows);
  tokens_out->resize(n);
  if (n == 0) return absl::OkStatus();
  const kernels::Matrix logits = logits_.FirstRows(*rows);
  picked_rows_ = *rows;
  if (shares != nullptr) {
    shares->share.resize(n);
    backend_->SampleRowsWithShares(logits, draws, *tokens_out, shares->tokens, shares->share);
  } else {
    backend_->SampleRows(logits, draws, *tokens_out);
  }
  if (logprobs != nullptr) {
    logprobs->token.resize(n);
    logprobs->top_ids.resize(n * static_cast<size_t>(top));
    logprobs->top_logprobs.resize(n * static_cast<size_t>(top));
    backend_->LogprobRows(logits, *tokens_out, top, logprobs->token, logprobs->top_ids,
                          logprobs->top_logprobs);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::LastLogitsRows(std::span<const int32_t> rows, std::vector<float>* out) {
  for (int32_t row : rows) {
    if (row < 0 || row >= picked_rows_) {
      return absl::InvalidArgumentError(
          StrCat("logits row ", row, " of a picked step of ", picked_rows_, " rows"));
    }
  }
  const int64_t cols = logits_.cols;
  out->resize(rows.size() * static_cast<size_t>(cols));
  if (rows.size() <= 1) {
    if (!rows.empty()) {
      backend_->CopyToHost(Matrix{logits_.data + rows[0] * cols, 1, cols}, out->data());
    }
    return absl::OkStatus();
  }
  const size_t bytes = out->size() * sizeof(float);
  if (gathered_ == nullptr || gathered_->bytes() < bytes) {
    absl::StatusOr<std::unique_ptr<kernels::DeviceBuffer>> buffer = backend_->Allocate(bytes);
    if (!buffer.ok()) return buffer.status();
    gathered_ = *std::move(buffer);
  }
  const Matrix gathered{static_cast<float*>(gathered_->data()), static_cast<int64_t>(rows.size()),
                        cols};
  backend_->GatherRows(logits_.FirstRows(picked_rows_), rows, gathered);
  backend_->CopyToHost(gathered, out->data());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> LlamaModel::ComputeLogits(std::span<const SequenceInput> sequences,
                                                  int layers) {
  picked_rows_ = 0;  // the logits change
  ++forward_passes_;
  const ModelConfig& c = config_;
  if (layers < 0 || layers > c.layers) {
    return absl::InvalidArgumentError(
        StrCat("cannot run ", layers, " layers of a ", c.layers, "-layer model"));
  }
  const int run_layers = layers == 0 ? c.layers : layers;
  // Validate everything and flatten the batch on the host.
  std::vector<int32_t> tokens, positions, slots, logit_rows;
  std::vector<kernels::AttentionSpan> spans;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const SequenceInput& seq = sequences[s];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    const int64_t end = int64_t{seq.first_position} + n;
    if (n == 0) return absl::InvalidArgumentError(StrCat("sequence ", s, " has no tokens"));
    if (seq.first_position < 0 || end > c.context_length) {
      return absl::InvalidArgumentError(StrCat("sequence ", s, " spans positions ",
                                               seq.first_position, "..", end - 1,
                                               ", outside the context of ", c.context_length));
    }
    if (static_cast<int64_t>(seq.block_table.size()) * block_size_ < end) {
      return absl::InvalidArgumentError(StrCat("sequence ", s, " needs ",
                                               (end + block_size_ - 1) / block_size_,
                                               " KV blocks but has ", seq.block_table.size()));
    }
    if (seq.logits < 0 || seq.logits > n) {
      return absl::InvalidArgumentError(
          StrCat("sequence ", s, " asks for ", seq.logits, " logit rows of ", n, " tokens"));
    }
    for (int32_t b : seq.block_table) {
      if (b < 0 || b >= kv_blocks_) {
        return absl::InvalidArgumentError(
            StrCat("sequence ", s, " has KV block ", b, ", outside 0..", kv_blocks_ - 1));
      }
    }
    kernels::AttentionSpan span;
    span.first_row = static_cast<int32_t>(tokens.size());
    span.rows = static_cast<int32_t>(n);
    span.first_position = seq.first_position;
    // The blocks the keys are in (a table may run further).
    span.block_table =
        seq.block_table.first(static_cast<size_t>((end + block_size_ - 1) / block_size_));
    spans.push_back(span);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t token = seq.tokens[static_cast<size_t>(i)];
      if (token < 0 || token >= c.vocab) {
        return absl::InvalidArgumentError(
            StrCat("token id ", token, " is outside the vocabulary of ", c.vocab));
      }
      const int32_t position = seq.first_position + static_cast<int32_t>(i);
      if (i >= n - seq.logits) logit_rows.push_back(static_cast<int32_t>(tokens.size()));
      tokens.push_back(token);
      positions.push_back(position);
      slots.push_back(seq.block_table[static_cast<size_t>(position / block_size_)] * block_size_ +
                      position % block_size_);
    }
  }
  const int64_t t = static_cast<int64_t>(tokens.size());
  const int64_t r = static_cast<int64_t>(logit_rows.size());
  if (t == 0) return int64_t{0};

  // A decode step: recorded, padded to a recorded batch size.
  const bool decode_step =
      step_graphs_ && !c.IsMoe() && backend_->SupportsStepGraphs() && t == r &&
      t <= kMaxStepGraphBatch &&
      std::all_of(sequences.begin(), sequences.end(),
                  [](const SequenceInput& s) { return s.tokens.size() == 1 && s.logits == 1; });
  if (decode_step) {
    const int64_t padded = StepGraphBatch(t);
    for (int64_t row = t; row < padded; ++row) {
      tokens.push_back(0);
      positions.push_back(0);
      slots.push_back(-1);  // stores nothing; no span covers the row
      logit_rows.push_back(static_cast<int32_t>(row));
    }
    if (absl::Status s = EnsureCapacity(padded, padded); !s.ok()) return s;
    // The attention inputs of a recording have a fixed size: every row's
    // table padded to a width class, the next power of two of blocks (at
    // least 16) that holds the batch's longest table.
    size_t longest = 1;
    for (const kernels::AttentionSpan& span : spans) {
      longest = std::max(longest, span.block_table.size());
    }
    const int32_t context_blocks = (c.context_length + block_size_ - 1) / block_size_;
    int32_t width = 16;
    while (static_cast<size_t>(width) < longest && width < context_blocks) width *= 2;
    width = std::min(width, std::max(context_blocks, 1));
    int width_class = 0;
    while ((16 << width_class) < width) ++width_class;
    kernels::Backend::StepGraphSpec spec;
    spec.owner = step_owner_;
    // padded <= 256, run_layers < 2^8, width_class < 2^8.
    spec.key = padded | (int64_t{run_layers} << 16) | (int64_t{width_class} << 24);
    spec.generation = buffers_generation_;
    spec.max_blocks_per_row = width;
    spec.max_keys = std::min(width * block_size_, c.context_length);
    backend_->RunStep(
        spec, [&] { IssueForward(tokens, positions, slots, spans, logit_rows, run_layers); });
  } else {
    if (absl::Status s = EnsureCapacity(t, r); !s.ok()) return s;
    IssueForward(tokens, positions, slots, spans, logit_rows, run_layers);
  }
  return r;
}

int64_t LlamaModel::NextStepOwner() {
  static std::atomic<int64_t> next{1};
  return next.fetch_add(1);
}

int64_t LlamaModel::StepGraphBatch(int64_t rows) {
  // Powers of two to 16, then steps of 16 to 64 and of 32 to 256: at most
  // 15 recordings, and a padded step is never more than a fifth larger
  // (above 16 rows) than the batch it serves.
  for (int64_t size : {1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256}) {
    if (rows <= size) return size;
  }
  return rows;
}

void LlamaModel::IssueForward(std::span<const int32_t> tokens, std::span<const int32_t> positions,
                              std::span<const int32_t> slots,
                              std::span<const kernels::AttentionSpan> spans,
                              std::span<const int32_t> logit_rows, int run_layers) {
  const ModelConfig& c = config_;
  const auto t = static_cast<int64_t>(tokens.size());
  kernels::Backend& be = *backend_;
  const Matrix x = x_.FirstRows(t), h = h_.FirstRows(t), q = q_.FirstRows(t), k = k_.FirstRows(t),
               v = v_.FirstRows(t), attn = attn_.FirstRows(t), gate = gate_.FirstRows(t),
               up = up_.FirstRows(t);
  kernels::AttentionShape global_shape{c.heads, c.kv_heads, c.head_dim, c.attention_scale};
  global_shape.softcap = c.attention_softcap;
  kernels::AttentionShape sliding_shape = global_shape;
  sliding_shape.window = c.sliding_window;

  be.Embed(token_embedding_, tokens, x);
  if (c.embedding_scale != 1.0f) be.Scale(x, c.embedding_scale);
  be.RmsNorm(x, layers_[0].attn_norm, c.norm_eps, h);
  for (int i = 0; i < run_layers; ++i) {
    const Layer& l = layers_[static_cast<size_t>(i)];
    const bool sliding = c.HasSlidingLayers() && c.sliding_layers[static_cast<size_t>(i)];
    const kernels::AttentionShape& shape = sliding ? sliding_shape : global_shape;
    // h holds this layer's normed input here.
    const Weight* qkv[] = {&l.wq, &l.wk, &l.wv};
    const Weight* qkv_bias[] = {l.bq.rows ? &l.bq : nullptr, l.bk.rows ? &l.bk : nullptr,
                                l.bv.rows ? &l.bv : nullptr};
    const Matrix qkv_out[] = {q, k, v};
    be.MatMul(h, qkv, qkv_bias, qkv_out);
    if (c.qk_norm && c.qk_norm_whole) {
      be.RmsNorm(q, l.q_norm, c.norm_eps, q);
      be.RmsNorm(k, l.k_norm, c.norm_eps, k);
    } else if (c.qk_norm) {
      // Each head is a row of head_dim: the rows are contiguous heads.
      const Matrix q_heads{q.data, t * c.heads, c.head_dim};
      const Matrix k_heads{k.data, t * c.kv_heads, c.head_dim};
      be.RmsNorm(q_heads, l.q_norm, c.norm_eps, q_heads);
      be.RmsNorm(k_heads, l.k_norm, c.norm_eps, k_heads);
    }
    be.RopeWriteKv(i, q, k, v, shape, positions, slots, sliding ? rope_sliding_ : rope_);
    be.Attention(i, q, shape, spans, attn);
    const Weight* wo[] = {&l.wo};
    const Matrix o_out[] = {h};
    be.MatMul(attn, wo, {}, o_out);
    if (c.post_norms) be.RmsNorm(h, l.attn_post_norm, c.norm_eps, h);
    be.AddRmsNorm(x, h, l.ffn_norm, c.norm_eps, h);

    // The feed-forward's output: in h, or the experts' sum.
    Matrix ffn_out = h;
    if (c.IsMoe()) {
      ffn_out = moe_out_.FirstRows(t);
      IssueExperts(l, h, ffn_out);
    } else {
      const Weight* gate_up[] = {&l.gate, &l.up};
      const Matrix gate_up_out[] = {gate, up};
      be.MatMul(h, gate_up, {}, gate_up_out);
      if (c.activation == ModelConfig::Activation::kGeluTanh) {
        be.GeluMul(gate, up, gate);
      } else {
        be.SiluMul(gate, up, gate);
      }
      const Weight* down[] = {&l.down};
      const Matrix down_out[] = {h};
      be.MatMul(gate, down, {}, down_out);
    }
    if (c.post_norms) be.RmsNorm(ffn_out, l.ffn_post_norm, c.norm_eps, ffn_out);
    if (i + 1 < run_layers) {
      be.AddRmsNorm(x, ffn_out, layers_[static_cast<size_t>(i) + 1].attn_norm, c.norm_eps, h);
    } else {
      be.Add(x, ffn_out);
    }
  }

  const auto r = static_cast<int64_t>(logit_rows.size());
  if (r == 0) return;
  const Matrix selected = selected_.FirstRows(r), logits = logits_.FirstRows(r);
  be.GatherRows(x, logit_rows, selected);
  be.RmsNorm(selected, output_norm_, c.norm_eps, selected);
  const Weight* output[] = {&output_};
  const Matrix logits_outs[] = {logits};
  be.MatMul(selected, output, {}, logits_outs);
  if (c.final_softcap > 0.0f) be.Softcap(logits, c.final_softcap);
}

void LlamaModel::IssueExperts(const Layer& l, const Matrix& in, Matrix out) {
  const ModelConfig& c = config_;
  kernels::Backend& be = *backend_;
  const int64_t t = in.rows;
  const Matrix logits = router_logits_.FirstRows(t);
  const Weight* router[] = {&l.router};
  const Matrix router_out[] = {logits};
  be.MatMul(in, router, {}, router_out);
  const MoeRoutingRule rule{c.experts, c.experts_used, c.expert_weights_norm,
                            c.expert_weights_scale};
  RouteTokens(be.HostRows(logits, router_host_), t, rule, assignment_);
  // Each token's output: 0, plus its experts' weighted outputs in expert
  // order (so the sum's order does not depend on the batch).
  zeros_.resize(static_cast<size_t>(t * c.embedding), 0.0f);
  be.CopyFromHost(zeros_.data(), out);
  for (size_t e = 0; e < static_cast<size_t>(c.experts); ++e) {
    const std::vector<int32_t>& rows = assignment_.rows[e];
    if (rows.empty()) continue;
    const auto n = static_cast<int64_t>(rows.size());
    const Matrix expert_in{expert_in_.data, n, c.embedding};
    const Matrix gate{gate_.data, n, c.expert_ffn}, up{up_.data, n, c.expert_ffn};
    const Matrix expert_out{expert_out_.data, n, c.embedding};
    be.GatherRows(in, rows, expert_in);
    const Weight* gate_up[] = {&l.expert_gate[e], &l.expert_up[e]};
    const Matrix gate_up_out[] = {gate, up};
    be.MatMul(expert_in, gate_up, {}, gate_up_out);
    be.SiluMul(gate, up, gate);
    const Weight* down[] = {&l.expert_down[e]};
    const Matrix down_out[] = {expert_out};
    be.MatMul(gate, down, {}, down_out);
    be.ScatterAddRows(out, rows, assignment_.weights[e], expert_out);
  }
}

}  // namespace tandem::model
