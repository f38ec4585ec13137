#include "client/http.h"

#include <curl/curl.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace tandem::client {

absl::Status HttpTransfer(const std::string& url, const std::string* json_body, double timeout_s,
                          const std::function<void(const char*, size_t)>& on_data, long* http_code,
                          const std::vector<std::pair<std::string, std::string>>& headers) {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  *http_code = 0;
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  using Callback = std::function<void(const char*, size_t)>;
  auto write = +[](char* data, size_t size, size_t count, void* user) -> size_t {
    (*static_cast<const Callback*>(user))(data, size * count);
    return size * count;
  };
  // curl_slist_append returns null, leaving the list as it was, when it
  // cannot allocate.
  curl_slist* header_list = nullptr;
  auto add_header = [&header_list](const std::string& line) {
    curl_slist* longer = curl_slist_append(header_list, line.c_str());
    if (longer == nullptr) return false;
    header_list = longer;
    return true;
  };
  bool headers_ok = true;
  for (const auto& [name, value] : headers) {
    headers_ok = headers_ok && add_header(absl::StrCat(name, ": ", value));
  }
  if (json_body != nullptr) headers_ok = headers_ok && add_header("Content-Type: application/json");
  if (!headers_ok) {
    curl_slist_free_all(header_list);
    curl_easy_cleanup(curl);
    return absl::ResourceExhaustedError(absl::StrCat(url, ": out of memory for the headers"));
  }
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  if (json_body != nullptr) {
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, json_body->c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(json_body->size()));
  }
  if (header_list != nullptr) curl_easy_setopt(curl, CURLOPT_HTTPHEADER, header_list);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, write);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &on_data);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_s * 1000));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  const CURLcode code = curl_easy_perform(curl);
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, http_code);
  curl_slist_free_all(header_list);
  curl_easy_cleanup(curl);
  if (code != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(url, ": ", curl_easy_strerror(code)));
  }
  return absl::OkStatus();
}

}  // namespace tandem::client
