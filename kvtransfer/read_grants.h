// Which of an agent's bytes a peer may read, and until when: the owner of KV
// pages grants a peer the ranges of one offer (TransferAgent::GrantReads)
// and the peer presents the grant's token with each read. The token is a
// bearer capability: it travels only over the authenticated peer channel
// (mutual TLS), so only the peer the offer went to can hold it.
//
// A token is the grant's number (8 bytes) and 16 random bytes drawn from the
// kernel's random source; a token is checked by its number, then its random
// part compared in constant time.
//
// Thread safety: none (the agent guards it with its own lock).
#ifndef TANDEM_KVTRANSFER_READ_GRANTS_H_
#define TANDEM_KVTRANSFER_READ_GRANTS_H_

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

// Fills `out` with `bytes` bytes from the kernel's random source;
// UNAVAILABLE when it gives none.
absl::Status RandomBytes(void* out, size_t bytes);

class ReadGrants {
 public:
  static constexpr size_t kTokenBytes = 24;

  // Grants reads of `ranges` (the owner's regions) until `until`. Grants
  // whose time has passed are forgotten here. INVALID_ARGUMENT for an empty
  // range list; UNAVAILABLE when the kernel gives no random bytes.
  absl::StatusOr<ReadGrant> Grant(std::span<const Descriptor> ranges, absl::Time until);

  // Ends a grant; a no-op for one that ended already.
  void Revoke(GrantId grant) { grants_.erase(grant); }

  // OK when `token` names a grant that is live at `now` and that covers
  // every byte of every range in `reads`; PERMISSION_DENIED otherwise, with
  // the reason (an unknown or revoked grant, an expired one, the first
  // range it does not cover).
  absl::Status Check(std::string_view token, std::span<const Descriptor> reads,
                     absl::Time now) const;

  size_t live() const { return grants_.size(); }

 private:
  struct Span {
    uint32_t region = 0;
    uint64_t begin = 0;
    uint64_t end = 0;  // one past the last byte
  };
  struct Entry {
    std::array<unsigned char, 16> secret{};
    absl::Time until;
    std::vector<Span> spans;  // sorted by (region, begin), disjoint, merged
  };

  absl::flat_hash_map<GrantId, Entry> grants_;
  GrantId next_ = 1;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_READ_GRANTS_H_
