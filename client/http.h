// One HTTP request through libcurl, its body handed over as it arrives (for
// metrics pages and llama-server's streamed completions).
#ifndef TANDEM_CLIENT_HTTP_H_
#define TANDEM_CLIENT_HTTP_H_

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tandem::client {

// GET `url`, or POST `json_body` as application/json when it is not null,
// with `headers` (name, value) besides. `on_data` receives the response body
// in pieces; `http_code` the status (0 when none came). An error only when
// the transfer itself failed.
absl::Status HttpTransfer(const std::string& url, const std::string* json_body, double timeout_s,
                          const std::function<void(const char*, size_t)>& on_data, long* http_code,
                          const std::vector<std::pair<std::string, std::string>>& headers = {});

}  // namespace tandem::client

#endif  // TANDEM_CLIENT_HTTP_H_
