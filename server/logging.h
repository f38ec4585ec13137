// Log set-up and the one line logged per finished request.
//
// --log_format=text: spdlog's usual lines. --log_format=json: one JSON object
// per line ({"time", "level", then either "msg" or, for request lines, the
// request's fields}), for log pipelines.
#ifndef TANDEM_SERVER_LOGGING_H_
#define TANDEM_SERVER_LOGGING_H_

#include <string>

#include "absl/status/status.h"
#include "scheduler/request.h"

namespace tandem::server {

// Installs the stderr logger in the given format ("text" or "json").
absl::Status ConfigureLogging(const std::string& format);

// The line for a finished request: key=value pairs, or a JSON object when
// the logger is in JSON mode.
std::string RequestFinishedLine(const std::string& request_id, int32_t prompt_tokens,
                                const scheduler::FinishInfo& info);

// `text` as a JSON string literal (quotes included).
std::string JsonString(std::string_view text);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_LOGGING_H_
