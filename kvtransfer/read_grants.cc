#include "kvtransfer/read_grants.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {
namespace {

// Equal bytes, taking the same time wherever they first differ.
bool SameSecret(const unsigned char* a, const unsigned char* b, size_t n) {
  unsigned char diff = 0;
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::Status RandomBytes(void* out, size_t bytes) {
  auto* to = static_cast<unsigned char*>(out);
  size_t filled = 0;
  while (filled < bytes) {
    const ssize_t n = getrandom(to + filled, bytes - filled, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError("the kernel gave no random bytes");
    }
    filled += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<ReadGrant> ReadGrants::Grant(std::span<const Descriptor> ranges, absl::Time until) {
  if (ranges.empty()) return absl::InvalidArgumentError("GrantReads: no ranges");
  const absl::Time now = absl::Now();
  absl::erase_if(grants_, [now](const auto& entry) { return entry.second.until <= now; });
  Entry entry;
  entry.until = until;
  if (absl::Status s = RandomBytes(entry.secret.data(), entry.secret.size()); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("GrantReads: ", s.message()));
  }
  for (const Descriptor& d : ranges) {
    if (d.bytes > 0) entry.spans.push_back({d.region, d.offset, d.offset + d.bytes});
  }
  std::sort(entry.spans.begin(), entry.spans.end(), [](const Span& a, const Span& b) {
    return a.region != b.region ? a.region < b.region : a.begin < b.begin;
  });
  std::vector<Span> merged;
  for (const Span& s : entry.spans) {
    if (!merged.empty() && merged.back().region == s.region && s.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, s.end);
    } else {
      merged.push_back(s);
    }
  }
  entry.spans = std::move(merged);
  const GrantId id = next_++;
  ReadGrant grant;
  grant.id = id;
  grant.token.resize(kTokenBytes);
  std::memcpy(grant.token.data(), &id, sizeof(id));
  std::memcpy(grant.token.data() + sizeof(id), entry.secret.data(), entry.secret.size());
  grants_.emplace(id, std::move(entry));
  return grant;
}

absl::Status ReadGrants::Check(std::string_view token, std::span<const Descriptor> reads,
                               absl::Time now) const {
  if (token.size() != kTokenBytes) {
    return absl::PermissionDeniedError("the read presents no valid grant");
  }
  GrantId id = 0;
  std::memcpy(&id, token.data(), sizeof(id));
  auto found = grants_.find(id);
  if (found == grants_.end() ||
      !SameSecret(reinterpret_cast<const unsigned char*>(token.data()) + sizeof(id),
                  found->second.secret.data(), found->second.secret.size())) {
    return absl::PermissionDeniedError("the read's grant is unknown or was revoked");
  }
  const Entry& entry = found->second;
  if (now >= entry.until) return absl::PermissionDeniedError("the read's grant has expired");
  for (size_t i = 0; i < reads.size(); ++i) {
    const Descriptor& r = reads[i];
    if (r.bytes == 0) continue;
    // The last span starting at or before the read's first byte.
    auto after = std::upper_bound(
        entry.spans.begin(), entry.spans.end(), r, [](const Descriptor& d, const Span& s) {
          return d.region != s.region ? d.region < s.region : d.offset < s.begin;
        });
    const bool covered = after != entry.spans.begin() && (after - 1)->region == r.region &&
                         r.offset < (after - 1)->end && r.bytes <= (after - 1)->end - r.offset;
    if (!covered) {
      return absl::PermissionDeniedError(absl::StrCat("range ", i, " (region ", r.region,
                                                      ", bytes ", r.offset, "..",
                                                      r.offset + r.bytes, ") was not granted"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
