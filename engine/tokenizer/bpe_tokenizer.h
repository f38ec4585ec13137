// Byte-level BPE (GPT-2 style) built from a GGUF's `tokenizer.ggml.*` metadata.
//
// Encoding: special and user-defined tokens are matched in the text first
// (longest match wins) when parse_special is set; the text between them is
// split by the model's pre-tokenizer, each piece's bytes are mapped to
// byte-level symbols and merged by merge rank (lowest first, leftmost first).
// Decoding maps each token back to its bytes; Decode(Encode(s)) == s for
// every text whose bytes all have byte tokens (some vocabularies, SmolLM2's
// among them, lack a few control characters; those bytes are dropped, as
// Hugging Face's tokenizer drops them).
//
// Thread safety: immutable after construction; share freely.
#ifndef TANDEM_ENGINE_TOKENIZER_BPE_TOKENIZER_H_
#define TANDEM_ENGINE_TOKENIZER_BPE_TOKENIZER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/model/gguf_file.h"
#include "engine/tokenizer/pretokenizer.h"

namespace tandem::tokenizer {

using TokenId = int32_t;

// Token kinds, numbered as GGUF's tokenizer.ggml.token_type.
enum class TokenKind : uint8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

struct SpecialTokens {
  std::optional<TokenId> bos, eos, eot, unknown, padding;
};

class BpeTokenizer {
 public:
  // Reads vocabulary, kinds, merges, special ids and the pre-tokenizer name.
  // Errors name the metadata key or the token that is wrong.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromGguf(const model::GgufFile& file);

  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  // Whether the vocabulary has a token for this byte (byte-level
  // vocabularies may omit bytes never seen in training; Encode drops them).
  bool HasByteToken(unsigned char byte) const { return byte_token_[byte] >= 0; }
  const SpecialTokens& special() const { return special_; }
  PretokenizerKind pretokenizer() const { return pretokenizer_; }
  bool add_bos() const { return add_bos_; }

  // Token ids for `text`. With parse_special, the text of control and
  // user-defined tokens becomes those tokens; without, it is plain text.
  std::vector<TokenId> Encode(std::string_view text, bool parse_special) const;
  // As Encode(text, true), but a special token's text is a token only where
  // special_allowed(byte offset of its first byte) is true; elsewhere it is
  // plain text. Text between special tokens is pre-tokenized as one run, so
  // the result equals Encode(text, true) whenever no special text is refused.
  std::vector<TokenId> EncodeSpecialWhere(std::string_view text,
                                          const std::function<bool(size_t)>& special_allowed) const;

  // The bytes of a token: its text for control/user-defined tokens, the raw
  // bytes it stands for otherwise. REQUIRES: 0 <= id < vocab_size().
  const std::string& TokenBytes(TokenId id) const { return token_bytes_[static_cast<size_t>(id)]; }
  TokenKind Kind(TokenId id) const { return kinds_[static_cast<size_t>(id)]; }
  // Exact decoding: the concatenated bytes of the tokens, control tokens
  // included unless skip_control.
  std::string Decode(std::span<const TokenId> ids, bool skip_control) const;

  // The id of a token given by its text, when there is one.
  std::optional<TokenId> Find(std::string_view token_text) const;

 private:
  BpeTokenizer() = default;
  void EncodePiece(std::string_view piece, std::vector<TokenId>* out) const;
  void EncodePlain(std::string_view text, std::vector<TokenId>* out) const;

  struct Merge {
    int32_t rank;
    TokenId result;
  };
  static uint64_t PairKey(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  PretokenizerKind pretokenizer_ = PretokenizerKind::kGpt2;
  bool add_bos_ = false;
  SpecialTokens special_;
  std::vector<std::string> token_bytes_;
  std::vector<TokenKind> kinds_;
  absl::flat_hash_map<std::string, TokenId> vocab_;  // GGUF token text -> id
  TokenId byte_token_[256] = {};  // single-byte symbols; -1 when the vocabulary has none
  absl::flat_hash_map<uint64_t, Merge> merges_;
  // Texts matched before pre-tokenization, longest first.
  std::vector<std::pair<std::string, TokenId>> specials_by_length_;
  bool special_first_byte_[256] = {};
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_BPE_TOKENIZER_H_
