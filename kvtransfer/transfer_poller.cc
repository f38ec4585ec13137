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

void TransferPoller::Watch(TransferId transfer, Callback done, absl::Time deadline,
                           std::function<void()> overdue) {
  absl::MutexLock lock(&mu_);
  watched_.push_back({transfer, std::move(done), deadline, std::move(overdue)});
}

void TransferPoller::Loop() {
  for (;;) {
    std::vector<std::pair<TransferStatus, Callback>> ended;
    std::vector<std::pair<TransferId, std::function<void()>>> overdue;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !watched_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      const absl::Time now = absl::Now();
      for (auto it = watched_.begin(); it != watched_.end();) {
        TransferStatus status = agent_->Poll(it->transfer);
        if (status.state == TransferState::kInProgress) {
          if (it->overdue && now >= it->deadline) {
            overdue.emplace_back(it->transfer, std::move(it->overdue));
            it->overdue = nullptr;
          }
          ++it;
          continue;
        }
        agent_->Release(it->transfer);
        ended.emplace_back(std::move(status), std::move(it->done));
        it = watched_.erase(it);
      }
    }
    for (auto& [status, done] : ended) done(status);
    // Looked at again outside the lock: one that ended meanwhile is not cut
    // off (its end is reported on the next round).
    for (auto& [transfer, act] : overdue) {
      if (agent_->Poll(transfer).state == TransferState::kInProgress) act();
    }
    // Nothing ended: look again shortly (a read of a few pages takes well
    // under a millisecond on a LAN).
    if (ended.empty()) absl::SleepFor(absl::Microseconds(100));
  }
}

}  // namespace tandem::kvtransfer
