#include "server/logging.h"

#include <atomic>
#include <memory>

#include "absl/time/time.h"
#include "engine/tokenizer/incremental_detokenizer.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "server/response_stream.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

std::atomic<bool> g_json{false};

// "%*": the whole line, built by JsonLogLine (the pattern is just "%*").
class JsonLineFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const spdlog::string_view_t level = spdlog::level::to_string_view(msg.level);
    const std::string line =
        JsonLogLine(std::string_view(level.data(), level.size()), absl::FromChrono(msg.time),
                    std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonLineFlag>();
  }
};

// `text` with every invalid UTF-8 byte replaced by U+FFFD (JSON strings,
// and protobuf's, are Unicode).
std::string ValidUtf8(std::string_view text) { return tokenizer::SanitizeUtf8(text); }

std::string PrintJson(const google::protobuf::Struct& fields) {
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(fields, &out).ok()) {
    return R"({"level":"error","msg":"a log line could not be printed as JSON"})";
  }
  return out;
}

}  // namespace

std::string JsonLogLine(std::string_view level, absl::Time time, std::string_view payload) {
  google::protobuf::Struct line;
  auto& fields = *line.mutable_fields();
  fields["time"].set_string_value(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()));
  fields["level"].set_string_value(std::string(level));
  google::protobuf::Struct object;
  if (!payload.empty() && payload.front() == '{' &&
      google::protobuf::util::JsonStringToMessage(payload, &object).ok()) {
    for (auto& [key, value] : *object.mutable_fields()) {
      if (key != "time" && key != "level") fields[key] = std::move(value);
    }
  } else {
    fields["msg"].set_string_value(ValidUtf8(payload));
  }
  return PrintJson(line);
}

absl::Status ConfigureLogging(const std::string& format) {
  auto logger = spdlog::stderr_color_mt("tandemd");
  if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonLineFlag>('*').set_pattern("%*");
    logger->set_formatter(std::move(formatter));
    g_json = true;
  } else if (format != "text") {
    return absl::InvalidArgumentError("--log_format must be text or json");
  }
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

std::string RequestFinishedLine(const std::string& request_id, int32_t prompt_tokens,
                                const scheduler::FinishInfo& info) {
  const v1::Timeline t = TimelineToProto(info.timeline);
  const std::string error = info.error.ok() ? "" : info.error.ToString();
  if (g_json) {
    google::protobuf::Struct line;
    auto& f = *line.mutable_fields();
    f["event"].set_string_value("request_finished");
    f["request_id"].set_string_value(ValidUtf8(request_id));
    f["finish_reason"].set_string_value(std::string(scheduler::FinishReasonName(info.reason)));
    f["path"].set_string_value(std::string(scheduler::PathName(info.path)));
    f["path_reason"].set_string_value(std::string(scheduler::PathReasonName(info.path_reason)));
    f["prompt_tokens"].set_number_value(prompt_tokens);
    f["cached_prompt_tokens"].set_number_value(info.usage.cached_prompt_tokens);
    f["completion_tokens"].set_number_value(info.usage.completion_tokens);
    f["drafted_tokens"].set_number_value(info.usage.drafted_tokens);
    f["accepted_tokens"].set_number_value(info.usage.accepted_tokens);
    f["queued_ms"].set_number_value(t.queued_ms());
    f["prefill_ms"].set_number_value(t.prefill_ms());
    f["first_token_ms"].set_number_value(t.first_token_ms());
    f["handoff_ms"].set_number_value(t.handoff_ms());
    f["decode_ms"].set_number_value(t.decode_ms());
    f["total_ms"].set_number_value(t.total_ms());
    if (!error.empty()) f["error"].set_string_value(ValidUtf8(error));
    return PrintJson(line);
  }
  return fmt::format(
      "request {} finished: reason={} path={} path_reason={} prompt_tokens={} "
      "cached_prompt_tokens={} completion_tokens={} drafted_tokens={} accepted_tokens={} "
      "queued_ms={:.1f} prefill_ms={:.1f} first_token_ms={:.1f} handoff_ms={:.1f} "
      "decode_ms={:.1f} total_ms={:.1f}{}",
      request_id, scheduler::FinishReasonName(info.reason), scheduler::PathName(info.path),
      scheduler::PathReasonName(info.path_reason), prompt_tokens, info.usage.cached_prompt_tokens,
      info.usage.completion_tokens, info.usage.drafted_tokens, info.usage.accepted_tokens,
      t.queued_ms(), t.prefill_ms(), t.first_token_ms(), t.handoff_ms(), t.decode_ms(),
      t.total_ms(), error.empty() ? "" : " error=" + error);
}

}  // namespace tandem::server
