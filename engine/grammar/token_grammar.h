// Structured output: which tokens may come next so that a request's answer
// stays inside a grammar (a JSON schema, or any JSON object).
//
// The grammar engine is xgrammar's C++ library (built from its PyPI source
// distribution by scripts/setup; its headers stay in token_grammar.cc). It
// compiles a grammar once against the model's vocabulary and then gives,
// after each accepted token, the set of tokens the grammar allows next as a
// bit mask. Masking happens on the logits before sampling (kernels::
// SampleRow): a disallowed token's logit becomes -inf, so every backend and
// the speculative verifier keep sampling bit for bit as they do unmasked.
//
// Thread safety: a GrammarVocabulary and a CompiledGrammar may be shared by
// any threads; a GrammarState belongs to one request at a time.
#ifndef TANDEM_ENGINE_GRAMMAR_TOKEN_GRAMMAR_H_
#define TANDEM_ENGINE_GRAMMAR_TOKEN_GRAMMAR_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/tokenizer/bpe_tokenizer.h"

namespace tandem::grammar {

using TokenId = tokenizer::TokenId;

// The allowed next tokens: bit (id % 32) of word (id / 32) is set when
// token id is allowed.
class TokenMask {
 public:
  explicit TokenMask(int vocab_size) : vocab_size_(vocab_size), words_((vocab_size + 31) / 32) {}

  bool Allows(TokenId id) const {
    return id >= 0 && id < vocab_size_ && ((words_[id / 32] >> (id % 32)) & 1u) != 0;
  }
  int vocab_size() const { return vocab_size_; }
  std::span<uint32_t> words() { return words_; }
  std::span<const uint32_t> words() const { return words_; }
  // -inf for every logit the mask refuses (ids past the mask included).
  void Apply(std::span<float> logits) const;

 private:
  int vocab_size_;
  std::vector<uint32_t> words_;
};

class CompiledGrammar;

// The model's vocabulary as the grammar engine sees it, and the compiler of
// grammars against it. One per model; compiled grammars are cached by text.
class GrammarVocabulary {
 public:
  // Control tokens (TokenKind::kControl) and tokens with raw control bytes
  // other than LF and CR never appear inside structured output (JSON on one
  // line, and the texts around tool calls); `stop_tokens` (the end-of-turn tokens) end it once the
  // grammar is complete.
  static std::unique_ptr<GrammarVocabulary> Create(const tokenizer::BpeTokenizer& tokenizer,
                                                   std::span<const TokenId> stop_tokens);
  ~GrammarVocabulary();

  // A grammar for answers that are one JSON value valid under `schema`
  // (JSON Schema text), on one line with the separators of Python's
  // json.dumps and Jinja's tojson (", " and ": ") and no other whitespace. With `strict`,
  // properties and items the schema does not name are refused even where it does not say so.
  // INVALID_ARGUMENT naming the problem when the schema is not JSON or uses
  // what the engine cannot enforce.
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileJsonSchema(
      std::string_view schema, bool strict = true) const;
  // A grammar for answers that are any one JSON object (response_format
  // json_object).
  std::shared_ptr<const CompiledGrammar> JsonObject() const;

  // A grammar for answers made of JSON values, each written between fixed
  // texts: tool calls in the form a chat template teaches, e.g.
  // `<tool_call>\n{"name": ...}\n</tool_call>`. INVALID_ARGUMENT as
  // CompileJsonSchema's.
  struct TaggedJson {
    std::string open;       // text before each value
    std::string schema;     // JSON Schema each value meets (not strict)
    std::string close;      // text after each value
    std::string separator;  // text between values
    bool repeated = false;  // one value, or one or more
  };
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileTaggedJson(
      const TaggedJson& spec) const;

  int vocab_size() const;

  struct Impl;

 private:
  explicit GrammarVocabulary(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// One request's position in its grammar.
class GrammarState {
 public:
  explicit GrammarState(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarState();
  GrammarState(GrammarState&&) noexcept;
  GrammarState& operator=(GrammarState&&) noexcept;

  // The tokens allowed next. Once the grammar is complete only the stop
  // tokens are.
  void FillMask(TokenMask* mask);
  // Advances over `token`; false (and no change) when the grammar refuses it.
  bool Accept(TokenId token);
  // Undoes the last `count` accepted tokens (rejected speculative drafts).
  void Rollback(int count);
  // A stop token was accepted after a complete answer.
  bool terminated() const;
  // The vocabulary the grammar was compiled against (masks are this long).
  int vocab_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A verification's masks: row j of `logits` (rows of `vocab` floats) keeps
// only the tokens `grammar` allows after the first j tokens of `draft`, and
// `grammar` is left as it was found. Rows after a drafted token that ends
// the answer (a stop token the grammar accepts) or that the grammar refuses
// keep the mask before it: verification never reaches them, as the answer
// ends at that token's row or the token is rejected there.
void MaskDraftRows(GrammarState& grammar, std::span<const TokenId> draft, std::span<float> logits,
                   size_t vocab);

}  // namespace tandem::grammar

#endif  // TANDEM_ENGINE_GRAMMAR_TOKEN_GRAMMAR_H_
