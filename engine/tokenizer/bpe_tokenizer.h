// The BPE tokenizers of GGUF vocabularies, built from `tokenizer.ggml.*`:
//
//  - byte-level BPE (`tokenizer.ggml.model` "gpt2": GPT-2, Llama 3, Qwen,
//    DeepSeek, Falcon...): the text is split by the model's pre-tokenizer,
//    each piece's bytes are mapped to byte-level symbols and merged by merge
//    rank (lowest first, leftmost first);
//  - SentencePiece BPE ("llama": Llama 2, Mistral, Phi-3, Gemma...): spaces
//    become U+2581, a space is prefixed where the vocabulary asks for one
//    (`add_space_prefix`, by default yes), and characters are merged by
//    token score (highest first, leftmost first); a character with no token
//    is spelled with the byte tokens <0xXX>;
//  - ranked merges over SentencePiece text ("gemma4"): spaces become U+2581
//    (no prefix), and runs of newlines and runs of other characters are
//    merged by rank as byte-level BPE merges bytes; a run of newlines that
//    is a token is that token, and a character with no token is spelled
//    with the byte tokens;
//  - WordPiece ("bert": BERT's encoders): BERT's normalization and word
//    splitting (wordpiece.h), then each word as its longest pieces from the
//    left, the first with U+2581 before it (GGUF's spelling of a word start;
//    Hugging Face's "##" continuations are bare); a word that cannot be
//    pieced together is the unknown token.
//
// Special and user-defined tokens are matched in the text first (longest
// match wins) when parse_special is set, and the text between them is encoded
// as above. Decoding maps each token back to its bytes; Decode(Encode(s)) == s
// for every text whose bytes all have tokens (some byte-level vocabularies,
// SmolLM2's among them, lack a few control characters; those bytes are
// dropped, as Hugging Face's tokenizer drops them), up to the space a
// SentencePiece vocabulary prefixes.
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
#include "engine/tokenizer/wordpiece.h"

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

enum class TokenizerModel {
  kByteLevelBpe,         // "gpt2"
  kSentencePiece,        // "llama"
  kSentencePieceMerges,  // "gemma4"
  kWordPiece,            // "bert"
};

struct SpecialTokens {
  std::optional<TokenId> bos, eos, eot, unknown, padding;
};

class BpeTokenizer {
 public:
  // Reads vocabulary, kinds, merges or scores, special ids and the
  // pre-tokenizer name.
  // Errors name the metadata key or the token that is wrong.
  static absl::StatusOr<std::unique_ptr<BpeTokenizer>> FromGguf(const model::GgufFile& file);

  int vocab_size() const { return static_cast<int>(token_bytes_.size()); }
  // Whether the vocabulary has a token for this byte (byte-level
  // vocabularies may omit bytes never seen in training; Encode drops them).
  bool HasByteToken(unsigned char byte) const { return byte_token_[byte] >= 0; }
  // That token (its byte-level symbol or its <0xXX> token), -1 when none.
  // Some vocabularies made the symbol an added token (DeepSeek's 'ÿ' is
  // user-defined), which decodes as its text, as in Hugging Face and llama.cpp.
  TokenId ByteToken(unsigned char byte) const { return byte_token_[byte]; }
  const SpecialTokens& special() const { return special_; }
  TokenizerModel model() const { return model_; }
  // Byte-level BPE only.
  PretokenizerKind pretokenizer() const { return pretokenizer_; }
  // SentencePiece models only: whether each run of plain text (at the
  // start, and after each special token) is encoded with a space before it.
  bool add_space_prefix() const { return add_space_prefix_; }
  bool add_bos() const { return add_bos_; }

  // Token ids for `text`. The text of a user-defined token is always that
  // token (as Hugging Face and llama.cpp match added tokens); the text of a
  // control token is that token with parse_special, plain text without.
  std::vector<TokenId> Encode(std::string_view text, bool parse_special) const;
  // As Encode(text, true), but a control token's text is a token only where
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
  // The text that Encode(text, /*parse_special=*/true) turns into `ids`:
  // Decode(ids, false) less the space a SentencePiece vocabulary prefixes to
  // each run of plain text (at the start and after a special token).
  std::string DecodeText(std::span<const TokenId> ids) const;

  // The id of a token given by its text, when there is one.
  std::optional<TokenId> Find(std::string_view token_text) const;

 private:
  BpeTokenizer() = default;
  // Read what differs between the models: byte-level symbols, SentencePiece
  // text and byte tokens (and scores), ranked merges.
  absl::Status ReadByteLevelBpe(const model::GgufFile& file,
                                std::span<const std::string_view> tokens);
  absl::Status ReadSentencePiece(const model::GgufFile& file,
                                 std::span<const std::string_view> tokens);
  absl::Status ReadMerges(const model::GgufFile& file);
  void EncodePiece(std::string_view piece, std::vector<TokenId>* out) const;
  void EncodeSentencePiece(std::string_view text, std::vector<TokenId>* out) const;
  void EncodeWordPiece(std::string_view text, std::vector<TokenId>* out) const;
  void EncodePlain(std::string_view text, std::vector<TokenId>* out) const;

  struct Merge {
    int32_t rank;
    TokenId result;
  };
  static uint64_t PairKey(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  TokenizerModel model_ = TokenizerModel::kByteLevelBpe;
  PretokenizerKind pretokenizer_ = PretokenizerKind::kGpt2;
  bool add_bos_ = false;
  bool add_space_prefix_ = false;
  bool ignore_merges_ = false;
  SpecialTokens special_;
  std::vector<std::string> token_bytes_;
  std::vector<TokenKind> kinds_;
  absl::flat_hash_map<std::string, TokenId> vocab_;  // GGUF token text -> id
  // The token of each byte: its byte-level symbol, or its <0xXX> token; -1
  // when the vocabulary has none.
  TokenId byte_token_[256] = {};
  absl::flat_hash_map<uint64_t, Merge> merges_;  // all but kSentencePiece
  std::vector<float> scores_;                    // kSentencePiece
  BertNormalizer bert_normalizer_;               // kWordPiece
  size_t longest_token_bytes_ = 0;               // kWordPiece
  // Texts matched before pre-tokenization, longest first.
  std::vector<std::pair<std::string, TokenId>> specials_by_length_;
  bool special_first_byte_[256] = {};
};

}  // namespace tandem::tokenizer

#endif  // TANDEM_ENGINE_TOKENIZER_BPE_TOKENIZER_H_
