// Bridges std::string_view and Debian's Abseil, whose absl::string_view is its
// own type (BUILD-NOTES, pitfall 6): absl::StrCat and heterogeneous lookups in
// absl hash maps do not accept std::string_view directly.
#ifndef TANDEM_COMMON_STRINGS_H_
#define TANDEM_COMMON_STRINGS_H_

#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tandem {

inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

namespace strings_internal {
inline absl::string_view Adapt(std::string_view s) { return AbslView(s); }
template <typename T>
const T& Adapt(const T& v) {
  return v;
}
}  // namespace strings_internal

// absl::StrCat that also takes std::string_view arguments.
template <typename... Args>
std::string StrCat(const Args&... args) {
  return absl::StrCat(strings_internal::Adapt(args)...);
}

}  // namespace tandem

#endif  // TANDEM_COMMON_STRINGS_H_
