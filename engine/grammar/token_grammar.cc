#include "engine/grammar/token_grammar.h"

#include <dlpack/dlpack.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <string>

#include "common/strings.h"
#include "engine/grammar/utf8_guard.h"

namespace tandem::grammar {

void TokenMask::Apply(std::span<float> logits) const {
  constexpr float kRefused = -std::numeric_limits<float>::infinity();
  for (size_t id = 0; id < logits.size(); ++id) {
    if (!Allows(static_cast<TokenId>(id))) logits[id] = kRefused;
  }
}

class CompiledGrammar {
 public:
  CompiledGrammar(xgrammar::CompiledGrammar compiled, std::shared_ptr<const Utf8Vocabulary> utf8)
      : compiled(std::move(compiled)), utf8(std::move(utf8)) {}
  xgrammar::CompiledGrammar compiled;
  std::shared_ptr<const Utf8Vocabulary> utf8;
};

struct GrammarVocabulary::Impl {
  Impl(xgrammar::TokenizerInfo info, const tokenizer::BpeTokenizer& tokenizer)
      : vocab_size(tokenizer.vocab_size()),
        utf8(std::make_shared<const Utf8Vocabulary>(tokenizer)),
        compiler(info, /*max_threads=*/1, /*cache_enabled=*/true),
        json_object(std::make_shared<const CompiledGrammar>(
            compiler.CompileJSONSchema(R"({"type": "object"})", /*any_whitespace=*/false,
                                       /*indent=*/std::nullopt, /*separators=*/std::nullopt,
                                       /*strict_mode=*/false),
            utf8)) {}

  int vocab_size;
  std::shared_ptr<const Utf8Vocabulary> utf8;
  mutable xgrammar::GrammarCompiler compiler;  // thread-safe; its cache is internal
  std::shared_ptr<const CompiledGrammar> json_object;
};

std::unique_ptr<GrammarVocabulary> GrammarVocabulary::Create(
    const tokenizer::BpeTokenizer& tokenizer, std::span<const TokenId> stop_tokens) {
  // The engine reads each token as the bytes it stands for (VocabType::RAW);
  // an empty string marks a token it must never produce inside the grammar.
  // Besides control tokens, that is every token with a byte below 0x20
  // other than LF and CR: JSON written on one line has no raw control
  // characters anywhere, and xgrammar 0.2.9 lets them into strings with
  // minLength/maxLength (its bounded-string rule excludes only '"', '\\',
  // CR and LF). LF stays for the texts around tagged values (tool calls).
  std::vector<std::string> vocabulary(static_cast<size_t>(tokenizer.vocab_size()));
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    if (tokenizer.Kind(id) == tokenizer::TokenKind::kControl) continue;
    const std::string& bytes = tokenizer.TokenBytes(id);
    const bool raw_control = std::any_of(bytes.begin(), bytes.end(), [](char c) {
      return static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\r';
    });
    if (!raw_control) vocabulary[static_cast<size_t>(id)] = bytes;
  }
  std::vector<int32_t> stops(stop_tokens.begin(), stop_tokens.end());
  xgrammar::TokenizerInfo info(vocabulary, xgrammar::VocabType::RAW, tokenizer.vocab_size(),
                               std::move(stops));
  return std::unique_ptr<GrammarVocabulary>(
      new GrammarVocabulary(std::make_unique<Impl>(std::move(info), tokenizer)));
}

GrammarVocabulary::GrammarVocabulary(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GrammarVocabulary::~GrammarVocabulary() = default;

int GrammarVocabulary::vocab_size() const { return impl_->vocab_size; }

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarVocabulary::CompileJsonSchema(
    std::string_view schema, bool strict) const {
  try {
    // Compact output (no free whitespace between tokens): the model cannot
    // spend its max_tokens on blanks. Strict mode (OpenAI's "strict": true)
    // refuses properties and items the schema does not name.
    return std::make_shared<const CompiledGrammar>(
        impl_->compiler.CompileJSONSchema(std::string(schema), /*any_whitespace=*/false,
                                          /*indent=*/std::nullopt, /*separators=*/std::nullopt,
                                          strict),
        impl_->utf8);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(tandem::StrCat("unusable JSON schema: ", e.what()));
  }
}

std::shared_ptr<const CompiledGrammar> GrammarVocabulary::JsonObject() const {
  return impl_->json_object;
}

namespace {

// `text` as a Lark string literal (xgrammar reads it as a JSON string):
// quotes, backslashes and control characters escaped; other bytes (UTF-8
// included) as they are.
std::string LarkLiteral(std::string_view text) {
  std::string out(1, '"');
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      constexpr char kHex[] = "0123456789abcdef";
      out += "\\u00";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    } else {
      out += c;
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarVocabulary::CompileTaggedJson(
    const TaggedJson& spec) const {
  try {
    // The value's grammar as the JSON-schema path builds it, referenced from
    // a Lark grammar that adds the texts around it.
    xgrammar::Grammar value = xgrammar::Grammar::FromJSONSchema(
        spec.schema, /*any_whitespace=*/false, /*indent=*/std::nullopt,
        /*separators=*/std::nullopt, /*strict_mode=*/false);
    const std::string repeat =
        spec.repeated ? tandem::StrCat(" (", LarkLiteral(spec.separator), " tagged)*") : "";
    const std::string open = spec.open.empty() ? "" : LarkLiteral(spec.open);
    const std::string close = spec.close.empty() ? "" : LarkLiteral(spec.close);
    const std::string lark =
        tandem::StrCat("start: tagged", repeat, "\ntagged: ", open, " @value ", close, "\n");
    return std::make_shared<const CompiledGrammar>(
        impl_->compiler.CompileLark(lark, {xgrammar::NamedGrammar{"value", std::move(value)}}),
        impl_->utf8);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(tandem::StrCat("unusable JSON schema: ", e.what()));
  }
}

struct GrammarState::Impl {
  explicit Impl(std::shared_ptr<const CompiledGrammar> grammar)
      : grammar(std::move(grammar)), matcher(this->grammar->compiled) {}
  std::shared_ptr<const CompiledGrammar> grammar;  // outlives the matcher
  xgrammar::GrammarMatcher matcher;
  Utf8Position position;             // after the accepted tokens
  std::vector<Utf8Position> before;  // before each accepted token
};

GrammarState::GrammarState(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}
GrammarState::~GrammarState() = default;
GrammarState::GrammarState(GrammarState&&) noexcept = default;
GrammarState& GrammarState::operator=(GrammarState&&) noexcept = default;

void GrammarState::FillMask(TokenMask* mask) {
  std::span<uint32_t> words = mask->words();
  int64_t shape[1] = {static_cast<int64_t>(words.size())};
  DLTensor tensor{};
  tensor.data = words.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = DLDataType{kDLInt, 32, 1};
  tensor.shape = shape;
  impl_->matcher.FillNextTokenBitmask(&tensor);
  impl_->grammar->utf8->Narrow(impl_->position, words);
}

bool GrammarState::Accept(TokenId token) {
  Utf8Position next = impl_->position;
  if (!impl_->grammar->utf8->Advance(&next, token)) return false;
  if (!impl_->matcher.AcceptToken(token)) return false;
  impl_->before.push_back(impl_->position);
  impl_->position = next;
  return true;
}

void GrammarState::Rollback(int count) {
  count = std::min(count, static_cast<int>(impl_->before.size()));
  if (count <= 0) return;
  impl_->matcher.Rollback(count);
  impl_->position = impl_->before[impl_->before.size() - static_cast<size_t>(count)];
  impl_->before.resize(impl_->before.size() - static_cast<size_t>(count));
}

bool GrammarState::terminated() const { return impl_->matcher.IsTerminated(); }

void MaskDraftRows(GrammarState& grammar, std::span<const TokenId> draft, std::span<float> logits,
                   size_t vocab) {
  TokenMask mask(grammar.vocab_size());
  int accepted = 0;
  bool last_mask = false;  // the rows from here on keep `mask` as it is
  for (size_t j = 0; (j + 1) * vocab <= logits.size(); ++j) {
    if (j > 0 && !last_mask) {
      if (grammar.Accept(draft[j - 1])) {
        ++accepted;
        // A terminated grammar has no next mask (xgrammar refuses to fill one).
        last_mask = grammar.terminated();
      } else {
        last_mask = true;
      }
    }
    if (!last_mask) grammar.FillMask(&mask);
    mask.Apply(logits.subspan(j * vocab, vocab));
  }
  grammar.Rollback(accepted);
}

int GrammarState::vocab_size() const {
  return impl_->grammar->compiled.GetTokenizerInfo().GetVocabSize();
}

}  // namespace tandem::grammar
