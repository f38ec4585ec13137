// JSON log lines: whatever a message holds, the line is one JSON object that a
// JSON parser (protobuf's, here) reads back with the same text.
#include "server/logging.h"

#include <gtest/gtest.h>

#include <string>

#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::server {
namespace {

google::protobuf::Struct Parse(const std::string& line) {
  google::protobuf::Struct out;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &out).ok()) << line;
  return out;
}

const absl::Time kTime = absl::FromUnixMillis(1764547200123);  // 2025-12-01T00:00:00.123Z

TEST(JsonLogLineTest, AnyMessageIsOneParsableObjectWithItsTextIntact) {
  const std::string nasty =
      "quotes \" and \\ backslashes, a\nnewline, a\ttab, \x01 control, \xe2\x82\xac euro";
  const std::string line = JsonLogLine("info", kTime, nasty);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  const google::protobuf::Struct parsed = Parse(line);
  EXPECT_EQ(parsed.fields().at("msg").string_value(), nasty);
  EXPECT_EQ(parsed.fields().at("level").string_value(), "info");
  EXPECT_EQ(parsed.fields().at("time").string_value(), "2025-12-01T00:00:00.123Z");
}

TEST(JsonLogLineTest, InvalidUtf8BecomesReplacementCharacters) {
  const std::string line = JsonLogLine("warning", kTime, "bad \xff\xfe bytes \xe2\x82");
  const google::protobuf::Struct parsed = Parse(line);
  EXPECT_EQ(parsed.fields().at("msg").string_value(),
            "bad \xef\xbf\xbd\xef\xbf\xbd bytes \xef\xbf\xbd\xef\xbf\xbd");
}

TEST(JsonLogLineTest, AJsonObjectPayloadBecomesMembersButCannotOverrideTimeOrLevel) {
  const std::string line = JsonLogLine(
      "info", kTime, R"({"event":"request_finished","completion_tokens":3,"level":"forged"})");
  const google::protobuf::Struct parsed = Parse(line);
  EXPECT_EQ(parsed.fields().at("event").string_value(), "request_finished");
  EXPECT_EQ(parsed.fields().at("completion_tokens").number_value(), 3);
  EXPECT_EQ(parsed.fields().at("level").string_value(), "info");
  EXPECT_FALSE(parsed.fields().contains("msg"));
  // Something that only looks like an object stays text.
  const google::protobuf::Struct text = Parse(JsonLogLine("info", kTime, "{not json}"));
  EXPECT_EQ(text.fields().at("msg").string_value(), "{not json}");
}

}  // namespace
}  // namespace tandem::server
