#include "engine/model/random_model.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/strings.h"
#include "engine/kernels/half.h"
#include "engine/model/gguf_writer.h"
#include "engine/model/quantize.h"
#include "engine/tokenizer/byte_map.h"
#include "engine/tokenizer/unicode.h"

namespace tandem::model {
namespace {

constexpr std::string_view kPrefix = "random:";
constexpr uint64_t kQ4_0Block = 18;  // f16 scale + 32 four-bit quants

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Q4_0 blocks with scale `scale` and random quants: block b's quants come
// from the seed, the tensor's key and b alone, so any chunk can be filled.
GgufWriter::Fill RandomQ4_0(uint64_t key, float scale) {
  const uint16_t d = kernels::FloatToHalf(scale);
  return [key, d](uint8_t* out, uint64_t offset, uint64_t bytes) {
    const uint64_t end = offset + bytes;
    for (uint64_t b = offset / kQ4_0Block; b * kQ4_0Block < end; ++b) {
      uint8_t block[kQ4_0Block];
      std::memcpy(block, &d, 2);
      const uint64_t q0 = Mix(key ^ (2 * b)), q1 = Mix(key ^ (2 * b + 1));
      std::memcpy(block + 2, &q0, 8);
      std::memcpy(block + 10, &q1, 8);
      const uint64_t from = std::max(offset, b * kQ4_0Block);
      const uint64_t to = std::min(end, (b + 1) * kQ4_0Block);
      std::memcpy(out + (from - offset), block + (from - b * kQ4_0Block), to - from);
    }
  };
}

GgufWriter::Fill ConstantF32(float value) {
  return [value](uint8_t* out, uint64_t offset, uint64_t bytes) {
    for (uint64_t i = 0; i < bytes; ++i) {
      uint8_t word[4];
      std::memcpy(word, &value, 4);
      out[i] = word[(offset + i) % 4];
    }
  };
}

// The value of element `index` of the tensor keyed `key`: a sum of four
// uniform draws (close to normal) with standard deviation `stddev`.
float RandomWeight(uint64_t key, uint64_t index, float stddev) {
  const uint64_t bits = Mix(key ^ (index * 0xD1B54A32D192ED03ull));
  const uint64_t sum =
      (bits & 0xffff) + ((bits >> 16) & 0xffff) + ((bits >> 32) & 0xffff) + (bits >> 48);
  constexpr float kUniformSumStd = 0.57735027f * 65536.0f;  // sqrt(4 / 12), in 16-bit units
  return (static_cast<float>(sum) - 2.0f * 65535.0f) * (stddev / kUniformSumStd);
}

// Rows of `row_length` random weights (RandomWeight of row * row_length + i)
// written as `type`. A chunk's rows are quantized on `threads` threads; a
// row that straddles two chunks is quantized for each.
GgufWriter::Fill QuantizedRandomRows(uint64_t key, float stddev, int64_t row_length,
                                     kernels::DType type, int threads) {
  return [=](uint8_t* out, uint64_t offset, uint64_t bytes) {
    const uint64_t row_bytes = kernels::RowBytes(type, row_length);
    const uint64_t first = offset / row_bytes, end = (offset + bytes + row_bytes - 1) / row_bytes;
    auto run = [&](uint64_t from, uint64_t to) {
      std::vector<float> values(static_cast<size_t>(row_length));
      std::vector<uint8_t> row(row_bytes);
      for (uint64_t r = from; r < to; ++r) {
        for (int64_t i = 0; i < row_length; ++i) {
          values[static_cast<size_t>(i)] = RandomWeight(key, r * row_length + i, stddev);
        }
        QuantizeRow(type, values.data(), row_length, row.data());
        const uint64_t lo = std::max(offset, r * row_bytes),
                       hi = std::min(offset + bytes, (r + 1) * row_bytes);
        std::memcpy(out + (lo - offset), row.data() + (lo - r * row_bytes), hi - lo);
      }
    };
    const uint64_t rows = end - first;
    const uint64_t workers = std::min<uint64_t>(std::max(threads, 1), rows);
    std::vector<std::thread> pool;
    for (uint64_t t = 1; t < workers; ++t) {
      pool.emplace_back(run, first + rows * t / workers, first + rows * (t + 1) / workers);
    }
    run(first, first + rows / workers);
    for (std::thread& thread : pool) thread.join();
  };
}

// Adds a model's tensors to a writer: Q4_0 matrices with random quants (the
// in-memory model), or, given a file type, random float weights quantized to
// the types that file type's rules give each tensor.
class TensorAdder {
 public:
  TensorAdder(GgufWriter& w, const RandomModelShape& s, std::optional<FileType> file_type,
              int threads)
      : w_(w), shape_(s), file_type_(file_type), threads_(threads) {}

  void SetLayer(int layer) { layer_ = layer; }

  // `experts` matrices of inputs x outputs in one tensor (expert-major) when
  // experts > 0.
  void Matrix(const std::string& name, int inputs, int outputs, uint64_t key, int experts = 0) {
    std::vector<uint64_t> dims = {static_cast<uint64_t>(inputs), static_cast<uint64_t>(outputs)};
    if (experts > 0) dims.push_back(static_cast<uint64_t>(experts));
    const uint64_t rows =
        static_cast<uint64_t>(outputs) * static_cast<uint64_t>(std::max(experts, 1));
    if (!file_type_) {
      // Uniform quants in 0..15 around 8: a weight's spread is about 4.6 x the
      // scale; rows of about 1/sqrt(inputs) keep activations in range.
      const float scale = 1.0f / (4.6f * std::sqrt(static_cast<float>(inputs)));
      w_.Tensor(name, std::move(dims), kGgmlQ4_0,
                static_cast<uint64_t>(inputs) / 32 * kQ4_0Block * rows, RandomQ4_0(key, scale));
      return;
    }
    TensorPlace place{name, 2, inputs, layer_, shape_.layers, shape_.tied_embeddings};
    place.query_heads_per_kv_head = shape_.heads / std::max(shape_.kv_heads, 1);
    const kernels::DType type = TensorTypeFor(*file_type_, place);
    const float stddev = 1.0f / std::sqrt(static_cast<float>(inputs));
    w_.Tensor(name, std::move(dims), GgmlTypeId(type), kernels::RowBytes(type, inputs) * rows,
              QuantizedRandomRows(key, stddev, inputs, type, threads_));
  }

  void Vector(const std::string& name, int size, float value) {
    w_.Tensor(name, {static_cast<uint64_t>(size)}, kGgmlF32, static_cast<uint64_t>(size) * 4,
              ConstantF32(value));
  }

 private:
  GgufWriter& w_;
  const RandomModelShape& shape_;
  std::optional<FileType> file_type_;
  int threads_;
  int layer_ = -1;
};

void Describe(GgufWriter& w, const RandomModelShape& s) {
  const std::string a = s.architecture + ".";
  w.String("general.architecture", s.architecture);
  w.String("general.name", StrCat(kPrefix, s.name));
  w.Uint32(a + "block_count", static_cast<uint32_t>(s.layers));
  w.Uint32(a + "embedding_length", static_cast<uint32_t>(s.embedding));
  w.Uint32(a + "feed_forward_length", static_cast<uint32_t>(s.ffn));
  w.Uint32(a + "attention.head_count", static_cast<uint32_t>(s.heads));
  w.Uint32(a + "attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  w.Uint32(a + "context_length", static_cast<uint32_t>(s.context));
  w.Float32(a + "rope.freq_base", s.rope_theta);
  w.Float32(a + "attention.layer_norm_rms_epsilon", s.rms_epsilon);
  if (s.experts > 0) {
    w.Uint32(a + "expert_count", static_cast<uint32_t>(s.experts));
    w.Uint32(a + "expert_used_count", static_cast<uint32_t>(s.experts_used));
  }
  if (s.head_dim != 0) {
    w.Uint32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.Uint32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  }
  // A byte-level vocabulary: the 256 byte tokens, ChatML's control tokens,
  // then unused fillers up to the shape's vocabulary size.
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  const std::array<char32_t, 256> byte_map = tokenizer::ByteToCodePoint();
  for (char32_t cp : byte_map) {
    tokenizer::AppendUtf8(cp, &tokens.emplace_back());
    types.push_back(1);  // normal
  }
  for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    tokens.emplace_back(special);
    types.push_back(3);  // control
  }
  while (static_cast<int>(tokens.size()) < s.vocab) {
    tokens.push_back(StrCat("<|unused_", tokens.size(), "|>"));
    types.push_back(5);  // unused
  }
  w.String("tokenizer.ggml.model", "gpt2");
  w.StringArray("tokenizer.ggml.tokens", tokens);
  w.Int32Array("tokenizer.ggml.token_type", types);
  w.StringArray("tokenizer.ggml.merges", {});
  w.Uint32("tokenizer.ggml.bos_token_id", 256);
  w.Uint32("tokenizer.ggml.eos_token_id", 258);  // <|im_end|> ends a turn
  w.Bool("tokenizer.ggml.add_bos_token", false);
  w.String("tokenizer.chat_template",
           "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
           "{% endfor %}<|im_start|>assistant\n");
}

void AddTensors(TensorAdder& add, const RandomModelShape& s, uint64_t seed) {
  const int head_dim = s.head_dim != 0 ? s.head_dim : s.embedding / s.heads;
  const int q_width = s.heads * head_dim, kv_width = s.kv_heads * head_dim;
  uint64_t key = Mix(seed);
  auto next_key = [&key] { return key = Mix(key); };
  add.Matrix("token_embd.weight", s.embedding, s.vocab, next_key());
  add.Vector("output_norm.weight", s.embedding, 1.0f);
  if (!s.tied_embeddings) add.Matrix("output.weight", s.embedding, s.vocab, next_key());
  for (int i = 0; i < s.layers; ++i) {
    add.SetLayer(i);
    const std::string p = StrCat("blk.", i, ".");
    add.Vector(p + "attn_norm.weight", s.embedding, 1.0f);
    add.Matrix(p + "attn_q.weight", s.embedding, q_width, next_key());
    add.Matrix(p + "attn_k.weight", s.embedding, kv_width, next_key());
    add.Matrix(p + "attn_v.weight", s.embedding, kv_width, next_key());
    if (s.qkv_bias) {
      add.Vector(p + "attn_q.bias", q_width, 0.0f);
      add.Vector(p + "attn_k.bias", kv_width, 0.0f);
      add.Vector(p + "attn_v.bias", kv_width, 0.0f);
    }
    if (s.architecture == "qwen3") {
      add.Vector(p + "attn_q_norm.weight", head_dim, 1.0f);
      add.Vector(p + "attn_k_norm.weight", head_dim, 1.0f);
    }
    if (s.architecture == "olmoe") {  // over the whole Q and K widths
      add.Vector(p + "attn_q_norm.weight", q_width, 1.0f);
      add.Vector(p + "attn_k_norm.weight", kv_width, 1.0f);
    }
    add.Matrix(p + "attn_output.weight", q_width, s.embedding, next_key());
    add.Vector(p + "ffn_norm.weight", s.embedding, 1.0f);
    if (s.experts > 0) {
      add.Matrix(p + "ffn_gate_inp.weight", s.embedding, s.experts, next_key());
      add.Matrix(p + "ffn_gate_exps.weight", s.embedding, s.ffn, next_key(), s.experts);
      add.Matrix(p + "ffn_up_exps.weight", s.embedding, s.ffn, next_key(), s.experts);
      add.Matrix(p + "ffn_down_exps.weight", s.ffn, s.embedding, next_key(), s.experts);
      continue;
    }
    add.Matrix(p + "ffn_gate.weight", s.embedding, s.ffn, next_key());
    add.Matrix(p + "ffn_up.weight", s.embedding, s.ffn, next_key());
    add.Matrix(p + "ffn_down.weight", s.ffn, s.embedding, next_key());
  }
}

}  // namespace

const std::vector<RandomModelShape>& RandomModelShapes() {
  static const auto* shapes = new std::vector<RandomModelShape>{
      {"llama3-8b", "llama", 32, 4096, 14336, 32, 8, 128256, 8192, 500000.0f, 1e-5f, false, false},
      {"llama3.2-1b", "llama", 16, 2048, 8192, 32, 8, 128256, 131072, 500000.0f, 1e-5f, false,
       true},
      {"qwen2.5-3b", "qwen2", 36, 2048, 11008, 16, 2, 151936, 32768, 1000000.0f, 1e-6f, true, true},
      {"qwen2.5-7b", "qwen2", 28, 3584, 18944, 28, 4, 152064, 32768, 1000000.0f, 1e-6f, true,
       false},
      {"qwen3-8b", "qwen3", 36, 4096, 12288, 32, 8, 151936, 40960, 1000000.0f, 1e-6f, false, false,
       128},
      // OLMoE-1B-7B: 64 experts of 1,024, 8 a token (6.9B weights, 1.3B active).
      {"olmoe-1b-7b", "olmoe", 16, 2048, 1024, 16, 16, 50304, 4096, 10000.0f, 1e-5f, false, false,
       0, 64, 8},
      {"smollm2-135m", "llama", 30, 576, 1536, 9, 3, 49152, 8192, 100000.0f, 1e-5f, false, true},
  };
  return *shapes;
}

bool IsRandomModel(std::string_view model_flag) { return model_flag.starts_with(kPrefix); }

absl::StatusOr<std::unique_ptr<GgufFile>> OpenModel(std::string_view model_flag) {
  if (IsRandomModel(model_flag)) return OpenRandomModel(model_flag);
  return GgufFile::Open(std::string(model_flag));
}

namespace {

struct RandomModelSpec {
  const RandomModelShape* shape = nullptr;
  uint64_t seed = 0;
};

// "random:NAME[@SEED]": the shape and the seed.
absl::StatusOr<RandomModelSpec> ParseRandomModel(std::string_view model_flag) {
  std::string_view spec = model_flag.substr(kPrefix.size());
  RandomModelSpec parsed;
  if (const size_t at = spec.find('@'); at != std::string_view::npos) {
    if (!absl::SimpleAtoi(AbslView(spec.substr(at + 1)), &parsed.seed)) {
      return absl::InvalidArgumentError(
          StrCat("--model=", model_flag, ": the seed after '@' is not a number"));
    }
    spec = spec.substr(0, at);
  }
  std::string known;
  for (const RandomModelShape& s : RandomModelShapes()) {
    if (s.name == spec) parsed.shape = &s;
    known = StrCat(known, known.empty() ? "" : ", ", s.name);
  }
  if (parsed.shape == nullptr) {
    return absl::InvalidArgumentError(
        StrCat("--model=", model_flag, ": no random model of that name (known: ", known, ")"));
  }
  return parsed;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> OpenRandomModel(std::string_view model_flag) {
  absl::StatusOr<RandomModelSpec> spec = ParseRandomModel(model_flag);
  if (!spec.ok()) return spec.status();
  return OpenRandomModel(*spec->shape, spec->seed);
}

absl::Status WriteRandomModel(std::string_view model_flag, FileType type, const std::string& path,
                              int threads) {
  if (!IsRandomModel(model_flag)) {
    return absl::InvalidArgumentError(
        StrCat("--model=", model_flag, ": only a random:NAME model can be written"));
  }
  absl::StatusOr<RandomModelSpec> spec = ParseRandomModel(model_flag);
  if (!spec.ok()) return spec.status();
  GgufWriter writer;
  Describe(writer, *spec->shape);
  writer.Uint32("general.file_type", LlamaFileTypeId(type));
  TensorAdder add(writer, *spec->shape, type, threads);
  AddTensors(add, *spec->shape, spec->seed);
  // Written beside the destination and renamed into place, so that a failed
  // write (a full disk) leaves no truncated model behind.
  const std::string partial = StrCat(path, ".partial");
  const int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::InternalError(StrCat(partial, ": cannot create: ", std::strerror(errno)));
  }
  absl::Status written = writer.WriteTo(fd);
  if (close(fd) != 0 && written.ok()) {
    written = absl::InternalError(StrCat(partial, ": close failed: ", std::strerror(errno)));
  }
  if (written.ok() && rename(partial.c_str(), path.c_str()) != 0) {
    written =
        absl::InternalError(StrCat(path, ": cannot rename into place: ", std::strerror(errno)));
  }
  if (!written.ok()) unlink(partial.c_str());
  return written;
}

absl::StatusOr<std::unique_ptr<GgufFile>> OpenRandomModel(const RandomModelShape& shape,
                                                          uint64_t seed) {
  GgufWriter writer;
  Describe(writer, shape);
  TensorAdder add(writer, shape, std::nullopt, 1);
  AddTensors(add, shape, seed);
  const int fd = memfd_create("tandem-random-model", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError("memfd_create failed");
  absl::Status written = writer.WriteTo(fd);
  absl::StatusOr<std::unique_ptr<GgufFile>> file =
      written.ok() ? GgufFile::Open(StrCat("/proc/self/fd/", fd)) : written;
  close(fd);  // the file's own mapping keeps the bytes
  return file;
}

}  // namespace tandem::model
