#include "scheduler/worker_thread.h"

#include <exception>

#include "common/check.h"
#include "common/strings.h"
#include "common/thread_name.h"

namespace tandem::scheduler {

WorkerThread::WorkerThread(std::string name, step::Worker* worker, Done done)
    : worker_(worker), done_(std::move(done)), thread_([this, name = std::move(name)] {
        NameThisThread(name);
        Loop();
      }) {}

WorkerThread::~WorkerThread() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void WorkerThread::Run(const step::StepPlan* plan) {
  absl::MutexLock lock(&mu_);
  TANDEM_CHECK(plan_ == nullptr, "a worker runs one step at a time");
  plan_ = plan;
}

void WorkerThread::Loop() {
  worker_->OnThreadStart();
  for (;;) {
    const step::StepPlan* plan = nullptr;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || plan_ != nullptr; };
      mu_.Await(absl::Condition(&ready));
      if (plan_ == nullptr) return;  // stopping with nothing to run
      plan = plan_;
    }
    step::StepResult result;
    // A worker that throws fails its step (and only the requests in it), as
    // one that returns an error does; the thread keeps serving.
    try {
      result = worker_->Execute(*plan);
    } catch (const std::exception& e) {
      result = step::StepResult();
      result.status = absl::InternalError(StrCat("the worker failed: ", e.what()));
    } catch (...) {
      result = step::StepResult();
      result.status = absl::InternalError("the worker failed with an unknown exception");
    }
    {
      absl::MutexLock lock(&mu_);
      plan_ = nullptr;
    }
    done_(std::move(result));
  }
}

}  // namespace tandem::scheduler
