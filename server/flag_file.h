// Reading the files that flags name (--api_keys_file, --tls_cert, ...).
#ifndef TANDEM_SERVER_FLAG_FILE_H_
#define TANDEM_SERVER_FLAG_FILE_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tandem::server {

// The whole file at `path`; INVALID_ARGUMENT "<flag>: cannot read '<path>'"
// when it cannot be read.
absl::StatusOr<std::string> ReadFlagFile(const std::string& path, std::string_view flag);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_FLAG_FILE_H_
