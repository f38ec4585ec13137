// Log set-up and the one line logged per finished request.
//
// --log_format=text: spdlog's usual lines. --log_format=json: one JSON object
// per line ({"time", "level", then either "msg" or, for request lines, the
// request's fields}), printed by protobuf's JSON printer, for log pipelines.
#ifndef TANDEM_SERVER_LOGGING_H_
#define TANDEM_SERVER_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "scheduler/request.h"

namespace tandem::server {

// Installs the stderr logger in the given format ("text" or "json").
absl::Status ConfigureLogging(const std::string& format);

// The line for a finished request: key=value pairs, or a JSON object when
// the logger is in JSON mode.
std::string RequestFinishedLine(const std::string& request_id, int32_t prompt_tokens,
                                const scheduler::FinishInfo& info);

// One JSON log line (no newline): {"time", "level", then the payload's
// members when it is a JSON object (a request line), else "msg"}, printed by
// protobuf's JSON printer (google.protobuf.Struct), so it parses whatever
// the payload holds; invalid UTF-8 becomes U+FFFD.
std::string JsonLogLine(std::string_view level, absl::Time time, std::string_view payload);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_LOGGING_H_
