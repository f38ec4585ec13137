// The grammar engine against the model's real vocabulary: masks that keep
// sampled answers inside a JSON schema, checked by parsing and validating
// the answers with nlohmann::json (an independent parser).
#include "engine/grammar/token_grammar.h"

#include <initializer_list>
#include <random>

#include "engine/grammar/utf8_guard.h"
#include "engine/model/random_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace tandem::grammar {
namespace {

using nlohmann::json;

// Bounded: the longest answer is well under 100 tokens.
constexpr char kPersonSchema[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 8},
    "age": {"type": "integer", "minimum": 0, "maximum": 150},
    "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3}
  },
  "required": ["name", "age", "tags"],
  "additionalProperties": false
})";

class TokenGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<model::GgufFile>> file =
        model::OpenRandomModel("random:smollm2-135m");
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = *std::move(file);
    absl::StatusOr<std::unique_ptr<tokenizer::BpeTokenizer>> tok =
        tokenizer::BpeTokenizer::FromGguf(*file_);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    ASSERT_TRUE(tokenizer_->Find("<|im_end|>").has_value());
    stop_ = *tokenizer_->Find("<|im_end|>");
    vocabulary_ = GrammarVocabulary::Create(*tokenizer_, std::vector<TokenId>{stop_});
  }

  // Walks the grammar drawing uniformly among the allowed tokens (the worst
  // case for a model: any allowed token is as likely as any other) until the
  // stop token; the answer's text, or "" when it took over `limit` tokens.
  std::string RandomAnswer(std::shared_ptr<const CompiledGrammar> grammar, uint32_t seed,
                           int limit) {
    GrammarState state(std::move(grammar));
    TokenMask mask(tokenizer_->vocab_size());
    std::mt19937 rng(seed);
    std::vector<TokenId> answer;
    for (int step = 0; step < limit; ++step) {
      state.FillMask(&mask);
      std::vector<TokenId> allowed;
      for (TokenId id = 0; id < tokenizer_->vocab_size(); ++id) {
        if (mask.Allows(id)) allowed.push_back(id);
      }
      EXPECT_FALSE(allowed.empty());
      if (allowed.empty()) return "";
      const TokenId token = allowed[rng() % allowed.size()];
      EXPECT_TRUE(state.Accept(token));
      if (token == stop_) {
        EXPECT_TRUE(state.terminated());
        return tokenizer_->Decode(answer, /*skip_control=*/false);
      }
      answer.push_back(token);
    }
    ADD_FAILURE() << "no stop token within " << limit << " tokens";
    return "";
  }

  std::unique_ptr<model::GgufFile> file_;
  std::unique_ptr<tokenizer::BpeTokenizer> tokenizer_;
  TokenId stop_ = 0;
  std::unique_ptr<GrammarVocabulary> vocabulary_;
};

TEST_F(TokenGrammarTest, FiftySeededAnswersParseAndMatchTheSchema) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> grammar =
      vocabulary_->CompileJsonSchema(kPersonSchema);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const std::string text = RandomAnswer(*grammar, seed, 200);
    const json answer = json::parse(text, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(answer.is_discarded()) << "seed " << seed << ": " << text;
    ASSERT_TRUE(answer.is_object()) << text;
    EXPECT_EQ(answer.size(), 3u) << text;
    ASSERT_TRUE(answer["name"].is_string()) << text;
    // maxLength counts characters (code points), not bytes; no raw
    // control characters (the parse above refuses them too).
    const std::string name = answer["name"];
    size_t characters = 0;
    for (unsigned char c : name) characters += (c & 0xC0) != 0x80;
    EXPECT_LE(characters, 8u) << text;
    ASSERT_TRUE(answer["age"].is_number_integer()) << text;
    EXPECT_GE(answer["age"].get<int64_t>(), 0) << text;
    EXPECT_LE(answer["age"].get<int64_t>(), 150) << text;
    ASSERT_TRUE(answer["tags"].is_array()) << text;
    EXPECT_LE(answer["tags"].size(), 3u) << text;
    for (const json& tag : answer["tags"]) {
      EXPECT_TRUE(tag == "a" || tag == "b" || tag == "c") << text;
    }
  }
}

TEST_F(TokenGrammarTest, JsonObjectAnswersAreObjects) {
  GrammarState state(vocabulary_->JsonObject());
  TokenMask mask(tokenizer_->vocab_size());
  state.FillMask(&mask);
  // The first token opens the object: "{" allowed; "[", text and the stop
  // token not.
  EXPECT_TRUE(mask.Allows(tokenizer_->Encode("{", false).at(0)));
  EXPECT_FALSE(mask.Allows(tokenizer_->Encode("[", false).at(0)));
  EXPECT_FALSE(mask.Allows(tokenizer_->Encode("the", false).at(0)));
  EXPECT_FALSE(mask.Allows(stop_));
  for (TokenId token : tokenizer_->Encode(R"({"a": 1})", false)) {
    ASSERT_TRUE(state.Accept(token)) << tokenizer_->TokenBytes(token);
  }
  ASSERT_TRUE(state.Accept(stop_));
  EXPECT_TRUE(state.terminated());
}

TEST_F(TokenGrammarTest, ControlTokensAreNeverAllowedAndStopOnlyAtTheEnd) {
  GrammarState state(*vocabulary_->CompileJsonSchema(R"({"type": "boolean"})"));
  TokenMask mask(tokenizer_->vocab_size());
  state.FillMask(&mask);
  for (TokenId id = 0; id < tokenizer_->vocab_size(); ++id) {
    if (tokenizer_->Kind(id) == tokenizer::TokenKind::kControl) {
      EXPECT_FALSE(mask.Allows(id)) << tokenizer_->TokenBytes(id);
    }
  }
  EXPECT_FALSE(state.Accept(tokenizer_->Encode("null", false).at(0)));
  for (TokenId token : tokenizer_->Encode("true", false)) ASSERT_TRUE(state.Accept(token));
  state.FillMask(&mask);
  EXPECT_TRUE(mask.Allows(stop_));
  int allowed = 0;
  for (TokenId id = 0; id < tokenizer_->vocab_size(); ++id) allowed += mask.Allows(id);
  EXPECT_EQ(allowed, 1);
}

TEST_F(TokenGrammarTest, RollbackUndoesRejectedDrafts) {
  GrammarState state(*vocabulary_->CompileJsonSchema(R"({"enum": ["yes", "no"]})"));
  TokenMask before(tokenizer_->vocab_size());
  state.FillMask(&before);
  ASSERT_TRUE(state.Accept(tokenizer_->Encode("\"", false).at(0)));
  state.Rollback(1);
  TokenMask after(tokenizer_->vocab_size());
  state.FillMask(&after);
  EXPECT_TRUE(std::equal(before.words().begin(), before.words().end(), after.words().begin()));
}

TEST_F(TokenGrammarTest, MaskingSetsRefusedLogitsToMinusInfinity) {
  TokenMask mask(40);
  mask.words()[0] = 0b101;
  std::vector<float> logits(40, 1.0f);
  mask.Apply(logits);
  EXPECT_EQ(logits[0], 1.0f);
  EXPECT_EQ(logits[2], 1.0f);
  EXPECT_EQ(logits[1], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(logits[39], -std::numeric_limits<float>::infinity());
}

TEST(Utf8PositionTest, OnlyRfc3629SequencesPass) {
  auto valid = [](std::initializer_list<std::string_view> tokens) {
    Utf8Position at;
    for (std::string_view t : tokens) {
      if (!at.Advance(t)) return false;
    }
    return at.between_characters();
  };
  EXPECT_TRUE(valid({"a", "\xC3", "\xA9"}));     // é split over two tokens
  EXPECT_TRUE(valid({"\xED\x9F", "\xBF"}));      // U+D7FF, the last before surrogates
  EXPECT_FALSE(valid({"\xED", "\xA0\x80"}));     // U+D800, a surrogate
  EXPECT_TRUE(valid({"\xF0\x9F\x98", "\x80"}));  // U+1F600
  EXPECT_FALSE(valid({"\xF4\x90\x80\x80"}));     // above U+10FFFF
  EXPECT_FALSE(valid({"\xE0\x80\x80"}));         // overlong
  EXPECT_FALSE(valid({"\xC0\xAF"}));             // overlong
  EXPECT_FALSE(valid({"\x80"}));                 // no lead byte
  EXPECT_FALSE(valid({"\xC3", "a"}));            // cut short
  Utf8Position open;
  ASSERT_TRUE(open.Advance("\xE2\x82"));
  EXPECT_FALSE(open.between_characters());
}

TEST_F(TokenGrammarTest, ABadSchemaIsAnInvalidArgument) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> bad =
      vocabulary_->CompileJsonSchema("{not json");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(bad.status().message()).find("JSON schema"), std::string::npos);
}

}  // namespace
}  // namespace tandem::grammar
