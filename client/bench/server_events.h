// What the HTTP targets (llama-server, any OpenAI-compatible server) share:
// reading a JSON body into a protobuf Struct and splitting a server-sent
// event stream into its `data:` payloads.
#ifndef TANDEM_CLIENT_BENCH_SERVER_EVENTS_H_
#define TANDEM_CLIENT_BENCH_SERVER_EVENTS_H_

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "google/protobuf/struct.pb.h"

namespace tandem::bench {

// `text` as a JSON object; an error naming `server` when it is not one.
absl::StatusOr<google::protobuf::Struct> ParseJson(const std::string& text,
                                                   std::string_view server);

// The field `key` of `object`, or null when it has none.
const google::protobuf::Value* Field(const google::protobuf::Struct& object,
                                     const std::string& key);

// Splits a text/event-stream body, handed over in arbitrary pieces, into
// events (separated by a blank line) and passes each `data: ` payload on.
class ServerEventSplitter {
 public:
  explicit ServerEventSplitter(std::function<void(const std::string&)> on_data)
      : on_data_(std::move(on_data)) {}

  void Feed(const char* data, size_t n);
  // What has not formed a whole event yet: after the transfer, an error
  // body that was not an event stream.
  const std::string& pending() const { return pending_; }

 private:
  std::function<void(const std::string&)> on_data_;
  std::string pending_;
};

}  // namespace tandem::bench

#endif  // TANDEM_CLIENT_BENCH_SERVER_EVENTS_H_
