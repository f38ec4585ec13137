// Finds stop strings in streamed text. Text that might be the start of a stop
// string is held back until it is known not to be, so the client never sees
// any part of a stop string.
#ifndef TANDEM_SERVER_STOP_STRINGS_H_
#define TANDEM_SERVER_STOP_STRINGS_H_

#include <string>
#include <string_view>
#include <vector>

namespace tandem::server {

class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  // Adds generated text; returns the text that can be shown now. After a
  // stop string is found, stopped() is true, the returned text ends right
  // before it, and further calls return nothing.
  std::string Push(std::string_view text);
  // The text still held back, at the end of a stream that did not stop.
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tandem::server

#endif  // TANDEM_SERVER_STOP_STRINGS_H_
