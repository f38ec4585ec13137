// The tokenizer on arbitrary bytes: encoding then decoding gives the bytes
// back exactly (byte-level BPE: but those without a token; SentencePiece
// models: through DecodeText, with U+2581 read as the space it stands for),
// special-token parsing never crashes, and the streaming detokenizer's pieces
// add up to Decode() of the same ids. Any GGUF's tokenizer can be fuzzed:
// TANDEM_FUZZ_MODEL names the file (a vocabulary-only one will do).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_replace.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "fuzz/fuzz_model.h"

using Kind = tandem::tokenizer::TokenKind;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tok = *tandem::fuzz::Model().tokenizer;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> plain = tok.Encode(text, /*parse_special=*/false);
  // Vocabularies whose token for a byte is an added one (DeepSeek's 'ÿ')
  // decode that byte as the token's text, as Hugging Face and llama.cpp do:
  // the exact round trip holds for the others.
  bool plain_byte_tokens = true;
  for (int b = 0; b < 256; ++b) {
    const int32_t id = tok.ByteToken(static_cast<unsigned char>(b));
    plain_byte_tokens =
        plain_byte_tokens &&
        (id < 0 || (tok.Kind(id) != Kind::kControl && tok.Kind(id) != Kind::kUserDefined));
  }
  if (!plain_byte_tokens || tok.model() == tandem::tokenizer::TokenizerModel::kWordPiece) {
    // Nothing to compare exactly (WordPiece lowercases, drops accents and
    // control characters, and spells unknown words as one token).
  } else if (tok.model() == tandem::tokenizer::TokenizerModel::kByteLevelBpe) {
    // Every byte comes back in order, except those the vocabulary has no
    // token for (rare control bytes, bytes invalid in UTF-8), which Encode
    // drops as Hugging Face's BPE does without an unknown token.
    std::string covered;
    for (char c : text) {
      if (tok.HasByteToken(static_cast<unsigned char>(c))) covered.push_back(c);
    }
    if (tok.Decode(plain, /*skip_control=*/false) != covered) std::abort();
  } else {
    bool every_byte = true;
    for (int b = 0; b < 256; ++b) {
      every_byte = every_byte && tok.HasByteToken(static_cast<unsigned char>(b));
    }
    const std::string expected =
        absl::StrReplaceAll(absl::string_view(text.data(), text.size()), {{"\xE2\x96\x81", " "}});
    if (every_byte && tok.DecodeText(plain) != expected) std::abort();
  }
  (void)tok.Encode(text, /*parse_special=*/true);
  // Arbitrary ids (two bytes each) through both detokenizers.
  std::vector<int32_t> ids;
  for (size_t i = 0; i + 1 < size; i += 2) {
    ids.push_back(static_cast<int32_t>((data[i] | data[i + 1] << 8) % tok.vocab_size()));
  }
  tandem::tokenizer::IncrementalDetokenizer stream(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Push(id);
  streamed += stream.Flush();
  // The stream holds back unfinished characters and skips control tokens;
  // what it emits in the end is the whole decoding, made valid UTF-8.
  const std::string whole = tok.Decode(ids, /*skip_control=*/true);
  if (streamed != tandem::tokenizer::SanitizeUtf8(whole)) std::abort();
  return 0;
}
