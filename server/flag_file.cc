#include "server/flag_file.h"

#include <fstream>
#include <sstream>

#include "common/strings.h"

namespace tandem::server {

absl::StatusOr<std::string> ReadFlagFile(const std::string& path, std::string_view flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(StrCat(flag, ": cannot read '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace tandem::server
