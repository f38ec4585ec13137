// The tokenizer models on small vocabularies written here, where each
// expected id follows by hand from the model's rules. The real vocabularies
// (llama.cpp's vocabulary GGUFs with the ids Hugging Face gives) are checked
// in tests/reference/test_vocabularies.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "engine/model/gguf_file.h"
#include "engine/tokenizer/bpe_tokenizer.h"
#include "tests/unit/gguf_builder.h"

namespace tandem::tokenizer {
namespace {

using ::testing::ElementsAre;

constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kByte = 6;

// Ids:                  0        1      2       3      4    5    6    7
//                       8       9     10      11      12        13        14
const std::vector<std::string> kTokens = {"<unk>", "<s>",    "</s>",    "\u2581", "a",
                                          "b",     "c",      "\u2581a", "ab",     "\u2581ab",
                                          "bc",    "<0xC3>", "<0xA9>",  "<tool>", "<0x0A>"};
const std::vector<int32_t> kTypes = {kUnknown, kControl, kControl, kNormal,      kNormal,
                                     kNormal,  kNormal,  kNormal,  kNormal,      kNormal,
                                     kNormal,  kByte,    kByte,    kUserDefined, kByte};
// Higher merges first: "ab" (-0.5) before "▁a" (-1.5), "bc" (-0.3) before "ab".
const std::vector<float> kScores = {0, 0, 0, -1, -2, -3, -4, -1.5, -0.5, -0.2, -0.3, 0, 0, 0, 0};

class SentencePieceTest : public ::testing::Test {
 protected:
  std::unique_ptr<BpeTokenizer> Load(std::optional<bool> add_space_prefix) {
    tandem::testing::GgufBuilder b(3);
    b.String("tokenizer.ggml.model", "llama")
        .StringArray("tokenizer.ggml.tokens", kTokens)
        .Int32Array("tokenizer.ggml.token_type", kTypes)
        .Float32Array("tokenizer.ggml.scores", kScores)
        .Uint32("tokenizer.ggml.bos_token_id", 1)
        .Uint32("tokenizer.ggml.eos_token_id", 2)
        .Uint32("tokenizer.ggml.unknown_token_id", 0);
    if (add_space_prefix.has_value()) b.Bool("tokenizer.ggml.add_space_prefix", *add_space_prefix);
    const tandem::testing::ScopedFile gguf(
        ::testing::TempDir() + "/spm_" + std::to_string(::getpid()) + ".gguf", b.Build());
    auto file = model::GgufFile::Open(gguf.path());
    EXPECT_TRUE(file.ok()) << file.status();
    auto tok = BpeTokenizer::FromGguf(**file);
    EXPECT_TRUE(tok.ok()) << tok.status();
    return tok.ok() ? *std::move(tok) : nullptr;
  }
};

TEST_F(SentencePieceTest, MergesByHighestScoreAfterPrefixingASpace) {
  auto tok = Load(std::nullopt);  // a prefix by default
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->model(), TokenizerModel::kSentencePiece);
  EXPECT_TRUE(tok->add_bos());
  // "▁ab": "ab" (-0.5) merges first, then "▁ab" (-0.2).
  EXPECT_THAT(tok->Encode("ab", false), ElementsAre(9));
  // "▁abc": "bc" (-0.3) wins over "ab" (-0.5); "abc" is no token, so "▁a".
  EXPECT_THAT(tok->Encode("abc", false), ElementsAre(7, 10));
  // Spaces inside the text are U+2581 too.
  EXPECT_THAT(tok->Encode("a b", false), ElementsAre(7, 3, 5));
}

TEST_F(SentencePieceTest, CharactersWithoutATokenAreSpelledInByteTokens) {
  auto tok = Load(std::nullopt);
  ASSERT_NE(tok, nullptr);
  EXPECT_THAT(tok->Encode("\u00e9\n", false), ElementsAre(3, 11, 12, 14));
  // No byte token for 'z': the unknown token.
  EXPECT_THAT(tok->Encode("z", false), ElementsAre(3, 0));
  EXPECT_EQ(tok->Decode(std::vector<TokenId>{3, 11, 12, 14}, false), " \u00e9\n");
}

TEST_F(SentencePieceTest, EachRunOfPlainTextGetsTheSpacePrefix) {
  auto tok = Load(std::nullopt);
  ASSERT_NE(tok, nullptr);
  // After a control token (parsed) and after a user-defined one (always).
  EXPECT_THAT(tok->Encode("<s>ab<tool>ab", true), ElementsAre(1, 9, 13, 9));
  // Without parse_special the control token is text; the user-defined one
  // still matches, as in Hugging Face and llama.cpp.
  EXPECT_THAT(tok->Encode("<s><tool>", false), ElementsAre(3, 0, 0, 0, 13));
  // DecodeText drops exactly the prefixed spaces, so it inverts Encode.
  const std::vector<TokenId> ids = tok->Encode("<s>ab<tool>a b", true);
  EXPECT_EQ(tok->Decode(ids, false), "<s> ab<tool> a b");
  EXPECT_EQ(tok->DecodeText(ids), "<s>ab<tool>a b");
}

TEST_F(SentencePieceTest, TheVocabularyCanTurnThePrefixOff) {
  auto tok = Load(false);
  ASSERT_NE(tok, nullptr);
  EXPECT_FALSE(tok->add_space_prefix());
  EXPECT_THAT(tok->Encode("ab", false), ElementsAre(8));
  EXPECT_EQ(tok->DecodeText(tok->Encode(" ab", false)), " ab");
}

TEST(WordPieceTest, WordsAreTheirLongestPiecesFromTheLeftOrUnknown) {
  tandem::testing::GgufBuilder b(3);
  // Ids:  0        1             2        3      4        5      6       7
  b.String("tokenizer.ggml.model", "bert")
      .StringArray("tokenizer.ggml.tokens", {"[UNK]", "\u2581hello", "\u2581un", "aff", "able",
                                             "\u2581,", "\u2581u", "affable"})
      .Int32Array("tokenizer.ggml.token_type",
                  {kControl, kNormal, kNormal, kNormal, kNormal, kNormal, kNormal, kNormal})
      .Uint32("tokenizer.ggml.unknown_token_id", 0);
  const tandem::testing::ScopedFile gguf(
      ::testing::TempDir() + "/wpm_" + std::to_string(::getpid()) + ".gguf", b.Build());
  auto file = model::GgufFile::Open(gguf.path());
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = BpeTokenizer::FromGguf(**file);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->model(), TokenizerModel::kWordPiece);
  // "▁un" is longer than "▁u", then "affable" than "aff"; "xyz" has no
  // pieces at all and "▁hellox" runs out after "▁hello": both unknown.
  EXPECT_THAT((*tok)->Encode("Hello unaffable, xyz hellox", false), ElementsAre(1, 2, 7, 5, 0, 0));
  EXPECT_EQ((*tok)->DecodeText(std::vector<TokenId>{1, 2, 7, 5}), "hello unaffable ,");
}

TEST(TokenizerModelTest, UnsupportedModelsAreNamed) {
  tandem::testing::GgufBuilder b(3);
  b.String("tokenizer.ggml.model", "t5")
      .StringArray("tokenizer.ggml.tokens", {"[PAD]", "a"})
      .Int32Array("tokenizer.ggml.token_type", {kControl, kNormal});
  const tandem::testing::ScopedFile gguf(
      ::testing::TempDir() + "/ugm_" + std::to_string(::getpid()) + ".gguf", b.Build());
  auto file = model::GgufFile::Open(gguf.path());
  ASSERT_TRUE(file.ok()) << file.status();
  auto tok = BpeTokenizer::FromGguf(**file);
  ASSERT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()),
              ::testing::HasSubstr("tokenizer model 't5' is not supported"));
}

}  // namespace
}  // namespace tandem::tokenizer
