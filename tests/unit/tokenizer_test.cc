// Tokenizer pieces that need no model file: pre-tokenizer rules, UTF-8
// helpers, the incremental detokenizer and stop strings. The full tokenizer
// is checked against Hugging Face's on the real vocabulary in
// tests/reference/test_tokenizer.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/pretokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/wordpiece.h"
#include "server/stop_strings.h"

namespace tandem::tokenizer {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Pieces(PretokenizerKind kind, std::string_view text) {
  std::vector<std::string> out;
  for (std::string_view p : Pretokenize(kind, text)) out.emplace_back(p);
  return out;
}

TEST(PretokenizerTest, Gpt2SplitsWordsNumbersPunctuationAndSpaces) {
  EXPECT_THAT(Pieces(PretokenizerKind::kGpt2, "Hello world, it's 2024!"),
              ElementsAre("Hello", " world", ",", " it", "'s", " 2024", "!"));
  // A run of spaces leaves its last space to the following word.
  EXPECT_THAT(Pieces(PretokenizerKind::kGpt2, "a   b"), ElementsAre("a", "  ", " b"));
  EXPECT_THAT(Pieces(PretokenizerKind::kGpt2, "x\n\ny"), ElementsAre("x", "\n", "\n", "y"));
  EXPECT_THAT(Pieces(PretokenizerKind::kGpt2, "end  "), ElementsAre("end", "  "));
}

TEST(PretokenizerTest, SmolLmIsolatesEveryDigit) {
  EXPECT_THAT(Pieces(PretokenizerKind::kDigitsThenGpt2, "in 2024 x"),
              ElementsAre("in", " ", "2", "0", "2", "4", " x"));
}

TEST(PretokenizerTest, Llama3GroupsDigitsByThreeAndKeepsNewlines) {
  EXPECT_THAT(Pieces(PretokenizerKind::kLlama3, "12345 I'M ok\n\n  next"),
              ElementsAre("123", "45", " I", "'M", " ok", "\n\n", " ", " next"));
  EXPECT_THAT(Pieces(PretokenizerKind::kQwen2, "123"), ElementsAre("1", "2", "3"));
}

TEST(PretokenizerTest, Qwen35JoinsMarksToLetters) {
  // U+0301 COMBINING ACUTE ACCENT is \p{M}: a letter's companion in Qwen3.5,
  // punctuation-like in Qwen2.
  EXPECT_THAT(Pieces(PretokenizerKind::kQwen35, "e\u0301t\u00e9"), ElementsAre("e\u0301t\u00e9"));
  EXPECT_THAT(Pieces(PretokenizerKind::kQwen2, "e\u0301t\u00e9"),
              ElementsAre("e", "\u0301t\u00e9"));
}

TEST(PretokenizerTest, FalconSplitsPunctuationFirstAndDigitsByThree) {
  // [\p{P}$+<=>^~|`]+ first, so "+=" is a piece before GPT-2 splits the
  // rest; then runs of three ASCII digits leave the space on its own.
  EXPECT_THAT(Pieces(PretokenizerKind::kFalcon, "a+=b 12345"),
              ElementsAre("a", "+=", "b", " ", "123", "45"));
  EXPECT_THAT(Pieces(PretokenizerKind::kFalcon, "12345"), ElementsAre("123", "45"));
}

TEST(PretokenizerTest, DeepseekSplitsNewlinesScriptsAndNumbers) {
  EXPECT_THAT(Pieces(PretokenizerKind::kDeepseekLlm, "Hi 東京\n12 ok.  "),
              ElementsAre("Hi", " ", "東京", "\n", "12", " ok", ".", "  "));
  EXPECT_THAT(Pieces(PretokenizerKind::kDeepseekCoder, "x=12\n"),
              ElementsAre("x", "=", "1", "2", "\n"));
}

TEST(PretokenizerTest, PiecesAlwaysConcatenateToTheInput) {
  const std::string text = "naïve café — 東京 🙂\t\tx\r\n  ,,, \xff\xfe end 12345\n ";
  for (auto kind :
       {PretokenizerKind::kGpt2, PretokenizerKind::kDigitsThenGpt2, PretokenizerKind::kLlama3,
        PretokenizerKind::kQwen2, PretokenizerKind::kQwen35, PretokenizerKind::kFalcon,
        PretokenizerKind::kDeepseekLlm, PretokenizerKind::kDeepseekCoder}) {
    std::string joined;
    for (std::string_view p : Pretokenize(kind, text)) joined += p;
    EXPECT_EQ(joined, text);
  }
}

TEST(PretokenizerTest, UnknownGgufNameIsAnError) {
  auto kind = PretokenizerFromGgufName("mystery");
  EXPECT_FALSE(kind.ok());
  EXPECT_THAT(std::string(kind.status().message()), ::testing::HasSubstr("'mystery'"));
}

TEST(BertWordsTest, NormalizesAndSplitsAsBertsBasicTokenizer) {
  // Accents go through the canonical decomposition, control characters
  // vanish, punctuation and CJK ideographs are words of their own.
  EXPECT_THAT(BertWords("H\u00e9llo, WORLD! \u6771\u4eac a\x01"
                        "b",
                        {}),
              ElementsAre("hello", ",", "world", "!", "\u6771", "\u4eac", "ab"));
  EXPECT_THAT(BertWords("H\u00e9llo, WORLD!", {.lowercase = false, .strip_accents = false}),
              ElementsAre("H\u00e9llo", ",", "WORLD", "!"));
  // A Hangul syllable decomposes into its jamo, which are letters, not marks.
  EXPECT_THAT(BertWords("\ud55c", {}), ElementsAre("\u1112\u1161\u11ab"));
  EXPECT_THAT(BertWords(" \t\n ", {}), ElementsAre());
}

TEST(UnicodeTest, ClassifiesLettersNumbersAndWhitespace) {
  EXPECT_EQ(Classify(U'é'), CharClass::kLetter);
  EXPECT_EQ(Classify(U'東'), CharClass::kLetter);
  EXPECT_EQ(Classify(U'٣'), CharClass::kNumber);  // Arabic-Indic digit three
  EXPECT_EQ(Classify(U'\u3000'), CharClass::kWhitespace);
  EXPECT_EQ(Classify(U'🙂'), CharClass::kOther);
}

TEST(UnicodeTest, CompleteUtf8PrefixHoldsBackAnUnfinishedCharacter) {
  const std::string smile = "\xf0\x9f\x99\x82";  // U+1F642
  EXPECT_EQ(CompleteUtf8Prefix("ab" + smile.substr(0, 1)), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab" + smile.substr(0, 3)), 2u);
  EXPECT_EQ(CompleteUtf8Prefix("ab" + smile), 6u);
  EXPECT_EQ(CompleteUtf8Prefix("ab\xff"), 3u);      // invalid: nothing to wait for
  EXPECT_EQ(CompleteUtf8Prefix("ab\xe0\x41"), 4u);  // broken sequence
}

TEST(UnicodeTest, InvalidBytesDecodeToReplacementCharacters) {
  const std::vector<CodePoint> cps = DecodeUtf8("a\xc3\x28");
  ASSERT_EQ(cps.size(), 3u);
  EXPECT_EQ(cps[1].value, 0xFFFDu);
  EXPECT_EQ(cps[2].value, U'(');
}

TEST(ChatTemplateTest, DetectsFamiliesAndTheDefaultSystemPrompt) {
  const std::string chatml =
      "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nBe kind.<|im_end|>\n' }}"
      "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content']}}";
  auto t = ChatTemplate::Create(chatml, "");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->family(), ChatTemplateFamily::kChatMl);
  EXPECT_EQ(t->default_system_prompt(), "Be kind.");
  const std::vector<ChatMessage> messages = {{"user", "Hi"}};
  EXPECT_EQ(*t->Render(messages),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  auto llama = ChatTemplate::Create("{{ '<|start_header_id|>' + message['role'] }}", "");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ(llama->family(), ChatTemplateFamily::kLlama3);
}

TEST(ChatTemplateTest, UnknownOrMissingTemplatesNeedAnOverride) {
  auto unknown =
      ChatTemplate::Create("{{ bos_token }}{% for m in messages %}[INST]{% endfor %}", "");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(
      std::string(unknown.status().message()),
      ::testing::HasSubstr("pass --chat_template (choices: chatml, llama3, or a FILE.jinja)"));
  auto missing = ChatTemplate::Create(std::nullopt, "");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()),
              ::testing::HasSubstr("no tokenizer.chat_template"));
  auto overridden = ChatTemplate::Create("{{ unknown }}", "llama3");
  ASSERT_TRUE(overridden.ok());
  EXPECT_EQ(overridden->family(), ChatTemplateFamily::kLlama3);
  EXPECT_FALSE(ChatTemplate::Create(std::nullopt, "alpaca").ok());
}

TEST(ChatTemplateTest, RejectsUnknownRolesAndEmptyConversations) {
  auto t = ChatTemplate::Create(std::nullopt, "chatml");
  ASSERT_TRUE(t.ok());
  const std::vector<ChatMessage> bad = {{"user", "a"}, {"tool", "b"}};
  EXPECT_THAT(std::string(t->Validate(bad).message()), ::testing::HasSubstr("messages[1].role"));
  EXPECT_FALSE(t->Validate({}).ok());
}

}  // namespace
}  // namespace tandem::tokenizer

namespace tandem::server {
namespace {

TEST(StopStringMatcherTest, HoldsBackPossiblePrefixesAndCutsAtTheStop) {
  StopStringMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.Push("Hello E"), "Hello ");
  EXPECT_EQ(m.Push("N"), "");
  EXPECT_EQ(m.Push("ough"), "ENough");
  EXPECT_EQ(m.Push(" text\n"), " text");
  EXPECT_EQ(m.Push("\nmore"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.Push("after"), "");
}

TEST(StopStringMatcherTest, FlushReturnsWhatWasHeldWhenNoStopCame) {
  StopStringMatcher m({"STOP"});
  EXPECT_EQ(m.Push("ab ST"), "ab ");
  EXPECT_EQ(m.Flush(), "ST");
  EXPECT_FALSE(m.stopped());
}

TEST(StopStringMatcherTest, EarliestStopWins) {
  StopStringMatcher m({"cd", "b"});
  EXPECT_EQ(m.Push("abcd"), "a");
  EXPECT_TRUE(m.stopped());
}

}  // namespace
}  // namespace tandem::server
