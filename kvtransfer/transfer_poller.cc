#include "kvtransfer/transfer_poller.h"

#include <pthread.h>

#include "absl/time/clock.h"

namespace tandem::kvtransfer {

TransferPoller::TransferPoller(TransferAgent* agent, std::string thread_name) : agent_(agent) {
  thread_ = std::thread([this, name = std::move(thread_name)] {
    pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
    Loop();
  });
}

TransferPoller::~TransferPoller() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void TransferPoller::Watch(TransferId transfer, Callback done) {
  absl::MutexLock lock(&mu_);
  watched_.emplace_back(transfer, std::move(done));
}

void TransferPoller::Loop() {
  for (;;) {
    std::vector<std::pair<TransferStatus, Callback>> ended;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !watched_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      for (auto it = watched_.begin(); it != watched_.end();) {
        TransferStatus status = agent_->Poll(it->first);
        if (status.state == TransferState::kInProgress) {
          ++it;
          continue;
        }
        agent_->Release(it->first);
        ended.emplace_back(std::move(status), std::move(it->second));
        it = watched_.erase(it);
      }
    }
    for (auto& [status, done] : ended) done(status);
    // Nothing ended: look again shortly (a read of a few pages takes well
    // under a millisecond on a LAN).
    if (ended.empty()) absl::SleepFor(absl::Microseconds(100));
  }
}

}  // namespace tandem::kvtransfer
