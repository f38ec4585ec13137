// The grammar engine against the model's real vocabulary: masks that keep
// sampled answers inside a JSON schema, checked by parsing and validating
// the answers with nlohmann::json (an independent parser).
#include "engine/grammar/token_grammar.h"

#include <initializer_list>

#include "engine/grammar/utf8_guard.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/grammar_walk.h"

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

class TokenGrammarTest : public testing::GrammarVocabularyTest {};

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

// A draft that copies a whole answer and its stop token, then runs on (as a
// suffix draft copied from an earlier identical answer does): the rows up
// to the stop token get their own masks, the rows after it the stop row's
// (the grammar has ended: no next mask exists), and the grammar is left
// where it was.
TEST_F(TokenGrammarTest, DraftRowsPastTheAnswersStopTokenKeepTheStopRowsMask) {
  GrammarState state(*vocabulary_->CompileJsonSchema(R"({"type": "boolean"})"));
  std::vector<TokenId> draft = tokenizer_->Encode("true", false);
  const size_t answer = draft.size();
  draft.push_back(stop_);
  for (TokenId token : tokenizer_->Encode("true", false)) draft.push_back(token);
  const size_t vocab = static_cast<size_t>(tokenizer_->vocab_size());
  std::vector<float> logits((draft.size() + 1) * vocab, 0.0f);
  TokenMask before(tokenizer_->vocab_size());
  state.FillMask(&before);

  MaskDraftRows(state, draft, logits, vocab);

  auto allowed = [&](size_t row, TokenId id) { return logits[row * vocab + id] == 0.0f; };
  EXPECT_TRUE(allowed(0, draft[0]));
  EXPECT_FALSE(allowed(0, stop_));
  // After the whole answer only the stop token is allowed, and so in every
  // row past it.
  for (size_t row = answer; row <= draft.size(); ++row) {
    EXPECT_TRUE(allowed(row, stop_)) << "row " << row;
    int count = 0;
    for (size_t id = 0; id < vocab; ++id) count += allowed(row, static_cast<TokenId>(id));
    EXPECT_EQ(count, 1) << "row " << row;
  }
  TokenMask after(tokenizer_->vocab_size());
  state.FillMask(&after);
  EXPECT_FALSE(state.terminated());
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

// Tool calls as a Hermes-style template writes them: the value between
// texts holding a newline and a quote (escaped into the grammar's text).
constexpr char kCallSchema[] = R"({"anyOf": [
  {"type": "object", "properties": {"name": {"const": "get_weather"},
   "arguments": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                 "required": ["city"], "additionalProperties": false}},
   "required": ["name", "arguments"], "additionalProperties": false},
  {"type": "object", "properties": {"name": {"const": "get_time"},
   "arguments": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},
                 "required": ["zone"], "additionalProperties": false}},
   "required": ["name", "arguments"], "additionalProperties": false}]})";

GrammarVocabulary::TaggedJson HermesCalls(bool repeated) {
  return {"<tool_call \"x\">\n", kCallSchema, "\n</tool_call>", "\n", repeated};
}

TEST_F(TokenGrammarTest, FiftySeededTaggedCallsParseAndMatchTheirTool) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> grammar =
      vocabulary_->CompileTaggedJson(HermesCalls(/*repeated=*/false));
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  const std::string open = "<tool_call \"x\">\n", close = "\n</tool_call>";
  for (uint32_t seed = 0; seed < 50; ++seed) {
    const std::string text = RandomAnswer(*grammar, seed, 200);
    ASSERT_GT(text.size(), open.size() + close.size()) << "seed " << seed << ": " << text;
    ASSERT_EQ(text.substr(0, open.size()), open) << text;
    ASSERT_EQ(text.substr(text.size() - close.size()), close) << text;
    const std::string value = text.substr(open.size(), text.size() - open.size() - close.size());
    const json call = json::parse(value, nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(call.is_discarded()) << "seed " << seed << ": " << text;
    ASSERT_EQ(call.size(), 2u) << text;
    const json& arguments = call.at("arguments");
    if (call.at("name") == "get_weather") {
      ASSERT_EQ(arguments.size(), 1u) << text;
      EXPECT_TRUE(arguments.at("city").is_string()) << text;
    } else {
      ASSERT_EQ(call.at("name"), "get_time") << text;
      ASSERT_EQ(arguments.size(), 1u) << text;
      EXPECT_TRUE(arguments.at("zone") == "UTC" || arguments.at("zone") == "CET") << text;
    }
    // Written as tojson writes it: ", " and ": ", no other whitespace.
    EXPECT_EQ(value.substr(0, 10), R"({"name": ")") << text;
    EXPECT_EQ(call.dump().size() + 2 + arguments.size() * 2, value.size()) << text;
  }
}

TEST_F(TokenGrammarTest, RepeatedTaggedCallsEndAfterAnyWholeCall) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> grammar =
      vocabulary_->CompileTaggedJson(HermesCalls(/*repeated=*/true));
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  const std::string call =
      "<tool_call \"x\">\n"
      R"({"name": "get_time", "arguments": {"zone": "UTC"}})"
      "\n</tool_call>";
  GrammarState state(*grammar);
  TokenMask mask(tokenizer_->vocab_size());
  for (const std::string& part : {call, "\n" + call}) {
    bool first = true;
    for (TokenId token : tokenizer_->Encode(part, false)) {
      state.FillMask(&mask);
      // Stop is allowed only between calls (before the second's separator).
      EXPECT_EQ(mask.Allows(stop_), first && part != call) << part;
      first = false;
      ASSERT_TRUE(state.Accept(token)) << part << " at " << tokenizer_->TokenBytes(token);
    }
    state.FillMask(&mask);
    EXPECT_TRUE(mask.Allows(stop_)) << "after a whole call the answer may end";
  }
  // Text other than the separator does not follow a call; a call must be whole.
  EXPECT_FALSE(state.Accept(tokenizer_->Encode("Sure", false).at(0)));
  ASSERT_TRUE(state.Accept(stop_));
  EXPECT_TRUE(state.terminated());
  // A newline inside the JSON value is refused (no free whitespace).
  GrammarState inside(*grammar);
  for (TokenId token : tokenizer_->Encode("<tool_call \"x\">\n{", false)) {
    ASSERT_TRUE(inside.Accept(token));
  }
  inside.FillMask(&mask);
  EXPECT_FALSE(mask.Allows(tokenizer_->Encode("\n", false).at(0)));
  EXPECT_TRUE(mask.Allows(tokenizer_->Encode("\"", false).at(0)));
}

}  // namespace
}  // namespace tandem::grammar
