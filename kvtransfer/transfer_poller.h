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

  // Calls `done` with the transfer's final status (kDone or kFailed).
  void Watch(TransferId transfer, Callback done);

 private:
  void Loop();

  TransferAgent* agent_;
  absl::Mutex mu_;
  std::vector<std::pair<TransferId, Callback>> watched_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem::kvtransfer

#endif  // TANDEM_KVTRANSFER_TRANSFER_POLLER_H_
