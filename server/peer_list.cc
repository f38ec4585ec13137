#include "server/peer_list.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/strings.h"

namespace tandem::server {

bool SplitHostPort(const std::string& entry, std::string* host, std::string* port) {
  const size_t colon = entry.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == entry.size()) return false;
  *host = entry.substr(0, colon);
  *port = entry.substr(colon + 1);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  int value = 0;
  return absl::SimpleAtoi(AbslView(*port), &value) && value > 0 && value < 65536;
}

absl::StatusOr<std::vector<std::string>> ParsePeerList(const std::string& flag) {
  std::vector<std::string> peers;
  for (absl::string_view part : absl::StrSplit(AbslView(flag), ',', absl::SkipWhitespace())) {
    std::string entry(absl::StripAsciiWhitespace(part));
    if (absl::StartsWith(entry, "dns:///")) entry = entry.substr(7);
    std::string host, port;
    if (!SplitHostPort(entry, &host, &port)) {
      return absl::InvalidArgumentError(
          StrCat("--decode_peers: '", entry, "' is not host:port (a name or an address)"));
    }
    peers.push_back(entry);
  }
  if (peers.empty()) return absl::InvalidArgumentError("--decode_peers: no peer given");
  return peers;
}

}  // namespace tandem::server
