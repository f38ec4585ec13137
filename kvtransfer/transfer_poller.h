// Watches transfers a TransferAgent is running and reports each one's end.
// Reads complete on the agent's own progress thread; the poller only looks
// (every 100 us while any is in flight, idle otherwise) and calls the
// transfer's callback once, after releasing it in the agent.
//
// Thread safety: Watch may be called from any thread; callbacks run on the
// poller's thread, one at a time, and must not block.
#ifndef TANDEM_KVTRANSFER_TRANSFER_POLLER_H_
#define TANDEM_KVTRANSFER_TRANSFER_POLLER_H_

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/transfer_agent.h"

namespace tandem::kvtransfer {

class TransferPoller {
 public:
  using Callback = std::function<void(const TransferStatus&)>;

  // `agent` must outlive the poller; `thread_name` names its thread.
  TransferPoller(TransferAgent* agent, std::string thread_name);
  // Stops; transfers still watched are not reported.
  ~TransferPoller();
  TransferPoller(const TransferPoller&) = delete;
  TransferPoller& operator=(const TransferPoller&) = delete;

  // Calls `done` with the transfer's final status (kDone or kFailed). When
  // the transfer is still in progress at `deadline`, calls `overdue` once
  // (on the poller's thread; it should make the transfer fail, e.g. by
  // removing its peer) and goes on watching.
  void Watch(TransferId transfer, Callback done, absl::Time deadline = absl::InfiniteFuture(),
             std::function<void()> overdue = nullptr);

 private:
  struct Watched {
    TransferId transfer;
    Callback done;
    absl::Time deadline;
    std::function<void()> overdue;  // null once called
  };
  void Loop();

  TransferAgent* agent_;
  absl::Mutex mu_;
  std::vector<Watched> watched_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSFER_POLLER_H_
