// Decode peers as --decode_peers names them: host:port entries.
#ifndef TANDEM_SERVER_PEER_LIST_H_
#define TANDEM_SERVER_PEER_LIST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem::server {

// Splits --decode_peers ("a:1,b:2"; a "dns:///" prefix is dropped) into
// host:port entries; errors name the bad entry.
absl::StatusOr<std::vector<std::string>> ParsePeerList(const std::string& flag);

// The host and port of "host:port" or "[v6]:port" (brackets removed); false
// unless the port is a number in 1..65535.
bool SplitHostPort(const std::string& entry, std::string* host, std::string* port);

}  // namespace tandem::server

#endif  // TANDEM_SERVER_PEER_LIST_H_
