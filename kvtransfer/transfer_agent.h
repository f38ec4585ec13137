// The KV-transfer seam: moves KV pages between two owners of KV storage that
// do not share memory (two daemons, or two backends of one daemon on
// different devices), shaped like NIXL's agent API so that a NIXL, UCX or
// device-copy backend can stand behind it:
//
//   1. each side registers its memory regions once (its paged KV storage);
//   2. each side publishes an opaque metadata blob (LocalMetadata), which the
//      other loads (AddPeer); tandemd carries it over its own gRPC;
//   3. the owner of the pages grants reads of exactly the ranges it offers,
//      until the offer's lease ends (GrantReads), and hands the grant's
//      token to the one peer it offers them to;
//   4. the reader posts reads over descriptor lists with that token
//      (PostRead): each local descriptor receives the bytes of the remote
//      descriptor of the same index;
//   5. the reader polls the transfer (Poll) until it is done or failed; when
//      every byte has landed, the agent sends the transfer's notification to
//      the peer, which collects it with TakeNotifications;
//   6. the owner revokes the grant (RevokeReads) before the pages go to
//      anything else.
//
// An agent answers only reads that a live grant covers: a peer that can
// reach the transport reads nothing it was not offered, and nothing after
// the offer ended. The owner's agent answers reads on its own progress
// thread; the caller posts nothing per transfer on the owner's side.
//
// Thread safety: every method may be called from any thread.
#ifndef TANDEM_KVTRANSFER_TRANSFER_AGENT_H_
#define TANDEM_KVTRANSFER_TRANSFER_AGENT_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer {

enum class MemoryKind : uint8_t { kHost, kCuda };

// `bytes` bytes at `offset` into region `region` (regions are numbered in
// the order their owner registered them, from 0).
struct Descriptor {
  uint32_t region = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;

  friend bool operator==(const Descriptor&, const Descriptor&) = default;
};

using PeerId = uint64_t;
using TransferId = uint64_t;
using GrantId = uint64_t;

// What GrantReads returns: the grant's number, for RevokeReads, and the
// token a reader presents (opaque bytes; give it only to that reader).
struct ReadGrant {
  GrantId id = 0;
  std::string token;
};

enum class TransferState : uint8_t { kInProgress, kDone, kFailed };

struct TransferStatus {
  TransferState state = TransferState::kInProgress;
  absl::Status error;  // why, when kFailed
};

class TransferAgent {
 public:
  virtual ~TransferAgent() = default;

  // The transport behind the agent, for logs ("ucx").
  virtual std::string backend() const = 0;

  // Registers [base, base + bytes) for transfers and returns its region
  // number. Register every region before publishing LocalMetadata(); the
  // memory must stay valid for the agent's life. UNIMPLEMENTED for memory
  // kinds the agent cannot copy.
  virtual absl::StatusOr<uint32_t> RegisterMemory(void* base, size_t bytes, MemoryKind kind) = 0;

  // What a peer needs to read this agent's regions and to notify it.
  virtual absl::StatusOr<std::string> LocalMetadata() = 0;

  // Connects to the agent whose LocalMetadata() is `metadata`.
  virtual absl::StatusOr<PeerId> AddPeer(std::string_view metadata) = 0;
  // Disconnects; transfers still in progress with that peer fail.
  virtual void RemovePeer(PeerId peer) = 0;

  // Lets the holder of the returned token read `ranges` of this agent's
  // regions until `until` or RevokeReads, whichever comes first.
  // INVALID_ARGUMENT for no ranges or a range outside its region.
  virtual absl::StatusOr<ReadGrant> GrantReads(std::span<const Descriptor> ranges,
                                               absl::Time until) = 0;
  // Ends a grant. When it returns, no byte of the grant's ranges is being
  // copied for a reader and none will be: the memory may be reused.
  virtual void RevokeReads(GrantId grant) = 0;

  // Reads remote[i] (the peer's memory) into local[i] (this agent's), for
  // every i, presenting `grant_token` (the peer's ReadGrant::token), and
  // then notifies the peer with `notification`. INVALID_ARGUMENT when the
  // lists differ in length or a pair differs in size; OUT_OF_RANGE when a
  // descriptor leaves its region; NOT_FOUND for an unknown peer or region.
  // Nothing is posted when it returns an error. A read the peer's grant does
  // not cover fails (Poll: kFailed, PERMISSION_DENIED with the reason).
  virtual absl::StatusOr<TransferId> PostRead(PeerId peer, std::span<const Descriptor> local,
                                              std::span<const Descriptor> remote,
                                              std::string_view grant_token,
                                              std::string notification) = 0;

  // Where `transfer` stands. kDone means every byte has landed in local
  // memory; kFailed (a peer that went away, a transport error) means the
  // local descriptors hold undefined bytes. NOT_FOUND error for an unknown
  // or released id.
  virtual TransferStatus Poll(TransferId transfer) = 0;

  // Forgets a transfer that is done or failed (REQUIRED: not in progress).
  virtual void Release(TransferId transfer) = 0;

  // Notifications peers sent after reading this agent's memory, oldest
  // first; each is returned once.
  virtual std::vector<std::string> TakeNotifications() = 0;

  // Testing only (--inject_fault=kv_transfer:stall@N:DUR): for `duration`
  // this agent's own thread answers no peer's read, as a source whose
  // machine or network stalled would not. Calls on this agent still make
  // progress.
  virtual void StopAnsweringForTesting(absl::Duration duration) = 0;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSFER_AGENT_H_
