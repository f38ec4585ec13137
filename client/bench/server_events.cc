#include "client/bench/server_events.h"

#include "absl/strings/str_cat.h"
#include "common/strings.h"
#include "google/protobuf/util/json_util.h"

namespace tandem::bench {

absl::StatusOr<google::protobuf::Struct> ParseJson(const std::string& text,
                                                   std::string_view server) {
  google::protobuf::Struct value;
  if (auto s = google::protobuf::util::JsonStringToMessage(text, &value); !s.ok()) {
    return absl::InvalidArgumentError(
        tandem::StrCat("unreadable JSON from ", server, ": ", s.ToString()));
  }
  return value;
}

const google::protobuf::Value* Field(const google::protobuf::Struct& object,
                                     const std::string& key) {
  auto it = object.fields().find(key);
  return it == object.fields().end() ? nullptr : &it->second;
}

void ServerEventSplitter::Feed(const char* data, size_t n) {
  pending_.append(data, n);
  size_t end;
  while ((end = pending_.find("\n\n")) != std::string::npos) {
    const std::string event = pending_.substr(0, end);
    pending_.erase(0, end + 2);
    if (event.rfind("data: ", 0) == 0) on_data_(event.substr(6));
  }
}

}  // namespace tandem::bench
