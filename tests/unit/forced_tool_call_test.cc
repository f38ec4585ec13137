// Forced tool calls (server/forced_tool_call.h) end to end on the default
// model's real vocabulary: uniform random walks through the grammar of a
// forced call are read back by the tool-call parser of the same format as
// calls to an offered tool whose arguments meet its schema (checked with
// nlohmann-json), and every refusal names its field.
#include "server/forced_tool_call.h"

#include <string>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/grammar_walk.h"

namespace tandem::server {
namespace {

using nlohmann::json;

google::protobuf::RepeatedPtrField<v1::Tool> WeatherAndTime() {
  google::protobuf::RepeatedPtrField<v1::Tool> tools;
  v1::Tool* weather = tools.Add();
  weather->set_name("get_weather");
  // "unit" before "city": the call must keep the schema's order.
  weather->set_parameters(
      R"({"type": "object", "properties": {"unit": {"enum": ["C", "F"]},)"
      R"( "city": {"type": "string", "maxLength": 12}}, "required": ["unit", "city"],)"
      R"( "additionalProperties": false})");
  v1::Tool* time = tools.Add();
  time->set_name("get_time");  // an optional argument
  time->set_parameters(R"({"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}},)"
                       R"( "additionalProperties": false})");
  return tools;
}

// The calls a parser of `format` reads out of `text` (content must be empty).
std::vector<ParsedToolCall> ParseCalls(ToolCallFormat format, const std::string& text) {
  ToolCallParser parser(format, /*reasoning=*/false);
  ParsedOutput first = parser.Push(text);
  ParsedOutput rest = parser.Finish();
  EXPECT_EQ(first.content + rest.content, "") << text;
  for (ParsedToolCall& call : rest.tool_calls) first.tool_calls.push_back(std::move(call));
  return first.tool_calls;
}

void ExpectValidArguments(const ParsedToolCall& call, const std::string& text) {
  const json arguments = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(arguments.is_object()) << text;
  if (call.name == "get_weather") {
    ASSERT_EQ(arguments.size(), 2u) << text;
    EXPECT_TRUE(arguments.at("unit") == "C" || arguments.at("unit") == "F") << text;
    EXPECT_TRUE(arguments.at("city").is_string()) << text;
    EXPECT_LT(text.find("\"unit\""), text.find("\"city\"")) << text;
  } else {
    ASSERT_EQ(call.name, "get_time") << text;
    ASSERT_LE(arguments.size(), 1u) << text;
    if (!arguments.empty()) {
      EXPECT_TRUE(arguments.at("zone") == "UTC" || arguments.at("zone") == "CET") << text;
    }
  }
}

class ForcedToolCallTest : public testing::GrammarVocabularyTest {};

TEST_F(ForcedToolCallTest, HermesCallsAreWrittenAsTheTemplateTeaches) {
  absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> calls =
      ForcedToolCalls(ToolCallFormat::kHermes, WeatherAndTime(), "required", /*parallel=*/true);
  ASSERT_TRUE(calls.ok()) << calls.status();
  EXPECT_EQ(calls->open, "<tool_call>\n");
  EXPECT_EQ(calls->close, "\n</tool_call>");
  EXPECT_EQ(calls->separator, "\n");
  EXPECT_TRUE(calls->repeated);
  EXPECT_FALSE(
      ForcedToolCalls(ToolCallFormat::kHermes, WeatherAndTime(), "required", false)->repeated);
  // Each tool is one choice: the name a constant, the arguments its schema
  // (any object for a tool without parameters), nothing else.
  google::protobuf::RepeatedPtrField<v1::Tool> plain;
  plain.Add()->set_name("ping");
  EXPECT_EQ(ForcedToolCalls(ToolCallFormat::kHermes, plain, "ping", false)->schema,
            R"({"type":"object","properties":{"name":{"const":"ping"},"arguments":)"
            R"({"type":"object"}},"required":["name","arguments"],"additionalProperties":false})");
}

TEST_F(ForcedToolCallTest, RequiredHermesAnswersAreOneCallToAnOfferedTool) {
  absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> calls =
      ForcedToolCalls(ToolCallFormat::kHermes, WeatherAndTime(), "required", /*parallel=*/false);
  ASSERT_TRUE(calls.ok()) << calls.status();
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      vocabulary_->CompileTaggedJson(*calls);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  bool weather = false, time = false;
  for (uint32_t seed = 0; seed < 40; ++seed) {
    const std::string text = RandomAnswer(*grammar, seed, 400);
    const std::vector<ParsedToolCall> parsed = ParseCalls(ToolCallFormat::kHermes, text);
    ASSERT_EQ(parsed.size(), 1u) << "seed " << seed << ": " << text;
    ExpectValidArguments(parsed[0], text);
    weather |= parsed[0].name == "get_weather";
    time |= parsed[0].name == "get_time";
  }
  EXPECT_TRUE(weather && time) << "both tools are reachable";
}

TEST_F(ForcedToolCallTest, ANamedToolIsTheOnlyOneCalled) {
  absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> calls =
      ForcedToolCalls(ToolCallFormat::kHermes, WeatherAndTime(), "get_weather", false);
  ASSERT_TRUE(calls.ok()) << calls.status();
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      vocabulary_->CompileTaggedJson(*calls);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::string text = RandomAnswer(*grammar, seed, 200);
    const std::vector<ParsedToolCall> parsed = ParseCalls(ToolCallFormat::kHermes, text);
    ASSERT_EQ(parsed.size(), 1u) << text;
    EXPECT_EQ(parsed[0].name, "get_weather");
    ExpectValidArguments(parsed[0], text);
  }
}

TEST_F(ForcedToolCallTest, Llama3AnswersAreOneJsonCallWithParameters) {
  absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> calls =
      ForcedToolCalls(ToolCallFormat::kLlama3, WeatherAndTime(), "get_weather", true);
  ASSERT_TRUE(calls.ok()) << calls.status();
  EXPECT_EQ(calls->open, "");
  EXPECT_FALSE(calls->repeated);  // Llama 3's answer is one call
  absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> grammar =
      vocabulary_->CompileTaggedJson(*calls);
  ASSERT_TRUE(grammar.ok()) << grammar.status();
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::string text = RandomAnswer(*grammar, seed, 200);
    EXPECT_EQ(text.substr(0, 36), R"({"name": "get_weather", "parameters")") << text;
    const std::vector<ParsedToolCall> parsed = ParseCalls(ToolCallFormat::kLlama3, text);
    ASSERT_EQ(parsed.size(), 1u) << text;
    EXPECT_EQ(parsed[0].name, "get_weather");
    ExpectValidArguments(parsed[0], text);
  }
}

TEST_F(ForcedToolCallTest, RefusalsNameTheirField) {
  auto message = [](ToolCallFormat format, const google::protobuf::RepeatedPtrField<v1::Tool>& t,
                    std::string_view choice) {
    absl::StatusOr<grammar::GrammarVocabulary::TaggedJson> calls =
        ForcedToolCalls(format, t, choice, true);
    EXPECT_FALSE(calls.ok());
    EXPECT_EQ(calls.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(calls.status().message());
  };
  EXPECT_EQ(message(ToolCallFormat::kHermes, WeatherAndTime(), "get_news"),
            "tool_choice: no tool named 'get_news' among tools");
  EXPECT_EQ(
      message(ToolCallFormat::kMistral, WeatherAndTime(), "required").rfind("tool_choice: ", 0),
      0u);
  EXPECT_NE(message(ToolCallFormat::kNone, WeatherAndTime(), "required").find("teaches none"),
            std::string::npos);
  google::protobuf::RepeatedPtrField<v1::Tool> bad = WeatherAndTime();
  bad[1].set_parameters("[1, 2]");
  EXPECT_EQ(message(ToolCallFormat::kHermes, bad, "required"),
            "tools[1].function.parameters: not a JSON object");
}

}  // namespace
}  // namespace tandem::server
