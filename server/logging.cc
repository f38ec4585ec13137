#include "server/logging.h"

#include <atomic>
#include <memory>

#include "server/response_stream.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace tandem::server {
namespace {

std::atomic<bool> g_json{false};

// "%*": the message as JSON members: a message that is already a JSON object
// (a request line) is spliced in; anything else becomes "msg":"...".
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    std::string out;
    if (text.size() >= 2 && text.front() == '{' && text.back() == '}') {
      out = std::string(text.substr(1, text.size() - 2));
    } else {
      out = "\"msg\":" + JsonString(text);
    }
    dest.append(out.data(), out.data() + out.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

std::string JsonString(std::string_view text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
          out += escaped;
        } else {
          out.push_back(static_cast<char>(c));
        }
    }
  }
  return out + "\"";
}

absl::Status ConfigureLogging(const std::string& format) {
  auto logger = spdlog::stderr_color_mt("tandemd");
  if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l",%*})");
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
    return fmt::format(
        R"({{"event":"request_finished","request_id":{},"finish_reason":"{}","path":"{}",)"
        R"("path_reason":"{}","prompt_tokens":{},"cached_prompt_tokens":{},)"
        R"("completion_tokens":{},"drafted_tokens":{},"accepted_tokens":{},)"
        R"("queued_ms":{:.1f},"prefill_ms":{:.1f},"first_token_ms":{:.1f},)"
        R"("handoff_ms":{:.1f},"decode_ms":{:.1f},"total_ms":{:.1f}{}}})",
        JsonString(request_id), scheduler::FinishReasonName(info.reason),
        scheduler::PathName(info.path), scheduler::PathReasonName(info.path_reason), prompt_tokens,
        info.usage.cached_prompt_tokens, info.usage.completion_tokens, info.usage.drafted_tokens,
        info.usage.accepted_tokens, t.queued_ms(), t.prefill_ms(), t.first_token_ms(),
        t.handoff_ms(), t.decode_ms(), t.total_ms(),
        error.empty() ? "" : ",\"error\":" + JsonString(error));
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
