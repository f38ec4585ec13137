// Runs one worker's steps on a thread of its own, one step at a time, and
// reports each result through a callback (to the scheduler thread's inbox).
//
// Thread safety: Run() is called by one thread (the scheduler), never while a
// step is running; the callback runs on the worker thread.
#ifndef TANDEM_SCHEDULER_WORKER_THREAD_H_
#define TANDEM_SCHEDULER_WORKER_THREAD_H_

#include <functional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/step/step_plan.h"

namespace tandem::scheduler {

class WorkerThread {
 public:
  using Done = std::function<void(step::StepResult)>;

  // `worker` must outlive this object. `name` names the thread.
  WorkerThread(std::string name, step::Worker* worker, Done done);
  ~WorkerThread();  // waits for a running step, then stops
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Starts executing `plan`, which must stay valid until `done` is called.
  void Run(const step::StepPlan* plan);

 private:
  void Loop();

  step::Worker* worker_;
  Done done_;
  absl::Mutex mu_;
  const step::StepPlan* plan_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tandem::scheduler

#endif  // TANDEM_SCHEDULER_WORKER_THREAD_H_
