#include "kvtransfer/agent_metadata.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tandem::kvtransfer {
namespace {

// "TKV" and a format version.
constexpr char kMagic[4] = {'T', 'K', 'V', '1'};
// Bounds that no real agent comes near, so a corrupt count cannot make the
// decoder allocate without limit.
constexpr uint64_t kMaxRegions = 4096;
constexpr uint64_t kMaxFieldBytes = 1 << 20;

void PutU64(std::string& out, uint64_t v) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(v >> (8 * i));  // little-endian
  out.append(bytes, 8);
}

void PutBytes(std::string& out, std::string_view bytes) {
  PutU64(out, bytes.size());
  out.append(bytes);
}

class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}

  absl::StatusOr<uint64_t> U64(absl::string_view what) {
    if (in_.size() < 8) return Truncated(what);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(8);
    return v;
  }

  absl::StatusOr<std::string> Bytes(absl::string_view what) {
    absl::StatusOr<uint64_t> size = U64(what);
    if (!size.ok()) return size.status();
    if (*size > kMaxFieldBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("KV-transfer metadata: ", what, " claims ", *size, " bytes"));
    }
    if (in_.size() < *size) return Truncated(what);
    std::string out(in_.substr(0, *size));
    in_.remove_prefix(*size);
    return out;
  }

  bool empty() const { return in_.empty(); }

 private:
  static absl::Status Truncated(absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("KV-transfer metadata: truncated in ", what));
  }

  std::string_view in_;
};

}  // namespace

std::string EncodeAgentMetadata(const AgentMetadata& metadata) {
  std::string out(kMagic, sizeof(kMagic));
  PutBytes(out, metadata.backend);
  PutBytes(out, metadata.address);
  PutU64(out, metadata.regions.size());
  for (const RegionMetadata& region : metadata.regions) {
    PutU64(out, region.base);
    PutU64(out, region.bytes);
    PutBytes(out, region.key);
  }
  return out;
}

absl::StatusOr<AgentMetadata> DecodeAgentMetadata(std::string_view bytes) {
  if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError("KV-transfer metadata: not a Tandem agent's (bad magic)");
  }
  Reader reader(bytes.substr(sizeof(kMagic)));
  AgentMetadata metadata;
  absl::StatusOr<std::string> backend = reader.Bytes("backend");
  if (!backend.ok()) return backend.status();
  metadata.backend = *std::move(backend);
  absl::StatusOr<std::string> address = reader.Bytes("address");
  if (!address.ok()) return address.status();
  metadata.address = *std::move(address);
  absl::StatusOr<uint64_t> count = reader.U64("region count");
  if (!count.ok()) return count.status();
  if (*count > kMaxRegions) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV-transfer metadata: ", *count, " regions (at most ", kMaxRegions, ")"));
  }
  for (uint64_t i = 0; i < *count; ++i) {
    RegionMetadata region;
    absl::StatusOr<uint64_t> base = reader.U64("region base");
    if (!base.ok()) return base.status();
    absl::StatusOr<uint64_t> size = reader.U64("region size");
    if (!size.ok()) return size.status();
    absl::StatusOr<std::string> key = reader.Bytes("region key");
    if (!key.ok()) return key.status();
    if (*base + *size < *base) {
      return absl::InvalidArgumentError("KV-transfer metadata: a region wraps the address space");
    }
    metadata.regions.push_back({*base, *size, *std::move(key)});
  }
  if (!reader.empty()) {
    return absl::InvalidArgumentError("KV-transfer metadata: trailing bytes");
  }
  return metadata;
}

}  // namespace tandem::kvtransfer
