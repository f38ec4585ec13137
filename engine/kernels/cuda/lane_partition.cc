#include "engine/kernels/cuda/lane_partition.h"

#include <algorithm>
#include <map>

namespace tandem::kernels::cuda {

int DecodeReservedSms(int device_sms, int flag) {
  if (device_sms < 2 || flag == 0) return 0;
  const int wanted = flag < 0 ? (device_sms + 7) / 8 : flag;
  return std::clamp(wanted, 0, device_sms / 2);
}

std::shared_ptr<LatencyLaneActivity> LatencyLaneActivity::ForDevice(int device) {
  static std::mutex mu;
  static auto* activities = new std::map<int, std::weak_ptr<LatencyLaneActivity>>();  // by mu
  std::lock_guard<std::mutex> lock(mu);
  std::weak_ptr<LatencyLaneActivity>& slot = (*activities)[device];
  if (std::shared_ptr<LatencyLaneActivity> live = slot.lock()) return live;
  auto made = std::make_shared<LatencyLaneActivity>();
  slot = made;
  return made;
}

void LatencyLaneActivity::StepBegan(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_++ == 0) began_ = now;
}

void LatencyLaneActivity::StepEnded(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ == 0) return;  // an EndStep without a BeginStep: nothing ran
  if (--running_ == 0) {
    last_end_ = now;
    last_duration_ = now - began_;
  }
}

bool LatencyLaneActivity::Busy(Clock::time_point now) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (running_ > 0) return true;
  return last_duration_ > Clock::duration::zero() && now - last_end_ < last_duration_;
}

}  // namespace tandem::kernels::cuda
