// tandem-probe: exposes engine pieces to the reference tests in
// tests/reference/, which compare them with independent implementations
// (Hugging Face tokenizers/transformers, llama.cpp, the gguf package).
//
// Text crosses the process boundary hex-encoded, one item per line, so that
// any bytes (newlines, invalid UTF-8) survive. Subcommands:
//   tokenize     stdin: hex text per line     stdout: token ids per line
//   detokenize   stdin: token ids per line    stdout: hex of the decoded bytes
//   stream-detokenize  stdin: token ids per line  stdout: the hex text emitted
//                after each token (one field per token), then the final flush
//   pretokenize  stdin: hex text per line     stdout: hex pieces per line
//   chat         stdin: role_hex:content_hex,... per line
//                stdout: hex rendering, a tab, then the token ids
//   logits       stdin: token ids per line    --out: float32 [lines][positions][vocab]
//   generate     stdin: token ids per line    stdout: greedy token ids per line
//   dequantize   --tensor NAME                --out: float32 elements
//   config                                    stdout: the parsed model config
//   matmul-mode                               stdout: the mode --matmul names
//                (auto: the one it chooses on this CPU)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "engine/kernels/cpu/cpu_backend.h"
#include "engine/kernels/cpu/dequantize.h"
#include "engine/model/gguf_file.h"
#include "engine/model/llama_model.h"
#include "engine/sampling/sampler.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "engine/tokenizer/pretokenizer.h"

ABSL_FLAG(std::string, model, "", "GGUF model file");
ABSL_FLAG(std::string, out, "", "output file for binary results");
ABSL_FLAG(std::string, tensor, "", "tensor name (dequantize)");
ABSL_FLAG(std::string, pretokenizer, "smollm", "pre-tokenizer name (pretokenize)");
ABSL_FLAG(int, threads, 2, "CPU threads");
ABSL_FLAG(std::string, matmul, "f32", "CPU matmul mode (f32, bf16, q8 or auto)");
ABSL_FLAG(int, max_tokens, 48, "tokens to generate (generate)");
ABSL_FLAG(int, chunk, 0, "prompt chunk size for logits/generate (0: whole prompt)");
ABSL_FLAG(int, positions, 1, "logits: rows for the last N positions of each prompt");
ABSL_FLAG(bool, parse_special, true, "match special tokens in text (tokenize)");
ABSL_FLAG(std::string, chat_template, "", "chat template override (chat)");
ABSL_FLAG(double, override_rope_base, 0, "replace the model's RoPE base (0: keep)");
ABSL_FLAG(double, override_norm_eps, 0, "replace the model's RMSNorm epsilon (0: keep)");
ABSL_FLAG(std::string, override_rope_layout, "", "replace the RoPE pairing: neox or adjacent");

namespace tandem {
namespace {

std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

std::string ToHex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

std::vector<int32_t> ParseIds(const std::string& line) {
  std::vector<int32_t> ids;
  std::istringstream in(line);
  int32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

void PrintIds(const std::vector<int32_t>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
  std::cout << "\n";
}

int Fail(const absl::Status& s) {
  std::cerr << "tandem-probe: " << s << "\n";
  return 1;
}

std::shared_ptr<const model::GgufFile> OpenModel() {
  absl::StatusOr<std::unique_ptr<model::GgufFile>> file =
      model::GgufFile::Open(absl::GetFlag(FLAGS_model));
  if (!file.ok()) {
    Fail(file.status());
    std::exit(1);
  }
  return std::shared_ptr<const model::GgufFile>(std::move(*file));
}

std::unique_ptr<tokenizer::BpeTokenizer> LoadTokenizer(const model::GgufFile& file) {
  auto t = tokenizer::BpeTokenizer::FromGguf(file);
  if (!t.ok()) {
    Fail(t.status());
    std::exit(1);
  }
  return *std::move(t);
}

// A model with a KV cache big enough for one sequence of the whole context.
struct LoadedModel {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;
  std::vector<int32_t> blocks;
};

LoadedModel LoadModel(std::shared_ptr<const model::GgufFile> file) {
  LoadedModel m;
  auto mode = kernels::cpu::ParseMatMulMode(absl::GetFlag(FLAGS_matmul));
  if (!mode.ok()) std::exit(Fail(mode.status()));
  m.backend = std::make_unique<kernels::cpu::CpuBackend>(absl::GetFlag(FLAGS_threads), *mode);
  constexpr int kBlockSize = 16;
  auto config = model::ReadModelConfig(*file);
  if (!config.ok()) std::exit(Fail(config.status()));
  const int blocks = (config->context_length + kBlockSize - 1) / kBlockSize;
  model::ModelOverrides overrides;
  if (absl::GetFlag(FLAGS_override_rope_base) > 0) {
    overrides.rope_base = static_cast<float>(absl::GetFlag(FLAGS_override_rope_base));
  }
  if (absl::GetFlag(FLAGS_override_norm_eps) > 0) {
    overrides.norm_eps = static_cast<float>(absl::GetFlag(FLAGS_override_norm_eps));
  }
  if (!absl::GetFlag(FLAGS_override_rope_layout).empty()) {
    overrides.rope_neox = absl::GetFlag(FLAGS_override_rope_layout) == "neox";
  }
  auto model =
      model::LlamaModel::Create(std::move(file), m.backend.get(), blocks, kBlockSize, overrides);
  if (!model.ok()) std::exit(Fail(model.status()));
  m.model = *std::move(model);
  // Blocks in reverse order, so that tests exercise a non-trivial table.
  for (int b = blocks - 1; b >= 0; --b) m.blocks.push_back(b);
  return m;
}

// Runs `tokens` from position `start` in chunks; returns the logits of the
// last `positions` tokens (which must all fall in the last chunk).
std::vector<float> RunPrompt(LoadedModel& m, const std::vector<int32_t>& tokens, int start,
                             int positions = 1) {
  const int chunk =
      absl::GetFlag(FLAGS_chunk) > 0 ? absl::GetFlag(FLAGS_chunk) : static_cast<int>(tokens.size());
  std::vector<float> logits;
  for (int pos = start; pos < static_cast<int>(tokens.size()); pos += chunk) {
    const int n = std::min<int>(chunk, static_cast<int>(tokens.size()) - pos);
    model::SequenceInput in;
    in.tokens = std::span<const int32_t>(tokens.data() + pos, static_cast<size_t>(n));
    in.first_position = pos;
    in.block_table = m.blocks;
    in.logits = pos + n == static_cast<int>(tokens.size()) ? std::min(positions, n) : 0;
    if (absl::Status s = m.model->Forward({&in, 1}, &logits); !s.ok()) std::exit(Fail(s));
  }
  return logits;
}

int Run(const std::string& command) {
  std::string line;
  if (command == "matmul-mode") {
    auto mode = kernels::cpu::ParseMatMulMode(absl::GetFlag(FLAGS_matmul));
    if (!mode.ok()) return Fail(mode.status());
    std::cout << kernels::cpu::MatMulModeName(*mode) << "\n";
    return 0;
  }
  if (command == "pretokenize") {
    auto kind = tokenizer::PretokenizerFromGgufName(absl::GetFlag(FLAGS_pretokenizer));
    if (!kind.ok()) return Fail(kind.status());
    while (std::getline(std::cin, line)) {
      const std::string text = FromHex(line);
      const auto pieces = tokenizer::Pretokenize(*kind, text);
      for (size_t i = 0; i < pieces.size(); ++i) std::cout << (i ? " " : "") << ToHex(pieces[i]);
      std::cout << "\n";
    }
    return 0;
  }
  auto file = OpenModel();
  if (command == "tokenize") {
    auto tok = LoadTokenizer(*file);
    while (std::getline(std::cin, line)) {
      PrintIds(tok->Encode(FromHex(line), absl::GetFlag(FLAGS_parse_special)));
    }
    return 0;
  }
  if (command == "stream-detokenize") {
    auto tok = LoadTokenizer(*file);
    while (std::getline(std::cin, line)) {
      tokenizer::IncrementalDetokenizer detokenizer(*tok);
      for (int32_t id : ParseIds(line)) std::cout << ToHex(detokenizer.Push(id)) << " ";
      std::cout << ToHex(detokenizer.Flush()) << "\n";
    }
    return 0;
  }
  if (command == "detokenize") {
    auto tok = LoadTokenizer(*file);
    while (std::getline(std::cin, line)) {
      std::cout << ToHex(tok->Decode(ParseIds(line), /*skip_control=*/false)) << "\n";
    }
    return 0;
  }
  if (command == "chat") {
    auto tok = LoadTokenizer(*file);
    auto tmpl_text = file->GetString("tokenizer.chat_template");
    std::optional<std::string_view> tmpl;
    if (tmpl_text.ok()) tmpl = *tmpl_text;
    auto chat =
        tokenizer::ChatTemplate::Create(tmpl, absl::GetFlag(FLAGS_chat_template), tok.get());
    if (!chat.ok()) return Fail(chat.status());
    while (std::getline(std::cin, line)) {
      std::vector<tokenizer::ChatMessage> messages;
      std::istringstream items(line);
      std::string item;
      while (std::getline(items, item, ',')) {
        const size_t colon = item.find(':');
        messages.push_back({FromHex(item.substr(0, colon)), FromHex(item.substr(colon + 1))});
      }
      if (absl::Status s = chat->Validate(messages); !s.ok()) return Fail(s);
      absl::StatusOr<std::string> text = chat->Render(messages);
      absl::StatusOr<std::vector<tokenizer::TokenId>> ids = chat->Encode(*tok, messages);
      if (!text.ok()) return Fail(text.status());
      if (!ids.ok()) return Fail(ids.status());
      std::cout << ToHex(*text) << "\t";
      PrintIds(*ids);
    }
    return 0;
  }
  if (command == "config") {
    auto config = model::ReadModelConfig(*file);
    if (!config.ok()) return Fail(config.status());
    std::cout << "architecture=" << config->architecture << "\nlayers=" << config->layers
              << "\nembedding=" << config->embedding << "\nffn=" << config->ffn
              << "\nheads=" << config->heads << "\nkv_heads=" << config->kv_heads
              << "\nhead_dim=" << config->head_dim << "\nvocab=" << config->vocab
              << "\ncontext_length=" << config->context_length
              << "\nrotary_dims=" << config->rotary_dims << "\nrope_base=" << config->rope_base
              << "\nrope_neox=" << config->rope_neox << "\nnorm_eps=" << config->norm_eps << "\n";
    return 0;
  }
  if (command == "dequantize") {
    const model::GgufTensor* t = file->FindTensor(absl::GetFlag(FLAGS_tensor));
    if (t == nullptr) return Fail(absl::NotFoundError("no such tensor"));
    std::vector<float> out(static_cast<size_t>(t->Elements()));
    kernels::cpu::DequantizeRow(t->dtype, t->data, t->Elements(), out.data());
    std::ofstream(absl::GetFlag(FLAGS_out), std::ios::binary)
        .write(reinterpret_cast<const char*>(out.data()),
               static_cast<std::streamsize>(out.size() * sizeof(float)));
    return 0;
  }
  if (command == "logits") {
    LoadedModel m = LoadModel(file);
    std::ofstream out(absl::GetFlag(FLAGS_out), std::ios::binary);
    while (std::getline(std::cin, line)) {
      const std::vector<float> logits =
          RunPrompt(m, ParseIds(line), 0, absl::GetFlag(FLAGS_positions));
      out.write(reinterpret_cast<const char*>(logits.data()),
                static_cast<std::streamsize>(logits.size() * sizeof(float)));
    }
    return 0;
  }
  if (command == "generate") {
    LoadedModel m = LoadModel(file);
    while (std::getline(std::cin, line)) {
      std::vector<int32_t> tokens = ParseIds(line);
      std::vector<int32_t> generated;
      int start = 0;
      for (int i = 0; i < absl::GetFlag(FLAGS_max_tokens); ++i) {
        const std::vector<float> logits = RunPrompt(m, tokens, start);
        start = static_cast<int>(tokens.size());
        const int32_t next = sampling::Sample(logits, step::SamplingParams{}, 0);
        generated.push_back(next);
        tokens.push_back(next);
      }
      PrintIds(generated);
    }
    return 0;
  }
  std::cerr << "unknown command '" << command << "'\n";
  return 2;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << "usage: tandem-probe COMMAND [--flags]\n";
    return 2;
  }
  return tandem::Run(args[1]);
}
