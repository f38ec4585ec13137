// The tokenizer on arbitrary bytes: encoding then decoding gives valid UTF-8
// back exactly (byte-level BPE), special-token parsing never crashes, and the
// streaming detokenizer's pieces add up to Decode() of the same ids.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/incremental_detokenizer.h"
#include "fuzz/fuzz_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& tok = *tandem::fuzz::Model().tokenizer;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> plain = tok.Encode(text, /*parse_special=*/false);
  // Every byte comes back in order, except those the vocabulary has no
  // token for (rare control bytes, bytes invalid in UTF-8), which Encode
  // drops as Hugging Face's BPE does without an unknown token.
  std::string covered;
  for (char c : text) {
    if (tok.HasByteToken(static_cast<unsigned char>(c))) covered.push_back(c);
  }
  if (tok.Decode(plain, /*skip_control=*/false) != covered) std::abort();
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
