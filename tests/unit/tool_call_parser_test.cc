// Tool calls and reasoning split out of a model's output (server/
// tool_call_parser.h), in each format, fed whole and fed a byte at a time
// (a stream cuts anywhere): the same content, reasoning and calls either way.
#include "server/tool_call_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::server {
namespace {

struct Piece {
  std::string text;
  bool control = false;
};

ParsedOutput Run(ToolCallParser parser, const std::vector<Piece>& pieces, bool byte_by_byte) {
  ParsedOutput all;
  auto add = [&all](ParsedOutput&& out) {
    all.content += out.content;
    all.reasoning += out.reasoning;
    for (ParsedToolCall& c : out.tool_calls) all.tool_calls.push_back(std::move(c));
  };
  for (const Piece& p : pieces) {
    if (p.control) {
      add(parser.PushControl(p.text));
    } else if (byte_by_byte) {
      for (char c : p.text) add(parser.Push(std::string_view(&c, 1)));
    } else {
      add(parser.Push(p.text));
    }
  }
  add(parser.Finish());
  return all;
}

// Runs both ways and checks they agree; returns the result.
ParsedOutput Parse(ToolCallFormat format, const std::vector<Piece>& pieces, bool reasoning = false,
                   bool starts_in_reasoning = false) {
  const ParsedOutput whole =
      Run(ToolCallParser(format, reasoning, starts_in_reasoning), pieces, false);
  const ParsedOutput bytes =
      Run(ToolCallParser(format, reasoning, starts_in_reasoning), pieces, true);
  EXPECT_EQ(whole.content, bytes.content);
  EXPECT_EQ(whole.reasoning, bytes.reasoning);
  EXPECT_EQ(whole.tool_calls.size(), bytes.tool_calls.size());
  for (size_t i = 0; i < std::min(whole.tool_calls.size(), bytes.tool_calls.size()); ++i) {
    EXPECT_EQ(whole.tool_calls[i].name, bytes.tool_calls[i].name);
    EXPECT_EQ(whole.tool_calls[i].arguments, bytes.tool_calls[i].arguments);
  }
  return whole;
}

TEST(ToolCallFormatTest, ChosenFromTheTemplate) {
  EXPECT_EQ(ToolCallFormatOf("{% for t in tools %}<tool_call>{{ t }}</tool_call>"),
            ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOf("{{ '[TOOL_CALLS]' + calls }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOf("<|start_header_id|>ipython{% if tools %}"), ToolCallFormat::kLlama3);
  EXPECT_EQ(ToolCallFormatOf("<|im_start|>{{ m.content }}<|im_end|>"), ToolCallFormat::kNone);
}

TEST(ToolCallParserTest, HermesCallsAfterContent) {
  const ParsedOutput out =
      Parse(ToolCallFormat::kHermes,
            {{"Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
              "\"Paris\", \"unit\": \"c\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\", "
              "\"arguments\": {}}</tool_call>"}});
  EXPECT_EQ(out.content, "Let me check.\n\n");
  ASSERT_EQ(out.tool_calls.size(), 2u);
  EXPECT_EQ(out.tool_calls[0].name, "get_weather");
  EXPECT_EQ(out.tool_calls[0].arguments, R"({"city":"Paris","unit":"c"})");  // key order kept
  EXPECT_EQ(out.tool_calls[1].name, "time");
  EXPECT_EQ(out.tool_calls[1].arguments, "{}");
}

TEST(ToolCallParserTest, HermesWithoutACallIsAllContentEvenWithAngleBrackets) {
  const ParsedOutput out = Parse(ToolCallFormat::kHermes, {{"a <b> and <tool but not a call <"}});
  EXPECT_EQ(out.content, "a <b> and <tool but not a call <");
  EXPECT_TRUE(out.tool_calls.empty());
}

TEST(ToolCallParserTest, AMalformedCallIsGivenBackAsContent) {
  const ParsedOutput out =
      Parse(ToolCallFormat::kHermes, {{"x<tool_call>{\"name\": oops}</tool_call>y"}});
  EXPECT_EQ(out.content, "x<tool_call>{\"name\": oops}</tool_call>y");
  EXPECT_TRUE(out.tool_calls.empty());
  // Cut off before its closing tag (the length limit): parsed if it is whole.
  const ParsedOutput cut =
      Parse(ToolCallFormat::kHermes, {{"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}"}});
  ASSERT_EQ(cut.tool_calls.size(), 1u);
  EXPECT_EQ(cut.tool_calls[0].arguments, R"({"a":1})");
}

TEST(ToolCallParserTest, ReasoningIsSplitOff) {
  const ParsedOutput out =
      Parse(ToolCallFormat::kHermes,
            {{"<think>\nThe user wants weather.\n</think>\n\n<tool_call>{\"name\": \"w\", "
              "\"arguments\": {}}</tool_call>"}},
            /*reasoning=*/true);
  EXPECT_EQ(out.reasoning, "\nThe user wants weather.\n");
  EXPECT_EQ(out.content, "\n\n");
  ASSERT_EQ(out.tool_calls.size(), 1u);
  // A template that opened <think> itself: the answer starts inside it.
  const ParsedOutput opened = Parse(ToolCallFormat::kNone, {{"hmm</think>Paris."}}, true, true);
  EXPECT_EQ(opened.reasoning, "hmm");
  EXPECT_EQ(opened.content, "Paris.");
  // Without the option, <think> is content.
  EXPECT_EQ(Parse(ToolCallFormat::kNone, {{"<think>x</think>y"}}).content, "<think>x</think>y");
}

TEST(ToolCallParserTest, MistralBothForms) {
  const ParsedOutput list = Parse(
      ToolCallFormat::kMistral,
      {{"Sure. "},
       {"[TOOL_CALLS]", true},
       {"[{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", \"arguments\": {}}]"}});
  EXPECT_EQ(list.content, "Sure. ");
  ASSERT_EQ(list.tool_calls.size(), 2u);
  EXPECT_EQ(list.tool_calls[1].name, "b");
  const ParsedOutput args =
      Parse(ToolCallFormat::kMistral, {{"[TOOL_CALLS]", true},
                                       {"get_weather[ARGS]{\"city\": \"Paris\"}"},
                                       {"[TOOL_CALLS]", true},
                                       {"time[ARGS]{}"}});
  ASSERT_EQ(args.tool_calls.size(), 2u);
  EXPECT_EQ(args.tool_calls[0].name, "get_weather");
  EXPECT_EQ(args.tool_calls[0].arguments, R"({"city":"Paris"})");
  EXPECT_EQ(args.tool_calls[1].name, "time");
  EXPECT_EQ(args.content, "");
}

TEST(ToolCallParserTest, Llama3JsonAnswersAndPythonTag) {
  const ParsedOutput call =
      Parse(ToolCallFormat::kLlama3,
            {{"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}"}});
  ASSERT_EQ(call.tool_calls.size(), 1u);
  EXPECT_EQ(call.tool_calls[0].arguments, R"({"city":"Oslo"})");
  EXPECT_EQ(call.content, "");
  // An answer that does not open with a call is content, braces and all.
  const ParsedOutput text = Parse(ToolCallFormat::kLlama3, {{"It is {sunny}."}});
  EXPECT_EQ(text.content, "It is {sunny}.");
  EXPECT_TRUE(text.tool_calls.empty());
  // A JSON answer that is not a call stays content.
  EXPECT_EQ(Parse(ToolCallFormat::kLlama3, {{"{\"answer\": 4}"}}).content, "{\"answer\": 4}");
  const ParsedOutput tagged =
      Parse(ToolCallFormat::kLlama3,
            {{"ok "}, {"<|python_tag|>", true}, {"{\"name\": \"f\", \"parameters\": {}}"}});
  EXPECT_EQ(tagged.content, "ok ");
  ASSERT_EQ(tagged.tool_calls.size(), 1u);
  EXPECT_EQ(tagged.tool_calls[0].name, "f");
}

TEST(ToolCallParserTest, OtherControlTokensAreIgnored) {
  const ParsedOutput out = Parse(ToolCallFormat::kHermes, {{"a"}, {"<|im_end|>", true}, {"b"}});
  EXPECT_EQ(out.content, "ab");
}

}  // namespace
}  // namespace tandem::server
