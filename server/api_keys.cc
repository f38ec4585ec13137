#include "server/api_keys.h"

#include <sstream>

#include "absl/strings/ascii.h"
#include "common/strings.h"
#include "server/flag_file.h"

namespace tandem::server {
namespace {

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]);
  }
  return diff == 0;
}

constexpr std::string_view kHealthService = "/grpc.health.v1.Health/";

}  // namespace

absl::Status ApiKeys::Check(std::string_view method_path,
                            std::optional<std::string_view> authorization) const {
  if (method_path.substr(0, kHealthService.size()) == kHealthService) return absl::OkStatus();
  if (!authorization.has_value()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <key>' metadata");
  }
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization->substr(0, kBearer.size()) != kBearer) {
    return absl::UnauthenticatedError("the authorization metadata is not a bearer token");
  }
  const std::string_view key = authorization->substr(kBearer.size());
  bool valid = false;
  for (const std::string& k : keys_) valid |= ConstantTimeEquals(key, k);
  if (!valid) return absl::UnauthenticatedError("invalid API key");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ReadApiKeys(const std::string& path) {
  absl::StatusOr<std::string> text = ReadFlagFile(path, "--api_keys_file");
  if (!text.ok()) return text.status();
  std::vector<std::string> keys;
  std::istringstream lines(*text);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string key(absl::StripAsciiWhitespace(AbslView(line)));
    if (key.empty() || key[0] == '#') continue;
    keys.push_back(key);
  }
  if (keys.empty()) {
    return absl::InvalidArgumentError(StrCat("--api_keys_file: '", path, "' holds no keys"));
  }
  return keys;
}

}  // namespace tandem::server
